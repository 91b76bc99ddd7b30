//! `/api/v1/messages`, `/api/v1/groups/{id}/close`, `/api/v1/events` for applications that send
//! through the gateway: parse → call the sending side (`outbound::submit`, the store's
//! outbound reads) → render.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::api::{ApiPath, ApiQuery, Caller, Problem, ProblemBody};
use super::input;
use super::openapi::OutboundMessage;
use crate::outbound::submit::{self, Refusal, Sending, Submitter};
use crate::outbound::view::{attempts_json, message_json};

/// The list filter of messages in doubt: their state is `sent`, with nothing more to send.
pub const IN_DOUBT: &str = "in_doubt";
use crate::store::outbound::{IdempotencyKey, OutFilter, OutMessage, SubmitError, Submitted};
use crate::wsr::GroupId;

fn invalid(field: &str, reason: impl Into<String>) -> Problem {
    Problem::field(field, reason.into())
}

/// The request header that makes a submit safe to retry (IETF httpapi
/// draft-ietf-httpapi-idempotency-key-header).
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Set (to `true`) on the answer to a retried submit: the message is the one stored before.
const IDEMPOTENT_REPLAYED: &str = "Idempotent-Replayed";

/// The `Idempotency-Key` of a request, if any: one header of 1–255 visible ASCII characters,
/// taken as it is (opaque).
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(IDEMPOTENCY_KEY, "give the header once"));
    }
    let key = value.as_bytes();
    if key.is_empty() || key.len() > 255 || !key.iter().all(|b| (0x21..=0x7E).contains(b)) {
        return Err(invalid(
            IDEMPOTENCY_KEY,
            "must be 1 to 255 visible ASCII characters (no spaces)",
        ));
    }
    Ok(Some(String::from_utf8_lossy(key).into_owned()))
}

/// The fingerprint of a submit request as the client sent it (IETF draft: of the request
/// payload): SHA-256, hex, of its JSON re-serialised with sorted keys, so that whitespace and
/// key order do not matter. Two requests with the same fingerprint ask for the same message.
fn fingerprint(request: &Value) -> String {
    crate::secrets::sha256_hex(request.to_string().as_bytes())
}

/// The API answer to a refused submission or group close.
fn submit_problem(e: SubmitError) -> Problem {
    match e {
        SubmitError::Conflict(why) => Problem(StatusCode::CONFLICT, "conflict", why),
        // 422 as the IETF draft asks for a key reused with a different request payload.
        SubmitError::KeyReused(why) => Problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            why,
        ),
        SubmitError::Store(e) => e.into(),
    }
}

#[utoipa::path(
    post,
    path = "/api/v1/messages",
    tag = "produce",
    summary = "Submit a message for the gateway to send reliably",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Makes the submit safe to retry: 1 to 255 visible ASCII characters")),
    request_body = super::openapi::SubmitBody,
    responses(
        (status = 202, description = "Stored; it is sent from here", body = SubmitAnswer,
            headers(("Idempotent-Replayed" = String, description = "`true` on a retried submit"))),
        (status = 400, description = "A field that is not valid (its name starts the reason)", body = ProblemBody),
        (status = 409, description = "The group cannot take it (closed, failed, another's)", body = ProblemBody),
        (status = 422, description = "The Idempotency-Key was used for a different request", body = ProblemBody),
    )
)]
pub async fn submit(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Problem> {
    let key = idempotency_key(&headers)?;
    let raw: Value = serde_json::from_slice(&body).map_err(|e| invalid("body", e.to_string()))?;
    // Read as a `Value` (for its fingerprint), so not through `json_body`: checked here.
    input::json(&raw)?;
    // Scoped by principal: applications cannot collide on (or probe) each other's keys.
    let idempotency = key.map(|key| IdempotencyKey {
        principal: caller.principal.clone(),
        key,
        fingerprint: fingerprint(&raw),
    });
    let submitter = Submitter {
        principal: caller.principal,
        operator: caller.admin,
    };
    let now = app.clock.now();
    let submitted = submit::submit(sending_of(&app), raw, submitter, idempotency, now)
        .await
        .map_err(|refusal| match refusal {
            Refusal::Invalid { field, reason } => invalid(&field, reason),
            Refusal::Store(e) => submit_problem(e),
        })?;
    Ok(submitted_answer(&submitted))
}

/// What submit preparation reads of the application.
pub(crate) fn sending_of(app: &AppState) -> Sending<'_> {
    Sending {
        store: &app.store,
        partners: &app.config.partners,
        destinations: &app.config.destinations,
        agreements: &app.config.agreements,
        default_agreement: &app.config.default_agreement,
        callback_url: &app.callback_url,
    }
}

/// The answer to a submit.
#[derive(Serialize, ToSchema)]
pub struct SubmitAnswer {
    id: String,
    group_id: String,
    /// The message's number in its group (absent for a singleton).
    number: Option<u64>,
    /// Where to follow its fate.
    status_url: String,
}

/// 202 with the message's id, group, number and status URL. A replay answers as the original
/// did, marked `Idempotent-Replayed`.
pub(super) fn submitted_answer(submitted: &Submitted) -> Response {
    let answer = SubmitAnswer {
        id: submitted.id.clone(),
        group_id: submitted.group_id.as_str().to_owned(),
        number: submitted.number,
        status_url: format!("/api/v1/messages/{}", submitted.id),
    };
    let mut response = (StatusCode::ACCEPTED, Json(answer)).into_response();
    if submitted.replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

#[utoipa::path(
    get,
    path = "/api/v1/messages/{id}",
    tag = "produce",
    summary = "One outbound message and its fate",
    params(("id" = String, Path, description = "The id the submit answered")),
    responses(
        (status = 200, description = "The message", body = OutboundMessage),
        (status = 404, description = "No such message (or another principal's)", body = ProblemBody),
    )
)]
pub async fn get_message(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, Problem> {
    let m = visible_message(&app, &caller, &id).await?;
    Ok(Json(message_json(&m, app.polling())))
}

#[utoipa::path(
    get,
    path = "/api/v1/messages/{id}/attempts",
    tag = "produce",
    summary = "An outbound message's story: every send and poll, with what the partner answered",
    description = "Each send of the message and each poll that asked about it: when, the \
                   partner's HTTP status (null: no answer came), what the answer said of this \
                   message (`ack`, `fault` with its code, `none`) and, for one that came to \
                   nothing, why (as `last_error` says it). The first 5 and the latest 20 are \
                   kept; `total` counts all, `omitted` those dropped between.",
    params(("id" = String, Path, description = "The id the submit answered")),
    responses(
        (status = 200, description = "Its attempts, oldest first", body = super::openapi::AttemptList),
        (status = 400, description = "A path that is not valid", body = ProblemBody),
        (status = 404, description = "No such message (or another principal's)", body = ProblemBody),
    )
)]
pub async fn get_attempts(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, Problem> {
    let m = visible_message(&app, &caller, &id).await?;
    let history = app.store.out_attempts(&m.id).await?;
    Ok(Json(attempts_json(&history)))
}

/// Message `id` if the caller may see it. Another principal's message answers as one that
/// does not exist: ids are no oracle.
async fn visible_message(app: &AppState, caller: &Caller, id: &str) -> Result<OutMessage, Problem> {
    let message = app.store.out_message(id).await?;
    let visible = |m: &OutMessage| {
        caller
            .sees_outbound()
            .is_none_or(|p| m.principal.as_deref() == Some(p))
    };
    message.filter(visible).ok_or_else(|| {
        Problem(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no message {id}"),
        )
    })
}

#[utoipa::path(
    get,
    path = "/api/v1/messages/{id}/response",
    tag = "produce",
    summary = "The partner's business response to an outbound message, as received",
    description = "When a partner answers one of our messages with a non-empty SOAP Body — a \
                   business response or an application SOAP Fault, with or without the ack, \
                   plain or as the root part of a multipart/related answer — the gateway \
                   keeps the answer (up to `max_message_bytes`) with the message. This \
                   returns it byte for byte with the Content-Type it came with; the message's \
                   `response` field says whether there is one.",
    params(("id" = String, Path, description = "The id the submit answered")),
    responses(
        (status = 200, description = "The partner's answer as received, with its Content-Type",
            content(
                (String = "text/xml"),
                (String = "application/soap+xml"),
                (String = "multipart/related")
            )),
        (status = 404, description = "No such message (or another principal's), or no business response kept for it", body = ProblemBody),
    )
)]
pub async fn get_response(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, Problem> {
    let m = visible_message(&app, &caller, &id).await?;
    let Some(kept) = app.store.out_response(&m.id).await? else {
        return Err(Problem(
            StatusCode::NOT_FOUND,
            "no-response",
            format!("message {id} has no business response (none received, or none yet)"),
        ));
    };
    // Stored as a header value it came as; anything else is served as opaque bytes.
    let content_type = HeaderValue::from_str(&kept.info.content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    Ok(([(CONTENT_TYPE, content_type)], kept.body).into_response())
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only messages in this state; `in_doubt`: sent, no verdict, nothing more to send (only
    /// polls settle them).
    #[param(pattern = "^(queued|sent|in_doubt|acked|faulted|failed)$")]
    state: Option<String>,
    /// Only messages of this groupId.
    group: Option<String>,
    /// Only messages to this configured partner (empty: those sent to a URL destination).
    partner: Option<String>,
    /// The id to list after (the previous page's `next_after`).
    after: Option<String>,
    /// `oldest` first (the default) or `newest` first (then `after` pages on to older ones).
    #[param(pattern = "^(oldest|newest)$")]
    order: Option<String>,
    /// 1 to 1000 (default 100; values beyond are clamped).
    limit: Option<i64>,
}

/// A page of outbound messages.
#[derive(Serialize, ToSchema)]
pub struct MessageList {
    #[schema(value_type = Vec<OutboundMessage>)]
    messages: Vec<Value>,
    /// Give as `after` for the next page.
    next_after: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/messages",
    tag = "produce",
    summary = "List outbound messages (the caller's own; an operator: all), oldest first or newest first",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of messages", body = MessageList),
        (status = 400, description = "A query parameter that is not valid", body = ProblemBody),
    )
)]
pub async fn list_messages(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<MessageList>, Problem> {
    if let Some(state) = &q.state
        && !["queued", "sent", IN_DOUBT, "acked", "faulted", "failed"].contains(&state.as_str())
    {
        return Err(invalid("state", format!("unknown state {state:?}")));
    }
    let newest_first = match q.order.as_deref() {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(other) => {
            return Err(invalid(
                "order",
                format!("unknown order {other:?}: oldest or newest"),
            ));
        }
    };
    let in_doubt = q.state.as_deref() == Some(IN_DOUBT);
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let messages = app
        .store
        .out_messages_of(
            &OutFilter {
                principal: caller.sees_outbound(),
                state: q.state.as_deref().filter(|_| !in_doubt),
                group: q.group.as_deref(),
                partner: q.partner.as_deref(),
                in_doubt,
                newest_first,
            },
            q.after.as_deref(),
            limit,
        )
        .await?;
    let next = messages.last().map(|m| m.id.clone());
    let polling = app.polling();
    let messages = messages.iter().map(|m| message_json(m, polling)).collect();
    Ok(Json(MessageList {
        messages,
        next_after: next,
    }))
}

/// The answer to a group close.
#[derive(Serialize, ToSchema)]
pub struct ClosedGroup {
    group_id: String,
    /// The number of the message now marked `last` (absent when there was none to mark).
    last: Option<u64>,
}

#[utoipa::path(
    post,
    path = "/api/v1/groups/{id}/close",
    tag = "produce",
    summary = "Mark an outbound group's latest message last, if it is not sent yet",
    params(("id" = String, Path, description = "The groupId")),
    responses(
        (status = 200, description = "Closed", body = ClosedGroup),
        (status = 400, description = "Not a valid groupId", body = ProblemBody),
        (status = 409, description = "The group cannot be closed so", body = ProblemBody),
    )
)]
pub async fn close_group(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ClosedGroup>, Problem> {
    let group_id = GroupId::parse(&id).map_err(|why| invalid("id", why))?;
    let last = app
        .store
        .close_group(&group_id, caller.sees_outbound())
        .await
        .map_err(submit_problem)?;
    Ok(Json(ClosedGroup { group_id: id, last }))
}
