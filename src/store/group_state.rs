//! The compact stored form of `rmp::GroupState` (the `groups.state_bin` column of both
//! backends): a versioned binary record of varints and length-prefixed strings, written and
//! read for every message, so it must be cheap. SQLite rows written before it carry JSON in
//! `groups.state` (`sqlite/group_json.rs`), read through `sqlite/group_state.rs`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::time::{from_millis, millis};
use crate::rmp::group::{Buffered, GroupParams, GroupState, GroupStatus};
use crate::rmp::ranges::RangeSet;
use crate::wsr::datetime::XsDuration;
use crate::wsr::{FaultCode, GroupId, GroupLimit, ReplyPattern, ReplyTo};

const VERSION: u8 = 1;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn signed(out: &mut Vec<u8>, v: i64) {
    varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn text(out: &mut Vec<u8>, s: &str) {
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn time(out: &mut Vec<u8>, t: &DateTime<Utc>) {
    signed(out, t.timestamp());
    varint(out, u64::from(t.timestamp_subsec_nanos()));
}

fn option<T>(out: &mut Vec<u8>, v: Option<T>, mut write: impl FnMut(&mut Vec<u8>, T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            write(out, v);
        }
    }
}

/// Appends the record of `state` to `out`.
pub fn encode(state: &GroupState, out: &mut Vec<u8>) {
    let p = &state.params;
    out.push(VERSION);
    text(out, state.group_id.as_str());
    text(out, &p.channel);
    out.push(
        u8::from(p.sequenced)
            | u8::from(p.ack_requested) << 1
            | u8::from(p.duplicate_elimination) << 2
            | u8::from(p.message_order) << 3,
    );
    match &p.limit {
        None => out.push(0),
        Some(GroupLimit::ExpiryTime(t)) => {
            out.push(1);
            time(out, t);
        }
        Some(GroupLimit::MaxIdleDuration(d)) => {
            out.push(2);
            text(out, &d.to_string());
        }
    }
    option(out, state.last, varint);
    let pairs = state.delivered.pairs();
    varint(out, pairs.len() as u64);
    for (a, b) in pairs {
        varint(out, *a);
        varint(out, *b);
    }
    varint(out, state.next_expected);
    varint(out, state.buffered.len() as u64);
    for (n, b) in &state.buffered {
        varint(out, *n);
        signed(out, millis(b.expiry));
        varint(out, b.bytes);
        match &b.reply {
            ReplyPattern::Response => out.push(0),
            ReplyPattern::Poll => out.push(1),
            ReplyPattern::Callback(to) => {
                out.push(2);
                text(out, &to.uri);
                option(out, to.reference_scheme.as_deref(), text);
            }
        }
    }
    varint(out, state.faults.len() as u64);
    for (n, code) in &state.faults {
        varint(out, *n);
        text(out, code.local_name());
    }
    time(out, &state.max_expiry);
    signed(out, millis(state.last_activity));
    text(out, state.status.as_str());
    option(out, state.terminated_at.map(millis), signed);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, String> {
        let (&b, rest) = self.0.split_first().ok_or("group state: truncated")?;
        self.0 = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("group state: varint too long".into())
    }

    fn signed(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn text(&mut self) -> Result<&'a str, String> {
        let len = usize::try_from(self.varint()?).map_err(|_| "group state: length")?;
        if len > self.0.len() {
            return Err("group state: truncated".into());
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(s).map_err(|_| "group state: not UTF-8".into())
    }

    fn time(&mut self) -> Result<DateTime<Utc>, String> {
        let secs = self.signed()?;
        let nanos = u32::try_from(self.varint()?).map_err(|_| "group state: nanos")?;
        DateTime::from_timestamp(secs, nanos).ok_or_else(|| "group state: time".into())
    }

    fn flag(&mut self) -> Result<bool, String> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(format!("group state: tag {t}")),
        }
    }
}

pub fn decode(bytes: &[u8]) -> Result<GroupState, String> {
    let mut r = Reader(bytes);
    let version = r.byte()?;
    if version != VERSION {
        return Err(format!("group state: unknown version {version}"));
    }
    let group_id = GroupId::parse(r.text()?)?;
    let channel = r.text()?.to_owned();
    let flags = r.byte()?;
    let limit = match r.byte()? {
        0 => None,
        1 => Some(GroupLimit::ExpiryTime(r.time()?)),
        2 => Some(GroupLimit::MaxIdleDuration(XsDuration::parse(r.text()?)?)),
        t => return Err(format!("group state: limit tag {t}")),
    };
    let last = if r.flag()? { Some(r.varint()?) } else { None };
    let count = r.varint()?;
    let mut pairs = Vec::new();
    for _ in 0..count {
        pairs.push((r.varint()?, r.varint()?));
    }
    let delivered = RangeSet::from_pairs(pairs).ok_or("delivered ranges are not canonical")?;
    let next_expected = r.varint()?;
    let mut buffered = BTreeMap::new();
    for _ in 0..r.varint()? {
        let n = r.varint()?;
        let expiry = from_millis(r.signed()?);
        let bytes = r.varint()?;
        let reply = match r.byte()? {
            0 => ReplyPattern::Response,
            1 => ReplyPattern::Poll,
            2 => {
                let uri = r.text()?.to_owned();
                let reference_scheme = if r.flag()? {
                    Some(r.text()?.to_owned())
                } else {
                    None
                };
                ReplyPattern::Callback(ReplyTo {
                    uri,
                    reference_scheme,
                })
            }
            t => return Err(format!("group state: reply tag {t}")),
        };
        buffered.insert(
            n,
            Buffered {
                expiry,
                bytes,
                reply,
            },
        );
    }
    let mut faults = BTreeMap::new();
    for _ in 0..r.varint()? {
        let n = r.varint()?;
        let name = r.text()?;
        let code =
            FaultCode::from_local_name(name).ok_or_else(|| format!("unknown fault code {name}"))?;
        faults.insert(n, code);
    }
    let max_expiry = r.time()?;
    let last_activity = from_millis(r.signed()?);
    let status = GroupStatus::parse(r.text()?).ok_or("unknown group status")?;
    let terminated_at = if r.flag()? {
        Some(from_millis(r.signed()?))
    } else {
        None
    };
    if !r.0.is_empty() {
        return Err("group state: trailing bytes".into());
    }
    Ok(GroupState {
        group_id,
        params: GroupParams {
            channel,
            sequenced: flags & 1 != 0,
            ack_requested: flags & 2 != 0,
            duplicate_elimination: flags & 4 != 0,
            message_order: flags & 8 != 0,
            limit,
        },
        last,
        delivered,
        next_expected,
        buffered,
        faults,
        max_expiry,
        last_activity,
        status,
        terminated_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_state_round_trips_through_the_record_and_the_json_of_old_rows_still_reads() {
        let t = Utc
            .with_ymd_and_hms(2026, 5, 6, 7, 8, 9)
            .single()
            .expect("time")
            + chrono::Duration::nanoseconds(123_456_789);
        let mut state = GroupState::new(
            GroupId::parse("mid:g@test").expect("id"),
            GroupParams {
                channel: "default".into(),
                sequenced: true,
                ack_requested: true,
                duplicate_elimination: false,
                message_order: true,
                limit: Some(GroupLimit::ExpiryTime(t)),
            },
            t,
        );
        // Stored in ms, as in the JSON form: only the limits keep full precision.
        let ms = from_millis(millis(t));
        state.last_activity = ms;
        state.last = Some(9);
        state.next_expected = 3;
        state.delivered = RangeSet::from_pairs(vec![(0, 2), (5, 5)]).expect("ranges");
        state.buffered.insert(
            4,
            Buffered {
                expiry: ms,
                bytes: 10,
                reply: ReplyPattern::Callback(ReplyTo {
                    uri: "http://x/acks".into(),
                    reference_scheme: Some("s".into()),
                }),
            },
        );
        state.faults.insert(7, FaultCode::GroupAborted);
        state.max_expiry = t;
        state.terminated_at = Some(from_millis(millis(t)));
        let mut bytes = Vec::new();
        encode(&state, &mut bytes);
        assert_eq!(decode(&bytes), Ok(state.clone()));
        assert!(bytes.len() < crate::store::group_json::encode(&state).len() / 2);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
