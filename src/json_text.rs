//! JSON string literals written a word at a time.
//!
//! A fetch's answer carries each payload as a JSON string, and serde_json's escaper looks up
//! every byte in a table: about a twentieth of a delivered message's instructions for a 1 KiB
//! payload. Here the runs of bytes that need no escape — nearly all of an XML payload — are
//! found eight bytes at a time (`wsr::word_scan`) and copied whole. The escapes are serde_json's
//! (`\"`, `\\`, the short forms, `\u00xx` for the other control characters), so the text is
//! the same, byte for byte, as `serde_json::to_string` writes it (the tests hold it to that).

use crate::hex::LOWER_HEX_DIGITS;
use crate::wsr::word_scan::{first_byte, some_byte_below, some_byte_is};

/// Appends `text` to `out` as a JSON string literal, quotes included.
pub fn push_json_string(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut clean_from = 0;
    while let Some(at) = next_to_escape(bytes, clean_from) {
        out.extend_from_slice(&bytes[clean_from..at]);
        push_escape(out, bytes[at]);
        clean_from = at + 1;
    }
    out.extend_from_slice(&bytes[clean_from..]);
    out.push(b'"');
}

/// A byte JSON does not allow in a string as it is: a control character, `"` or `\`.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Where the first byte at or after `from` that needs an escape is.
fn next_to_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let may_hold =
        |word| some_byte_below(word, 0x20) || some_byte_is(word, b'"') || some_byte_is(word, b'\\');
    first_byte(bytes.get(from..)?, may_hold, needs_escape).map(|at| from + at)
}

/// Appends the escape of one byte that `needs_escape`.
fn push_escape(out: &mut Vec<u8>, b: u8) {
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        0x0c => b'f',
        b'\n' => b'n',
        b'\r' => b'r',
        b'\t' => b't',
        _ => {
            let high = LOWER_HEX_DIGITS[usize::from(b >> 4)];
            let low = LOWER_HEX_DIGITS[usize::from(b & 0x0f)];
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', high, low]);
            return;
        }
    };
    out.extend_from_slice(&[b'\\', short]);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ours(text: &str) -> String {
        let mut out = Vec::new();
        push_json_string(&mut out, text);
        String::from_utf8(out).expect("UTF-8 in, UTF-8 out")
    }

    fn serdes(text: &str) -> String {
        serde_json::to_string(text).expect("a string serializes")
    }

    #[test]
    fn every_byte_that_needs_an_escape_is_escaped_as_serde_json_does_at_every_position() {
        let base = "<a b=\"c\">caf\u{e9} \u{20ac}\u{10348} x</a>".repeat(2);
        for at in 0..=base.len() {
            if !base.is_char_boundary(at) {
                continue;
            }
            for c in (0u8..0x20).chain([b'"', b'\\', 0x7f, b'/', b'\'']) {
                let mut text = base.clone();
                text.insert(at, char::from(c));
                assert_eq!(ours(&text), serdes(&text), "{c:#x} at {at}");
            }
        }
        assert_eq!(ours(""), "\"\"");
        assert_eq!(ours("\u{1}\u{1f}"), r#""\u0001\u001f""#);
    }

    proptest! {
        #[test]
        fn any_string_is_written_as_serde_json_writes_it(text in any::<String>()) {
            prop_assert_eq!(ours(&text), serdes(&text));
        }

        #[test]
        fn mostly_ascii_with_escapes_is_written_as_serde_json_writes_it(
            text in "[a-z<>=\"\\\\\t\n\u{0}-\u{1f}\u{e9}]{0,64}"
        ) {
            prop_assert_eq!(ours(&text), serdes(&text));
        }
    }
}
