//! Lexical forms of the simple XSD types on the wire other than time: `xs:unsignedLong` and
//! `xs:boolean`. Lenient on input (surrounding whitespace, a leading `+`), exact on output.
//! And `excerpt`: how any wire value is quoted in a reason. A leaf of `wsr/`.

/// Trims XML whitespace (space, tab, CR, LF) only: other Unicode spaces are content.
pub fn xml_trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

/// Whether a character may appear in an XML 1.0 document (the `Char` production).
pub fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// The start of a wire value for a defect's reason: at most 64 characters, so that a hostile
/// value cannot make the reason (and the SOAP Fault or log line carrying it) large, with
/// control and non-XML characters replaced so the fault we write stays well-formed.
pub fn excerpt(s: &str) -> std::borrow::Cow<'_, str> {
    let cut = match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    };
    let clean = |c: char| !c.is_control() && is_xml_char(c);
    if cut.chars().all(clean) {
        std::borrow::Cow::Borrowed(cut)
    } else {
        cut.chars()
            .map(|c| if clean(c) { c } else { '\u{FFFD}' })
            .collect()
    }
}

/// Parses an `xs:unsignedLong` over the full `u64` range. Leading zeros are valid.
pub fn parse_unsigned_long(raw: &str) -> Result<u64, String> {
    let s = xml_trim(raw);
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{}' is not an xs:unsignedLong", excerpt(raw)));
    }
    digits.parse::<u64>().map_err(|_| {
        format!(
            "'{}' is above the xs:unsignedLong maximum 18446744073709551615",
            excerpt(raw)
        )
    })
}

/// Parses an `xs:boolean`: `true`, `false`, `1`, `0`.
pub fn parse_boolean(raw: &str) -> Option<bool> {
    match xml_trim(raw) {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

/// Whether a value is a legal `xs:anyURI` as validators check it: an RFC 3986 URI reference
/// once the characters URIs cannot hold (spaces, non-ASCII, ...) are %-escaped. What we accept
/// as an identifier we must be able to echo back in a schema-valid acknowledgment.
pub fn check_any_uri(value: &str) -> Result<(), &'static str> {
    if value.chars().any(|c| c.is_control() || !is_xml_char(c)) {
        return Err("contains control or non-XML characters");
    }
    let bytes = value.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        {
            return Err("'%' must start a two-digit hex escape");
        }
    }
    let no_brackets = |part: &str| !part.contains(['[', ']']);
    let (rest, fragment) = value.split_once('#').unwrap_or((value, ""));
    if fragment.contains('#') {
        return Err("more than one '#'");
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    if !no_brackets(fragment) || !no_brackets(query) {
        return Err("'[' or ']' in the query or fragment");
    }
    let rest = match rest.find(':') {
        Some(colon) if !rest[..colon].contains('/') => {
            let mut scheme = rest[..colon].chars();
            let valid = scheme.next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
            if !valid {
                return Err("the part before ':' is not a URI scheme");
            }
            &rest[colon + 1..]
        }
        _ => rest,
    };
    let path = match rest.strip_prefix("//") {
        Some(hier) => {
            let (authority, path) = hier.find('/').map_or((hier, ""), |i| hier.split_at(i));
            check_authority(authority)?;
            path
        }
        None => rest,
    };
    if !no_brackets(path) {
        return Err("'[' or ']' in the path");
    }
    Ok(())
}

/// `[userinfo "@"] host [":" port]`, host a name or a bracketed IP literal.
fn check_authority(authority: &str) -> Result<(), &'static str> {
    let host_port = match authority.split_once('@') {
        Some((userinfo, host_port)) => {
            if userinfo.contains(['[', ']']) || host_port.contains('@') {
                return Err("the authority holds more than one '@' or a bracket in its user part");
            }
            host_port
        }
        None => authority,
    };
    // `None`: no port; `Some(p)`: a ':' was there, and validators want digits after it.
    let port = if let Some(literal) = host_port.strip_prefix('[') {
        let (inside, after) = literal.split_once(']').ok_or("unclosed '[' in the host")?;
        if inside.is_empty() || inside.contains('[') {
            return Err("malformed IP literal host");
        }
        match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err("text after the IP literal host"),
        }
    } else {
        let (host, port) = match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        };
        if host.contains([']', '[']) {
            return Err("'[' or ']' in the host");
        }
        port
    };
    // Validators read the port as a 32-bit signed number.
    if port.is_some_and(|p| p.parse::<u32>().map_or(true, |n| n > i32::MAX as u32)) {
        return Err("the port is not a number up to 2147483647");
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
        for bad in [
            "",
            "-1",
            "18446744073709551616",
            "abc",
            "1.0",
            "+",
            "1 2",
            "\u{2003}5",
        ] {
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
        for bad in [
            "a%zz",
            "a%2",
            "a#f#g",
            "a[b]",
            ":a",
            "1x:y",
            "a\u{1}b",
            "mid://a@b@c",
            "http://h:80x/",
            "http://[::1/x",
            "mid://host:",
            "http://h:2147483648/",
            "a\u{FFFE}b",
        ] {
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
