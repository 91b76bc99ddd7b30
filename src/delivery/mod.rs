//! Delivery to applications (DESIGN §5): subscriptions over the inbox. The pure parts —
//! topic filters and identities, subscription rules, unforgeable per-attempt receipts, one
//! message's lease/outcome state machine, the choice of what a member gets, group heads,
//! sessions coming and going, what handing out and settling do, and when time alone changes
//! something — and the workers over the store: long-poll fetch, push to webhooks and
//! housekeeping, which wait by notification (`wait`).

pub mod filter;
pub mod group;
pub mod lease;
pub mod maintain;
pub mod pick;
pub mod pull;
pub mod push;
pub mod receipt;
pub mod retention;
pub mod session;
pub mod settle;
pub mod subscription;
pub mod wait;
pub mod wake;

use serde_json::{Value, json};

use crate::store::InboxEntry;
use crate::wsr::datetime::date_time_string;

/// A delivered message as applications see it, in fetch answers, webhook POSTs and the inbox.
pub fn message_json(e: &InboxEntry) -> Value {
    json!({
        "offset": e.offset,
        "partner": e.partner,
        "channel": e.channel,
        "topic": e.topic,
        "group_id": e.group_id,
        "number": e.number,
        "payload": e.payload,
        "namespaces": serde_json::from_str::<Value>(&e.namespaces).unwrap_or(Value::Null),
        "received_at": date_time_string(&e.received_at),
        "expiry": date_time_string(&e.expiry),
    })
}
