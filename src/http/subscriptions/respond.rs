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
use crate::http::wsr::inbound_of;
use crate::inbound::respond::{AnswerRefused, keep_application_answer};

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
    let conflict = |why: String| Problem(StatusCode::CONFLICT, "conflict", why);
    let body: RespondBody = json_body(&bytes)?;
    let receipt = receipt_for(&app, &caller, &body.receipt, &mut HashMap::new()).await?;
    match keep_application_answer(inbound_of(&app), receipt.offset, &body.response).await {
        Ok(()) => {}
        Err(AnswerRefused::Store(e)) => return Err(e.into()),
        Err(AnswerRefused::NoSuchMessage) => {
            return Err(Problem(
                StatusCode::NOT_FOUND,
                "not-found",
                "no such delivery".into(),
            ));
        }
        Err(AnswerRefused::Invalid(why)) => return Err(Problem::field("response", why)),
        Err(AnswerRefused::NotAnsweredByApi(channel)) => {
            return Err(conflict(format!(
                "channel {channel} is not a request-response channel answered through the API"
            )));
        }
        Err(AnswerRefused::AnsweredAlready) => {
            return Err(conflict(format!(
                "the message at offset {} is answered already",
                receipt.offset
            )));
        }
    }
    let now = app.clock.now();
    let settled = app
        .store
        .settle_many(&[(receipt.clone(), Some(Outcome::Accepted), None)], now)
        .await?;
    let settled = matches!(settled.first(), Some(Ok(())));
    Ok(Json(RespondAnswer {
        offset: receipt.offset,
        answered: true,
        settled,
    }))
}
