//! The HTTP surface: thin axum handlers only. `/wsr/{channel}` for partners' messages,
//! `/wsr/_callback` for their acks of ours, `/api/v1/*` for operators and applications,
//! `/healthz` and `/readyz`.

mod admin;
pub mod messages;
pub mod soap;
mod wsr;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::clock::Clock;
use crate::config::Config;
use crate::store::Store;

/// What every handler may use; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<Config>,
    pub clock: Arc<dyn Clock>,
    /// The ReplyTo of our own Callback-pattern messages.
    pub callback_url: String,
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
        .route(
            "/api/v1/callback-endpoints",
            get(admin::list_endpoints)
                .post(admin::add_endpoint)
                .delete(admin::remove_endpoint),
        )
        .route("/api/v1/groups", get(admin::list_groups))
        .route("/api/v1/groups/{id}", get(admin::get_group))
        .route("/api/v1/inbox", get(admin::read_inbox))
        .route("/healthz", get(health))
        .route("/readyz", get(health))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

async fn health() -> &'static str {
    "ok\n"
}
