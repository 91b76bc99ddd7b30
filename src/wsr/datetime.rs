//! `xs:dateTime` and `xs:duration`, the two time types on the WS-R wire.
//!
//! Input is accepted in every lexical form XSD allows (with or without a zone, any fraction
//! length, `24:00:00`); output is always UTC with `Z`. Duration arithmetic is calendar-correct:
//! years and months move the civil date (day pinned to the month's end), then days and the time
//! part are added as exact spans (XSD Part 2, appendix E).

use std::fmt::{self, Write as _};

use chrono::{
    DateTime, Datelike, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Timelike, Utc,
};

use super::lexical::{excerpt, xml_trim};

/// Whether a parsed dateTime carried a zone. Zone-less values are read as UTC (D12) and the
/// caller may want to log that, since a peer writing local time is an interop hazard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    Explicit,
    Absent,
}

/// Parses an `xs:dateTime` into a UTC instant.
pub fn parse_date_time(raw: &str) -> Result<(DateTime<Utc>, Zone), String> {
    let s = xml_trim(raw);
    let bad = |why: &str| format!("'{}' is not an xs:dateTime: {why}", excerpt(raw));
    let mut p = Lexer::new(s);

    let negative = p.eat(b'-');
    let year_digits = p.digits();
    if year_digits.len() < 4 || (year_digits.len() > 4 && year_digits.starts_with('0')) {
        return Err(bad(
            "the year needs four digits (more only without leading zeros)",
        ));
    }
    let year: i32 = year_digits.parse().map_err(|_| bad("year out of range"))?;
    // Year 0 does not exist in XSD 1.0, and years before 1 mean nothing on this wire; refusing
    // them also keeps every instant we accept writable again.
    if negative || year == 0 {
        return Err(bad("years before 0001 are not supported"));
    }
    let month = p
        .expect_sep(b'-')
        .and_then(|_| p.fixed2())
        .ok_or_else(|| bad("month"))?;
    let day = p
        .expect_sep(b'-')
        .and_then(|_| p.fixed2())
        .ok_or_else(|| bad("day"))?;
    let hour = p
        .expect_sep(b'T')
        .and_then(|_| p.fixed2())
        .ok_or_else(|| bad("hour"))?;
    let minute = p
        .expect_sep(b':')
        .and_then(|_| p.fixed2())
        .ok_or_else(|| bad("minute"))?;
    let second = p
        .expect_sep(b':')
        .and_then(|_| p.fixed2())
        .ok_or_else(|| bad("second"))?;
    let nanos = if p.eat(b'.') {
        let frac = p.digits();
        if frac.is_empty() {
            return Err(bad("empty fraction of a second"));
        }
        fraction_to_nanos(frac)
    } else {
        0
    };
    let offset_minutes: Option<i32> = if p.eat(b'Z') {
        Some(0)
    } else if let Some(sign) = p.eat_any(b"+-") {
        let hh = p.fixed2().ok_or_else(|| bad("zone hours"))?;
        let mm = p
            .expect_sep(b':')
            .and_then(|_| p.fixed2())
            .ok_or_else(|| bad("zone minutes"))?;
        if mm > 59 || hh > 14 || (hh == 14 && mm != 0) {
            return Err(bad("zone offset out of range"));
        }
        let total = (hh * 60 + mm) as i32;
        Some(if sign == b'-' { -total } else { total })
    } else {
        None
    };
    if !p.at_end() {
        return Err(bad("unexpected trailing characters"));
    }

    let date = NaiveDate::from_ymd_opt(year, month, day).ok_or_else(|| bad("no such date"))?;
    // 24:00:00 is the first instant of the next day; any other hour 24 is invalid.
    let (time, carry_day) = if hour == 24 {
        if minute != 0 || second != 0 || nanos != 0 {
            return Err(bad("hour 24 is only allowed as 24:00:00"));
        }
        (NaiveTime::MIN, true)
    } else {
        let t = NaiveTime::from_hms_nano_opt(hour, minute, second, nanos)
            .filter(|_| second < 60)
            .ok_or_else(|| bad("time out of range"))?;
        (t, false)
    };
    let mut local = NaiveDateTime::new(date, time);
    if carry_day {
        local = local
            .checked_add_signed(TimeDelta::days(1))
            .ok_or_else(|| bad("out of range"))?;
    }
    let utc = local
        .checked_sub_signed(TimeDelta::minutes(offset_minutes.unwrap_or(0).into()))
        .filter(|t| t.year() >= 1)
        .ok_or_else(|| bad("out of range"))?;
    let zone = if offset_minutes.is_some() {
        Zone::Explicit
    } else {
        Zone::Absent
    };
    Ok((utc.and_utc(), zone))
}

/// `t + span`, pinned to the last (or first) representable instant instead of overflowing.
/// Instants and spans come from the wire, the API and the config: arithmetic on them must
/// never panic (D13), and a deadline beyond the representable range is "never" anyway.
pub fn saturating_add(t: DateTime<Utc>, span: TimeDelta) -> DateTime<Utc> {
    t.checked_add_signed(span)
        .unwrap_or(if span < TimeDelta::zero() {
            DateTime::<Utc>::MIN_UTC
        } else {
            DateTime::<Utc>::MAX_UTC
        })
}

/// `t - span`, saturating like `saturating_add`.
pub fn saturating_sub(t: DateTime<Utc>, span: TimeDelta) -> DateTime<Utc> {
    t.checked_sub_signed(span)
        .unwrap_or(if span < TimeDelta::zero() {
            DateTime::<Utc>::MAX_UTC
        } else {
            DateTime::<Utc>::MIN_UTC
        })
}

/// `t + wait` for a `std` duration (retry waits, intervals), saturating.
pub fn saturating_add_std(t: DateTime<Utc>, wait: std::time::Duration) -> DateTime<Utc> {
    saturating_add(t, TimeDelta::from_std(wait).unwrap_or(TimeDelta::MAX))
}

/// An instant as `xs:dateTime` text (see `format_date_time`).
pub fn date_time_string(t: &DateTime<Utc>) -> String {
    let mut out = String::with_capacity(24);
    format_date_time(t, &mut out);
    out
}

/// Writes an instant as `xs:dateTime` in UTC with `Z`, with as many fraction digits as needed.
/// Digits are pushed directly rather than through `write!`: two of these are written for
/// every message a fetch hands out, and `core::fmt` made them a tenth of the fetch's cost.
pub fn format_date_time(t: &DateTime<Utc>, out: &mut String) {
    // The fields of the naive UTC value: each of `DateTime`'s own accessors converts to local
    // time (a no-op for UTC, but not free) again.
    let (date, time) = (t.date_naive(), t.time());
    let year = date.year();
    if year < 0 {
        out.push('-');
    }
    push_decimal(out, year.unsigned_abs(), 4);
    let fields = [
        ('-', date.month()),
        ('-', date.day()),
        ('T', time.hour()),
        (':', time.minute()),
        (':', time.second()),
    ];
    for (separator, value) in fields {
        out.push(separator);
        push_decimal(out, value, 2);
    }
    push_fraction(t.timestamp_subsec_nanos(), out);
    out.push('Z');
}

/// Appends `value` in decimal, zero-padded to at least `width` digits (at most 10), without
/// `core::fmt`: the digit writer of the gateway's per-message text (xs:dateTime fields, log
/// lines' time, IPv4 sources).
pub fn push_decimal(out: &mut String, value: u32, width: usize) {
    // Only as many divisions as there are digits: most fields are two.
    let mut digits = [b'0'; 10];
    let mut first = digits.len();
    let mut rest = value;
    while rest > 0 || first > digits.len() - width.clamp(1, digits.len()) {
        first -= 1;
        digits[first] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    for d in &digits[first..] {
        out.push(char::from(*d));
    }
}

/// Nanoseconds as `.` and up to nine fraction digits, trailing zeros left out; nothing for 0.
fn push_fraction(nanos: u32, out: &mut String) {
    if nanos == 0 {
        return;
    }
    let (mut kept, mut width) = (nanos, 9);
    while kept % 10 == 0 {
        kept /= 10;
        width -= 1;
    }
    out.push('.');
    push_decimal(out, kept, width);
}

/// Up to nine digits are kept (nanoseconds); further digits cannot be represented and are cut.
fn fraction_to_nanos(frac: &str) -> u32 {
    let mut nanos = 0u32;
    for (i, b) in frac.bytes().take(9).enumerate() {
        nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
    }
    nanos
}

/// An `xs:duration` with every field as written, so that what is read is what gets written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct XsDuration {
    pub negative: bool,
    pub years: u32,
    pub months: u32,
    pub days: u32,
    pub hours: u32,
    pub minutes: u32,
    pub seconds: u32,
    pub nanos: u32,
}

impl XsDuration {
    /// Parses `[-]PnYnMnDTnHnMnS` (fractional seconds allowed; at least one field; `T` only
    /// with a time field after it).
    pub fn parse(raw: &str) -> Result<XsDuration, String> {
        let s = xml_trim(raw);
        let bad = |why: &str| format!("'{}' is not an xs:duration: {why}", excerpt(raw));
        let mut p = Lexer::new(s);
        let mut d = XsDuration {
            negative: p.eat(b'-'),
            ..XsDuration::default()
        };
        if !p.eat(b'P') {
            return Err(bad("it must start with P"));
        }
        let mut any = false;
        let mut in_time = false;
        // Designators must appear in this order; `rank` enforces it.
        let mut rank = 0;
        while !p.at_end() {
            if p.eat(b'T') {
                if in_time {
                    return Err(bad("T twice"));
                }
                in_time = true;
                rank = 3;
                if p.at_end() {
                    return Err(bad("T without a time field"));
                }
                continue;
            }
            let digits = p.digits();
            if digits.is_empty() {
                return Err(bad("expected a number"));
            }
            let value: u32 = digits.parse().map_err(|_| bad("field too large"))?;
            let mut nanos = 0;
            if p.eat(b'.') {
                let frac = p.digits();
                if frac.is_empty() {
                    return Err(bad("empty fraction"));
                }
                nanos = fraction_to_nanos(frac);
                if p.peek() != Some(b'S') {
                    return Err(bad("only seconds may have a fraction"));
                }
            }
            let designator = p.next().ok_or_else(|| bad("missing designator"))?;
            let (slot, new_rank) = match (in_time, designator) {
                (false, b'Y') => (&mut d.years, 1),
                (false, b'M') => (&mut d.months, 2),
                (false, b'D') => (&mut d.days, 3),
                (true, b'H') => (&mut d.hours, 4),
                (true, b'M') => (&mut d.minutes, 5),
                (true, b'S') => (&mut d.seconds, 6),
                _ => return Err(bad("unexpected designator")),
            };
            if new_rank <= rank {
                return Err(bad("fields out of order or repeated"));
            }
            rank = new_rank;
            *slot = value;
            if designator == b'S' {
                d.nanos = nanos;
            }
            any = true;
        }
        if !any {
            return Err(bad("no field"));
        }
        Ok(d)
    }

    /// Adds this duration to an instant, calendar-correct. `None` when out of range.
    pub fn add_to(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let months = u64::from(self.years) * 12 + u64::from(self.months);
        let months = Months::new(u32::try_from(months).ok()?);
        let span = TimeDelta::try_days(i64::from(self.days))?
            .checked_add(&TimeDelta::try_hours(i64::from(self.hours))?)?
            .checked_add(&TimeDelta::try_minutes(i64::from(self.minutes))?)?
            .checked_add(&TimeDelta::try_seconds(i64::from(self.seconds))?)?
            .checked_add(&TimeDelta::nanoseconds(i64::from(self.nanos)))?;
        if self.negative {
            t.checked_sub_months(months)?.checked_sub_signed(span)
        } else {
            t.checked_add_months(months)?.checked_add_signed(span)
        }
    }

    pub fn is_zero(&self) -> bool {
        let XsDuration {
            negative: _,
            years,
            months,
            days,
            hours,
            minutes,
            seconds,
            nanos,
        } = *self;
        [years, months, days, hours, minutes, seconds, nanos]
            .iter()
            .all(|v| *v == 0)
    }
}

impl fmt::Display for XsDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::with_capacity(16);
        if self.negative {
            out.push('-');
        }
        out.push('P');
        for (v, d) in [(self.years, 'Y'), (self.months, 'M'), (self.days, 'D')] {
            if v != 0 {
                let _ = write!(out, "{v}{d}");
            }
        }
        let has_time = self.hours != 0 || self.minutes != 0 || self.seconds != 0 || self.nanos != 0;
        if has_time || self.is_zero() {
            out.push('T');
            for (v, d) in [(self.hours, 'H'), (self.minutes, 'M')] {
                if v != 0 {
                    let _ = write!(out, "{v}{d}");
                }
            }
            if self.seconds != 0 || self.nanos != 0 || self.is_zero() {
                let _ = write!(out, "{}", self.seconds);
                push_fraction(self.nanos, &mut out);
                out.push('S');
            }
        }
        f.write_str(&out)
    }
}

/// A byte cursor over ASCII lexical forms.
struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a str) -> Self {
        Lexer { s, pos: 0 }
    }
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }
    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }
    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn eat_any(&mut self, set: &[u8]) -> Option<u8> {
        let b = self.peek().filter(|b| set.contains(b))?;
        self.pos += 1;
        Some(b)
    }
    fn expect_sep(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }
    fn digits(&mut self) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        &self.s[start..self.pos]
    }
    fn fixed2(&mut self) -> Option<u32> {
        let bytes = self.s.as_bytes().get(self.pos..self.pos + 2)?;
        if !bytes.iter().all(u8::is_ascii_digit) {
            return None;
        }
        self.pos += 2;
        Some(u32::from(bytes[0] - b'0') * 10 + u32::from(bytes[1] - b'0'))
    }
    fn at_end(&self) -> bool {
        self.pos == self.s.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .single()
            .expect("valid test date")
    }

    #[test]
    fn date_time_forms() {
        let z = parse_date_time("2025-03-01T12:00:00Z").expect("Z");
        assert_eq!(z, (utc(2025, 3, 1, 12, 0, 0), Zone::Explicit));
        let zoneless = parse_date_time("2026-12-28T19:44:33").expect("no zone");
        assert_eq!(zoneless, (utc(2026, 12, 28, 19, 44, 33), Zone::Absent));
        let off = parse_date_time("2025-03-01T14:30:00+02:30").expect("offset");
        assert_eq!(off.0, utc(2025, 3, 1, 12, 0, 0));
        let midnight = parse_date_time("2024-12-31T24:00:00Z").expect("24:00");
        assert_eq!(midnight.0, utc(2025, 1, 1, 0, 0, 0));
        let frac = parse_date_time("2025-03-01T12:00:00.123456789123Z").expect("long fraction");
        assert_eq!(frac.0.timestamp_subsec_nanos(), 123_456_789);
    }

    #[test]
    fn date_time_rejects() {
        for bad in [
            "",
            "2025-02-30T00:00:00Z",
            "2025-3-01T00:00:00Z",
            "2025-03-01 12:00:00Z",
            "2025-03-01T12:00Z",
            "2025-03-01T12:00:60Z",
            "2025-03-01T24:00:01Z",
            "2025-03-01T12:00:00+15:00",
            "2025-03-01T12:00:00.Z",
            "02025-03-01T12:00:00Z",
            "2025-03-01T12:00:00Zjunk",
            "tomorrow",
            "0000-01-01T00:00:00Z",
            "-0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+01:00",
        ] {
            assert!(parse_date_time(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn date_time_writes_utc_z() {
        let mut s = String::new();
        format_date_time(&utc(2025, 3, 1, 12, 0, 0), &mut s);
        assert_eq!(s, "2025-03-01T12:00:00Z");
        let mut s = String::new();
        let t = utc(2025, 3, 1, 12, 0, 0) + TimeDelta::milliseconds(250);
        format_date_time(&t, &mut s);
        assert_eq!(s, "2025-03-01T12:00:00.25Z");
    }

    #[test]
    fn duration_fields_and_calendar_addition() {
        let d = XsDuration::parse("P1Y2M3DT4H5M6.5S").expect("full duration");
        assert_eq!(
            (
                d.years, d.months, d.days, d.hours, d.minutes, d.seconds, d.nanos
            ),
            (1, 2, 3, 4, 5, 6, 500_000_000)
        );
        assert_eq!(d.to_string(), "P1Y2M3DT4H5M6.5S");
        // One month after 31 January is the end of February (day pinned), not 3 March.
        let one_month = XsDuration::parse("P1M").expect("P1M");
        assert_eq!(
            one_month.add_to(utc(2024, 1, 31, 0, 0, 0)),
            Some(utc(2024, 2, 29, 0, 0, 0))
        );
        assert_eq!(
            one_month.add_to(utc(2025, 1, 31, 0, 0, 0)),
            Some(utc(2025, 2, 28, 0, 0, 0))
        );
        let neg = XsDuration::parse("-PT30M").expect("negative");
        assert!(neg.negative);
        assert_eq!(
            neg.add_to(utc(2025, 1, 1, 0, 0, 0)),
            Some(utc(2024, 12, 31, 23, 30, 0))
        );
        assert_eq!(XsDuration::parse("PT0S").expect("zero").to_string(), "PT0S");
    }

    #[test]
    fn duration_rejects() {
        for bad in [
            "",
            "P",
            "PT",
            "1D",
            "P1H",
            "PT1D",
            "P1M1Y",
            "P1.5D",
            "P-1D",
            "PT1.S",
            "P99999999999D",
            "P1DT",
        ] {
            assert!(XsDuration::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn formatting_matches_chrono_for_every_width_and_fraction() {
        let cases = [
            (1, 1, 1, 0, 0, 0, 0),
            (999, 12, 31, 23, 59, 59, 1),
            (2026, 12, 6, 8, 5, 9, 120_000_000),
            (2026, 2, 28, 13, 7, 0, 999_999_999),
            (10_000, 7, 4, 1, 2, 3, 500),
            (-44, 3, 15, 12, 0, 0, 0),
        ];
        for (y, mo, d, h, mi, s, nanos) in cases {
            let t = Utc
                .with_ymd_and_hms(y, mo, d, h, mi, s)
                .single()
                .expect("valid")
                + chrono::Duration::nanoseconds(nanos);
            let mut ours = String::new();
            format_date_time(&t, &mut ours);
            let fraction = format!("{:09}", t.timestamp_subsec_nanos());
            let fraction = fraction.trim_end_matches('0');
            let expected = format!(
                "{}{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}{}Z",
                if y < 0 { "-" } else { "" },
                y.unsigned_abs(),
                mo,
                d,
                h,
                mi,
                s,
                if fraction.is_empty() { "" } else { "." },
                fraction
            );
            assert_eq!(ours, expected);
            // Our reader takes years from 1 on (no year 0 or before in a message).
            if y > 0 {
                assert_eq!(
                    parse_date_time(&ours).ok().map(|(read, _)| read),
                    Some(t),
                    "{ours} reads back"
                );
            }
        }
    }
}
