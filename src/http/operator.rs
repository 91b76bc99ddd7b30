//! `/api/v1/messages/{id}/resend` and `/api/v1/messages/{id}/fail`: an operator's word on an
//! outbound message (admin scope), for one in doubt above all. The decision and its save are
//! `outbound::operator`'s; this reads the request and says what became of it.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use super::api::{ApiPath, Caller, Problem, ProblemBody, json_body};
use super::openapi::OutboundMessage;
use crate::outbound::operator::{ActionError, OperatorAction, act, check_reason};
use crate::outbound::view::message_json;

/// The body of a fail: why, in the operator's words (optional).
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// At most 1 000 bytes, no control characters; kept in the message's reason.
    #[serde(default)]
    reason: String,
}

/// One attempt now, with the same identity: 200 with the message, 409 when it is final or
/// expired (or changed meanwhile), 404 when there is none.
#[utoipa::path(
    post,
    path = "/api/v1/messages/{id}/resend",
    tag = "admin",
    summary = "Send an outbound message again now, with the same identity",
    description = "One attempt at once, even past its schedule's last: for a message in doubt, \
                   the destination acks it as a duplicate or delivers it.",
    params(("id" = String, Path, description = "The message id")),
    responses(
        (status = 200, description = "Due now", body = OutboundMessage),
        (status = 404, description = "No such message", body = ProblemBody),
        (status = 409, description = "Final, expired, or changed meanwhile", body = ProblemBody),
    )
)]
pub async fn resend(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, Problem> {
    answer(
        &app,
        act(&app.store, &id, OperatorAction::Resend, app.clock.now()).await,
    )
}

/// Ends the message `failed` ("failed by operator NAME: REASON"), and the rest of its ordered
/// group with it. The body is optional: `{"reason": "…"}`.
#[utoipa::path(
    post,
    path = "/api/v1/messages/{id}/fail",
    tag = "admin",
    summary = "End an outbound message failed (and the rest of its ordered group)",
    params(("id" = String, Path, description = "The message id")),
    request_body(content = FailRequest, description = "Optional"),
    responses(
        (status = 200, description = "Failed", body = OutboundMessage),
        (status = 400, description = "A body or reason that is not valid", body = ProblemBody),
        (status = 404, description = "No such message", body = ProblemBody),
        (status = 409, description = "Already final, or changed meanwhile", body = ProblemBody),
    )
)]
pub async fn fail(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    body: Bytes,
) -> Result<Json<Value>, Problem> {
    let request: FailRequest = json_body(&body)?;
    check_reason(&request.reason).map_err(|why| Problem::field("reason", why))?;
    let action = OperatorAction::Fail {
        operator: &caller.principal,
        why: &request.reason,
    };
    answer(&app, act(&app.store, &id, action, app.clock.now()).await)
}

fn answer(
    app: &AppState,
    outcome: Result<crate::store::outbound::OutMessage, ActionError>,
) -> Result<Json<Value>, Problem> {
    match outcome {
        Ok(message) => Ok(Json(message_json(&message, app.polling()))),
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
