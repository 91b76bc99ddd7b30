//! The console's Log out ends the sign-in, not only the browser's copy of the cookie: a copy
//! taken before is refused afterwards on every page and action, on both stores (`it` and
//! `it-postgres` run this file); the sign-out is kept until the sign-in would have ended,
//! then purged. Two gateways on one database: `cluster.rs`.

use chrono::Duration;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, ORIGIN, SET_COOKIE};
use wsr_gateway::config::{ApiToken, Scope};

use super::support::{ClockExt as _, TestApp, spawn_app_with};

pub const ADMIN: &str = "sign-out-admin-token-0123456789";
const FORM: &str = "application/x-www-form-urlencoded";

pub async fn app() -> TestApp {
    spawn_app_with(|c| c.tokens = vec![ApiToken::plain(ADMIN, "ops", vec![Scope::Admin])]).await
}

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// A POST from the console's own pages (its Origin), with `cookie` if not empty.
pub async fn post(app: &TestApp, cookie: &str, path: &str, body: &str) -> reqwest::Response {
    let mut request = client()
        .post(app.url(path))
        .header(ORIGIN, format!("http://{}", app.addr))
        .header(CONTENT_TYPE, FORM)
        .body(body.to_owned());
    if !cookie.is_empty() {
        request = request.header(COOKIE, cookie);
    }
    request.send().await.expect("answers")
}

/// The `Set-Cookie` of an answer, which must have one.
fn set_cookie(r: &reqwest::Response) -> String {
    r.headers()
        .get(SET_COOKIE)
        .expect("a cookie")
        .to_str()
        .expect("text")
        .to_owned()
}

/// Signs in with the admin token; the cookie to send (`name=value`).
pub async fn sign_in(app: &TestApp) -> String {
    let r = post(app, "", "/console/login", &format!("token={ADMIN}")).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    set_cookie(&r)
        .split(';')
        .next()
        .expect("name=value")
        .to_owned()
}

pub async fn get(app: &TestApp, cookie: &str, path: &str) -> (StatusCode, String) {
    let r = client()
        .get(app.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("answers");
    (r.status(), r.text().await.expect("body"))
}

/// The sign-in's nonce in a cookie `wsr_console=v2.{expiry}.{nonce}.{principal}.{mac}`.
fn nonce_of(cookie: &str) -> String {
    let value = cookie
        .strip_prefix("wsr_console=")
        .expect("the console cookie");
    let parts: Vec<&str> = value.split('.').collect();
    assert_eq!(parts.len(), 5, "{value}");
    parts[2].to_owned()
}

/// What a copy of a signed-out cookie gets: the login page (401) saying why, on a page and on
/// an action alike (the action is refused at the door, before it looks for its message).
pub async fn assert_signed_out(app: &TestApp, cookie: &str) {
    for path in ["/console", "/console/messages", "/console/inbox"] {
        let (status, page) = get(app, cookie, path).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {page}");
        assert!(page.contains("ended with Log out"), "{path}: {page}");
        assert!(page.contains("<label for=\"token\">"), "{path}: {page}");
    }
    let r = post(app, cookie, "/console/message/resend", "id=no-such").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let page = r.text().await.expect("body");
    assert!(page.contains("ended with Log out"), "{page}");
}

#[tokio::test]
async fn a_cookie_copied_before_log_out_is_refused_after_it_and_a_new_sign_in_works() {
    let app = app().await;
    let cookie = sign_in(&app).await;
    let copy = cookie.clone();
    assert_eq!(get(&app, &copy, "/console").await.0, StatusCode::OK);
    // Signed in, an action reaches its message (there is none).
    let r = post(&app, &copy, "/console/message/resend", "id=no-such").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let out = post(&app, &cookie, "/console/logout", "").await;
    assert_eq!(out.status(), StatusCode::OK);
    assert!(set_cookie(&out).contains("Max-Age=0"), "the browser's goes");
    assert_signed_out(&app, &copy).await;

    // Logging out again with the copy changes nothing.
    let again = post(&app, &copy, "/console/logout", "").await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_signed_out(&app, &copy).await;

    // A new sign-in is a sign-in of its own: it works, and the old one stays ended.
    let fresh = sign_in(&app).await;
    assert_ne!(nonce_of(&fresh), nonce_of(&copy));
    let (status, page) = get(&app, &fresh, "/console").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let r = post(&app, &fresh, "/console/message/resend", "id=no-such").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_signed_out(&app, &copy).await;
    app.stop().await;
}

#[tokio::test]
async fn a_log_out_without_a_sign_in_of_ours_records_nothing() {
    let app = app().await;
    let cookie = sign_in(&app).await;
    // A made-up cookie (any nonce, no valid MAC) is not written to the store.
    let value = cookie.strip_prefix("wsr_console=").expect("cookie");
    let (body, _) = value.rsplit_once('.').expect("mac");
    let forged = format!("wsr_console={body}.{}", "00".repeat(32));
    let out = post(&app, &forged, "/console/logout", "").await;
    assert_eq!(out.status(), StatusCode::OK);
    assert!(
        !app.store
            .console_signed_out(&nonce_of(&forged))
            .await
            .expect("read"),
        "an unsigned nonce is not recorded"
    );
    assert_eq!(get(&app, &cookie, "/console").await.0, StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn a_sign_out_is_kept_until_its_sign_in_would_have_ended_then_purged() {
    let app = app().await;
    let cookie = sign_in(&app).await;
    let nonce = nonce_of(&cookie);
    assert!(!app.store.console_signed_out(&nonce).await.expect("read"));
    assert_eq!(
        post(&app, &cookie, "/console/logout", "").await.status(),
        StatusCode::OK
    );
    assert!(app.store.console_signed_out(&nonce).await.expect("read"));
    let now = app.clock.now_utc();
    assert_eq!(
        app.store
            .purge_console_sign_outs(now, now - Duration::days(400))
            .await
            .expect("purge"),
        0,
        "the sign-in has 12 hours to run"
    );
    assert!(app.store.console_signed_out(&nonce).await.expect("read"));
    // The audit trail's sign-in and sign-out are kept within their retention.
    let audited = |app: &TestApp| {
        let store = app.store.clone();
        async move { store.audit_entries(None, 10).await.expect("trail").len() }
    };
    assert_eq!(audited(&app).await, 2);

    // Past its 12 hours the cookie is refused as ended, and its sign-out can go.
    app.clock
        .advance(Duration::hours(12) + Duration::seconds(1));
    let (status, page) = get(&app, &cookie, "/console").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(page.contains("ended after 12 hours"), "{page}");
    let later = app.clock.now_utc();
    assert_eq!(
        app.store
            .purge_console_sign_outs(later, later - Duration::hours(12))
            .await
            .expect("purge"),
        1
    );
    // Past the audit trail's retention (here 12 hours), its entries go too.
    assert_eq!(
        audited(&app).await,
        0,
        "entries older than the retention purged"
    );
    assert!(!app.store.console_signed_out(&nonce).await.expect("read"));
    let (status, _) = get(&app, &cookie, "/console").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "still ended");
    app.stop().await;
}
