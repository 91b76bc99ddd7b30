//! How an outbound message is shown to applications: the JSON of the messages API and of the
//! notify webhooks (below `http/`, so that the sender's webhooks need nothing from it).

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use base64::Engine as _;

use crate::outbound::http_client::redacted;
use crate::rmp::sender::OutState;
use crate::store::outbound::{AttemptHistory, KeptResponse, OutMessage, ResponseInfo};
use crate::wsr::SoapVersion;
use crate::wsr::datetime::{date_time_string, saturating_add_std};

/// What the sender's settings tell of a message beyond its row: when the next poll asks
/// about it.
#[derive(Debug, Clone, Copy)]
pub struct Polling {
    pub interval: std::time::Duration,
}

impl Polling {
    /// When the next poll asks about `m`: a poll interval after the last one, for a message
    /// only a poll can settle (in doubt, or a Poll-pattern one waiting for its ack); `None`
    /// before its first poll (the next pass asks) or when no poll will.
    pub fn next_poll(&self, m: &OutMessage) -> Option<DateTime<Utc>> {
        let awaits_poll = m.outbound.in_doubt()
            || (m.reply == "Poll" && matches!(m.outbound.state, OutState::Sent));
        let last = m.last_poll_at?;
        awaits_poll.then(|| saturating_add_std(last, self.interval))
    }
}

/// Where an application reads a message's attempts and polls.
pub fn attempts_url(id: &str) -> String {
    format!("/api/v1/messages/{id}/attempts")
}

/// The JSON view of an outbound message (API answers, notify webhooks).
pub fn message_json(m: &OutMessage, polling: Polling) -> Value {
    let (fault, reason) = match &m.outbound.state {
        OutState::Faulted(code) => (Some(code.local_name()), None),
        OutState::Failed(reason) => (None, Some(reason.as_str())),
        _ => (None, None),
    };
    let in_doubt = m.outbound.in_doubt();
    // In doubt, no attempt is due: `next_attempt` there is when doubt ends (`Outbound::due`).
    let (next_attempt, doubt_ends_at) = if in_doubt {
        (None, m.outbound.next_attempt)
    } else {
        (m.outbound.next_attempt, None)
    };
    let finished_at = m.outbound.state.is_final().then_some(m.updated_at);
    json!({
        "id": m.id,
        "group_id": m.group_id.as_str(),
        "number": m.number,
        // Without userinfo or query: a partner's address may carry credentials, and every
        // principal who may read the message reads this.
        "destination": redacted(&m.destination),
        "partner": m.partner,
        "reply_pattern": m.reply,
        "soap_version": if m.version == SoapVersion::Soap12 { "1.2" } else { "1.1" },
        "state": m.outbound.state.name(),
        "fault": fault,
        "reason": reason,
        "attempts": m.outbound.attempts,
        "expiry": date_time_string(&m.outbound.expiry),
        "next_attempt": next_attempt.as_ref().map(date_time_string),
        // Sent, no verdict, nothing more to send: only a poll (or an operator) settles it.
        "in_doubt": in_doubt,
        "doubt_ends_at": doubt_ends_at.as_ref().map(date_time_string),
        "last_poll_at": m.last_poll_at.as_ref().map(date_time_string),
        "next_poll_at": polling.next_poll(m).as_ref().map(date_time_string),
        "submitted_at": date_time_string(&m.submitted_at),
        // When it became acked, faulted or failed.
        "finished_at": finished_at.as_ref().map(date_time_string),
        "attempts_url": attempts_url(&m.id),
        "idempotency_key": m.idempotency_key,
        // The latest failed attempt's cause (kept after a later success), for messages that
        // stay `sent` without an answer.
        "last_error": m.last_error.as_ref().map(|e| e.cause.as_str()),
        "last_error_at": m.last_error.as_ref().map(|e| date_time_string(&e.at)),
        // The partner's business response, if one was kept (its bytes: `response_url`).
        "response": m.response.as_ref().map(|r| response_json(&m.id, r)),
    })
}

/// Business responses up to this size are carried inline by events and notify webhooks;
/// larger ones by their link alone.
pub const INLINE_RESPONSE_BYTES: u64 = 64 * 1024;

/// Where an application reads a message's business response as received.
pub fn response_url(id: &str) -> String {
    format!("/api/v1/messages/{id}/response")
}

/// What the message JSON says of a kept business response.
pub fn response_json(id: &str, r: &ResponseInfo) -> Value {
    json!({
        "size": r.size,
        "soap_fault": r.soap_fault,
        "received_at": date_time_string(&r.received_at),
        "content_type": r.content_type,
        "href": response_url(id),
    })
}

/// `response_json` with the response itself when it is small (`INLINE_RESPONSE_BYTES`): as
/// `body` when it is UTF-8 text, else as `body_base64`.
pub fn response_inline(id: &str, r: &KeptResponse) -> Value {
    let mut v = response_json(id, &r.info);
    if r.info.size <= INLINE_RESPONSE_BYTES {
        match std::str::from_utf8(&r.body) {
            Ok(text) => v["body"] = json!(text),
            Err(_) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(&r.body);
                v["body_base64"] = json!(encoded);
            }
        }
    }
    v
}

/// The JSON of a notify webhook: the message's, its business response inline when small.
pub fn notify_json(m: &OutMessage, polling: Polling, response: Option<&KeptResponse>) -> Value {
    let mut v = message_json(m, polling);
    if let Some(r) = response {
        v["response"] = response_inline(&m.id, r);
    }
    v
}

/// The JSON of a message's story (`GET /api/v1/messages/{id}/attempts`): every kept attempt
/// and poll, oldest first, and how many there were.
pub fn attempts_json(history: &AttemptHistory) -> Value {
    let attempts: Vec<Value> = history
        .kept
        .iter()
        .map(|(n, a)| {
            json!({
                "n": n,
                "kind": a.kind.name(),
                "at": date_time_string(&a.at),
                "status": a.status,
                "verdict": a.verdict.name(),
                "fault": a.verdict.fault().map(|c| c.local_name()),
                "cause": a.failure,
            })
        })
        .collect();
    json!({
        "total": history.total,
        "omitted": history.total.saturating_sub(history.kept.len() as u64),
        "attempts": attempts,
    })
}
