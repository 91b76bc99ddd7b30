//! `POST /api/v1/respond`: an application answers a request of a request-response channel
//! (D16, the spec's Respond) with the receipt of its delivery. The answer is kept for the
//! partner's exchange (and every copy of the request), then the delivery is settled accepted.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::settle::receipt_for;
use crate::delivery::lease::Outcome;
use crate::http::AppState;
use crate::http::api::{Caller, Problem, ProblemBody, json_body};
use crate::inbound::respond::application_answer;
use crate::outbound::backend::Responder;
use crate::rmp::exchange::keep_until_from;
use crate::store::NewCall;
use crate::wsr::{GroupId, MessageKey};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RespondBody {
    /// The receipt of the delivery being answered.
    receipt: String,
    /// The children of the answer's SOAP Body (a SOAP Fault is answered with HTTP 500).
    response: String,
}

/// An answer kept and its delivery settled.
#[derive(Serialize, ToSchema)]
pub struct RespondAnswer {
    pub offset: i64,
    pub answered: bool,
    /// False when the receipt's attempt is no longer the current one: the answer counts,
    /// the delivery is settled by whoever holds it now.
    pub settled: bool,
}

#[utoipa::path(
    post,
    path = "/api/v1/respond",
    tag = "consume",
    summary = "Answer a request-response message (the partner's exchange gets it) and settle it",
    request_body = RespondBody,
    responses(
        (status = 200, description = "Answered (and settled, unless the attempt was stale)", body = RespondAnswer),
        (status = 400, description = "A field that is not valid, or a receipt that is not genuine", body = ProblemBody),
        (status = 404, description = "No such delivery", body = ProblemBody),
        (status = 409, description = "Not a request answered through the API, or answered already", body = ProblemBody),
    )
)]
pub async fn respond(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    bytes: Bytes,
) -> Result<Json<RespondAnswer>, Problem> {
    let body: RespondBody = json_body(&bytes)?;
    let receipt = receipt_for(&app, &caller, &body.receipt, &mut HashMap::new()).await?;
    let not_found = || {
        Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            "no such delivery".into(),
        )
    };
    let entry = app
        .store
        .inbox(receipt.offset - 1, 1)
        .await?
        .into_iter()
        .find(|e| e.offset == receipt.offset)
        .ok_or_else(not_found)?;
    let conflict = |why: String| Problem(StatusCode::CONFLICT, "conflict", why);
    match app.config.operations.get(&entry.channel) {
        Some(op) if matches!(op.responder, Responder::Api { .. }) => {}
        _ => {
            return Err(conflict(format!(
                "channel {} is not a request-response channel answered through the API",
                entry.channel
            )));
        }
    }
    let answer = application_answer(&body.response, &app.config.limits)
        .map_err(|why| Problem::field("response", why))?;
    let group_id = GroupId::parse(&entry.group_id).map_err(|_| not_found())?;
    let key = MessageKey {
        group_id,
        number: entry.number,
    };
    let source = match entry.partner.as_str() {
        "" => "(anonymous)".to_owned(),
        p => format!("partner:{p}"),
    };
    let now = app.clock.now();
    let call = NewCall {
        partner: &entry.partner,
        key: &key,
        channel: &entry.channel,
        source: &source,
        now,
        keep_until: keep_until_from(entry.expiry, app.store.policy().answer_polls_for),
    };
    if !app.store.answer_request(call, &answer).await? {
        return Err(conflict(format!(
            "the message at offset {} is answered already",
            entry.offset
        )));
    }
    let settled = app
        .store
        .settle_many(&[(receipt.clone(), Some(Outcome::Accepted))], now)
        .await?;
    let settled = matches!(settled.first(), Some(Ok(())));
    Ok(Json(RespondAnswer {
        offset: receipt.offset,
        answered: true,
        settled,
    }))
}
