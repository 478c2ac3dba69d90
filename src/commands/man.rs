//! `ktune man [-o DIR]`: the man page (roff, section 1) from the clap definitions
//! ([`crate::cli`]): the main page on stdout, or with `-o DIR` `ktune.1` and one
//! page per subcommand (`ktune-tune.1`, `ktune-profiles-list.1`, ...), each written
//! as a file the user named ([`crate::atomic::write_output`]). The directory
//! itself is created when missing, its parent never.

use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::report::GeneratedReport;
use crate::{Error, Result};

pub fn run(dir: Option<&Path>) -> Result<GeneratedReport> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = dir else {
        return Ok(GeneratedReport::Text(page(cmd)?.1));
    };
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Usage(format!("-o `{}` is not a directory; give the directory to write the man pages into", dir.display())));
    }
    let mut pages = Vec::new();
    collect(cmd, &mut pages)?;
    // The directory named, not its parents: a missing parent is refused by the
    // first page's write, naming it.
    if !dir.exists() && dir.parent().is_none_or(|p| p.as_os_str().is_empty() || p.is_dir()) {
        std::fs::create_dir(dir)
            .map_err(|e| Error::Usage(format!("cannot create -o {}: {e}{}", dir.display(), crate::atomic::write_hint(&e))))?;
    }
    let mut written = Vec::new();
    for (name, text) in pages {
        let path = dir.join(name);
        crate::atomic::write_output(&path, &[], text.as_bytes())?;
        written.push(path);
    }
    Ok(GeneratedReport::Files(written))
}

/// The page of `cmd` and of each of its visible subcommands, depth first.
fn collect(cmd: clap::Command, out: &mut Vec<(String, String)>) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
        collect(sub, out)?;
    }
    out.push(page(cmd)?);
    Ok(())
}

/// (file name, roff text) of one command's page.
fn page(cmd: clap::Command) -> Result<(String, String)> {
    let man = clap_mangen::Man::new(cmd);
    let mut buf = Vec::new();
    man.render(&mut buf)?;
    let text = String::from_utf8(buf).map_err(|e| Error::Io(std::io::Error::other(e)))?;
    Ok((man.get_filename(), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_subcommand_in_a_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let GeneratedReport::Files(files) = run(Some(dir.path())).expect("pages") else { panic!("files expected") };
        let names: Vec<String> = files.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        for want in ["ktune.1", "ktune-tune.1", "ktune-report.1", "ktune-profiles-list.1"] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
        let top = std::fs::read_to_string(dir.path().join("ktune.1")).expect("ktune.1");
        assert!(top.contains(".TH ktune") && top.contains("completions"), "{top}");
    }
}
