//! The names a hub sends (and a cache on disk holds) as data, checked before any
//! of them becomes part of a path: blob ids and SHA-256s as lowercase hex of their
//! exact length, commit hashes as 40 hex digits, repository file names as
//! relative `/`-separated paths of ordinary components, revisions as git ref
//! names. Each check says why a name is refused, for the message that names it
//! (escaped: [`crate::text::escaped`]).

use crate::text::is_unprintable;

/// Longest repository file name accepted, in bytes (the hub's own limit is
/// far below; a component is at most 255, as on every common file system).
const MAX_FILE_NAME: usize = 1024;
const MAX_COMPONENT: usize = 255;
/// Longest revision accepted, in bytes.
const MAX_REVISION: usize = 256;

/// Whether `s` is exactly `len` lowercase hex digits.
pub fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `s` is a commit hash as the hub writes it (40 lowercase hex digits).
pub fn is_commit(s: &str) -> bool {
    is_hex(s, 40)
}

/// Why `name` cannot be a file of a repository's snapshot, if it cannot: it
/// must be relative, `/`-separated, with no empty, `.` or `..` component, and
/// hold no backslash, NUL, control or bidirectional-override character.
pub fn file_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is empty");
    }
    if name.len() > MAX_FILE_NAME {
        return Some("is longer than 1024 bytes");
    }
    if name.starts_with('/') {
        return Some("is an absolute path");
    }
    if name.contains('\\') {
        return Some("holds a backslash");
    }
    if name.chars().any(is_unprintable) {
        return Some("holds a control character");
    }
    for part in name.split('/') {
        match part {
            "" => return Some("has an empty path component"),
            "." | ".." => return Some("has a `.` or `..` path component"),
            p if p.len() > MAX_COMPONENT => return Some("has a path component longer than 255 bytes"),
            _ => {}
        }
    }
    None
}

/// Why `rev` cannot be a revision (a branch, tag or commit), if it cannot: git's
/// ref-name rules (`git check-ref-format`), which also keep it a relative path
/// of ordinary components under the cache's `refs/`.
pub fn revision_problem(rev: &str) -> Option<&'static str> {
    if rev.is_empty() {
        return Some("is empty");
    }
    if rev.len() > MAX_REVISION {
        return Some("is longer than 256 bytes");
    }
    if rev.chars().any(|c| is_unprintable(c) || c == ' ' || "~^:?*[\\".contains(c)) {
        return Some("holds a space, a control character or one of ~ ^ : ? * [ \\");
    }
    if rev.contains("..") || rev.contains("@{") || rev == "@" {
        return Some("holds `..` or `@{`");
    }
    if rev.ends_with('.') {
        return Some("ends with `.`");
    }
    for part in rev.split('/') {
        if part.is_empty() {
            return Some("has an empty path component (a leading, trailing or double `/`)");
        }
        if part.starts_with('.') || part.ends_with(".lock") {
            return Some("has a component that starts with `.` or ends with `.lock`");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_relative_paths_of_ordinary_components() {
        for ok in ["model.gguf", "Q4_K_M/m-00001-of-00002.gguf", "a b/ñ.json", ".gitattributes", "a..b"] {
            assert_eq!(file_name_problem(ok), None, "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "a\\b", "a\0b", "x\u{1b}[2J", "r\u{202e}fdp.gguf", ".."]
        {
            assert!(file_name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(file_name_problem(&"a".repeat(256)).is_some());
        assert!(file_name_problem(&["a"; 600].join("/")).is_some());
    }

    #[test]
    fn revisions_follow_git_ref_names() {
        for ok in ["main", "v1.0", "refs/pr/1", "release-2024_01", "0123456789abcdef0123456789abcdef01234567"] {
            assert_eq!(revision_problem(ok), None, "{ok}");
        }
        for bad in [
            "", "../../x", "a/../b", "/abs", "a/", "a//b", ".hidden", "a/.b", "x.lock", "a b", "a:b", "a~1", "a^", "a*", "a[", "@",
            "a@{1}", "a\\b", "end.", "x\u{1b}",
        ] {
            assert!(revision_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn hashes_are_lowercase_hex_of_their_length() {
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit("0123456789ABCDEF0123456789abcdef01234567"));
        assert!(!is_commit("0123456789abcdef0123456789abcdef0123456"));
        assert!(is_hex(&"a".repeat(64), 64));
        assert!(!is_hex("/etc/hostname", 13));
        assert!(!is_hex(&"g".repeat(64), 64));
    }
}
