//! Taking messages: a session's fetch, long-polling through `consume::pull`, answered
//! straight from the borrowed rows.

use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SESSION;
use super::sessions::own_session;
use crate::consume::pull::fetch_waiting;
use crate::consume::view::MessageView;
use crate::delivery::fetch::Take;
use crate::delivery::receipt::Unsigned;
use crate::http::AppState;
use crate::http::api::{ApiPath, Caller, Problem, ProblemBody, json_body as body, json_written};
use crate::http::openapi::InboxMessage;
use crate::json_text::push_json_string;
use crate::wsr::datetime::date_time_string;

const MAX_FETCH: usize = 1000;
const MAX_WAIT: Duration = Duration::from_secs(60);

/// About what a handed message's fields other than its payload and namespaces take in a
/// fetch's answer (names, ids, times, its receipt).
const ANSWER_FIELDS_BYTES: usize = 512;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct FetchBody {
    /// At most this many messages: 1 to 1000 (default 10), and at most the gateway's
    /// `max_fetch_bytes` of payload (the first message whatever its size).
    max: Option<usize>,
    /// Wait up to this long for a first message (at most 60000; default 0).
    wait_ms: Option<u64>,
}

#[utoipa::path(
    post,
    path = "/api/v1/sessions/{session}/fetch",
    tag = "consume",
    summary = "Take messages: each leased until settled or its deadline",
    params(("session" = String, Path, description = SESSION)),
    request_body(content = Option<FetchBody>, description = "May be empty"),
    responses(
        (status = 200, description = "The messages handed out (maybe none)", body = FetchAnswerSchema),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No live session of that id", body = ProblemBody),
        (status = 409, description = "The session is a push worker's", body = ProblemBody),
        (status = 429, description = "The principal has too many fetches waiting", body = ProblemBody),
    )
)]
pub async fn fetch(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(session): ApiPath<String>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: FetchBody = body(&bytes)?;
    let max = request.max.unwrap_or(10);
    if !(1..=MAX_FETCH).contains(&max) {
        return Err(Problem::field("max", format!("must be 1 to {MAX_FETCH}")));
    }
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0)).min(MAX_WAIT);
    own_session(&app, &caller, &session).await?;
    // A long poll holds one of the principal's waiting slots while it waits (dropped with
    // the answer); a fetch that does not wait needs none.
    let _waiting = match wait.is_zero() {
        true => None,
        false => Some(app.waiting_fetches.take(&caller.principal).ok_or_else(|| {
            Problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-waiting-fetches",
                format!(
                    "{} has {} fetches waiting already; fetch without wait_ms or wait for one \
                     to answer",
                    caller.principal,
                    app.waiting_fetches.max()
                ),
            )
        })?),
    };
    let take = Take::pull(max, app.config.delivery.max_fetch_bytes);
    let handed = fetch_waiting(&app.store, &app.clock, &session, take, wait).await?;
    crate::metrics::delivered("pull", handed.len());
    crate::consume::traced::fetched(&app.store, &session, handed.iter().map(|h| &h.message)).await;
    let messages = handed
        .iter()
        .map(|h| {
            Ok(HandedView {
                message: MessageView::of(&h.message),
                receipt: h.receipt.sign(&app.receipts)?,
                attempt: h.receipt.attempt,
                deadline: h.deadline.as_ref().map(date_time_string),
            })
        })
        .collect::<Result<_, Unsigned>>()
        .map_err(|e| {
            // The leases stand: the messages come again when their deadlines pass.
            tracing::error!(error = %e, "a fetch's receipts could not be signed");
            Problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "receipt-unsigned",
                e.to_string(),
            )
        })?;
    // Written from the borrowed rows: a batch of payloads is not copied into a JSON tree first.
    // The buffer is sized for the payloads and namespaces and each message's other fields
    // (escaping may still make it grow).
    let capacity = handed
        .iter()
        .map(|h| h.message.payload.len() + h.message.namespaces.len() + ANSWER_FIELDS_BYTES)
        .sum();
    Ok(json_written(FetchAnswer { messages }.write(capacity)))
}

/// A fetch's answer: `{"messages": [...]}`.
struct FetchAnswer<'a> {
    messages: Vec<HandedView<'a>>,
}

impl FetchAnswer<'_> {
    /// The answer's JSON, in a buffer of `capacity` bytes made beforehand (axum's `Json`
    /// grows one from 128 bytes, copying it at each doubling). Each message's fields are
    /// serde's; its payload, most of its bytes, is written after them by `json_text`, which
    /// escapes it several times faster than serde_json.
    fn write(&self, capacity: usize) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(capacity);
        out.extend_from_slice(br#"{"messages":["#);
        for (i, handed) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut out, handed)?;
            // serde_json writes a struct as an object, `}` its last byte: the payload goes in
            // before it (after the other fields, so never first).
            if out.pop() != Some(b'}') {
                return Err(serde::ser::Error::custom(
                    "a handed message is not an object",
                ));
            }
            out.extend_from_slice(br#","payload":"#);
            push_json_string(&mut out, handed.message.payload());
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
        Ok(out)
    }
}

/// A fetch's answer, as documented (`FetchAnswer` borrows, which a schema cannot).
#[derive(ToSchema)]
#[schema(as = FetchAnswer)]
#[allow(dead_code)] // a description only: the answer is a FetchAnswer
struct FetchAnswerSchema {
    messages: Vec<HandedSchema>,
}

/// One handed-out message: an inbox message with what settling it takes.
#[derive(ToSchema)]
#[schema(as = HandedMessage)]
#[allow(dead_code)] // a description only: the answer is a HandedView
struct HandedSchema {
    #[serde(flatten)]
    message: InboxMessage,
    /// Give it to settle or extend.
    receipt: String,
    attempt: u32,
    /// When the lease ends (absent: settled on sending).
    deadline: Option<String>,
}

/// One handed-out message: the message, and what settling it takes.
/// Serialized by hand: the message's fields but its payload, then the hand-out's, in one
/// object (`FetchAnswer::write` adds the payload).
struct HandedView<'a> {
    message: MessageView<'a>,
    receipt: String,
    attempt: u32,
    deadline: Option<String>,
}

impl Serialize for HandedView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        // The view's fields but its payload, and three of the hand-out's.
        let mut s = serializer.serialize_struct("HandedView", MessageView::FIELDS - 1 + 3)?;
        self.message.serialize_fields_but_payload(&mut s)?;
        s.serialize_field("receipt", &self.receipt)?;
        s.serialize_field("attempt", &self.attempt)?;
        s.serialize_field("deadline", &self.deadline)?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    use super::*;
    use crate::store::InboxEntry;

    fn entry(namespaces: &str) -> InboxEntry {
        let at = Utc
            .with_ymd_and_hms(2026, 12, 6, 10, 0, 0)
            .single()
            .expect("a time");
        InboxEntry {
            offset: 7,
            partner: "acme".into(),
            channel: "orders".into(),
            topic: "orders/PO".into(),
            group_id: "mid:1@acme".into(),
            number: Some(3),
            payload: "<PO a=\"1\"/>".into(),
            namespaces: namespaces.into(),
            received_at: at,
            expiry: at + chrono::Duration::hours(1),
        }
    }

    #[test]
    fn a_handed_message_is_one_flat_object_with_its_receipt() {
        let e = entry(r#"[["p","urn:po"]]"#);
        let handed = HandedView {
            message: MessageView::of(&e),
            receipt: "r".into(),
            attempt: 2,
            deadline: None,
        };
        let answer = FetchAnswer {
            messages: vec![handed],
        };
        let written: serde_json::Value =
            serde_json::from_slice(&answer.write(0).expect("written")).expect("JSON");
        assert_eq!(
            written["messages"][0],
            json!({
                "offset": 7, "partner": "acme", "channel": "orders", "topic": "orders/PO",
                "group_id": "mid:1@acme", "number": 3, "payload": "<PO a=\"1\"/>",
                "namespaces": [["p", "urn:po"]], "received_at": "2026-12-06T10:00:00Z",
                "expiry": "2026-12-06T11:00:00Z", "receipt": "r", "attempt": 2,
                "deadline": null
            })
        );
        assert_eq!(
            serde_json::to_value(MessageView::of(&e)).expect("serialized")["namespaces"],
            json!([["p", "urn:po"]])
        );
    }

    #[test]
    fn an_answer_carries_every_payload_exactly_whatever_it_holds() {
        let payloads = [
            "",
            "<PO a=\"1\">caf\u{e9} \u{20ac}\\ \t\r\n</PO>",
            "\u{0}\u{1f}\u{7f}\"\"",
        ];
        let entries: Vec<InboxEntry> = payloads
            .iter()
            .map(|p| InboxEntry {
                payload: (*p).into(),
                ..entry("[]")
            })
            .collect();
        let messages = entries
            .iter()
            .map(|e| HandedView {
                message: MessageView::of(e),
                receipt: "r".into(),
                attempt: 1,
                deadline: Some("2026-12-06T10:05:00Z".into()),
            })
            .collect();
        let bytes = FetchAnswer { messages }.write(16).expect("written");
        let written: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        let handed = written["messages"].as_array().expect("a list");
        assert_eq!(handed.len(), payloads.len());
        for (message, payload) in handed.iter().zip(payloads) {
            assert_eq!(message["payload"], payload);
            assert_eq!(message["deadline"], "2026-12-06T10:05:00Z");
            assert_eq!(message.as_object().map(|o| o.len()), Some(13), "{message}");
        }
        // No message at all is an empty list.
        let none = FetchAnswer { messages: vec![] }.write(0).expect("written");
        assert_eq!(none, br#"{"messages":[]}"#);
    }

    #[test]
    fn namespaces_that_are_not_json_are_null() {
        let e = entry("not json");
        let written = serde_json::to_value(MessageView::of(&e)).expect("serialized");
        assert_eq!(written["namespaces"], serde_json::Value::Null);
    }
}
