//! How a delivered message looks to applications: built from the store's inbox row, so it
//! lives with the workers (which may read the store) and not in pure `delivery`.

use serde::Serialize;
use serde_json::Value;

use crate::store::InboxEntry;
use crate::wsr::datetime::date_time_string;

/// A delivered message as applications see it, in fetch answers, webhook POSTs and the inbox.
/// Borrowed from the entry, so a fetch answer is written straight from the rows.
#[derive(Serialize)]
pub struct MessageView<'a> {
    offset: i64,
    partner: &'a str,
    channel: &'a str,
    topic: &'a str,
    group_id: &'a str,
    number: Option<u64>,
    payload: &'a str,
    namespaces: Value,
    received_at: String,
    expiry: String,
}

impl<'a> MessageView<'a> {
    pub fn of(e: &'a InboxEntry) -> MessageView<'a> {
        MessageView {
            offset: e.offset,
            partner: &e.partner,
            channel: &e.channel,
            topic: &e.topic,
            group_id: &e.group_id,
            number: e.number,
            payload: &e.payload,
            namespaces: serde_json::from_str::<Value>(&e.namespaces).unwrap_or(Value::Null),
            received_at: date_time_string(&e.received_at),
            expiry: date_time_string(&e.expiry),
        }
    }
}

/// `MessageView` as a JSON value, for answers that add fields of their own.
pub fn message_json(e: &InboxEntry) -> Value {
    // Strings, numbers and a `Value`: nothing in a view can fail to serialize.
    serde_json::to_value(MessageView::of(e)).unwrap_or(Value::Null)
}
