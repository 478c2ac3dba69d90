//! All formatting: every command's [`Report`] as a human table (tabled), markdown
//! or JSON, warnings, the streamed text of `run`, and progress bars on stderr
//! (the [`crate::progress::Progress`] implementations). Commands build reports;
//! only this module turns them into text.

mod bench;
mod bench_kernels;
mod devices;
mod diff;
mod eval;
mod kernels;
mod profiles;
mod progress;
pub mod report_html;
mod run;
mod tune;

use std::io::Write;

use serde::Serialize;
use tabled::settings::Style;
use tabled::{Table, Tabled};

pub use progress::{Bars, TextStream};

use crate::Result;

/// How a report is rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Markdown,
    Json,
}

/// What a command returns: serializable (`--format json`) and renderable for a
/// person.
pub trait Report: Serialize {
    /// The human rendering (`--format table`).
    fn table(&self) -> String;
    /// Markdown (`--format markdown`); the table where a report has no other.
    fn markdown(&self) -> String {
        self.table()
    }
}

/// `report` in `format`.
pub fn render<R: Report + ?Sized>(report: &R, format: Format) -> Result<String> {
    Ok(match format {
        Format::Table => report.table(),
        Format::Markdown => report.markdown(),
        Format::Json => serde_json::to_string_pretty(report)?,
    })
}

/// Renders `report` in `format` and writes it to stdout.
pub fn emit<R: Report + ?Sized>(report: &R, format: Format) -> Result<()> {
    print(&render(report, format)?)
}

/// Writes rendered output to stdout.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// A warning on stderr.
pub fn warn(msg: &str) {
    // Never a panic over a stderr that cannot be written (a full disk).
    let _ = writeln!(std::io::stderr(), "ktune: warning: {msg}");
}

impl Report for crate::report::GeneratedReport {
    /// The generated text as it is (a completion script, a man page), or the files written.
    fn table(&self) -> String {
        match self {
            crate::report::GeneratedReport::Text(t) => t.clone(),
            crate::report::GeneratedReport::Files(files) => {
                files.iter().map(|f| format!("wrote {}", f.display())).collect::<Vec<_>>().join("\n")
            }
        }
    }
}

impl Report for crate::model::hub::Resolved {
    /// The path to give `--gguf` / `--model-dir`, then where it came from and its files.
    fn table(&self) -> String {
        let flag = if self.gguf { "--gguf" } else { "--model-dir" };
        let got = if self.downloaded > 0 { format!("downloaded {}", bytes(self.downloaded)) } else { "all from the cache".to_string() };
        let mut lines = vec![
            self.path.display().to_string(),
            format!(
                "repo:     {}@{} (commit {}), {got}; the same as {flag} {}",
                self.repo,
                self.revision,
                self.commit,
                self.path.display()
            ),
        ];
        lines.extend(self.files.iter().map(|f| format!("file:     {}", f.display())));
        lines.join("\n")
    }
}

impl Report for crate::report::SchemaReport {
    /// The schema is JSON whatever the format.
    fn table(&self) -> String {
        serde_json::to_string_pretty(&self.0).unwrap_or_default()
    }
}

/// `rows` as a table in tabled's sharp style, a header row first (every table of
/// rows of one `Tabled` struct).
fn sharp_table<T: Tabled>(rows: impl IntoIterator<Item = T>) -> String {
    Table::new(rows).with(Style::sharp()).to_string()
}

/// The first 12 characters of a fingerprint or key.
fn short(fp: &str) -> String {
    crate::text::prefix(fp, 12).to_string()
}

/// A byte count for people: GiB, MiB or KiB, `-` for none.
fn bytes(b: u64) -> String {
    if b == 0 {
        "-".into()
    } else if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", b / 1024)
    }
}
