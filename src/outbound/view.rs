//! How an outbound message is shown to applications: the JSON of the messages API and of the
//! notify webhooks (below `http/`, so that the sender's webhooks need nothing from it).

use serde_json::{Value, json};

use crate::rmp::sender::OutState;
use crate::store::outbound::OutMessage;
use crate::wsr::SoapVersion;
use crate::wsr::datetime::date_time_string;

/// The JSON view of an outbound message (API answers, notify webhooks).
pub fn message_json(m: &OutMessage) -> Value {
    let (fault, reason) = match &m.outbound.state {
        OutState::Faulted(code) => (Some(code.local_name()), None),
        OutState::Failed(reason) => (None, Some(reason.as_str())),
        _ => (None, None),
    };
    json!({
        "id": m.id,
        "group_id": m.group_id.as_str(),
        "number": m.number,
        "destination": m.destination,
        "partner": m.partner,
        "reply_pattern": m.reply,
        "soap_version": if m.version == SoapVersion::Soap12 { "1.2" } else { "1.1" },
        "state": m.outbound.state.name(),
        "fault": fault,
        "reason": reason,
        "attempts": m.outbound.attempts,
        "expiry": date_time_string(&m.outbound.expiry),
        "next_attempt": m.outbound.next_attempt.as_ref().map(date_time_string),
        "idempotency_key": m.idempotency_key,
        // The latest failed attempt's cause (kept after a later success), for messages that
        // stay `sent` without an answer.
        "last_error": m.last_error.as_ref().map(|e| e.cause.as_str()),
        "last_error_at": m.last_error.as_ref().map(|e| date_time_string(&e.at)),
    })
}
