//! Atomic file writes: a temporary file in the target's directory, renamed over the
//! target, so a reader never sees half a file and a failed write leaves the old one.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically, creating the directory when needed. The
/// file gets the permissions a plain create would (0666 less the umask on Unix).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = temp_beside(path)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A temporary file in `path`'s directory (created when needed) that
/// `persist(path)` renames over it, with the permissions a plain create would
/// give: for a file written in pieces (a large one, streamed).
pub fn temp_beside(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
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
    builder.tempfile_in(dir)
}

/// What to do about a failed write, from its cause, to follow the error in a
/// message: a full disk (or a file-size or quota limit) or a place that cannot
/// be written; empty for other causes. A write through [`write_atomic`] leaves
/// the file it was to replace as it was, and the hint says so.
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
}
