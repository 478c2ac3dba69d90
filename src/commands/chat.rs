//! `ktune chat`: a conversation with a model on one device, through the shared
//! [`Generator`] (the model source, profile and engine chosen as `run` chooses
//! them). Each turn is rendered with the model's chat template and the reply
//! streamed as it is generated; the KV cache is kept between turns, so a turn
//! prefills only what the last one did not leave in it. When a turn would not fit
//! the context, the oldest turns are dropped (the system prompt is kept) with a
//! notice on stderr. Commands: `/reset`, `/system TEXT`, `/stats`, `/exit`.
//! On a terminal: line editing and history (rustyline; `chat_history.txt` under
//! the cache directory), Ctrl-C stops a reply and keeps the session, Ctrl-C twice
//! at the prompt (or Ctrl-D) exits. Otherwise one message a line from stdin, each
//! reply followed by the line [`DELIMITER`]; a line that is not UTF-8 is read
//! with U+FFFD for its bad bytes, and a notice on stderr. Being interactive, this command
//! writes to stdout and stderr itself.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustyline::error::ReadlineError;

use crate::cli::ChatArgs;
use crate::generate::{self, Completion, Generator, Limits, Output};
use crate::{Error, Result};

/// The line after each reply when stdin is not a terminal.
pub const DELIMITER: &str = "---";

/// The conversation: the system prompt and the turns kept.
#[derive(Default)]
struct Conversation {
    system: Option<String>,
    /// (user, assistant) pairs, oldest first.
    turns: Vec<(String, String)>,
}

impl Conversation {
    /// The turns to render, with `user` as the last message.
    fn messages<'a>(&'a self, user: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut m: Vec<(&str, &str)> = self.system.iter().map(|s| ("system", s.as_str())).collect();
        for (u, a) in &self.turns {
            m.push(("user", u));
            m.push(("assistant", a));
        }
        m.push(("user", user));
        m
    }
}

/// Where the lines come from.
enum Input {
    Editor { editor: Box<rustyline::DefaultEditor>, history: Option<std::path::PathBuf> },
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    /// The next line; None at the end of input (Ctrl-D, or twice Ctrl-C in a row).
    fn next(&mut self) -> Result<Option<String>> {
        match self {
            Input::Lines(lines) => {
                let mut bytes = Vec::new();
                let n = lines.read_until(b'\n', &mut bytes).map_err(|e| Error::Usage(format!("reading stdin: {e}")))?;
                Ok((n > 0).then(|| line_text(&bytes)))
            }
            Input::Editor { editor, .. } => {
                let mut interrupted = false;
                loop {
                    match editor.readline("> ") {
                        Ok(line) => {
                            if !line.trim().is_empty() {
                                let _ = editor.add_history_entry(line.as_str());
                            }
                            return Ok(Some(line));
                        }
                        Err(ReadlineError::Interrupted) if !interrupted => {
                            eprintln!("(Ctrl-C again or /exit to leave)");
                            interrupted = true;
                        }
                        Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(None),
                        Err(e) => return Err(Error::Usage(format!("reading the terminal: {e}"))),
                    }
                }
            }
        }
    }

    /// Writes the history file (a failure is a warning: the chat itself went well).
    fn save(&mut self) {
        if let Input::Editor { editor, history: Some(path) } = self
            && let Err(e) =
                path.parent().map_or(Ok(()), std::fs::create_dir_all).map_err(ReadlineError::from).and_then(|_| editor.save_history(path))
        {
            eprintln!("warning: history not saved to {}: {e}", path.display());
        }
    }
}

/// A line of stdin as text, its line end taken off: bytes that are not UTF-8
/// become U+FFFD, with a notice on stderr (the session goes on).
fn line_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if let std::borrow::Cow::Owned(_) = text {
        eprintln!("[the line is not valid UTF-8: the bytes that are not were replaced with U+FFFD]");
    }
    text.trim_end_matches(['\n', '\r']).to_string()
}

/// Runs until the input ends (chat) or a signal (serve); `warn` shows the
/// warnings of loading (the application's `output::warn`).
pub fn run(selector: Option<&str>, args: &ChatArgs, warn: &dyn Fn(&str)) -> Result<()> {
    let params = args.generate.sampler();
    generate::check_sampling(&params)?;
    let settings = args.generate.generator("chat")?;
    let tty = std::io::stdin().is_terminal();
    let mut g = Generator::open(selector, &settings)?;
    for w in &g.warnings {
        warn(w);
    }
    eprintln!(
        "ktune chat: {} on {}, {}, context {} tokens. /reset, /system TEXT, /stats, /exit",
        g.model,
        g.device,
        g.profile.as_deref().map_or("the runtime's defaults".to_string(), |p| format!("profile {p}")),
        g.context
    );
    let mut input = if tty {
        let mut editor = rustyline::DefaultEditor::new().map_err(|e| Error::Usage(format!("cannot open the terminal: {e}")))?;
        let history = if args.no_history { None } else { crate::profile::cache::root().ok().map(|d| d.join("chat_history.txt")) };
        if let Some(p) = &history {
            let _ = editor.load_history(p);
        }
        Input::Editor { editor: Box::new(editor), history }
    } else {
        Input::Lines(std::io::stdin().lock())
    };
    // Ctrl-C: stops the reply being generated (at a terminal's prompt the editor
    // reads it as a key); outside a reply, it ends the process. Installed after
    // the editor, which replaces the SIGINT handler while it lives.
    let cancel = Arc::new(AtomicBool::new(false));
    let replying = Arc::new(AtomicBool::new(false));
    {
        let (cancel, replying) = (cancel.clone(), replying.clone());
        ctrlc::set_handler(move || {
            if replying.load(Ordering::SeqCst) {
                cancel.store(true, Ordering::SeqCst);
            } else {
                std::process::exit(130);
            }
        })
        .map_err(|e| Error::Usage(format!("cannot catch Ctrl-C: {e}")))?;
    }
    let mut chat = Conversation { system: args.system.clone(), turns: Vec::new() };
    let mut last: Option<Completion> = None;
    let limits = Limits { max_tokens: args.max_tokens, stop: Vec::new(), ignore_eos: args.generate.sampling.ignore_eos };
    while let Some(line) = input.next()? {
        let line = line.trim();
        match line.split_once(' ').map_or((line, ""), |(c, rest)| (c, rest.trim())) {
            ("", _) => continue,
            ("/exit" | "/quit", _) => break,
            ("/reset", _) => {
                chat.turns.clear();
                g.reset();
                eprintln!("[conversation cleared]");
            }
            ("/system", text) => {
                chat.system = (!text.is_empty()).then(|| text.to_string());
                chat.turns.clear();
                eprintln!("[system prompt {}; conversation cleared]", if text.is_empty() { "removed" } else { "set" });
            }
            ("/stats", _) => eprintln!("{}", stats(&g, last.as_ref())),
            (c, _) if c.starts_with('/') && c[1..].chars().all(|ch| ch.is_ascii_alphabetic()) => {
                eprintln!("[unknown command {c}: /reset, /system TEXT, /stats, /exit]");
            }
            _ => {
                let Some(prompt) = fit(&g, &mut chat, line, args.max_tokens)? else { continue };
                cancel.store(false, Ordering::SeqCst);
                replying.store(true, Ordering::SeqCst);
                let mut out = std::io::stdout().lock();
                let mut stream = |t: &str| out.write_all(t.as_bytes()).and_then(|_| out.flush()).is_ok();
                let done = g.complete(&prompt, params, Output { limits: &limits, cancel: Some(&cancel), stream: &mut stream });
                replying.store(false, Ordering::SeqCst);
                let c = done?;
                let text = c.decoded.text.clone().unwrap_or_default();
                writeln!(out)?;
                if c.decoded.stop_reason == crate::report::StopReason::Cancelled {
                    eprintln!("[reply stopped]");
                }
                if !tty {
                    writeln!(out, "{DELIMITER}")?;
                }
                out.flush()?;
                chat.turns.push((line.to_string(), text));
                last = Some(c);
            }
        }
    }
    input.save();
    Ok(())
}

/// The prompt of `chat` with `user` as the next message, within the context with
/// room for a reply of `reply` tokens: the oldest turns dropped (a notice each)
/// until it fits. None (and a notice) when `user` alone does not fit.
fn fit(g: &Generator, chat: &mut Conversation, user: &str, reply: usize) -> Result<Option<Vec<u32>>> {
    loop {
        let ids = g.prompter.render(&chat.messages(user))?;
        let fits = ids.len() + reply.min(g.context / 2).max(1) <= g.context;
        if fits || (chat.turns.is_empty() && ids.len() < g.context) {
            return Ok(Some(ids));
        }
        if chat.turns.is_empty() {
            eprintln!("[the message is {} tokens with the system prompt; the context holds {}: not sent]", ids.len(), g.context);
            return Ok(None);
        }
        chat.turns.remove(0);
        eprintln!("[context full ({} of {} tokens): dropped the oldest turn]", ids.len(), g.context);
    }
}

/// `/stats`: the last reply's speeds, the profile, the context used.
fn stats(g: &Generator, last: Option<&Completion>) -> String {
    let mut s = format!(
        "model {} on {}; {}; context {} of {} tokens; decode chain {}",
        g.model,
        g.device,
        g.profile.as_deref().map_or("the runtime's defaults".to_string(), |p| format!("profile {p}")),
        g.engine.pos,
        g.context,
        g.chain
    );
    if let Some(c) = last {
        let d = &c.decoded;
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        s.push_str(&format!(
            "\nlast reply: prefill {} of {} prompt tokens at {:.1} tok/s, decode {} tokens at {:.1} tok/s ({})",
            c.prefilled,
            c.prompt_tokens,
            rate(c.prefilled, c.prefill_seconds),
            d.generated.len(),
            rate(d.decode_tokens, d.decode_seconds),
            d.stop_reason
        ));
    }
    s
}
