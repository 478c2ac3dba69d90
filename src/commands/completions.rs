//! `ktune completions SHELL`: the shell's completion script, generated from the
//! clap definitions ([`crate::cli`]) so it never falls behind them.

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::report::GeneratedReport;
use crate::{Error, Result};

pub fn run(shell: Shell) -> Result<GeneratedReport> {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "ktune", &mut buf);
    let text = String::from_utf8(buf).map_err(|e| Error::Io(std::io::Error::other(e)))?;
    Ok(GeneratedReport::Text(text))
}
