//! `/api/v1/messages/{id}/resend` and `/api/v1/messages/{id}/fail`: an operator's word on an
//! outbound message (admin scope), for one in doubt above all. The decision and its save are
//! `outbound::operator`'s; this reads the request and says what became of it.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::admin::{Caller, Problem};
use crate::outbound::operator::{ActionError, OperatorAction, act};
use crate::outbound::view::message_json;

/// The longest reason an operator may give (it is stored with the message and shown).
const MAX_REASON_BYTES: usize = 1000;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FailRequest {
    #[serde(default)]
    reason: String,
}

/// One attempt now, with the same identity: 200 with the message, 409 when it is final or
/// expired (or changed meanwhile), 404 when there is none.
pub async fn resend(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, Problem> {
    answer(act(&app.store, &id, OperatorAction::Resend, app.clock.now()).await)
}

/// Ends the message `failed` ("failed by operator NAME: REASON"), and the rest of its ordered
/// group with it. The body is optional: `{"reason": "…"}`.
pub async fn fail(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, Problem> {
    let request: FailRequest = if body.iter().all(u8::is_ascii_whitespace) {
        FailRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| Problem::field("body", e.to_string()))?
    };
    if request.reason.len() > MAX_REASON_BYTES {
        return Err(Problem::field(
            "reason",
            format!("at most {MAX_REASON_BYTES} bytes"),
        ));
    }
    if request.reason.chars().any(char::is_control) {
        return Err(Problem::field("reason", "no control characters".into()));
    }
    let action = OperatorAction::Fail {
        operator: &caller.principal,
        why: &request.reason,
    };
    answer(act(&app.store, &id, action, app.clock.now()).await)
}

fn answer(
    outcome: Result<crate::store::outbound::OutMessage, ActionError>,
) -> Result<Json<Value>, Problem> {
    match outcome {
        Ok(message) => Ok(Json(message_json(&message))),
        Err(ActionError::NotFound(id)) => Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no message {id}"),
        )),
        Err(e @ (ActionError::Refused(_) | ActionError::Changed(_))) => {
            Err(Problem(StatusCode::CONFLICT, "conflict", e.to_string()))
        }
        Err(ActionError::Store(e)) => Err(e.into()),
    }
}
