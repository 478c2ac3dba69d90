//! Files a user names (flags, profiles, bundles): what a path must be before it
//! is read, and reading one whole with a size limit. A directory, a device, a
//! pipe or a socket is refused saying which it is ([`FileKind`]) (a device such as `/dev/zero`
//! would otherwise be read without end), and a file larger than its kind allows
//! is refused before any of it is read. The errors are `io::Error`s whose text
//! names the problem without the path: the caller's message names the path.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// The size of `path` when it is a regular file (symbolic links followed), else
/// an error saying what it is.
pub fn regular_file(path: &Path) -> Result<u64, Error> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(Error::new(ErrorKind::NotFound, "no such file")),
        Err(e) => return Err(e),
    };
    match FileKind::of(&meta) {
        FileKind::File => Ok(meta.len()),
        other => Err(Error::new(ErrorKind::InvalidInput, format!("{}, not a regular file", other.name()))),
    }
}

/// What a path names (symbolic links followed), in the user's words: the one
/// description of it, for what is read ([`regular_file`]) and what is written
/// (`atomic`: a character device is written through, the rest refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
    Other,
}

impl FileKind {
    pub fn of(m: &std::fs::Metadata) -> FileKind {
        let t = m.file_type();
        if t.is_file() {
            return FileKind::File;
        }
        if t.is_dir() {
            return FileKind::Dir;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_char_device() {
                return FileKind::CharDevice;
            }
            if t.is_block_device() {
                return FileKind::BlockDevice;
            }
            if t.is_fifo() {
                return FileKind::Fifo;
            }
            if t.is_socket() {
                return FileKind::Socket;
            }
        }
        FileKind::Other
    }

    /// It, named in a message ("a directory").
    pub fn name(self) -> &'static str {
        match self {
            FileKind::File => "a regular file",
            FileKind::Dir => "a directory",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::Socket => "a socket",
            FileKind::Other => "not a regular file",
        }
    }
}

/// The bytes of the regular file `path`, refused when it holds more than `limit`
/// bytes (`what` names the kind of file in that message: "a profile").
pub fn read_limited(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, Error> {
    let len = regular_file(path)?;
    let too_big = |n: u64| Error::new(ErrorKind::InvalidData, format!("{n} bytes, more than the {limit} {what} may hold"));
    if len > limit {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grew since its size was read is still read only to the limit.
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_limited`] as UTF-8 text.
pub fn read_text_limited(path: &Path, limit: u64, what: &str) -> Result<String, Error> {
    String::from_utf8(read_limited(path, limit, what)?)
        .map_err(|e| Error::new(ErrorKind::InvalidData, format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to())))
}

#[cfg(test)]
mod tests {
    use super::{read_limited, regular_file};
    use std::path::Path;

    #[test]
    fn directories_devices_and_large_files_are_refused_saying_which() {
        let dir = tempfile::tempdir().expect("tmp");
        assert!(regular_file(dir.path()).expect_err("dir").to_string().contains("a directory"));
        assert!(regular_file(&dir.path().join("none")).expect_err("missing").to_string().contains("no such file"));
        if Path::new("/dev/zero").exists() {
            assert!(read_limited(Path::new("/dev/zero"), 10, "a profile").expect_err("device").to_string().contains("device"));
        }
        let f = dir.path().join("f");
        std::fs::write(&f, [7u8; 11]).expect("write");
        assert_eq!(read_limited(&f, 11, "x").expect("fits"), [7u8; 11]);
        let e = read_limited(&f, 10, "a profile").expect_err("too big").to_string();
        assert_eq!(e, "11 bytes, more than the 10 a profile may hold");
    }
}
