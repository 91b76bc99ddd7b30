//! The receiver side's domain rows: what a store is given (a received message and its payload)
//! and what it answers (the committed verdict, inbox entries, callbacks owed, sweep reports).

use chrono::{DateTime, Utc};

use crate::rmp::quota::{HeldBack, SourceQuota};
use crate::rmp::receiver::{Action, Verdict};
use crate::rmp::replies::ReplyItem;
use crate::wsr::Request;

/// Registered URLs the gateway may POST to: partners' Callback ReplyTo addresses (D10), and
/// the webhooks of push subscriptions. Nothing else is ever a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoints {
    Callback,
    Push,
}

/// A message payload: text that shares the request's buffer where it can, so that a big
/// message is not copied on its way to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(bytes::Bytes);

impl Payload {
    /// `text` taken from `buffer` (zero-copy when it lies inside it).
    pub fn within(buffer: &bytes::Bytes, text: &str) -> Payload {
        let range = buffer.as_ptr_range();
        let inside =
            range.start <= text.as_ptr() && text.as_bytes().as_ptr_range().end <= range.end;
        if inside {
            Payload(buffer.slice_ref(text.as_bytes()))
        } else {
            Payload(bytes::Bytes::copy_from_slice(text.as_bytes()))
        }
    }

    pub fn as_str(&self) -> &str {
        // Built from `str`s only, so always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Payload {
        Payload(bytes::Bytes::from(text))
    }
}

/// A reliable message ready for the receiver's decision and, if accepted, the inbox.
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    /// The partner it came from ("" for an anonymous caller): its group, duplicates and
    /// order are that partner's alone (D14).
    pub partner: String,
    pub channel: String,
    pub request: Request,
    /// The Body's children as received.
    pub payload: Payload,
    /// JSON list of the namespace declarations the payload may rely on.
    pub namespaces: String,
    /// `{channel}/{local name of the first Body child}`.
    pub topic: String,
    /// Who sent it, as far as we know (the peer's IP address): the source a new group is
    /// counted against (`max_open_groups_per_source`).
    pub source: String,
    /// What `source` may keep stored, and how fast, on this message's channel (D13).
    pub quota: SourceQuota,
    /// Callback acks go out in the SOAP version of the message they acknowledge.
    pub soap12: bool,
    /// When it arrived (the decision's clock).
    pub now: DateTime<Utc>,
    /// Whether its delivery appends it to the inbox: not where a SOAP backend answers the
    /// channel's requests, whose answer is the delivery (D16).
    pub inbox: bool,
    /// A SOAP backend's answer to this request (D16), kept with its delivery in one
    /// transaction: when the request's exchange is no longer that call's, neither is stored
    /// (`StoreError::Superseded`).
    pub answer: Option<KeptAnswer>,
}

impl ReceivedMessage {
    /// The quota this message counts against (D13): one that is not kept (a SOAP backend's
    /// request, D16) counts against its source's rate only.
    pub fn source_quota(&self) -> SourceQuota {
        match self.inbox {
            true => self.quota,
            false => SourceQuota {
                max_stored_bytes: 0,
                ..self.quota
            },
        }
    }
}

/// A call's business response, kept as its request's answer with the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptAnswer {
    pub attempt: crate::store::Attempt,
    pub answer: crate::store::CachedAnswer,
}

/// The committed decision for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub verdict: Verdict,
    /// What became of the message itself: delivered, buffered, or neither (a duplicate, or
    /// a fault). Metrics tell duplicates by it.
    pub action: Action,
    /// The quota that refused it, when one did (the verdict is then the transient fault).
    pub held_back: Option<HeldBack>,
}

/// A delivered message with only the head of its payload: for showing a large message
/// without reading it whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxExcerpt {
    /// The message; its `payload` is empty (the head is below).
    pub entry: InboxEntry,
    /// The payload's first bytes, as many as were asked for (a UTF-8 character may be cut at
    /// the end).
    pub head: Vec<u8>,
    /// The whole payload's size in bytes.
    pub size: u64,
}

/// One delivered message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    pub offset: i64,
    /// Who sent it ("" for an anonymous caller).
    pub partner: String,
    pub channel: String,
    pub topic: String,
    pub group_id: String,
    pub number: Option<u64>,
    pub payload: String,
    pub namespaces: String,
    pub received_at: DateTime<Utc>,
    pub expiry: DateTime<Utc>,
}

/// An ack or fault owed to a sender by the Callback pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCallback {
    pub id: i64,
    /// The partner whose message this answers ("" for an anonymous caller): the callback
    /// presents our credentials towards it.
    pub partner: String,
    pub endpoint: String,
    pub soap12: bool,
    /// The ack or fault: a singleton, a number, or a range (poll answers sent by callback).
    pub reply: ReplyItem,
    pub expiry: DateTime<Utc>,
    pub attempts: u32,
}

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub changed: usize,
    pub purged: usize,
    pub discarded: usize,
}

/// A stored payload as text: the UTF-8 the request carried (SQLite keeps big payloads as
/// BLOBs, small ones as TEXT; PostgreSQL as bytea). Checked by `from_utf8`, which runs a word
/// at a time over ASCII, where `from_utf8_lossy` decodes byte by byte even when nothing is
/// lost.
pub(in crate::store) fn payload_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::Payload;
    use bytes::Bytes;

    #[test]
    fn a_payload_shares_its_request_buffer_and_copies_text_from_elsewhere() {
        let buffer = Bytes::from_static(b"<e><b>body text</b></e>");
        let text = std::str::from_utf8(&buffer[6..15]).expect("utf-8");
        let shared = Payload::within(&buffer, text);
        assert_eq!(shared.as_str(), "body text");
        assert_eq!(shared.0.as_ptr(), text.as_ptr(), "no copy");
        let elsewhere = String::from("body text");
        let copied = Payload::within(&buffer, &elsewhere);
        assert_eq!(copied.as_str(), "body text");
        assert_ne!(copied.0.as_ptr(), elsewhere.as_ptr());
    }
}
