//! `/api/v1/messages/{id}/resend`, `…/fail` and `…/send-again`: an operator's word on an
//! outbound message (admin scope), for one in doubt or ended without success above all. The decision and its save are
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
use crate::outbound::operator::{
    self, ActionError, OperatorAction, SendAgainError, act, check_reason,
};
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
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, Problem> {
    let outcome = act(&app.store, &id, OperatorAction::Resend, app.clock.now()).await;
    if outcome.is_ok() {
        super::audit::note(&app, &caller.principal, "resend", &id, None).await;
    }
    answer(&app, outcome)
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
    let outcome = act(&app.store, &id, action, app.clock.now()).await;
    if outcome.is_ok() {
        let why = Some(request.reason.clone()).filter(|r| !r.trim().is_empty());
        super::audit::note(&app, &caller.principal, "fail", &id, why).await;
    }
    answer(&app, outcome)
}

/// A failed or faulted message sent again as a new one: 202 with the new message's id (its
/// history and the old one's name each other), 409 when the message has not ended so or its
/// destination is no longer allowed, 404 when there is none.
#[utoipa::path(
    post,
    path = "/api/v1/messages/{id}/send-again",
    tag = "admin",
    summary = "Send a failed or faulted outbound message again, as a new message",
    description = "A new message (new identity, a singleton) with the stored envelope's Body, \
                   SOAP version, reply pattern, acknowledgment and duplicate-elimination \
                   requests, retry schedule, lifetime (from now) and notify webhook, to the \
                   same partner or URL, for the same principal. The old message stays as it \
                   is; its history gets a `sent_again` event naming the new one, whose \
                   `queued` event names the old one and the operator.",
    params(("id" = String, Path, description = "The message id")),
    responses(
        (status = 202, description = "The new message, stored; it is sent from here", body = super::messages::SubmitAnswer),
        (status = 400, description = "A path that is not valid", body = ProblemBody),
        (status = 404, description = "No such message", body = ProblemBody),
        (status = 409, description = "Not failed or faulted, or its destination is no longer allowed", body = ProblemBody),
    )
)]
pub async fn send_again(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<axum::response::Response, Problem> {
    let sending = super::messages::sending_of(&app);
    match operator::send_again(sending, &id, &caller.principal, app.clock.now()).await {
        Ok(submitted) => {
            let detail = Some(format!("as {}", submitted.id));
            super::audit::note(&app, &caller.principal, "send_again", &id, detail).await;
            Ok(super::messages::submitted_answer(&submitted))
        }
        Err(SendAgainError::NotFound(id)) => Err(Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no message {id}"),
        )),
        Err(e @ (SendAgainError::Refused(_) | SendAgainError::Submit(_))) => {
            Err(Problem(StatusCode::CONFLICT, "conflict", e.to_string()))
        }
        Err(SendAgainError::Store(e)) => Err(e.into()),
    }
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
