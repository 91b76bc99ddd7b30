//! The HTTP surface: thin axum handlers only. `/wsr/{channel}` for partners' messages,
//! `/wsr/_callback` for their acks of ours, `/api/v1/*` for operators and applications,
//! `/healthz` and `/readyz`, `/metrics`, the operators' console at `/console`. Around every
//! request: its request id and span (`request_id.rs`) and its latency histogram.

mod admin;
pub mod api;
pub mod audit;
pub mod auth;
mod console;
mod events;
mod forwarded;
mod input;
pub mod messages;
pub mod openapi;
mod operator;
mod partners;
mod request_id;
mod scrape;
pub mod serve;
pub mod slots;
pub mod soap;
mod subscriptions;
pub mod tls;
mod wsr;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_util::future::{BoxFuture, Either};
use utoipa::OpenApi as _;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use crate::clock::Clock;
use crate::config::{Config, Scope};
use crate::delivery::receipt::ReceiptKey;
use crate::outbound::backend::Backends;
use crate::store::Store;
use auth::Door;
pub use console::ConsoleKey;

/// What every handler may use; one reference count to clone (a request clones it several
/// times on its way through the layers).
#[derive(Clone)]
pub struct AppState(Arc<AppContext>);

impl AppState {
    pub fn new(context: AppContext) -> AppState {
        AppState(Arc::new(context))
    }

    /// What the sender's settings tell of an outbound message's next poll.
    pub fn polling(&self) -> crate::outbound::view::Polling {
        crate::outbound::view::Polling {
            interval: self.config.poll_interval,
        }
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
    /// The SOAP services behind request-response channels (D16).
    pub backends: Backends,
    /// Signs and checks delivery receipts.
    pub receipts: Arc<ReceiptKey>,
    /// Signs and checks the console's sign-in cookies (derived from the receipts' secret).
    pub console_key: Arc<ConsoleKey>,
    /// Open `/api/v1/events` streams per principal.
    pub event_streams: Arc<slots::KeyedSlots>,
    /// Long-polling fetches waiting per principal.
    pub waiting_fetches: Arc<slots::KeyedSlots>,
    /// Subscriptions and sessions counted against their caps and created, one at a time.
    pub admissions: crate::consume::admit::Admissions,
    /// What this gateway's pushes found of each push subscription's webhook.
    pub push_health: crate::consume::push::PushHealthBook,
    /// The listener's certificate, when it serves TLS (its expiry is a gauge of `/metrics`).
    pub server_certificate: Option<tls::TlsReloader>,
    /// Bounds the refused console sign-ins written to the audit trail.
    pub audit_refusals: audit::RefusalLimiter,
}

/// Who may call an `/api/v1` route.
const PRODUCE: &[Scope] = &[Scope::Produce, Scope::Admin];
const CONSUME: &[Scope] = &[Scope::Consume, Scope::Admin];
const ADMIN: &[Scope] = &[Scope::Admin];

pub fn router(state: AppState) -> Router {
    // The codec enforces the exact limit with a clear fault; this only stops the read early.
    let body_limit = state.config.limits.max_bytes.saturating_add(1);
    let (api, document) = api(&state).split_for_parts();
    // Serialized once: the document is the same for every request.
    let document = openapi::Document(document.to_json().unwrap_or_default().into());
    Router::new()
        // Mostly taken by `Gateway` before the router; here for the rest (see `partner_door`).
        .route(
            CALLBACK_ROUTE,
            post(|State(app): State<AppState>, request: Request| {
                partner_post(app, Door::Callback, request)
            }),
        )
        .route(
            CHANNEL_ROUTE,
            post(|State(app): State<AppState>, request: Request| {
                partner_post(app, Door::Channel, request)
            }),
        )
        .merge(api.layer(Extension(document)))
        // The gateway's root is its console, for whoever opens it in a browser.
        .route(
            "/",
            get(|| async { axum::response::Redirect::to("/console") }),
        )
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(scrape::scrape))
        // The operators' console: HTML, its own cookie door (not a bearer token).
        .merge(console::router())
        .layer(DefaultBodyLimit::max(body_limit))
        // Outermost: every answer, a guard's 401 included, carries the request id, and
        // everything logged while handling it is inside its span.
        .layer(axum::middleware::from_fn(framed_route))
        .with_state(state)
}

/// The partners' route patterns: the router's routes, and the latency label of a request that
/// `Gateway` takes past the router (the same label either way).
const CHANNEL_ROUTE: &str = "/wsr/{channel}";
const CALLBACK_ROUTE: &str = "/wsr/_callback";

/// The gateway's HTTP service, as the listener (`serve`) calls it. A partner's `POST /wsr/…`
/// (one request per message: the gateway's hot path) goes straight to its handler, framed and
/// guarded as in the router; every other request goes through the router. Through the router
/// such a request cost 10 boxed futures and 14 clones of boxed services (its layers, the guard's
/// middleware, the extractors): going past it saves 38 of a message's 130 allocations and 2.4 %
/// of its instructions (`bench/instructions-per-message.sh`).
#[derive(Clone)]
pub struct Gateway {
    app: AppState,
    router: Router,
}

impl Gateway {
    pub fn new(state: AppState) -> Gateway {
        Gateway {
            router: router(state.clone()),
            app: state,
        }
    }
}

impl tower::Service<Request> for Gateway {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<RouteFuture<Infallible>, BoxFuture<'static, Result<Response, Infallible>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let Some(door) = partner_door(&request) else {
            return Either::Left(self.router.call(request));
        };
        let app = self.app.clone();
        Either::Right(Box::pin(async move {
            let route = match door {
                Door::Channel => CHANNEL_ROUTE,
                Door::Callback => CALLBACK_ROUTE,
            };
            Ok(framed(route, request, |request| partner_post(app, door, request)).await)
        }))
    }
}

/// The partners' route a request is for, when `Gateway` takes it past the router: a POST to
/// `/wsr/_callback`, or to `/wsr/{channel}` with a channel the router would pass on as it is
/// written (no escapes). Anything else — another method (405), a path the router decodes or
/// does not route (404) — is left to the router, so that both ways answer alike.
fn partner_door(request: &Request) -> Option<Door> {
    if request.method() != axum::http::Method::POST {
        return None;
    }
    match request.uri().path().strip_prefix("/wsr/")? {
        "_callback" => Some(Door::Callback),
        channel if !channel.is_empty() && !channel.contains(['/', '%']) => Some(Door::Channel),
        _ => None,
    }
}

/// A partner's POST: the guard (D14), then the handler of its route.
async fn partner_post(app: AppState, door: Door, request: Request) -> Response {
    let app = &app;
    auth::guarded(app, door, request, |request, admitted| async move {
        match door {
            Door::Channel => wsr::receive(app, request, admitted).await,
            Door::Callback => wsr::callback(app, request, admitted).await,
        }
    })
    .await
}

/// Every `/api/v1` route, each registered and documented by one `routes!` call (add routes
/// here and nowhere else: the `openapi` integration test holds the document to the router).
fn api(state: &AppState) -> OpenApiRouter<AppState> {
    // Every `/api/v1` route is guarded: the token and its scope are checked before any
    // extractor reads the path, query or body (401/403 first, never 400/415). The same
    // scopes write the route's security into the document.
    let guarded = |scopes: &'static [Scope], mut routes: UtoipaMethodRouter<AppState>| {
        openapi::document_guard(&mut routes.1, scopes);
        routes.2 = routes
            .2
            .route_layer(from_fn_with_state((state.clone(), scopes), require));
        routes
    };
    use {admin as a, messages as m, subscriptions as s};
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(guarded(PRODUCE, routes!(m::list_messages, m::submit)))
        .routes(guarded(PRODUCE, routes!(m::get_message)))
        .routes(guarded(PRODUCE, routes!(m::get_response)))
        .routes(guarded(PRODUCE, routes!(m::get_attempts)))
        .routes(guarded(ADMIN, routes!(operator::resend)))
        .routes(guarded(ADMIN, routes!(operator::fail)))
        .routes(guarded(ADMIN, routes!(operator::send_again)))
        .routes(guarded(PRODUCE, routes!(m::close_group)))
        .routes(guarded(PRODUCE, routes!(events::events)))
        .routes(guarded(
            ADMIN,
            routes!(
                a::list_callback_endpoints,
                a::add_callback_endpoint,
                a::remove_callback_endpoint
            ),
        ))
        .routes(guarded(
            ADMIN,
            routes!(
                a::list_push_endpoints,
                a::add_push_endpoint,
                a::remove_push_endpoint
            ),
        ))
        .routes(guarded(ADMIN, routes!(partners::list_partners)))
        .routes(guarded(ADMIN, routes!(audit::list)))
        .routes(guarded(ADMIN, routes!(a::list_groups)))
        .routes(guarded(ADMIN, routes!(a::get_group)))
        .routes(guarded(ADMIN, routes!(a::abort_group)))
        .routes(guarded(ADMIN, routes!(a::read_inbox)))
        .routes(guarded(CONSUME, routes!(s::list, s::create)))
        .routes(guarded(CONSUME, routes!(s::get, s::delete)))
        .routes(guarded(CONSUME, routes!(s::grant, s::revoke)))
        .routes(guarded(CONSUME, routes!(s::pause)))
        .routes(guarded(CONSUME, routes!(s::resume)))
        .routes(guarded(CONSUME, routes!(s::join)))
        .routes(guarded(CONSUME, routes!(s::dead_letters)))
        .routes(guarded(CONSUME, routes!(s::replay_dead_letters)))
        .routes(guarded(CONSUME, routes!(s::purge_dead_letters)))
        .routes(guarded(CONSUME, routes!(s::leave)))
        .routes(guarded(CONSUME, routes!(s::fetch)))
        .routes(guarded(CONSUME, routes!(s::heartbeat)))
        .routes(guarded(CONSUME, routes!(s::settle)))
        .routes(guarded(CONSUME, routes!(s::respond)))
        .routes(guarded(CONSUME, routes!(s::extend)))
        // The public shape of the API: no token (it tells nothing a client could not learn).
        .routes(routes!(openapi::openapi_json))
}

/// The guard of an `/api/v1` route: `authorize` the bearer token for `scopes`, and hand the
/// handler its `Caller` as a request extension; the request is not read any further otherwise.
async fn require(
    State((app, scopes)): State<(AppState, &'static [Scope])>,
    mut request: Request,
    next: Next,
) -> Response {
    match api::authorize(&app, request.headers(), scopes).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(problem) => problem.into_response(),
    }
}

/// The router's layer around every route: `framed`, with the route's pattern. One layer rather
/// than two: a `Router`'s layers wrap each route, and every layer clones the whole stack
/// beneath it for each request.
async fn framed_route(request: Request, next: Next) -> Response {
    // A shared pattern (cloning it copies no text).
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let route = route.as_ref().map_or("unmatched", |p| p.as_str());
    framed(route, request, |request| next.run(request)).await
}

/// Around every request: the request id and its span (`request_id::within`), and the request's
/// latency by route pattern (never the path: it holds ids), method and status class, until the
/// response head.
async fn framed<F, Fut>(route: &str, request: Request, handler: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let started = std::time::Instant::now();
    let method = match *request.method() {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::DELETE => "DELETE",
        axum::http::Method::HEAD => "HEAD",
        _ => "other",
    };
    let response = request_id::within(request, handler).await;
    crate::metrics::http_request(route, method, response.status().as_u16(), started.elapsed());
    response
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

#[cfg(test)]
mod tests {
    use super::*;

    fn door(method: &str, path: &str) -> Option<Door> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .expect("request");
        partner_door(&request)
    }

    #[test]
    fn only_partners_posts_to_a_plain_route_go_past_the_router() {
        assert_eq!(door("POST", "/wsr/default"), Some(Door::Channel));
        assert_eq!(door("POST", "/wsr/default?x=1"), Some(Door::Channel));
        assert_eq!(door("POST", "/wsr/_callback"), Some(Door::Callback));
        for (method, path) in [
            ("GET", "/wsr/default"),
            ("PUT", "/wsr/_callback"),
            ("POST", "/wsr/"),
            ("POST", "/wsr"),
            ("POST", "/wsr/default/"),
            ("POST", "/wsr/a/b"),
            ("POST", "/wsr/defa%75lt"),
            ("POST", "/wsrx/default"),
            ("POST", "/api/v1/messages"),
        ] {
            assert_eq!(door(method, path), None, "{method} {path}");
        }
    }
}
