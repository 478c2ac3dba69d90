//! Shortening text for messages and tables: the one place that cuts a string
//! for display. Text from files (profiles, bundles, model metadata, cache file
//! names) can hold any character, so cuts are counted in characters, never at a
//! byte offset (cutting a multibyte character panics). `tests/it/hostile_cli.rs`
//! scans the display code for byte-offset cuts that bypass this module.

use std::borrow::Cow;

/// The first `chars` characters of `s` (all of it when shorter).
pub fn prefix(s: &str, chars: usize) -> &str {
    match s.char_indices().nth(chars) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// `s` when it has at most `chars` characters, else its first `chars` and `…`.
pub fn shorten(s: &str, chars: usize) -> Cow<'_, str> {
    let p = prefix(s, chars);
    if p.len() == s.len() { Cow::Borrowed(s) } else { Cow::Owned(format!("{p}…")) }
}

#[cfg(test)]
mod tests {
    use super::{prefix, shorten};

    #[test]
    fn cuts_count_characters_not_bytes() {
        assert_eq!(prefix("abcdef", 3), "abc");
        assert_eq!(prefix("ab", 8), "ab");
        // Each of these is 2 to 4 bytes: a byte-offset cut at 3 would split one.
        assert_eq!(prefix("ééééé", 3), "ééé");
        assert_eq!(prefix("🦀🦀🦀🦀", 2), "🦀🦀");
        assert_eq!(shorten("ñandú", 2), "ña…");
        assert_eq!(shorten("ñandú", 5), "ñandú");
        assert_eq!(shorten("", 0), "");
        assert_eq!(shorten("x", 0), "…");
    }
}
