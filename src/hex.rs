//! Lowercase hex, the one spelling the gateway writes bytes in: receipts, session ids,
//! submit fingerprints, certificate and secret digests.

/// `bytes` as lowercase hex, two digits a byte.
pub fn lower_hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    push_lower_hex(&mut text, bytes);
    text
}

/// The digits of lowercase hex, by value.
pub const LOWER_HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `bytes` as lowercase hex to `text`.
pub fn push_lower_hex(text: &mut String, bytes: &[u8]) {
    text.reserve(bytes.len() * 2);
    for b in bytes {
        // Both digits are ASCII: pushed as `char`s they take the one-byte path.
        text.push(char::from(LOWER_HEX_DIGITS[usize::from(b >> 4)]));
        text.push(char::from(LOWER_HEX_DIGITS[usize::from(b & 0x0f)]));
    }
}

/// The bytes `text` spells in hex (either case), if it is hex of at most `max_bytes` bytes.
/// Digit by digit rather than `u8::from_str_radix` per pair (which also takes a sign, "+f"):
/// every settlement decodes its receipt.
pub fn from_hex(text: &str, max_bytes: usize) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) || text.len() > 2 * max_bytes {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// The value of one hex digit.
fn nibble(digit: u8) -> Option<u8> {
    // At most 15 for radix 16.
    char::from(digit).to_digit(16).map(|v| v as u8)
}

#[cfg(test)]
mod tests {
    use super::{from_hex, lower_hex};

    #[test]
    fn hex_reads_back_what_was_written_and_nothing_else() {
        assert_eq!(from_hex("000fa5ff", 4), Some(vec![0x00, 0x0f, 0xa5, 0xff]));
        assert_eq!(from_hex("A5", 1), Some(vec![0xa5]));
        assert_eq!(from_hex("000fa5ff", 3), None, "longer than allowed");
        assert_eq!(from_hex("abc", 4), None, "odd length");
        assert_eq!(from_hex("zz", 4), None);
        assert_eq!(from_hex("+1", 4), None, "a sign is not a digit");
        assert_eq!(from_hex("é", 4), None, "not ASCII");
    }

    #[test]
    fn every_byte_is_two_lowercase_digits() {
        assert_eq!(lower_hex(&[]), "");
        assert_eq!(lower_hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
