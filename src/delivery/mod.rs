//! Delivery to applications (DESIGN §5): subscriptions over the inbox. The pure parts —
//! topic filters and identities, subscription rules, unforgeable per-attempt receipts, one
//! message's lease/outcome state machine and the choice of what a member gets — and the
//! workers over the store: long-poll fetch and push to webhooks.

pub mod filter;
pub mod lease;
pub mod maintain;
pub mod pick;
pub mod pull;
pub mod push;
pub mod receipt;
pub mod subscription;

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
