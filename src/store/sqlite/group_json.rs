//! The stored form of `rmp::GroupState` before migration 0011: JSON in the `groups.state`
//! column, still read for rows written then (new rows use `group_state.rs`). A mirror type keeps
//! serde out of the protocol rooms and makes the stored format explicit (times in Unix ms,
//! fault codes and durations by their wire names).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rmp::group::{Buffered, GroupParams, GroupState, GroupStatus};
use crate::rmp::ranges::RangeSet;
use crate::store::time::{from_millis, millis};
use crate::wsr::datetime::{XsDuration, format_date_time, parse_date_time};
use crate::wsr::{FaultCode, GroupId, GroupLimit, ReplyPattern, ReplyTo};

#[derive(Serialize, Deserialize)]
struct StoredGroup {
    group_id: String,
    channel: String,
    sequenced: bool,
    ack_requested: bool,
    duplicate_elimination: bool,
    message_order: bool,
    /// xs:dateTime text: full precision, since it is compared with every later message's.
    group_expiry: Option<String>,
    group_max_idle: Option<String>,
    last: Option<u64>,
    delivered: Vec<(u64, u64)>,
    next_expected: u64,
    buffered: Vec<StoredBuffered>,
    faults: Vec<(u64, String)>,
    /// xs:dateTime text: full precision, since the purge must not come a moment early.
    max_expiry: String,
    last_activity_ms: i64,
    status: String,
    terminated_at_ms: Option<i64>,
}

#[derive(Serialize, Deserialize)]
struct StoredBuffered {
    number: u64,
    expiry_ms: i64,
    bytes: u64,
    /// "Response", "Poll", or the callback address.
    reply: String,
    callback: bool,
    reference_scheme: Option<String>,
}

pub fn encode(state: &GroupState) -> String {
    let p = &state.params;
    let (group_expiry, group_max_idle) = match &p.limit {
        None => (None, None),
        Some(GroupLimit::ExpiryTime(t)) => {
            let mut text = String::new();
            format_date_time(t, &mut text);
            (Some(text), None)
        }
        Some(GroupLimit::MaxIdleDuration(d)) => (None, Some(d.to_string())),
    };
    let stored = StoredGroup {
        group_id: state.group_id.as_str().to_owned(),
        channel: p.channel.clone(),
        sequenced: p.sequenced,
        ack_requested: p.ack_requested,
        duplicate_elimination: p.duplicate_elimination,
        message_order: p.message_order,
        group_expiry,
        group_max_idle,
        last: state.last,
        delivered: state.delivered.pairs().to_vec(),
        next_expected: state.next_expected,
        buffered: state
            .buffered
            .iter()
            .map(|(n, b)| {
                let (reply, callback, reference_scheme) = match &b.reply {
                    ReplyPattern::Callback(to) => {
                        (to.uri.clone(), true, to.reference_scheme.clone())
                    }
                    other => (other.value().to_owned(), false, None),
                };
                StoredBuffered {
                    number: *n,
                    expiry_ms: millis(b.expiry),
                    bytes: b.bytes,
                    reply,
                    callback,
                    reference_scheme,
                }
            })
            .collect(),
        faults: state
            .faults
            .iter()
            .map(|(n, c)| (*n, c.local_name().to_owned()))
            .collect(),
        max_expiry: {
            let mut text = String::new();
            format_date_time(&state.max_expiry, &mut text);
            text
        },
        last_activity_ms: millis(state.last_activity),
        status: state.status.as_str().to_owned(),
        terminated_at_ms: state.terminated_at.map(millis),
    };
    // Serializing plain data cannot fail.
    serde_json::to_string(&stored).unwrap_or_default()
}

pub fn decode(json: &str) -> Result<GroupState, String> {
    let s: StoredGroup = serde_json::from_str(json).map_err(|e| format!("group state: {e}"))?;
    let limit = match (s.group_expiry, s.group_max_idle) {
        (Some(text), _) => Some(GroupLimit::ExpiryTime(parse_date_time(&text)?.0)),
        (None, Some(d)) => Some(GroupLimit::MaxIdleDuration(XsDuration::parse(&d)?)),
        (None, None) => None,
    };
    let buffered: BTreeMap<u64, Buffered> = s
        .buffered
        .into_iter()
        .map(|b| {
            let reply = match (b.callback, b.reply.as_str()) {
                (true, _) => ReplyPattern::Callback(ReplyTo {
                    uri: b.reply.clone(),
                    reference_scheme: b.reference_scheme.clone(),
                }),
                (false, "Poll") => ReplyPattern::Poll,
                (false, _) => ReplyPattern::Response,
            };
            let buffered = Buffered {
                expiry: from_millis(b.expiry_ms),
                bytes: b.bytes,
                reply,
            };
            (b.number, buffered)
        })
        .collect();
    let faults = s
        .faults
        .into_iter()
        .map(|(n, name)| {
            FaultCode::from_local_name(&name)
                .map(|c| (n, c))
                .ok_or_else(|| format!("unknown fault code {name}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(GroupState {
        group_id: GroupId::parse(&s.group_id)?,
        params: GroupParams {
            channel: s.channel,
            sequenced: s.sequenced,
            ack_requested: s.ack_requested,
            duplicate_elimination: s.duplicate_elimination,
            message_order: s.message_order,
            limit,
        },
        last: s.last,
        delivered: RangeSet::from_pairs(s.delivered).ok_or("delivered ranges are not canonical")?,
        next_expected: s.next_expected,
        buffered,
        faults,
        max_expiry: parse_date_time(&s.max_expiry)?.0,
        last_activity: from_millis(s.last_activity_ms),
        status: GroupStatus::parse(&s.status).ok_or("unknown group status")?,
        terminated_at: s.terminated_at_ms.map(from_millis),
    })
}
