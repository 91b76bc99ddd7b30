//! What died: listing a subscription's dead letters, replaying and purging them.

use axum::body::Bytes;
use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{managed, visible};
use crate::consume::view::message_json;
use crate::http::AppState;
use crate::http::api::{ApiPath, ApiQuery, Caller, Problem, ProblemBody, json_body as body};
use crate::http::openapi::InboxMessage;
use crate::store::delivery::DeadLetterChange;

const MAX_OFFSETS: usize = 1000;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterPage {
    /// The offset to list after (the previous page's `next_after`; default 0).
    after: Option<i64>,
    /// 1 to 1000 (default 100; values beyond are clamped).
    limit: Option<i64>,
}

/// A dead letter: why it died, after how many attempts, and the message if still kept.
#[derive(Serialize, ToSchema)]
pub struct DeadLetterView {
    offset: i64,
    reason: String,
    attempts: u32,
    #[schema(value_type = Option<InboxMessage>)]
    message: Option<Value>,
}

/// A page of dead letters.
#[derive(Serialize, ToSchema)]
pub struct DeadLetterList {
    dead_letters: Vec<DeadLetterView>,
    /// Give as `after` for the next page.
    next_after: Option<i64>,
}

#[utoipa::path(
    get,
    path = "/api/v1/subscriptions/{id}/dead-letters",
    tag = "consume",
    summary = "List a subscription's dead letters",
    params(("id" = i64, Path, description = "The subscription's id"), DeadLetterPage),
    responses(
        (status = 200, description = "A page of dead letters", body = DeadLetterList),
        (status = 400, description = "A parameter that does not parse", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn dead_letters(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(page): ApiQuery<DeadLetterPage>,
) -> Result<Json<DeadLetterList>, Problem> {
    visible(&app, &caller, id).await?;
    let letters = app
        .store
        .dead_letters(
            id,
            page.after.unwrap_or(0),
            page.limit.unwrap_or(100).clamp(1, 1000),
        )
        .await?;
    let next = letters.last().map(|l| l.offset);
    let dead_letters = letters
        .iter()
        .map(|l| DeadLetterView {
            offset: l.offset,
            reason: l.reason.clone(),
            attempts: l.attempts,
            message: l.message.as_ref().map(message_json),
        })
        .collect();
    Ok(Json(DeadLetterList {
        dead_letters,
        next_after: next,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeadLetterSelection {
    /// Offsets to act on (at most 1000); absent: all of the subscription's dead letters.
    offsets: Option<Vec<i64>>,
}

/// How many dead letters a replay put back.
#[derive(Serialize, ToSchema)]
pub struct Replayed {
    replayed: u64,
}

/// How many dead letters a purge removed.
#[derive(Serialize, ToSchema)]
pub struct Purged {
    purged: u64,
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/dead-letters/replay",
    tag = "consume",
    summary = "Put dead letters back to be delivered again (owner or operator)",
    params(("id" = i64, Path, description = "The subscription's id")),
    request_body(content = Option<DeadLetterSelection>, description = "May be empty: all"),
    responses(
        (status = 200, description = "How many were put back", body = Replayed),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn replay_dead_letters(
    caller: Extension<Caller>,
    state: State<AppState>,
    id: ApiPath<i64>,
    bytes: Bytes,
) -> Result<Json<Replayed>, Problem> {
    let replayed = change_dead_letters(DeadLetterChange::Replay, caller, state, id, bytes).await?;
    Ok(Json(Replayed { replayed }))
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/dead-letters/purge",
    tag = "consume",
    summary = "Remove dead letters for good (owner or operator)",
    params(("id" = i64, Path, description = "The subscription's id")),
    request_body(content = Option<DeadLetterSelection>, description = "May be empty: all"),
    responses(
        (status = 200, description = "How many were removed", body = Purged),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
    )
)]
pub async fn purge_dead_letters(
    caller: Extension<Caller>,
    state: State<AppState>,
    id: ApiPath<i64>,
    bytes: Bytes,
) -> Result<Json<Purged>, Problem> {
    let purged = change_dead_letters(DeadLetterChange::Purge, caller, state, id, bytes).await?;
    Ok(Json(Purged { purged }))
}

/// Replays or purges the selected dead letters; how many.
async fn change_dead_letters(
    change: DeadLetterChange,
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    bytes: Bytes,
) -> Result<u64, Problem> {
    managed(&app, &caller, id).await?;
    let selection: DeadLetterSelection = body(&bytes)?;
    if selection
        .offsets
        .as_ref()
        .is_some_and(|o| o.len() > MAX_OFFSETS)
    {
        return Err(Problem::field(
            "offsets",
            format!("at most {MAX_OFFSETS} per request; leave it out for all"),
        ));
    }
    let changed = app
        .store
        .change_dead_letters(id, selection.offsets.as_deref(), change, app.clock.now())
        .await?;
    let action = change.action();
    let detail = Some(match &selection.offsets {
        Some(offsets) => format!("{} offset(s): {changed} changed", offsets.len()),
        None => format!("all: {changed} changed"),
    });
    let target = format!("subscription {id}");
    crate::http::audit::note(&app, &caller.principal, action, &target, detail).await;
    Ok(changed)
}
