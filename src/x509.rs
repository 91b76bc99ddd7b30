//! The one field of an X.509 certificate the gateway reads itself: its validity's `notAfter`,
//! for the expiry gauge (`wsr_tls_certificate_not_after_seconds`) and its alert. rustls checks
//! certificates but does not hand their fields out, and none of the allowed crates parses
//! X.509; the walk below reads only the fixed prefix of `tbsCertificate` (RFC 5280 §4.1) up to
//! `validity`, with every length checked against what is left.

use chrono::{DateTime, NaiveDate, Utc};

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xA0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element: (tag, contents, what follows it).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let bytes = usize::from(first & 0x7f);
        if bytes == 0 || bytes > 4 || rest.len() < bytes {
            return None;
        }
        let (len_bytes, rest) = rest.split_at(bytes);
        let len = len_bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

/// The element of `tag` at the start of `input`, and what follows it.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (found, contents, rest) = element(input)?;
    (found == tag).then_some((contents, rest))
}

/// The `notAfter` of a DER certificate; `None` when it is not one.
pub fn not_after(der: &[u8]) -> Option<DateTime<Utc>> {
    let (certificate, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(certificate, SEQUENCE)?;
    let tbs = match element(tbs)? {
        (VERSION, _, rest) => rest,
        _ => tbs,
    };
    let (_serial, rest) = expect(tbs, INTEGER)?;
    let (_signature, rest) = expect(rest, SEQUENCE)?;
    let (_issuer, rest) = expect(rest, SEQUENCE)?;
    let (validity, _) = expect(rest, SEQUENCE)?;
    let (_, _not_before, rest) = element(validity)?;
    let (tag, not_after, _) = element(rest)?;
    time(tag, not_after)
}

/// UTCTime `YYMMDDHHMMSSZ` (years 1950–2049, RFC 5280 §4.1.2.5.1) or GeneralizedTime
/// `YYYYMMDDHHMMSSZ`.
fn time(tag: u8, text: &[u8]) -> Option<DateTime<Utc>> {
    let text = std::str::from_utf8(text).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| digits.get(range)?.parse::<u32>().ok();
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = number(0..2)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (GENERALIZED_TIME, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let field = |i: usize| number(rest + 2 * i..rest + 2 * i + 2);
    let date = NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, field(0)?, field(1)?)?;
    let at = date.and_hms_opt(field(2)?, field(3)?, field(4)?)?;
    Some(at.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(not_after: (i32, u8, u8)) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).expect("params");
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn reads_not_after_in_utc_time_and_generalized_time() {
        let cert = certificate((2031, 7, 9));
        let expected = NaiveDate::from_ymd_opt(2031, 7, 9)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc());
        assert_eq!(not_after(&cert), expected);
        // From 2050 on, RFC 5280 says GeneralizedTime.
        let late = certificate((2061, 1, 2));
        assert_eq!(
            not_after(&late).map(|t| t.format("%Y-%m-%d").to_string()),
            Some("2061-01-02".to_owned())
        );
    }

    #[test]
    fn anything_else_is_none_without_panicking() {
        let cert = certificate((2031, 7, 9));
        for cut in 0..cert.len() {
            let _ = not_after(&cert[..cut]);
        }
        assert_eq!(not_after(b""), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(time(UTC_TIME, b"991332000000Z"), None, "month 13");
        assert_eq!(
            time(UTC_TIME, b"491231235959Z").map(|t| t.to_rfc3339()),
            Some("2049-12-31T23:59:59+00:00".to_owned())
        );
    }
}
