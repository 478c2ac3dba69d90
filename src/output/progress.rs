//! Progress on stderr (indicatif bars, hidden when stderr is not a terminal) and
//! the generated text `run` streams to stdout.

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::progress::Progress;

/// Progress bars on stderr: one indicatif bar per phase, notes printed above it.
/// `counter` is the `{prefix} [bar] pos/len msg` bar of `kernels --verify` and
/// `bench` (each step's name as the message); `tune` the tuner's, with a spinner and
/// the elapsed time, which logs each phase with its start time when stderr is not a
/// terminal (the bar is hidden there); `download` a bytes bar per file, which
/// logs each file likewise. Nothing is shown until the first phase.
pub struct Bars {
    template: &'static str,
    prefix: &'static str,
    /// The start of the work, when phases are logged (on a hidden bar) and steps not shown.
    tune_start: Option<Instant>,
    bar: Mutex<Option<ProgressBar>>,
}

impl Bars {
    pub fn counter(prefix: &'static str) -> Bars {
        Bars { template: "{prefix} [{bar:30}] {pos}/{len} {msg}", prefix, tune_start: None, bar: Mutex::new(None) }
    }

    pub fn tune() -> Bars {
        Bars {
            template: "{spinner} [{elapsed_precise}] [{bar:30}] {pos}/{len} {msg}",
            prefix: "",
            tune_start: Some(Instant::now()),
            bar: Mutex::new(None),
        }
    }

    pub fn download() -> Bars {
        Bars {
            template: "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            prefix: "",
            tune_start: Some(Instant::now()),
            bar: Mutex::new(None),
        }
    }

    fn with_bar(&self, f: impl FnOnce(&ProgressBar)) {
        if let Ok(b) = self.bar.lock()
            && let Some(pb) = b.as_ref()
        {
            f(pb);
        }
    }
}

impl Progress for Bars {
    fn phase(&self, msg: &str, len: u64) {
        let pb = ProgressBar::new(len);
        pb.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(self.template) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_prefix(self.prefix);
        if !msg.is_empty() {
            pb.set_message(msg.to_string());
        }
        if let Some(start) = self.tune_start
            && pb.is_hidden()
        {
            let _ = writeln!(std::io::stderr(), "ktune: [{:7.1} s] {msg}", start.elapsed().as_secs_f64());
        }
        if let Ok(mut b) = self.bar.lock()
            && let Some(old) = b.replace(pb)
        {
            old.finish_and_clear();
        }
    }
    fn step(&self, what: &str) {
        if self.tune_start.is_none() {
            self.with_bar(|pb| pb.set_message(what.to_string()));
        }
    }
    fn tick(&self) {
        self.with_bar(|pb| pb.inc(1));
    }
    fn advance(&self, n: u64) {
        self.with_bar(|pb| pb.inc(n));
    }
    fn advance_to(&self, pos: u64) {
        self.with_bar(|pb| pb.set_position(pos));
    }
    fn note(&self, msg: &str) {
        // A hidden bar (stderr not a terminal) prints nothing: the note goes to stderr.
        match self.bar.lock().ok().and_then(|b| b.clone()).filter(|pb| !pb.is_hidden()) {
            Some(pb) => pb.println(format!("ktune: {msg}")),
            None => {
                let _ = writeln!(std::io::stderr(), "ktune: {msg}");
            }
        }
    }
    fn done(&self) {
        if let Ok(mut b) = self.bar.lock()
            && let Some(pb) = b.take()
        {
            pb.finish_and_clear();
        }
    }
}

/// Generated text on stdout as it is produced (`ktune run`, table format),
/// ended by a newline once something was written.
pub struct TextStream {
    wrote: bool,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream { wrote: false }
    }

    /// Writes `piece` and flushes (a closed stdout is not an error here: the report says it again).
    pub fn piece(&mut self, piece: &str) {
        let mut out = std::io::stdout().lock();
        if !self.wrote {
            let _ = out.write_all(b"output:   ");
        }
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
        self.wrote = true;
    }

    pub fn finish(self) {
        if self.wrote {
            let _ = std::io::stdout().lock().write_all(b"\n");
        }
    }
}

impl Default for TextStream {
    fn default() -> Self {
        TextStream::new()
    }
}
