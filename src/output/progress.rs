//! Progress on stderr (indicatif bars, hidden when stderr is not a terminal) and
//! the generated text `run` streams to stdout.

use std::io::Write;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::progress::Progress;

/// A counting bar per phase, `{prefix} [bar] pos/len msg` (`kernels --verify`,
/// `bench`); nothing is shown until the first phase.
pub struct Counter {
    prefix: &'static str,
    bar: Mutex<Option<ProgressBar>>,
}

impl Counter {
    pub fn new(prefix: &'static str) -> Counter {
        Counter { prefix, bar: Mutex::new(None) }
    }

    fn with_bar(&self, f: impl FnOnce(&ProgressBar)) {
        if let Ok(b) = self.bar.lock()
            && let Some(pb) = b.as_ref()
        {
            f(pb);
        }
    }
}

impl Progress for Counter {
    fn phase(&self, msg: &str, len: u64) {
        let pb = ProgressBar::new(len);
        pb.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}") {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_prefix(self.prefix);
        if !msg.is_empty() {
            pb.set_message(msg.to_string());
        }
        if let Ok(mut b) = self.bar.lock()
            && let Some(old) = b.replace(pb)
        {
            old.finish_and_clear();
        }
    }
    fn step(&self, what: &str) {
        self.with_bar(|pb| pb.set_message(what.to_string()));
    }
    fn tick(&self) {
        self.with_bar(|pb| pb.inc(1));
    }
    fn note(&self, msg: &str) {
        match self.bar.lock().ok().and_then(|b| b.clone()) {
            Some(pb) => pb.println(format!("ktune: {msg}")),
            None => eprintln!("ktune: {msg}"),
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

/// The tuner's progress on stderr: one bar per phase (indicatif), notes above it.
pub struct TuneProgress {
    bar: Mutex<Option<ProgressBar>>,
    start: std::time::Instant,
}

impl TuneProgress {
    pub fn new() -> TuneProgress {
        TuneProgress { bar: Mutex::new(None), start: std::time::Instant::now() }
    }
}

impl Default for TuneProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for TuneProgress {
    fn phase(&self, msg: &str, len: u64) {
        if let Ok(mut b) = self.bar.lock() {
            if let Some(old) = b.take() {
                old.finish_and_clear();
            }
            let pb = ProgressBar::new(len);
            pb.set_draw_target(ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] [{bar:30}] {pos}/{len} {msg}") {
                pb.set_style(style.progress_chars("=> "));
            }
            pb.set_message(msg.to_string());
            // Without a terminal the bar is hidden: log the phase with its start time.
            if pb.is_hidden() {
                eprintln!("ktune: [{:7.1} s] {msg}", self.start.elapsed().as_secs_f64());
            }
            *b = Some(pb);
        }
    }
    fn tick(&self) {
        if let Ok(b) = self.bar.lock()
            && let Some(pb) = b.as_ref()
        {
            pb.inc(1);
        }
    }
    fn note(&self, msg: &str) {
        match self.bar.lock().ok().and_then(|b| b.clone()) {
            Some(pb) => pb.println(format!("ktune: {msg}")),
            None => eprintln!("ktune: {msg}"),
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
