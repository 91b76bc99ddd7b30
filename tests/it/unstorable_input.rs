//! Text the store cannot hold (a NUL, U+0000: PostgreSQL's `text` refuses it) in an API or
//! console input is a 400 naming the field, the same on both backends (`it` and
//! `it-postgres` run this file), and never a 503 "store-unavailable".

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, ORIGIN, SET_COOKIE};
use serde_json::{Value, json};
use wsr_gateway::config::{ApiToken, Scope};

use super::support::{TestApp, spawn_app_with};

const ADMIN: &str = "unstorable-admin-token-0123456789";
const CONSUMER: &str = "unstorable-consume-token-0123456789";

async fn app() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![
            ApiToken::plain(ADMIN, "ops", vec![Scope::Admin]),
            ApiToken::plain(CONSUMER, "reader", vec![Scope::Consume]),
        ];
    })
    .await
}

/// Sends `method path` with `token` (and `body` as JSON); asserts a 400 problem whose reason
/// names `field` and says why.
async fn refused_naming(
    app: &TestApp,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    field: &str,
) {
    let mut request = app.client.request(method, app.url(path)).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.expect("answers");
    let status = r.status();
    let problem: Value = r.json().await.expect("a JSON problem");
    assert_ne!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {problem}");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {problem}");
    assert_eq!(problem["error"], "invalid-field", "{path}: {problem}");
    let reason = problem["reason"].as_str().expect("a reason");
    assert!(
        reason.starts_with(&format!("{field}: ")) && reason.contains("U+0000"),
        "{path}: {reason}"
    );
}

#[tokio::test]
async fn a_nul_in_an_api_input_is_a_400_naming_the_field() {
    use reqwest::Method;
    let app = app().await;
    // A query filter, a path id, a query parameter beside a path id.
    refused_naming(
        &app,
        ADMIN,
        Method::GET,
        "/api/v1/messages?state=sent&group=mid%3Aa%00b",
        None,
        "group",
    )
    .await;
    refused_naming(
        &app,
        ADMIN,
        Method::GET,
        "/api/v1/messages/a%00b",
        None,
        "id",
    )
    .await;
    refused_naming(
        &app,
        ADMIN,
        Method::GET,
        "/api/v1/groups/mid%3Ag?partner=%00",
        None,
        "partner",
    )
    .await;
    // JSON fields: a subscription's name, a field of a submit, a URL to unregister.
    let subscription = json!({"name": "audit\u{0}", "filter": "default/#"});
    refused_naming(
        &app,
        CONSUMER,
        Method::POST,
        "/api/v1/subscriptions",
        Some(subscription),
        "name",
    )
    .await;
    let submit = json!({"destination": "http://127.0.0.1:9/\u{0}", "body": "<a/>"});
    refused_naming(
        &app,
        ADMIN,
        Method::POST,
        "/api/v1/messages",
        Some(submit),
        "destination",
    )
    .await;
    refused_naming(
        &app,
        ADMIN,
        Method::DELETE,
        "/api/v1/push-endpoints?url=http%3A%2F%2Fx%2F%00",
        None,
        "url",
    )
    .await;
    let url = json!({"url": "http://127.0.0.1:9/\u{0}"});
    refused_naming(
        &app,
        ADMIN,
        Method::POST,
        "/api/v1/push-endpoints",
        Some(url),
        "url",
    )
    .await;

    // A principal to grant, on a subscription that exists.
    let created: Value = app
        .client
        .post(app.url("/api/v1/subscriptions"))
        .bearer_auth(CONSUMER)
        .json(&json!({"name": "audit", "filter": "default/#"}))
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    let id = created["id"]
        .as_i64()
        .unwrap_or_else(|| panic!("{created}"));
    let grant = format!("/api/v1/subscriptions/{id}/grants/some%00one");
    refused_naming(&app, CONSUMER, Method::PUT, &grant, None, "principal").await;

    // Nothing of it reached the store as a failure: it answers, and says it is ready.
    let ready = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("answers");
    assert_eq!(ready.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn a_nul_in_a_console_search_is_a_400_naming_the_field() {
    let app = app().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let signed = client
        .post(app.url("/console/login"))
        .header(ORIGIN, format!("http://{}", app.addr))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("token={ADMIN}"))
        .send()
        .await
        .expect("answers");
    assert_eq!(signed.status(), StatusCode::SEE_OTHER);
    let cookie = signed.headers()[SET_COOKIE]
        .to_str()
        .expect("text")
        .split(';')
        .next()
        .expect("name=value")
        .to_owned();
    for (path, field) in [
        ("/console/inbox?channel=default%00", "channel"),
        ("/console/inbox?group=mid%3Ag%00", "group"),
        ("/console/messages?partner=a%00", "partner"),
        ("/console/message?id=x%00", "id"),
        ("/console/group?id=mid%3Ag&partner=%00", "partner"),
    ] {
        let r = client
            .get(app.url(path))
            .header(COOKIE, &cookie)
            .send()
            .await
            .expect("answers");
        let status = r.status();
        let page = r.text().await.expect("page");
        assert_ne!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {page}");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {page}");
        assert!(
            page.contains(&format!("{field}: contains a NUL character (U+0000)")),
            "{path}: {page}"
        );
    }
    app.stop().await;
}
