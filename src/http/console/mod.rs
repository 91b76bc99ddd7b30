//! The operators' web console at `/console`: server-rendered HTML (no script, one embedded
//! stylesheet), behind an admin token. This file holds the routes and the door: the login
//! that checks an admin token as the API does and answers a signed sign-in cookie
//! (`session.rs`: never the token itself; every gateway of a cluster accepts it, no session
//! table), the log-out that records the sign-in as signed out in the store (so a copy of the
//! cookie is refused by every gateway), the check of that cookie on every request, and the
//! same-origin check on every POST. The pages are `pages/`; they only call the store and
//! `outbound::operator`, as the API's handlers do.

mod html;
mod pages;
mod session;

pub use session::ConsoleKey;

use axum::Router;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::AppState;
use super::api::{Caller, authorized_token, caller_of};
use crate::config::Scope;

/// The sign-in cookie (`session::sign`).
const COOKIE: &str = "wsr_console";

/// The longest cookie value read (a sign-in is about 120 bytes).
const MAX_COOKIE_BYTES: usize = 1024;

/// The longest token the login form takes (configured tokens are far shorter).
const MAX_TOKEN_BYTES: usize = 512;

/// The console's routes (outside `/api/v1`: not in the OpenAPI document).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(pages::overview))
        .route("/console/console.css", get(stylesheet))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .route("/console/messages", get(pages::messages))
        .route("/console/message", get(pages::message))
        .route("/console/message/envelope", get(pages::envelope))
        .route("/console/message/response", get(pages::response))
        .route("/console/message/resend", post(pages::resend))
        .route("/console/message/fail", post(pages::fail))
        .route("/console/message/send-again", post(pages::send_again))
        .route("/console/partners", get(pages::partners))
        .route("/console/groups", get(pages::groups))
        .route("/console/group", get(pages::group))
        .route("/console/group/abort", post(pages::abort_group))
        .route("/console/inbox", get(pages::inbox))
        .route("/console/inbox/message", get(pages::inbox_message))
        .route("/console/inbox/message/payload", get(pages::inbox_payload))
        .route("/console/subscriptions", get(pages::subscriptions))
        .route("/console/subscription", get(pages::subscription))
        .route(
            "/console/subscription/dead-letters",
            post(pages::change_dead_letters),
        )
        .route("/console/subscription/push", post(pages::change_push))
        .route("/console/endpoints", get(pages::endpoints))
        .route("/console/audit", get(pages::audit))
}

async fn stylesheet() -> Response {
    let mut response = include_str!("console.css").into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// A signed-in operator: a sign-in cookie whose admin token is still configured, now, and
/// whose sign-in was not signed out (the store says, for every gateway of a cluster).
/// Without it the answer is the login page (401); 503 when the store cannot say.
pub struct Operator(pub Caller);

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Response> {
        let Some(value) = cookie_value(&parts.headers) else {
            return Err(login_page(app, StatusCode::UNAUTHORIZED, None));
        };
        let signed_in =
            session::verify(&app.console_key, value, &app.config.tokens, app.clock.now())
                .map_err(|why| login_page(app, StatusCode::UNAUTHORIZED, Some(why.to_string())))?;
        // Only a cookie we signed costs a read.
        match app.store.console_signed_out(signed_in.nonce.as_str()).await {
            Ok(false) => Ok(Operator(caller_of(signed_in.token))),
            Ok(true) => Err(login_page(
                app,
                StatusCode::UNAUTHORIZED,
                Some(session::SignInError::SignedOut.to_string()),
            )),
            Err(e) => Err(store_unavailable(
                &e,
                "the store could not check the sign-in; try again",
                false,
            )),
        }
    }
}

/// The 503 page when the store fails the door (`signed_in`: with the navigation and the
/// log-out button, to try again).
fn store_unavailable(e: &dyn std::fmt::Display, why: &str, signed_in: bool) -> Response {
    crate::store::health::log_store_failure("console answered 503", e);
    html::page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Store unavailable",
        &html::error(why),
        signed_in,
    )
}

/// A POST that may change something: the operator, and a request that comes from the
/// console's own pages (Origin, or else Referer, naming this Host). Anything else is 403
/// before the body is read: a page elsewhere cannot make a signed-in browser act.
pub struct Acting(pub Caller);

impl FromRequestParts<AppState> for Acting {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Response> {
        same_origin(&parts.headers, forwarded_host(&parts.extensions))
            .map_err(IntoResponse::into_response)?;
        let Operator(caller) = Operator::from_request_parts(parts, app).await?;
        Ok(Acting(caller))
    }
}

/// The host a trusted proxy says the client asked for (`[trusted_proxy] host_header`).
fn forwarded_host(extensions: &axum::http::Extensions) -> Option<&str> {
    extensions
        .get::<super::serve::ForwardedHost>()
        .map(|h| h.0.as_str())
}

/// The CSRF check: Origin (or, when a browser sends none, Referer) must name the host the
/// request was sent to: `Host`, or the host a trusted proxy that rewrites `Host` names.
/// Browsers set both and a page cannot forge them.
fn same_origin(headers: &HeaderMap, forwarded_host: Option<&str>) -> Result<(), html::Stop> {
    let forbidden = |why: &str| -> html::Stop {
        html::page(StatusCode::FORBIDDEN, "Forbidden", &html::error(why), false).into()
    };
    let host = forwarded_host
        .or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok()))
        .ok_or_else(|| forbidden("the request names no Host"))?;
    let authority_of = |url: &str| -> Option<String> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))?;
        Some(rest.split('/').next().unwrap_or("").to_ascii_lowercase())
    };
    let origin = match headers.get(header::ORIGIN) {
        Some(origin) => origin.to_str().ok().and_then(authority_of),
        None => headers
            .get(header::REFERER)
            .and_then(|r| r.to_str().ok())
            .and_then(authority_of),
    };
    match origin {
        Some(authority) if authority == host.to_ascii_lowercase() => Ok(()),
        Some(_) => Err(forbidden(
            "this form was not sent from the console's own pages",
        )),
        None => Err(forbidden(
            "the request carries neither Origin nor Referer; send it from the console",
        )),
    }
}

/// The console cookie's value, if the request carries one of a sane length.
fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .find(|value| !value.is_empty() && value.len() <= MAX_COOKIE_BYTES)
}

/// The cookie: the browser sends it only to `/console`, never to a script, never from
/// another site's page, and only over TLS when the browser reached us by TLS (our listener's,
/// or a TLS-terminating proxy's: the browser's `Origin` says `https`).
fn cookie(app: &AppState, headers: &HeaderMap, value: &str, max_age: Option<u32>) -> HeaderValue {
    let https = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("https://"));
    let secure = if app.config.tls.is_some() || https {
        "; Secure"
    } else {
        ""
    };
    let age = max_age.map_or(String::new(), |s| format!("; Max-Age={s}"));
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/console{secure}{age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("wsr_console=; Max-Age=0"))
}

/// The cookie's Max-Age: the sign-in's own lifetime, so the browser drops it then too.
fn session_seconds() -> u32 {
    u32::try_from(session::LIFETIME_HOURS * 3600).unwrap_or(u32::MAX)
}

fn login_page(app: &AppState, status: StatusCode, problem: Option<String>) -> Response {
    let mut body = String::new();
    let admin_configured = app
        .config
        .tokens
        .iter()
        .any(|t| t.scopes.contains(&Scope::Admin));
    if !admin_configured {
        // Nobody can sign in: say so, and how to make it possible.
        body.push_str(&html::error(
            "No admin token is configured, so nobody can sign in. Start the gateway with \
             WSR_ADMIN_TOKEN=<a long random token> in its environment, or add a [[tokens]] \
             entry with scopes = [\"admin\"] to its configuration file, then sign in with \
             that token.",
        ));
    }
    if let Some(problem) = problem {
        body.push_str(&html::error(&format!("Not signed in: {problem}")));
    }
    body.push_str(
        "<p>Sign in with an API token that has the <code>admin</code> scope. The console \
         keeps a signed sign-in for this site (not the token) for 12 hours or until you log \
         out, checked against the configured tokens on every page.</p>\
         <form method=\"post\" action=\"/console/login\">\
         <label for=\"token\">Admin token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required>\
         <button type=\"submit\">Log in</button></form>",
    );
    html::page(status, "Log in", &body, false)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// `POST /console/login`: an admin token becomes the console cookie; any other answer is
/// the login page again, with the reason (never the token).
async fn login(
    State(app): State<AppState>,
    host: Option<axum::Extension<super::serve::ForwardedHost>>,
    headers: HeaderMap,
    form: Result<axum::Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if let Err(refused) = same_origin(&headers, host.as_ref().map(|h| h.0.0.as_str())) {
        return refused.into_response();
    }
    let Ok(axum::Form(form)) = form else {
        return login_page(&app, StatusCode::BAD_REQUEST, Some("give a token".into()));
    };
    let token = form.token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        let why = "unknown token";
        super::audit::note_refused(&app, "(unknown)", "console_sign_in", "console", why).await;
        return login_page(&app, StatusCode::UNAUTHORIZED, Some(why.into()));
    }
    let configured = match authorized_token(&app, token, &[Scope::Admin]).await {
        Ok(configured) => configured,
        Err(super::api::Problem(_, _, why)) => {
            // Who tried is unknown (a token that is not an admin's names nobody we trust).
            super::audit::note_refused(&app, "(unknown)", "console_sign_in", "console", &why).await;
            return login_page(&app, StatusCode::UNAUTHORIZED, Some(why));
        }
    };
    let Some(nonce) = session::Nonce::fresh() else {
        return login_page(
            &app,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("no randomness for a sign-in; try again".into()),
        );
    };
    super::audit::note(
        &app,
        &configured.principal,
        "console_sign_in",
        "console",
        None,
    )
    .await;
    let signed = session::sign(&app.console_key, configured, &nonce, app.clock.now());
    let mut response = pages::see_other("/console");
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie(&app, &headers, &signed, Some(session_seconds())),
    );
    response
}

/// `POST /console/logout` (same-origin only, so another site cannot sign an operator out
/// either): the sign-in the cookie holds is recorded as signed out in the store, so that no
/// gateway takes the cookie again, a copy of it included; then the cookie is cleared. A
/// cookie we did not sign, or one already ended, records nothing (nobody can fill the table
/// with made-up sign-ins). When the store cannot record it, the answer is 503 and the cookie
/// stays, so the operator can log out again.
async fn logout(
    State(app): State<AppState>,
    host: Option<axum::Extension<super::serve::ForwardedHost>>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = same_origin(&headers, host.as_ref().map(|h| h.0.0.as_str())) {
        return refused.into_response();
    }
    let signed_in = cookie_value(&headers).and_then(|value| {
        session::genuine(&app.console_key, value, &app.config.tokens, app.clock.now()).ok()
    });
    if let Some(signed_in) = signed_in {
        let recorded = app
            .store
            .sign_out_console(signed_in.nonce.as_str(), signed_in.expires)
            .await;
        if let Err(e) = recorded {
            return store_unavailable(
                &e,
                "Not signed out: the store could not record it, so the sign-in still holds. \
                 Log out again.",
                true,
            );
        }
        super::audit::note(
            &app,
            &signed_in.token.principal,
            "console_sign_out",
            "console",
            None,
        )
        .await;
    }
    let mut response = login_page(&app, StatusCode::OK, None);
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie(&app, &headers, "", Some(0)));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(name.clone(), HeaderValue::from_str(value).expect("value"));
        }
        h
    }

    fn same_origin_here(h: &HeaderMap) -> Result<(), html::Stop> {
        same_origin(h, None)
    }

    #[test]
    fn behind_a_proxy_that_rewrites_host_the_forwarded_host_is_the_origin_to_match() {
        let rewritten = (header::HOST, "127.0.0.1:8080");
        let browser = (header::ORIGIN, "https://gw.example");
        let h = headers(&[rewritten, browser]);
        assert!(same_origin(&h, None).is_err(), "Host alone does not match");
        assert!(same_origin(&h, Some("gw.example")).is_ok());
        assert!(same_origin(&h, Some("evil.example")).is_err());
    }

    #[test]
    fn a_post_must_come_from_the_same_origin() {
        let host = (header::HOST, "gw.example:8080");
        assert!(same_origin_here(&headers(std::slice::from_ref(&host))).is_err());
        let ours = (header::ORIGIN, "http://gw.example:8080");
        assert!(same_origin_here(&headers(&[host.clone(), ours])).is_ok());
        let theirs = (header::ORIGIN, "https://evil.example");
        assert!(same_origin_here(&headers(&[host.clone(), theirs])).is_err());
        let null = (header::ORIGIN, "null");
        assert!(same_origin_here(&headers(&[host.clone(), null])).is_err());
        let referer = (header::REFERER, "https://GW.example:8080/console/messages");
        assert!(same_origin_here(&headers(&[host.clone(), referer])).is_ok());
        let lookalike = (header::REFERER, "http://gw.example:8080.evil.example/");
        assert!(same_origin_here(&headers(&[host, lookalike])).is_err());
    }

    #[test]
    fn the_sign_in_is_found_among_other_cookies_and_an_empty_or_huge_one_is_none() {
        let h = headers(&[(
            header::COOKIE,
            &format!("other=1; {COOKIE}=v1.x.y.z; more=2"),
        )]);
        assert_eq!(cookie_value(&h), Some("v1.x.y.z"));
        let empty = headers(&[(header::COOKIE, "wsr_console=")]);
        assert_eq!(cookie_value(&empty), None);
        let huge = format!("{COOKIE}={}", "a".repeat(MAX_COOKIE_BYTES + 1));
        assert_eq!(cookie_value(&headers(&[(header::COOKIE, &huge)])), None);
    }
}
