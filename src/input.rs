//! Files a user names (flags, profiles, bundles): what a path must be before it
//! is read, and reading one whole with a size limit. A directory, a device, a
//! pipe or a socket is refused saying which it is (a device such as `/dev/zero`
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
    if meta.is_file() {
        return Ok(meta.len());
    }
    let what = if meta.is_dir() { "a directory" } else { "a device, pipe or socket" };
    Err(Error::new(ErrorKind::InvalidInput, format!("{what}, not a regular file")))
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
