//! The HTTP surface: thin axum handlers only. `/wsr/{channel}` for partners' messages,
//! `/wsr/_callback` for their acks of ours, `/api/v1/*` for operators and applications,
//! `/healthz` and `/readyz`.

mod admin;
pub mod messages;
pub mod serve;
pub mod soap;
mod subscriptions;
mod wsr;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{MethodRouter, get, post};

use crate::clock::Clock;
use crate::config::Config;
use crate::delivery::receipt::ReceiptKey;
use crate::store::delivery::DeadLetterChange;
use crate::store::{Endpoints, Store};

/// What every handler may use; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<Config>,
    pub clock: Arc<dyn Clock>,
    /// The ReplyTo of our own Callback-pattern messages.
    pub callback_url: String,
    /// Signs and checks delivery receipts.
    pub receipts: Arc<ReceiptKey>,
}

pub fn router(state: AppState) -> Router {
    // The codec enforces the exact limit with a clear fault; this only stops the read early.
    let body_limit = state.config.limits.max_bytes.saturating_add(1);
    Router::new()
        .route("/wsr/_callback", post(messages::callback))
        .route("/wsr/{channel}", post(wsr::receive))
        .route(
            "/api/v1/messages",
            get(messages::list_messages).post(messages::submit),
        )
        .route("/api/v1/messages/{id}", get(messages::get_message))
        .route("/api/v1/groups/{id}/close", post(messages::close_group))
        .route("/api/v1/events", get(messages::events))
        .route("/api/v1/callback-endpoints", endpoints(Endpoints::Callback))
        .route("/api/v1/push-endpoints", endpoints(Endpoints::Push))
        .route("/api/v1/groups", get(admin::list_groups))
        .route("/api/v1/groups/{id}", get(admin::get_group))
        .route("/api/v1/inbox", get(admin::read_inbox))
        .route(
            "/api/v1/subscriptions",
            get(subscriptions::list).post(subscriptions::create),
        )
        .route(
            "/api/v1/subscriptions/{id}",
            get(subscriptions::get).delete(subscriptions::delete),
        )
        .route(
            "/api/v1/subscriptions/{id}/grants/{principal}",
            axum::routing::put(subscriptions::grant).delete(subscriptions::revoke),
        )
        .route(
            "/api/v1/subscriptions/{id}/sessions",
            post(subscriptions::join),
        )
        .route(
            "/api/v1/subscriptions/{id}/dead-letters",
            get(subscriptions::dead_letters),
        )
        .route(
            "/api/v1/subscriptions/{id}/dead-letters/replay",
            post(|s, h, p, b| {
                subscriptions::change_dead_letters(DeadLetterChange::Replay, s, h, p, b)
            }),
        )
        .route(
            "/api/v1/subscriptions/{id}/dead-letters/purge",
            post(|s, h, p, b| {
                subscriptions::change_dead_letters(DeadLetterChange::Purge, s, h, p, b)
            }),
        )
        .route(
            "/api/v1/sessions/{session}",
            axum::routing::delete(subscriptions::leave),
        )
        .route(
            "/api/v1/sessions/{session}/fetch",
            post(subscriptions::fetch),
        )
        .route(
            "/api/v1/sessions/{session}/heartbeat",
            post(subscriptions::heartbeat),
        )
        .route("/api/v1/settle", post(subscriptions::settle))
        .route("/api/v1/extend", post(subscriptions::extend))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// List, register and remove one kind of registered endpoint.
fn endpoints(kind: Endpoints) -> MethodRouter<AppState> {
    get(move |s, h| admin::list_endpoints(kind, s, h))
        .post(move |s, h, b| admin::add_endpoint(kind, s, h, b))
        .delete(move |s, h, q| admin::remove_endpoint(kind, s, h, q))
}

/// Alive: the process answers.
async fn health() -> &'static str {
    "ok\n"
}

/// Ready: the store can commit, so messages sent now can be acknowledged. 503 with the
/// reason otherwise (writer stopped, disk full, corrupt database), so that a load balancer
/// stops sending partners here.
async fn ready(
    axum::extract::State(app): axum::extract::State<AppState>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match app.store.readiness().await {
        Ok(()) => "ok\n".into_response(),
        Err(reason) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: the store cannot commit: {reason}\n"),
        )
            .into_response(),
    }
}
