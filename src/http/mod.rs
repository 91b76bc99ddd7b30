//! The HTTP surface: thin axum handlers only. `/wsr/{channel}` for partners, `/api/v1/*` for
//! operators, `/healthz` and `/readyz`.

mod admin;
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
}

pub fn router(state: AppState) -> Router {
    // The codec enforces the exact limit with a clear fault; this only stops the read early.
    let body_limit = state.config.limits.max_bytes.saturating_add(1);
    Router::new()
        .route("/wsr/{channel}", post(wsr::receive))
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
