//! `ktune chat` driven through stdin (not a terminal: one message a line, each
//! reply followed by a `---` line): replies equal `run --chat`'s text, `/reset`,
//! `/system`, `/stats` (a turn that extends the last prefills only its new
//! tokens), and a context too small for the conversation dropping the oldest
//! turns with a notice; a line of invalid UTF-8 answered with U+FFFD for its bad
//! bytes. The tiny SmolLM2-shaped GGUF fixture, whose file has no
//! chat template, with the published SmolLM2 template given as a file.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::common::{fixture, gguf_dir, ktune_in, ktune_process, tempdir};

/// The fixture's model flags (`--device cpu`, the GGUF file, the template).
fn model_args(c: &mut Command) -> &mut Command {
    c.args(["--device", "cpu", "--gguf"])
        .arg(gguf_dir().join("smollm2-tiny-q8_0.gguf"))
        .arg("--chat-template")
        .arg(fixture("chat_templates/smollm2.jinja"))
}

/// `chat` with `flags`, `input` on stdin: (exit code, stdout, stderr).
fn chat(flags: &[&str], input: &str) -> (Option<i32>, String, String) {
    chat_bytes(flags, input.as_bytes())
}

/// [`chat`] with any bytes on stdin.
fn chat_bytes(flags: &[&str], input: &[u8]) -> (Option<i32>, String, String) {
    let cache = tempdir();
    let mut c = ktune_process(cache.path());
    c.arg("chat");
    model_args(&mut c).args(flags).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("runs");
    child.stdin.take().expect("stdin").write_all(input).expect("writes");
    let out = child.wait_with_output().expect("ends");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The replies in chat's stdout (each ends with the line `---`).
fn replies(stdout: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in stdout.lines() {
        if line == "---" {
            out.push(cur.trim_end_matches('\n').to_string());
            cur.clear();
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    out
}

#[test]
fn chat_replies_like_run_and_handles_reset_system_and_stats() {
    let (code, stdout, stderr) =
        chat(&["--max-tokens", "6"], "hello\nhow are you today\n/stats\n/reset\n/system Be brief.\nhello\n/exit\nnot read\n");
    assert_eq!(code, Some(0), "{stderr}");
    let r = replies(&stdout);
    assert_eq!(r.len(), 3, "three replies: {stdout:?}");
    // The first turn is run --chat's prompt: the same greedy text.
    let cache = tempdir();
    let mut c = ktune_process(cache.path());
    c.arg("run");
    let out = model_args(&mut c).args(["--prompt", "hello", "--chat", "--max-tokens", "6", "--format", "json"]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r[0], v["text"].as_str().expect("text").trim_end_matches('\n'), "chat's first reply is run --chat's text");
    // The second turn extends the first: only its new tokens were prefilled.
    let stats = regex::Regex::new(r"prefill (\d+) of (\d+) prompt tokens").expect("regex");
    let m = stats.captures(&stderr).unwrap_or_else(|| panic!("no /stats line: {stderr}"));
    let (prefilled, prompt): (usize, usize) = (m[1].parse().expect("n"), m[2].parse().expect("n"));
    assert!(prefilled < prompt, "the KV cache was reused: {prefilled} of {prompt} prefilled");
    assert!(stderr.contains("[conversation cleared]"), "{stderr}");
    assert!(stderr.contains("[system prompt set; conversation cleared]"), "{stderr}");
    // After /reset and a new system prompt, "hello" is another prompt than the first.
    assert!(!stderr.contains("error"), "{stderr}");
}

#[test]
fn chat_drops_the_oldest_turns_when_the_context_fills() {
    let msg = "tell me a long story about the sea and the ships that sail on it every day";
    let input = format!("{msg}\n{msg}\n{msg}\n{msg}\n{msg}\n");
    let (code, stdout, stderr) = chat(&["--max-tokens", "8", "--context", "160"], &input);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(replies(&stdout).len(), 5, "every message answered: {stdout:?} {stderr}");
    assert!(stderr.contains("dropped the oldest turn"), "{stderr}");
}

#[test]
fn chat_message_longer_than_the_context_is_refused_and_the_session_goes_on() {
    let long = "word ".repeat(200);
    let (code, stdout, stderr) = chat(&["--max-tokens", "4", "--context", "128"], &format!("{long}\nhello\n"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("not sent"), "{stderr}");
    assert_eq!(replies(&stdout).len(), 1, "{stdout:?}");
}

/// Regression (issue 45): one line of invalid UTF-8 on stdin ended the session
/// with "writing output failed". Its bad bytes become U+FFFD with a notice, and
/// both lines are answered.
#[test]
fn chat_line_of_invalid_utf8_is_answered_and_the_session_goes_on() {
    let (code, stdout, stderr) = chat_bytes(&["--max-tokens", "4"], b"caf\xe9 \xff\xfe au lait\nhello\n");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(replies(&stdout).len(), 2, "both lines answered: {stdout:?} {stderr}");
    assert_eq!(stderr.matches("not valid UTF-8").count(), 1, "one notice, for the bad line: {stderr}");
    assert!(!stderr.contains("failed"), "{stderr}");
}

#[test]
fn chat_with_a_builtin_model_says_it_needs_a_tokenizer() {
    let cache = tempdir();
    let out = ktune_in(cache.path()).args(["chat", "--device", "cpu", "--model", "smollm2-135m", "--layers", "1"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chat needs a tokenizer.json"), "{err}");
}
