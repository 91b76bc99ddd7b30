//! The HTTP surface: thin axum handlers only. For now the health endpoints; `/wsr/*` and
//! `/api/v1/*` arrive with the receiver.

use axum::Router;
use axum::routing::get;

pub fn router() -> Router {
    Router::new()
        .route("/healthz", get(health))
        .route("/readyz", get(health))
}

async fn health() -> &'static str {
    "ok\n"
}
