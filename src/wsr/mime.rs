//! MIME multipart/related (SOAP with Attachments) packaging: finds the root part, which holds
//! the SOAP envelope. Peers such as Holodeck send every message this way, even without
//! attachments (D12).

use memchr::memmem;

/// The root part of a multipart/related body and how many other parts (attachments) came with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootPart<'a> {
    pub envelope: &'a [u8],
    pub attachments: usize,
}

/// Whether a `Content-Type` names a multipart/related body.
pub fn is_multipart(content_type: &str) -> bool {
    media_type(content_type).eq_ignore_ascii_case("multipart/related")
}

fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// A parameter of a `Content-Type` value (quotes removed), case-insensitive name. Parameters
/// without a value (`; action;`) are skipped rather than derailing the rest.
pub fn parameter<'c>(content_type: &'c str, name: &str) -> Option<&'c str> {
    let mut rest = content_type.split_once(';')?.1;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return None;
        }
        let key_end = rest.find(['=', ';']).unwrap_or(rest.len());
        let key = rest[..key_end].trim_matches([' ', '\t']);
        let Some(after) = rest[key_end..].strip_prefix('=') else {
            rest = &rest[key_end..];
            continue;
        };
        let after = after.trim_start_matches([' ', '\t']);
        let (value, remainder) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            },
            None => {
                let end = after.find(';').unwrap_or(after.len());
                (after[..end].trim_end_matches([' ', '\t']), &after[end..])
            }
        };
        if key.eq_ignore_ascii_case(name) {
            return Some(value);
        }
        rest = remainder;
    }
}

/// Finds the root part: the one whose Content-ID is the `start` parameter, else the first.
pub fn root_part<'a>(content_type: &str, body: &'a [u8]) -> Result<RootPart<'a>, String> {
    let boundary = parameter(content_type, "boundary")
        .filter(|b| !b.is_empty() && b.len() <= 200)
        .ok_or("multipart/related without a usable boundary parameter")?;
    let start = parameter(content_type, "start").map(strip_angles);
    let parts = split_parts(body, boundary)?;
    let root_index = match start {
        Some(id) => parts
            .iter()
            .position(|p| p.content_id.map(strip_angles) == Some(id))
            .ok_or_else(|| format!("no MIME part has the start Content-ID <{id}>"))?,
        None => 0,
    };
    let root = &parts[root_index];
    if let Some(enc) = root.transfer_encoding {
        let enc = enc.trim();
        if !["7bit", "8bit", "binary"]
            .iter()
            .any(|ok| enc.eq_ignore_ascii_case(ok))
        {
            return Err(format!(
                "the root MIME part uses Content-Transfer-Encoding '{enc}'; only 7bit, 8bit and binary are supported"
            ));
        }
    }
    if root
        .content_type
        .is_some_and(|ct| media_type(ct).eq_ignore_ascii_case("application/xop+xml"))
    {
        return Err(
            "MTOM/XOP packaging is not supported; send SOAP with Attachments or a plain envelope"
                .into(),
        );
    }
    Ok(RootPart {
        envelope: root.content,
        attachments: parts.len() - 1,
    })
}

fn strip_angles(id: &str) -> &str {
    let id = id.trim();
    id.strip_prefix('<')
        .and_then(|i| i.strip_suffix('>'))
        .unwrap_or(id)
}

struct Part<'a> {
    content_id: Option<&'a str>,
    content_type: Option<&'a str>,
    transfer_encoding: Option<&'a str>,
    content: &'a [u8],
}

fn split_parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let delimiter = format!("--{boundary}");
    let finder = memmem::Finder::new(delimiter.as_bytes());
    // The first delimiter may open the body or follow a preamble line.
    let first = finder
        .find(body)
        .filter(|&i| i == 0 || body[..i].ends_with(b"\n"))
        .ok_or("multipart body without its boundary")?;
    let mut parts = Vec::new();
    let mut pos = first + delimiter.len();
    loop {
        if body[pos..].starts_with(b"--") {
            break;
        }
        // Skip transport padding up to the end of the delimiter line.
        let line_end = memchr::memchr(b'\n', &body[pos..]).ok_or("truncated MIME part")?;
        let part_start = pos + line_end + 1;
        let next = find_delimiter(&finder, body, part_start)
            .ok_or("MIME part without a closing boundary")?;
        // The CRLF (or LF) before the delimiter belongs to the delimiter.
        let mut part_end = next;
        if body[..part_end].ends_with(b"\r\n") {
            part_end -= 2;
        } else if body[..part_end].ends_with(b"\n") {
            part_end -= 1;
        }
        parts.push(parse_part(&body[part_start..part_end.max(part_start)])?);
        pos = next + delimiter.len();
        if parts.len() > 1000 {
            return Err("too many MIME parts".into());
        }
    }
    if parts.is_empty() {
        return Err("multipart body without parts".into());
    }
    Ok(parts)
}

/// The next delimiter that starts a line.
fn find_delimiter(finder: &memmem::Finder<'_>, body: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let i = at + finder.find(&body[at..])?;
        if i == from || body[..i].ends_with(b"\n") {
            return Some(i);
        }
        at = i + 1;
    }
}

fn parse_part(raw: &[u8]) -> Result<Part<'_>, String> {
    let (head_len, sep_len) = match memmem::find(raw, b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => match memmem::find(raw, b"\n\n") {
            Some(i) => (i, 2),
            None if raw.starts_with(b"\r\n") => (0, 2),
            None => return Err("MIME part without a header section".into()),
        },
    };
    let head =
        std::str::from_utf8(&raw[..head_len]).map_err(|_| "MIME part headers are not UTF-8")?;
    let mut part = Part {
        content_id: None,
        content_type: None,
        transfer_encoding: None,
        content: &raw[head_len + sep_len..],
    };
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("content-id") {
            part.content_id = Some(value.trim());
        } else if name.eq_ignore_ascii_case("content-type") {
            part.content_type = Some(value.trim());
        } else if name.eq_ignore_ascii_case("content-transfer-encoding") {
            part.transfer_encoding = Some(value.trim());
        }
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters() {
        let ct = r#"multipart/related; boundary=MIMEBoundary_1; type="text/xml"; start="<0.urn:uuid:1@apache.org>""#;
        assert!(is_multipart(ct));
        assert_eq!(parameter(ct, "boundary"), Some("MIMEBoundary_1"));
        assert_eq!(parameter(ct, "type"), Some("text/xml"));
        assert_eq!(parameter(ct, "START"), Some("<0.urn:uuid:1@apache.org>"));
        assert_eq!(parameter(ct, "charset"), None);
        assert!(!is_multipart("text/xml; charset=UTF-8"));
        let valueless = r#"multipart/related; action; boundary=b1; start="<r;oot>"; x="#;
        assert_eq!(parameter(valueless, "boundary"), Some("b1"));
        assert_eq!(parameter(valueless, "start"), Some("<r;oot>"));
        assert_eq!(parameter(valueless, "x"), Some(""));
    }

    #[test]
    fn root_by_start_and_attachments_counted() {
        let ct = r#"multipart/related; boundary="b1"; start="<root>""#;
        let body = b"preamble\r\n--b1\r\nContent-ID: <att>\r\n\r\nATTACHMENT\r\n--b1\r\nContent-Type: text/xml\r\nContent-ID: <root>\r\n\r\n<e/>\r\n--b1--\r\n";
        let root = root_part(ct, body).expect("root part");
        assert_eq!(root.envelope, b"<e/>");
        assert_eq!(root.attachments, 1);
    }

    #[test]
    fn broken_packaging_is_refused() {
        let ct = "multipart/related; boundary=b1";
        assert!(root_part(ct, b"--b1\r\nContent-Type: text/xml\r\n\r\n<e/>").is_err());
        assert!(root_part(ct, b"no boundary here").is_err());
        assert!(root_part("multipart/related", b"--b1\r\n\r\n<e/>\r\n--b1--").is_err());
        let b64 = b"--b1\r\nContent-Transfer-Encoding: base64\r\n\r\nPGUvPg==\r\n--b1--";
        assert!(root_part(ct, b64).is_err());
    }
}
