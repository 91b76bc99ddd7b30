//! Lexical forms of the simple XSD types on the wire other than time: `xs:unsignedLong` and
//! `xs:boolean`. Lenient on input (surrounding whitespace, a leading `+`), exact on output.

/// Parses an `xs:unsignedLong` over the full `u64` range. Leading zeros are valid.
pub fn parse_unsigned_long(raw: &str) -> Result<u64, String> {
    let s = raw.trim();
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "'{}' is not an xs:unsignedLong",
            super::datetime::truncate(raw)
        ));
    }
    digits.parse::<u64>().map_err(|_| {
        format!(
            "'{}' is above the xs:unsignedLong maximum 18446744073709551615",
            super::datetime::truncate(raw)
        )
    })
}

/// Parses an `xs:boolean`: `true`, `false`, `1`, `0`.
pub fn parse_boolean(raw: &str) -> Option<bool> {
    match raw.trim() {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

/// Whether a value is a legal `xs:anyURI` as validators check it: a URI reference once the
/// characters URIs cannot hold (spaces, non-ASCII, ...) are %-escaped. What we accept as an
/// identifier we must be able to echo back in a schema-valid acknowledgment.
pub fn check_any_uri(value: &str) -> Result<(), &'static str> {
    if value.chars().any(char::is_control) {
        return Err("contains control characters");
    }
    let bytes = value.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' {
            let hex = bytes.get(i + 1..i + 3);
            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                return Err("'%' must start a two-digit hex escape");
            }
        }
    }
    if value.matches('#').count() > 1 {
        return Err("more than one '#'");
    }
    let before_path = value
        .find(['/', '?', '#'])
        .map_or(value, |end| &value[..end]);
    if let Some(colon) = before_path.find(':') {
        let scheme = &before_path[..colon];
        let mut chars = scheme.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !valid {
            return Err("the part before ':' is not a URI scheme");
        }
    }
    // Brackets are only legal around an IP literal host (`//[::1]`).
    let brackets_ok = match value.find('[') {
        None => !value.contains(']'),
        Some(open) => {
            value[..open].ends_with("//")
                && value[open..].find(']').is_some()
                && value[open + 1..].find(['[']).is_none()
                && value.matches(']').count() == 1
        }
    };
    if !brackets_ok {
        return Err("'[' and ']' are only allowed around an IP literal host");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_long_full_range() {
        assert_eq!(parse_unsigned_long("0"), Ok(0));
        assert_eq!(parse_unsigned_long("007"), Ok(7));
        assert_eq!(parse_unsigned_long(" +42 "), Ok(42));
        assert_eq!(parse_unsigned_long("18446744073709551615"), Ok(u64::MAX));
        for bad in ["", "-1", "18446744073709551616", "abc", "1.0", "+", "1 2"] {
            assert!(parse_unsigned_long(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn any_uri_as_validators_see_it() {
        for ok in [
            "mid:a@b",
            "mid://123@vm",
            "a b",
            "%41",
            "http://[::1]:8/x",
            "urn:x#frag",
            "é",
            "a|b",
        ] {
            assert_eq!(check_any_uri(ok), Ok(()), "{ok}");
        }
        for bad in ["a%zz", "a%2", "a#f#g", "a[b]", ":a", "1x:y", "a\u{1}b"] {
            assert!(check_any_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn booleans() {
        assert_eq!(parse_boolean("true"), Some(true));
        assert_eq!(parse_boolean("1"), Some(true));
        assert_eq!(parse_boolean(" false "), Some(false));
        assert_eq!(parse_boolean("0"), Some(false));
        assert_eq!(parse_boolean("TRUE"), None);
        assert_eq!(parse_boolean("yes"), None);
    }
}
