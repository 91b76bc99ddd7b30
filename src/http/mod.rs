//! The HTTP surface: thin axum handlers only. `/wsr/{channel}` for partners' messages,
//! `/wsr/_callback` for their acks of ours, `/api/v1/*` for operators and applications,
//! `/healthz` and `/readyz`, `/metrics`. Around every request: its request id and span
//! (`request_id.rs`) and its latency histogram.

mod admin;
pub mod auth;
mod forwarded;
pub mod messages;
mod operator;
mod request_id;
mod scrape;
pub mod serve;
pub mod soap;
pub mod streams;
mod subscriptions;
pub mod tls;
mod wsr;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};

use crate::clock::Clock;
use crate::config::{Config, Scope};
use crate::delivery::receipt::ReceiptKey;
use crate::store::delivery::DeadLetterChange;
use crate::store::{Endpoints, Store};

/// What every handler may use; one reference count to clone (a request clones it several
/// times on its way through the layers).
#[derive(Clone)]
pub struct AppState(Arc<AppContext>);

impl AppState {
    pub fn new(context: AppContext) -> AppState {
        AppState(Arc::new(context))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppContext;

    fn deref(&self) -> &AppContext {
        &self.0
    }
}

/// The contents of an `AppState`.
pub struct AppContext {
    pub store: Store,
    pub config: Arc<Config>,
    pub clock: Arc<dyn Clock>,
    /// The ReplyTo of our own Callback-pattern messages.
    pub callback_url: String,
    /// Signs and checks delivery receipts.
    pub receipts: Arc<ReceiptKey>,
    /// Open `/api/v1/events` streams per principal.
    pub event_streams: Arc<streams::StreamSlots>,
}

/// Who may call an `/api/v1` route.
const PRODUCE: &[Scope] = &[Scope::Produce, Scope::Admin];
const CONSUME: &[Scope] = &[Scope::Consume, Scope::Admin];
const ADMIN: &[Scope] = &[Scope::Admin];

pub fn router(state: AppState) -> Router {
    // The codec enforces the exact limit with a clear fault; this only stops the read early.
    let body_limit = state.config.limits.max_bytes.saturating_add(1);
    // Every `/api/v1` route is guarded: the token and its scope are checked before any
    // extractor reads the path, query or body (401/403 first, never 400/415).
    let api = |scopes: &'static [Scope], route: MethodRouter<AppState>| {
        route.route_layer(from_fn_with_state((state.clone(), scopes), require))
    };
    // Partners are identified before any extractor reads the body (D14).
    let partners = |door: auth::Door, route: MethodRouter<AppState>| {
        route.route_layer(from_fn_with_state((state.clone(), door), auth::guard))
    };
    Router::new()
        .route(
            "/wsr/_callback",
            partners(auth::Door::Callback, post(messages::callback)),
        )
        .route(
            "/wsr/{channel}",
            partners(auth::Door::Channel, post(wsr::receive)),
        )
        .route(
            "/api/v1/messages",
            api(PRODUCE, get(messages::list_messages).post(messages::submit)),
        )
        .route(
            "/api/v1/messages/{id}",
            api(PRODUCE, get(messages::get_message)),
        )
        .route(
            "/api/v1/messages/{id}/resend",
            api(ADMIN, post(operator::resend)),
        )
        .route(
            "/api/v1/messages/{id}/fail",
            api(ADMIN, post(operator::fail)),
        )
        .route(
            "/api/v1/groups/{id}/close",
            api(PRODUCE, post(messages::close_group)),
        )
        .route("/api/v1/events", api(PRODUCE, get(messages::events)))
        .route(
            "/api/v1/callback-endpoints",
            api(ADMIN, endpoints(Endpoints::Callback)),
        )
        .route(
            "/api/v1/push-endpoints",
            api(ADMIN, endpoints(Endpoints::Push)),
        )
        .route("/api/v1/groups", api(ADMIN, get(admin::list_groups)))
        .route("/api/v1/groups/{id}", api(ADMIN, get(admin::get_group)))
        .route("/api/v1/inbox", api(ADMIN, get(admin::read_inbox)))
        .route(
            "/api/v1/subscriptions",
            api(
                CONSUME,
                get(subscriptions::list).post(subscriptions::create),
            ),
        )
        .route(
            "/api/v1/subscriptions/{id}",
            api(
                CONSUME,
                get(subscriptions::get).delete(subscriptions::delete),
            ),
        )
        .route(
            "/api/v1/subscriptions/{id}/grants/{principal}",
            api(
                CONSUME,
                axum::routing::put(subscriptions::grant).delete(subscriptions::revoke),
            ),
        )
        .route(
            "/api/v1/subscriptions/{id}/sessions",
            api(CONSUME, post(subscriptions::join)),
        )
        .route(
            "/api/v1/subscriptions/{id}/dead-letters",
            api(CONSUME, get(subscriptions::dead_letters)),
        )
        .route(
            "/api/v1/subscriptions/{id}/dead-letters/replay",
            api(
                CONSUME,
                post(|c, s, p, b| {
                    subscriptions::change_dead_letters(DeadLetterChange::Replay, c, s, p, b)
                }),
            ),
        )
        .route(
            "/api/v1/subscriptions/{id}/dead-letters/purge",
            api(
                CONSUME,
                post(|c, s, p, b| {
                    subscriptions::change_dead_letters(DeadLetterChange::Purge, c, s, p, b)
                }),
            ),
        )
        .route(
            "/api/v1/sessions/{session}",
            api(CONSUME, axum::routing::delete(subscriptions::leave)),
        )
        .route(
            "/api/v1/sessions/{session}/fetch",
            api(CONSUME, post(subscriptions::fetch)),
        )
        .route(
            "/api/v1/sessions/{session}/heartbeat",
            api(CONSUME, post(subscriptions::heartbeat)),
        )
        .route("/api/v1/settle", api(CONSUME, post(subscriptions::settle)))
        .route("/api/v1/extend", api(CONSUME, post(subscriptions::extend)))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(scrape::scrape))
        .layer(DefaultBodyLimit::max(body_limit))
        // Outermost: every answer, a guard's 401 included, carries the request id, and
        // everything logged while handling it is inside its span.
        .layer(axum::middleware::from_fn(timed))
        .layer(axum::middleware::from_fn(request_id::layer))
        .with_state(state)
}

/// The guard of an `/api/v1` route: `authorize` the bearer token for `scopes`, and hand the
/// handler its `Caller` as a request extension; the request is not read any further otherwise.
async fn require(
    State((app, scopes)): State<(AppState, &'static [Scope])>,
    mut request: Request,
    next: Next,
) -> Response {
    match admin::authorize(&app, request.headers(), scopes).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(problem) => problem.into_response(),
    }
}

/// Records the request's latency by route pattern (never the path: it holds ids), method and
/// status class, until the response head.
async fn timed(request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = match *request.method() {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::DELETE => "DELETE",
        axum::http::Method::HEAD => "HEAD",
        _ => "other",
    };
    let response = next.run(request).await;
    crate::metrics::http_request(route, method, response.status().as_u16(), started.elapsed());
    response
}

/// List, register and remove one kind of registered endpoint.
fn endpoints(kind: Endpoints) -> MethodRouter<AppState> {
    get(move |s| admin::list_endpoints(kind, s))
        .post(move |s, b| admin::add_endpoint(kind, s, b))
        .delete(move |s, q, b| admin::remove_endpoint(kind, s, q, b))
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
