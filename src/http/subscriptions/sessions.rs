//! Members: joining a pull subscription, keeping the session alive, leaving; and the check
//! every use of a session makes (`own_session`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{SESSION, consumer, existing, refused};
use crate::delivery::access::{self, Denied};
use crate::http::AppState;
use crate::http::api::{ApiPath, Caller, Problem, ProblemBody, json_body as body};
use crate::wsr::datetime::date_time_string;

const MAX_TTL_MS: u64 = 3_600_000;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct JoinBody {
    /// How long the session lives without a fetch or heartbeat: 100 to 3600000 ms (default
    /// from the configuration).
    ttl_ms: Option<u64>,
}

/// A consumer session.
#[derive(Serialize, ToSchema)]
pub struct SessionAnswer {
    session: String,
    subscription: i64,
    ttl_ms: i64,
    expires_at: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/subscriptions/{id}/sessions",
    tag = "consume",
    summary = "Join a pull subscription: a session to fetch with",
    params(("id" = i64, Path, description = "The subscription's id")),
    request_body(content = Option<JoinBody>, description = "May be empty"),
    responses(
        (status = 201, description = "Joined", body = SessionAnswer),
        (status = 400, description = "A field that is not valid", body = ProblemBody),
        (status = 404, description = "No such subscription", body = ProblemBody),
        (status = 409, description = "A push subscription has no pull members", body = ProblemBody),
        (status = 429, description = "The subscription has max_sessions_per_subscription sessions", body = ProblemBody),
    )
)]
pub async fn join(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    bytes: Bytes,
) -> Result<Response, Problem> {
    let request: JoinBody = body(&bytes)?;
    let sub = existing(&app, id).await?;
    access::may_join(&consumer(&caller), &sub.held()).map_err(|why| refused(why, &caller, &sub))?;
    let ttl = match request.ttl_ms {
        None => app.config.delivery.session_ttl,
        Some(ms) if (100..=MAX_TTL_MS).contains(&ms) => chrono::Duration::milliseconds(ms as i64),
        Some(_) => {
            return Err(Problem::field(
                "ttl_ms",
                format!("must be 100 to {MAX_TTL_MS}"),
            ));
        }
    };
    let session = app
        .admissions
        .join(
            id,
            &new_session_id()?,
            &caller.principal,
            ttl,
            app.clock.now(),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SessionAnswer {
            session: session.id,
            subscription: id,
            ttl_ms: session.ttl.num_milliseconds(),
            expires_at: date_time_string(&session.expires_at),
        }),
    )
        .into_response())
}

fn new_session_id() -> Result<String, Problem> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| {
        Problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "no randomness for a session id".into(),
        )
    })?;
    Ok(crate::hex::lower_hex(&bytes))
}

/// The live session `id` of `caller`, on a subscription `caller` still may use.
pub(super) async fn own_session(
    app: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<crate::store::delivery::Session, Problem> {
    let gone = || {
        Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no live session {id:?} (unknown or lapsed); join again"),
        )
    };
    let (session, sub) = app
        .store
        .member(id, app.clock.now())
        .await?
        .ok_or_else(gone)?;
    let who = consumer(caller);
    access::owns_session(&who, &session.principal).map_err(|_| {
        Problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("session {id:?} belongs to another principal"),
        )
    })?;
    access::may_join(&who, &sub.held()).map_err(|why| match why {
        Denied::Push => Problem(
            StatusCode::CONFLICT,
            "conflict",
            format!("session {id:?} is the gateway's own push worker"),
        ),
        other => refused(other, caller, &sub),
    })?;
    Ok(session)
}

/// A session kept alive.
#[derive(Serialize, ToSchema)]
pub struct HeartbeatAnswer {
    session: String,
    expires_at: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/sessions/{session}/heartbeat",
    tag = "consume",
    summary = "Keep a session alive",
    params(("session" = String, Path, description = SESSION)),
    responses(
        (status = 200, description = "Alive until expires_at", body = HeartbeatAnswer),
        (status = 404, description = "No live session of that id", body = ProblemBody),
        (status = 409, description = "The session is a push worker's", body = ProblemBody),
    )
)]
pub async fn heartbeat(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(session): ApiPath<String>,
) -> Result<Json<HeartbeatAnswer>, Problem> {
    own_session(&app, &caller, &session).await?;
    let expires_at = app.store.heartbeat(&session, app.clock.now()).await?;
    Ok(Json(HeartbeatAnswer {
        session,
        expires_at: date_time_string(&expires_at),
    }))
}

#[utoipa::path(
    delete,
    path = "/api/v1/sessions/{session}",
    tag = "consume",
    summary = "Leave: the session's leased messages go back to the others",
    params(("session" = String, Path, description = SESSION)),
    responses(
        (status = 204, description = "Left"),
        (status = 404, description = "No live session of that id", body = ProblemBody),
        (status = 409, description = "The session is a push worker's", body = ProblemBody),
    )
)]
pub async fn leave(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(session): ApiPath<String>,
) -> Result<StatusCode, Problem> {
    own_session(&app, &caller, &session).await?;
    app.store.leave(&session, app.clock.now()).await?;
    Ok(StatusCode::NO_CONTENT)
}
