//! How a delivered message looks to applications: built from the store's inbox row, so it
//! lives with the workers (which may read the store) and not in pure `delivery`.

use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::store::InboxEntry;
use crate::wsr::datetime::date_time_string;

/// A delivered message as applications see it, in fetch answers, webhook POSTs and the inbox.
/// Borrowed from the entry, so a fetch answer is written straight from the rows.
pub struct MessageView<'a> {
    offset: i64,
    partner: &'a str,
    channel: &'a str,
    topic: &'a str,
    group_id: &'a str,
    number: Option<u64>,
    payload: &'a str,
    /// The stored JSON as it is (checked, not rebuilt); `null` if it is not JSON.
    namespaces: Option<&'a RawValue>,
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
            namespaces: serde_json::from_str(&e.namespaces).ok(),
            received_at: date_time_string(&e.received_at),
            expiry: date_time_string(&e.expiry),
        }
    }

    /// How many fields the view has (its payload one of them).
    pub const FIELDS: usize = 10;

    /// The message's payload, which `serialize_fields_but_payload` leaves out.
    pub fn payload(&self) -> &'a str {
        self.payload
    }

    /// Writes the view's fields but its payload into a struct being serialized, so that an
    /// answer adding fields of its own (a fetch's receipt) is one flat object without
    /// `#[serde(flatten)]`, which goes through a map and costs several times as much per
    /// field; that answer writes the payload itself (a fetch's, with `json_text`).
    pub fn serialize_fields_but_payload<S: SerializeStruct>(
        &self,
        s: &mut S,
    ) -> Result<(), S::Error> {
        self.serialize_fields_with(s, false)
    }

    fn serialize_fields_with<S: SerializeStruct>(
        &self,
        s: &mut S,
        payload: bool,
    ) -> Result<(), S::Error> {
        s.serialize_field("offset", &self.offset)?;
        s.serialize_field("partner", self.partner)?;
        s.serialize_field("channel", self.channel)?;
        s.serialize_field("topic", self.topic)?;
        s.serialize_field("group_id", self.group_id)?;
        s.serialize_field("number", &self.number)?;
        if payload {
            s.serialize_field("payload", self.payload)?;
        }
        s.serialize_field("namespaces", &self.namespaces)?;
        s.serialize_field("received_at", &self.received_at)?;
        s.serialize_field("expiry", &self.expiry)
    }
}

impl Serialize for MessageView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("MessageView", Self::FIELDS)?;
        self.serialize_fields_with(&mut s, true)?;
        s.end()
    }
}

/// `MessageView` as a JSON value, for answers that add fields of their own.
pub fn message_json(e: &InboxEntry) -> Value {
    // Strings, numbers and a `Value`: nothing in a view can fail to serialize.
    serde_json::to_value(MessageView::of(e)).unwrap_or(Value::Null)
}
