//! `GET /api/v1/events`: state changes of outbound messages as server-sent events, read from
//! the store's event log; at most `MAX_EVENT_STREAMS` open per principal (`streams`).

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::api::{ApiQuery, Caller, Problem, ProblemBody};
use crate::outbound::view::{response_inline, response_url};
use crate::store::outbound::{OutEvent, RESPONSE_EVENT};
use crate::wsr::datetime::date_time_string;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// The event `seq` to start after (the last `id:` seen; default 0: from the start).
    after: Option<i64>,
}

/// The data of one `state` event of `GET /api/v1/events` (JSON).
#[derive(Serialize, ToSchema)]
pub struct StateEvent {
    seq: i64,
    /// The message's id.
    id: String,
    /// Its new state.
    state: String,
    detail: Option<String>,
    at: String,
}

/// A partner's business response kept with an outbound message (`outbound::view`): in the
/// message's JSON without its bytes; in `response` events and notify webhooks also inline
/// when at most 64 KiB (`body` when UTF-8 text, else `body_base64`).
#[derive(ToSchema)]
#[allow(dead_code)] // a description only: written by outbound::view
pub struct OutboundResponse {
    /// Its length in bytes.
    size: u64,
    /// Whether its Body is an application SOAP Fault.
    soap_fault: bool,
    received_at: String,
    /// The Content-Type it came with (a multipart/related answer stays one).
    content_type: String,
    /// Where to read it as received: `/api/v1/messages/{id}/response`.
    href: String,
    /// The response as text (events and notify webhooks, when small and UTF-8).
    body: Option<String>,
    /// The response base64-encoded (events and notify webhooks, when small and not UTF-8).
    body_base64: Option<String>,
}

/// The data of one `response` event of `GET /api/v1/events` (JSON): a partner's business
/// response to one of our messages was kept.
#[derive(Serialize, ToSchema)]
pub struct ResponseEvent {
    seq: i64,
    /// The message's id.
    id: String,
    at: String,
    /// The response: inline (`body` or `body_base64`) up to 64 KiB, else by its `href`.
    #[schema(value_type = OutboundResponse)]
    response: serde_json::Value,
}

/// One logged event as a server-sent event: a state change (`state`), or a kept business
/// response (`response`, read from the store to carry it inline when small).
async fn sse_event(store: &crate::store::Store, e: OutEvent) -> SseEvent {
    let event = SseEvent::default().id(e.seq.to_string());
    let at = date_time_string(&e.at);
    if e.state == RESPONSE_EVENT {
        let kept = store.out_response(&e.message_id).await.ok().flatten();
        let response = match &kept {
            Some(r) => response_inline(&e.message_id, r),
            // Gone since (or unreadable now): its link still says where it was.
            None => json!({ "href": response_url(&e.message_id) }),
        };
        let data = json!(ResponseEvent {
            seq: e.seq,
            id: e.message_id,
            at,
            response,
        });
        return event.event("response").data(data.to_string());
    }
    let data = json!(StateEvent {
        seq: e.seq,
        id: e.message_id,
        state: e.state,
        detail: e.detail,
        at,
    });
    event.event("state").data(data.to_string())
}

/// Server-sent events of state changes, from `after` on, as they happen: of the caller's own
/// messages (an operator: of all). At most `MAX_EVENT_STREAMS` open per principal.
#[utoipa::path(
    get,
    path = "/api/v1/events",
    tag = "produce",
    summary = "Follow state changes of outbound messages as server-sent events",
    description = "Events named `state`, each with `id:` its seq and `data:` a StateEvent as \
                   JSON, and events named `response` when a partner's business response to a \
                   message was kept, with `data:` a ResponseEvent (the response inline up to \
                   64 KiB, else its link); keep-alive comments between. The stream does not \
                   end by itself.",
    params(EventsQuery),
    responses(
        (status = 200, description = "A stream of `state` events (data: a StateEvent) and `response` events (data: a ResponseEvent)",
            content_type = "text/event-stream", body = String),
        (status = 400, description = "A query parameter that does not parse", body = ProblemBody),
        (status = 429, description = "The principal holds too many streams open", body = ProblemBody),
    )
)]
pub async fn events(
    Extension(caller): Extension<Caller>,
    State(app): State<AppState>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Sse<impl futures_core::Stream<Item = Result<SseEvent, Infallible>>>, Problem> {
    let slot = app.event_streams.take(&caller.principal).ok_or_else(|| {
        Problem(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-streams",
            format!(
                "{} holds {} event streams open already; close one first",
                caller.principal,
                app.event_streams.max()
            ),
        )
    })?;
    let store = app.store.clone();
    let start = q.after.unwrap_or(0);
    let pending: Vec<OutEvent> = Vec::new();
    let principal = caller.sees_outbound().map(str::to_owned);
    // The slot lives in the stream's state: it is given back when the stream is dropped.
    let stream = futures_util::stream::unfold(
        ((store, principal, slot), start, pending),
        |(own, mut after, mut pending)| async move {
            loop {
                let (store, principal, _slot) = &own;
                if let Some(e) = pending.pop() {
                    let event = sse_event(store, e).await;
                    return Some((Ok(event), (own, after, pending)));
                }
                match store.out_events_of(principal.as_deref(), after, 100).await {
                    Ok(batch) if !batch.is_empty() => {
                        after = batch.last().map_or(after, |e| e.seq);
                        pending = batch.into_iter().rev().collect();
                    }
                    // Nothing new: look again shortly (events are rare next to the messages).
                    _ => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
