//! Every file ktune writes goes through here. A regular file is written whole or
//! not at all: a temporary file in the target's directory, renamed over the
//! target, so a reader never sees half a file and a failed write leaves the old
//! one. Nothing else is replaced: a directory, a FIFO, a socket or a block
//! device at the target is an error (the rename would put a regular file in its
//! place: `-o /dev/null` run as root once replaced the system's device).
//!
//! Two kinds of write:
//! - a file the user named (`-o`, `--save-logits`, `--dump-logits`, man pages,
//!   HTML reports: [`write_output`], [`OutputFile`] for one written in pieces):
//!   a character device there (`/dev/null`, `/dev/stdout` on a terminal) is
//!   written through, opened and written, never renamed over; a file that is one
//!   of the command's own inputs (the same device and inode, through symbolic
//!   links and hard links) is refused; a missing folder is an error naming it,
//!   never created; a symbolic link to a file is followed (the file it names is
//!   replaced, the link kept). The checks run again just before the rename.
//! - ktune's own files (the profile cache, the hub's refs: [`write_atomic`]),
//!   whose folders are created when missing.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::input::FileKind;

/// Why a file the user named was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Something there that a rename would destroy and a write cannot go through.
    #[error(
        "{}: {what}; ktune writes a regular file (replaced whole) or a character device such as /dev/null (written through) and replaces nothing else: give a file path",
        path.display()
    )]
    NotAFile { path: PathBuf, what: &'static str },
    /// The output is one of the command's own inputs.
    #[error(
        "{} is the same file as {flag} {}: writing it would replace what this command reads; write to another path",
        path.display(),
        input.display()
    )]
    SameAsInput { path: PathBuf, flag: String, input: PathBuf },
    /// The folder the file goes into does not exist (it is not created).
    #[error("{}: the folder {} {what}: create it first (mkdir -p {}) or write elsewhere", path.display(), dir.display(), dir.display())]
    NoFolder { path: PathBuf, dir: PathBuf, what: &'static str },
    #[error("cannot write {}: {source}{}", path.display(), write_hint(source))]
    Io { path: PathBuf, source: std::io::Error },
}

/// A command's inputs, by the flag that names each (`("--file", path)`): an
/// output may be none of them.
pub type Inputs<'a> = [(&'a str, &'a Path)];

/// How a checked output is written.
#[derive(Debug)]
enum Place {
    /// A regular file, or nothing yet: a temporary file renamed over `target`
    /// (the path with its symbolic links resolved).
    Replace { target: PathBuf },
    /// A character device, opened and written.
    Through,
}

/// What is at `path` for an output named by the user, and how to write it.
fn place(path: &Path, inputs: &Inputs<'_>) -> Result<Place, WriteError> {
    let io = |source| WriteError::Io { path: path.to_path_buf(), source };
    let not_a_file = |what| WriteError::NotAFile { path: path.to_path_buf(), what };
    match std::fs::metadata(path) {
        Ok(meta) => {
            match FileKind::of(&meta) {
                FileKind::CharDevice => return Ok(Place::Through),
                FileKind::File => {}
                other => return Err(not_a_file(other.name())),
            }
            for (flag, input) in inputs {
                if std::fs::metadata(input).is_ok_and(|m| same_file(&m, &meta)) {
                    return Err(WriteError::SameAsInput { path: path.to_path_buf(), flag: flag.to_string(), input: input.to_path_buf() });
                }
            }
            Ok(Place::Replace { target: std::fs::canonicalize(path).map_err(io)? })
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(not_a_file("a symbolic link to nothing"));
            }
            let dir = folder(path);
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => Ok(Place::Replace { target: path.to_path_buf() }),
                Ok(_) => Err(WriteError::NoFolder { path: path.to_path_buf(), dir: dir.to_path_buf(), what: "is not a folder" }),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    Err(WriteError::NoFolder { path: path.to_path_buf(), dir: dir.to_path_buf(), what: "does not exist" })
                }
                Err(e) => Err(io(e)),
            }
        }
        Err(e) => Err(io(e)),
    }
}

/// Checks that `path` can be written as an output of a command reading
/// `inputs`, before the work that produces it: what [`write_output`] and
/// [`OutputFile::create`] refuse, refused now.
pub fn check_output(path: &Path, inputs: &Inputs<'_>) -> Result<(), WriteError> {
    place(path, inputs).map(|_| ())
}

/// Writes `bytes` to the file the user named `path` (see the module's rules):
/// a regular file replaced whole, a character device written through.
pub fn write_output(path: &Path, inputs: &Inputs<'_>, bytes: &[u8]) -> Result<(), WriteError> {
    let mut out = OutputFile::create(path, inputs)?;
    out.write_all(bytes).map_err(|source| WriteError::Io { path: path.to_path_buf(), source })?;
    out.finish()
}

/// A file the user named, written in pieces ([`Write`]) and put in place by
/// [`OutputFile::finish`]; dropped unfinished, it leaves the target as it was
/// (a character device has had what was written).
pub struct OutputFile {
    path: PathBuf,
    inputs: Vec<(String, PathBuf)>,
    sink: Sink,
}

enum Sink {
    Temp { file: tempfile::NamedTempFile, target: PathBuf },
    Through(File),
}

impl OutputFile {
    /// Checks `path` ([`check_output`]) and starts writing it.
    pub fn create(path: &Path, inputs: &Inputs<'_>) -> Result<OutputFile, WriteError> {
        let io = |source| WriteError::Io { path: path.to_path_buf(), source };
        let sink = match place(path, inputs)? {
            Place::Replace { target } => Sink::Temp { file: temp_beside(&target).map_err(io)?, target },
            // No create, no truncate: a device is written as it is.
            Place::Through => Sink::Through(std::fs::OpenOptions::new().write(true).open(path).map_err(io)?),
        };
        let inputs = inputs.iter().map(|(f, p)| (f.to_string(), p.to_path_buf())).collect();
        Ok(OutputFile { path: path.to_path_buf(), inputs, sink })
    }

    /// The path the user named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Everything written: a temporary file is renamed over the target, after
    /// the target is checked again (something put there since the start is
    /// refused, and the temporary file removed).
    pub fn finish(self) -> Result<(), WriteError> {
        let io = |source| WriteError::Io { path: self.path.clone(), source };
        match self.sink {
            Sink::Through(mut f) => f.flush().map_err(io),
            Sink::Temp { mut file, target } => {
                file.flush().map_err(io)?;
                let inputs: Vec<(&str, &Path)> = self.inputs.iter().map(|(f, p)| (f.as_str(), p.as_path())).collect();
                if let Place::Through = place(&self.path, &inputs)? {
                    return Err(WriteError::NotAFile {
                        path: self.path.clone(),
                        what: "a character device put there while it was being written",
                    });
                }
                file.persist(&target).map_err(|e| io(e.error))?;
                Ok(())
            }
        }
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.sink {
            Sink::Temp { file, .. } => file.write(buf),
            Sink::Through(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.sink {
            Sink::Temp { file, .. } => file.flush(),
            Sink::Through(f) => f.flush(),
        }
    }
}

/// Writes `bytes` to `path`, one of ktune's own files (a cache entry),
/// atomically, creating the directory when needed. Something at `path` that is
/// not a regular file is left alone and the write refused
/// ([`ErrorKind::InvalidInput`]). The file gets the permissions a plain create
/// would (0666 less the umask on Unix).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let refused = |what: &str| {
        std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("{what}, not a regular file: ktune does not replace it; remove it or move the cache"),
        )
    };
    let check = || match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(refused(FileKind::of(&m).name())),
        _ => Ok(()),
    };
    check()?;
    let dir = folder(path);
    std::fs::create_dir_all(dir)?;
    let mut tmp = temp_beside(path)?;
    tmp.write_all(bytes)?;
    check()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The folder `path` goes into (`.` for a bare name).
fn folder(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// A temporary file in `path`'s (existing) directory that `persist(path)`
/// renames over it, with the permissions a plain create would give.
fn temp_beside(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut builder = tempfile::Builder::new();
    let prefix = format!(".{name}.");
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    let perms = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::Permissions::from_mode(0o666)
    };
    #[cfg(unix)]
    builder.permissions(perms);
    builder.tempfile_in(folder(path))
}

/// Whether two files' metadata (symbolic links followed) are of one file.
#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    false
}

/// What to do about a failed write, from its cause, to follow the error in a
/// message: a full disk (or a file-size or quota limit) or a place that cannot
/// be written; empty for other causes. A write through this module leaves the
/// file it was to replace as it was, and the hint says so.
pub fn write_hint(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind::{FileTooLarge, PermissionDenied, QuotaExceeded, ReadOnlyFilesystem, StorageFull};
    match e.kind() {
        StorageFull | FileTooLarge | QuotaExceeded => {
            " (the disk is full or a size limit was reached: free some space, or write elsewhere; KTUNE_CACHE_DIR moves the cache. The file there before, if any, is unchanged)"
        }
        ReadOnlyFilesystem | PermissionDenied => {
            " (that place cannot be written: make it writable, or write elsewhere; KTUNE_CACHE_DIR moves the cache. The file there before, if any, is unchanged)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sub").join("x.yaml");
        write_atomic(&p, b"one").expect("first write");
        write_atomic(&p, b"two").expect("second write");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "two");
        let left: Vec<_> = std::fs::read_dir(p.parent().expect("dir")).expect("ls").collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn a_cache_write_leaves_a_directory_in_its_place_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.yaml");
        std::fs::create_dir(&p).expect("mkdir");
        let e = write_atomic(&p, b"one").expect_err("a directory");
        assert!(e.to_string().contains("a directory, not a regular file"), "{e}");
        assert!(p.is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1, "no temporary left");
    }

    #[test]
    fn user_outputs_are_not_given_folders_nor_written_over_their_inputs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no").join("such").join("out.bin");
        let e = write_output(&missing, &[], b"x").expect_err("no folder").to_string();
        assert!(e.contains("the folder") && e.contains("does not exist") && e.contains("mkdir -p"), "{e}");
        assert!(!dir.path().join("no").exists(), "the folder is not created");
        let input = dir.path().join("in.txt");
        std::fs::write(&input, b"text").expect("write");
        let link = dir.path().join("link.txt");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&input, &link).expect("symlink");
        for out in [&input, &link] {
            let e = write_output(out, &[("--file", &input)], b"x").expect_err("an input").to_string();
            assert!(e.contains("the same file as --file"), "{e}");
        }
        assert_eq!(std::fs::read(&input).expect("read"), b"text");
        // Through a link to another file: that file is replaced, the link kept.
        let other = dir.path().join("other.txt");
        write_output(&link, &[("--file", &other)], b"new").expect("through the link");
        assert_eq!(std::fs::read(&input).expect("read"), b"new");
        assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
        let e = write_output(dir.path(), &[], b"x").expect_err("a directory").to_string();
        assert!(e.contains("a directory;"), "{e}");
    }
}
