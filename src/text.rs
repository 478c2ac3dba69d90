//! Shortening text for messages and tables: the one place that cuts a string
//! for display. Text from files (profiles, bundles, model metadata, cache file
//! names) can hold any character, so cuts are counted in characters, never at a
//! byte offset (cutting a multibyte character panics). `tests/it/hostile_cli.rs`
//! scans the display code for byte-offset cuts that bypass this module. Text
//! from the network (a hub's file names) is shown through [`escaped`], so a
//! terminal escape sequence in it is printed as text, never obeyed.

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

/// Whether `c` would act on a terminal rather than show: a control character
/// (C0, DEL, C1: escape sequences, carriage returns) or a bidirectional override
/// or isolate (text that displays in another order than it reads).
pub fn is_unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every [`is_unprintable`] character written as its Rust escape
/// (`\u{1b}`, `\n`), and at most `chars` characters of it (then `…`).
pub fn escaped(s: &str, chars: usize) -> Cow<'_, str> {
    let s = shorten(s, chars);
    if !s.chars().any(is_unprintable) {
        return s;
    }
    Cow::Owned(s.chars().map(|c| if is_unprintable(c) { c.escape_default().to_string() } else { c.to_string() }).collect())
}

#[cfg(test)]
mod tests {
    use super::{escaped, prefix, shorten};

    /// Each cut on inputs of 1- to 4-byte characters: the cuts count characters
    /// (a byte-offset cut at 3 would split `é` or `🦀`), and `escaped` shows
    /// terminal controls as text.
    #[test]
    fn cuts_count_characters_and_escape_controls() {
        let escaped: fn(&str, usize) -> String = |s, n| escaped(s, n).into_owned();
        let prefix: fn(&str, usize) -> String = |s, n| prefix(s, n).to_string();
        let shorten: fn(&str, usize) -> String = |s, n| shorten(s, n).into_owned();
        let cases = [
            (escaped, "model.gguf", 80, "model.gguf"),
            (escaped, "a\u{1b}]0;pwned\u{7}b", 80, "a\\u{1b}]0;pwned\\u{7}b"),
            (escaped, "x\ry\u{202e}z", 80, "x\\ry\\u{202e}z"),
            (escaped, "ñandú\u{1b}", 3, "ñan…"),
            (prefix, "abcdef", 3, "abc"),
            (prefix, "ééééé", 3, "ééé"),
            (prefix, "🦀🦀🦀🦀", 2, "🦀🦀"),
            (shorten, "ñandú", 2, "ña…"),
            (shorten, "ñandú", 6, "ñandú"),
            (shorten, "", 0, ""),
            (shorten, "x", 0, "…"),
        ];
        for (cut, input, n, want) in cases {
            assert_eq!(cut(input, n), want, "{input:?} cut to {n}");
        }
    }
}
