//! Outbound trust (issue 12, items 5, 6, 7, 13; D13, D15): answers are read up to
//! `max_message_bytes` and no further, no outbound call follows a redirect, applications send
//! only to configured partners (URL destinations only where allowed, never to an internal
//! address that is not listed), notify URLs must be registered, and a failed attempt leaves
//! its cause on the message as `last_error`.

#[allow(unused_imports)]
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use wsr_gateway::Config;
use wsr_gateway::outbound::destination::DestinationRules;
use wsr_gateway::wsr::{
    GroupId, Headers, MessageId, ReplyPattern, ReplyTo, Request, SoapVersion, write_envelope,
};

use super::support::{ClockExt, TestApp, free_port, serve_local, spawn_app_with, start_gateway};

const TOKEN: &str = "outbound-trust-token-0123456789";

fn producer(c: &mut Config) {
    c.tokens = vec![super::support::producer_token(TOKEN)];
}

async fn submit_to(client: &reqwest::Client, api: &str, body: Value) -> (u16, Value) {
    let r = client
        .post(format!("{api}/api/v1/messages"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("API answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn submit(app: &TestApp, body: Value) -> (u16, Value) {
    super::support::submit_as(app, TOKEN, body).await
}

async fn message(client: &reqwest::Client, api: &str, id: &str) -> Value {
    client
        .get(format!("{api}/api/v1/messages/{id}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("API answers")
        .json()
        .await
        .expect("message JSON")
}

/// The message's JSON once `last_error` is set (bounded: 20 s).
async fn with_last_error(client: &reqwest::Client, api: &str, id: &str) -> Value {
    for _ in 0..400 {
        let m = message(client, api, id).await;
        if m["last_error"].is_string() {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no last_error within 20 s: {}",
        message(client, api, id).await
    );
}

/// A local server that counts the POSTs to `/` and answers each with `answer`.
async fn counting_server(
    answer: impl Fn() -> axum::response::Response + Clone + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let handler = move || {
        let (count, answer) = (count.clone(), answer.clone());
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            answer()
        }
    };
    let router = axum::Router::new().route("/", axum::routing::post(handler));
    (format!("{}/", serve_local(router).await), seen)
}

fn redirect_to(target: &str) -> impl Fn() -> axum::response::Response + Clone + use<> {
    let target = target.to_owned();
    move || {
        let mut headers = HeaderMap::new();
        headers.insert("location", target.parse().expect("a header value"));
        (StatusCode::TEMPORARY_REDIRECT, headers).into_response()
    }
}

/// Item 5: a destination answering 64 MiB (chunked, no length announced) made the sender read
/// it all, on every attempt. Now it reads up to `max_message_bytes` (1 MiB here) and gives up:
/// the gateway's peak memory stays within a fixed bound, and the message says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_answer_is_cut_at_the_cap_and_memory_stays_bounded() {
    const ANSWER: usize = 64 * 1024 * 1024;
    let (big, served) = counting_server(|| {
        let chunk = axum::body::Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = ANSWER / chunk.len();
        let stream = futures_util::stream::iter(
            (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
        );
        (StatusCode::OK, axum::body::Body::from_stream(stream)).into_response()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = dir.path().join("gw.toml");
    let database = super::support::fresh_database(dir.path(), "gw.db").await;
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\nmax_message_bytes = 1048576\n\
             [partners]\nbig = {big:?}\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nprincipal = \"app\"\nscopes = [\"produce\"]\n",
            database.setting()
        ),
    )
    .expect("config");
    let mut child = start_gateway(&config);
    let pid = child.id();
    let api = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let before = super::support::proc_status_kib(pid, "VmRSS");
    let (status, answer) = submit_to(
        &client,
        &api,
        json!({ "destination": "big", "agreement": { "waits_ms": [100, 100, 100, 100] },
                "body": "<b:Big xmlns:b=\"urn:b\"/>" }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id");
    // Three attempts, each answered with 64 MiB (bounded: 30 s).
    let mut shown = Value::Null;
    for _ in 0..600 {
        shown = message(&client, &api, id).await;
        if served.load(Ordering::SeqCst) >= 3 && shown["attempts"].as_u64() >= Some(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let peak = super::support::proc_status_kib(pid, "VmHWM");
    let _ = child.kill();
    let _ = child.wait();
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "RSS before {} MiB, peak after three 64 MiB answers {} MiB (+{grown_mib} MiB)",
        before / 1024,
        peak / 1024
    );
    assert!(
        grown_mib < 32,
        "peak RSS grew by {grown_mib} MiB reading 64 MiB answers"
    );
    let last_error = shown["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("max_message_bytes"),
        "last_error names the cap: {shown}"
    );
    assert_eq!(shown["state"], "sent", "resent while the schedule allows");
}

/// Item 7: the sender followed a destination's 307 with the SOAP body to wherever it pointed.
/// Now a redirect is a failed attempt naming the status; the target sees nothing.
#[tokio::test]
async fn a_redirect_from_a_destination_is_not_followed() {
    let (target, target_seen) = counting_server(|| StatusCode::OK.into_response()).await;
    let (redirecting, redirecting_seen) = counting_server(redirect_to(&target)).await;
    let sender = spawn_app_with(|c| {
        producer(c);
        c.partners.insert_address("p", redirecting.clone());
    })
    .await;
    let (status, answer) = submit(
        &sender,
        json!({ "destination": "p", "body": "<r:R xmlns:r=\"urn:r\"/>" }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id");
    let shown = with_last_error(&sender.client, &sender.url(""), id).await;
    assert!(
        shown["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("307")),
        "{shown}"
    );
    assert!(redirecting_seen.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        target_seen.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
    sender.stop().await;
}

/// Item 7: callback acks followed a registered endpoint's 307 to an unregistered URL (D10:
/// callbacks go only to registered endpoints). Now the redirect is a failed callback, retried
/// to the registered endpoint; the redirect target never hears from us.
#[tokio::test]
async fn a_redirect_from_a_callback_endpoint_is_not_followed() {
    let (target, target_seen) = counting_server(|| StatusCode::OK.into_response()).await;
    let (endpoint, endpoint_seen) = counting_server(redirect_to(&target)).await;
    let app = spawn_app_with(|_| {}).await;
    app.register_callback(&endpoint).await;
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse("mid:redirected@test").expect("group"),
            sequence: None,
        },
        expiry_time: app.clock.now_utc() + chrono::Duration::hours(1),
        reply_pattern: ReplyPattern::Callback(ReplyTo::bare(&endpoint)),
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    let xml = write_envelope(
        SoapVersion::Soap11,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        "<p:Order xmlns:p=\"urn:p\">redirected</p:Order>",
    );
    let answer = app.send(SoapVersion::Soap11, xml).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    // The first callback and a retry of it (the redirect counted as a failure), moving the
    // test clock so the retry comes due; bounded.
    for _ in 0..400 {
        if endpoint_seen.load(Ordering::SeqCst) >= 2 {
            break;
        }
        app.clock.advance(chrono::Duration::seconds(1));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        endpoint_seen.load(Ordering::SeqCst) >= 2,
        "a redirect is a failed callback, retried"
    );
    assert_eq!(
        target_seen.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
    app.stop().await;
}

/// Item 6: any produce token made the gateway POST to any URL. Now, by default, a destination
/// must be a configured partner: a URL is refused at submit, naming the field, and nothing is
/// stored or sent.
#[tokio::test]
async fn an_unconfigured_url_destination_is_refused_naming_destination() {
    let (url, seen) = counting_server(|| StatusCode::OK.into_response()).await;
    let sender = spawn_app_with(producer).await;
    let (status, answer) = submit(
        &sender,
        json!({ "destination": url, "body": "<r:R xmlns:r=\"urn:r\"/>" }),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"], "invalid-field");
    assert!(
        answer["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("destination:")),
        "{answer}"
    );
    let stored = sender
        .store
        .out_messages(None, None, None, 10)
        .await
        .expect("list");
    assert!(stored.is_empty(), "nothing stored");
    assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing sent");
    sender.stop().await;
}

/// Item 6: even with URL destinations allowed, loopback, private, link-local and other
/// internal addresses (and `localhost`) are refused at submit — so message fates cannot scan
/// the network — unless the operator lists them.
#[tokio::test]
async fn internal_url_destinations_are_refused_unless_listed() {
    let (listed, _) = counting_server(|| StatusCode::OK.into_response()).await;
    let listed_addr = listed
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let sender = spawn_app_with(|c| {
        producer(c);
        c.destinations =
            DestinationRules::new(true, std::slice::from_ref(&listed_addr)).expect("valid rules");
    })
    .await;
    let other_port = free_port();
    for refused in [
        format!("http://127.0.0.1:{other_port}/wsr"),
        "http://10.0.0.1/wsr".to_owned(),
        "http://192.168.1.1/wsr".to_owned(),
        "http://169.254.169.254/latest/meta-data".to_owned(),
        "http://[::1]:8080/wsr".to_owned(),
        "http://[fd00::1]/wsr".to_owned(),
        "http://0.0.0.0:8080/".to_owned(),
        "http://2130706433/".to_owned(),
        format!("http://localhost:{other_port}/wsr"),
    ] {
        let (status, answer) = submit(
            &sender,
            json!({ "destination": refused, "body": "<r:R xmlns:r=\"urn:r\"/>" }),
        )
        .await;
        assert_eq!(status, 400, "{refused}: {answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("destination:")),
            "{answer}"
        );
    }
    let (status, answer) = submit(
        &sender,
        json!({ "destination": listed, "body": "<r:R xmlns:r=\"urn:r\"/>" }),
    )
    .await;
    assert_eq!(status, 202, "a listed address is allowed: {answer}");
    sender.stop().await;
}

/// Item 6: `notify_url` could be any URL. Now it must be a registered webhook (the push
/// endpoints' registry), like push subscriptions' URLs.
#[tokio::test]
async fn an_unregistered_notify_url_is_refused_naming_notify_url() {
    let (hook, seen) = counting_server(|| StatusCode::OK.into_response()).await;
    let sender = spawn_app_with(|c| {
        producer(c);
        c.partners
            .insert_address("p", format!("http://127.0.0.1:{}/", free_port()));
    })
    .await;
    let body =
        json!({ "destination": "p", "body": "<r:R xmlns:r=\"urn:r\"/>", "notify_url": hook });
    let (status, answer) = submit(&sender, body.clone()).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("notify_url:")),
        "{answer}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    sender
        .store
        .add_endpoint(
            wsr_gateway::store::Endpoints::Push,
            None,
            &hook,
            chrono::Utc::now(),
        )
        .await
        .expect("register");
    let (status, answer) = submit(&sender, body).await;
    assert_eq!(status, 202, "registered: {answer}");
    sender.stop().await;
}

/// Item 13: a message to an unreachable partner stayed `sent` with no reason and no error.
/// Now its JSON (and the list) shows `last_error` with the cause while it is still retried.
#[tokio::test]
async fn an_unreachable_partner_leaves_its_cause_as_last_error() {
    // A port nobody listens on: bound, then let go.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = dead.local_addr().expect("addr").port();
    drop(dead);
    let sender = spawn_app_with(|c| {
        producer(c);
        c.partners
            .insert_address("gone", format!("http://127.0.0.1:{port}/wsr"));
    })
    .await;
    let (status, answer) = submit(
        &sender,
        json!({ "destination": "gone", "agreement": { "waits_ms": [600000] },
                "body": "<r:R xmlns:r=\"urn:r\"/>" }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id");
    let shown = with_last_error(&sender.client, &sender.url(""), id).await;
    let cause = shown["last_error"].as_str().expect("last_error");
    assert!(
        cause.contains("unreachable") && cause.to_lowercase().contains("refused"),
        "{cause}"
    );
    assert!(shown["last_error_at"].is_string(), "{shown}");
    assert_eq!(shown["state"], "sent");
    assert!(shown["next_attempt"].is_string(), "still retried: {shown}");
    let listed: Value = sender
        .client
        .get(sender.url("/api/v1/messages"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("list JSON");
    assert_eq!(listed["messages"][0]["last_error"], shown["last_error"]);
    sender.stop().await;
}

/// Issue 33 (its first case): a partner that answers `200` with an envelope but no ack (a plain
/// SOAP service, a wrong path behind a proxy) fails the Response-pattern attempt, with the
/// cause on the message after one attempt.
#[tokio::test]
async fn a_200_without_an_ack_is_a_failed_attempt_with_its_cause() {
    let (plain, served) = counting_server(|| {
        let envelope = write_envelope(SoapVersion::Soap11, Headers::default(), "<ok/>");
        (
            StatusCode::OK,
            [("content-type", "text/xml; charset=utf-8")],
            envelope,
        )
            .into_response()
    })
    .await;
    let app = spawn_app_with(|c| {
        producer(c);
        c.partners.insert_address("plain", plain.clone());
    })
    .await;
    let (status, answer) = submit(
        &app,
        json!({ "destination": "plain", "agreement": { "reply_pattern": "Response" }, "body": "<a/>" }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id");
    let m = with_last_error(&app.client, &app.url(""), id).await;
    assert!(served.load(Ordering::SeqCst) >= 1);
    let cause = m["last_error"].as_str().expect("text");
    assert!(cause.contains("without an ack"), "{cause}");
    app.stop().await;
}
