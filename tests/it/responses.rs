//! Notify with a response (issue 30, sending side): when a partner answers one of our messages
//! with a business response or an application SOAP Fault — with or without the ack, plain or
//! as the root part of a multipart/related answer — the gateway keeps the answer with the
//! message: `GET /api/v1/messages/{id}/response` serves it as received, the message's JSON
//! says there is one, the event stream and the notify webhook carry it. A scripted partner on
//! 127.0.0.1 answers; the Holodeck 1.x answers are replayed from `tests/fixtures/holodeck-rr/`.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header::CONTENT_TYPE};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::support::{TestApp, allow_loopback_urls, serve_local, spawn_app_with, submit_as};

const TOKEN: &str = "producer-token-0123456789";
const OTHER: &str = "other-producer-token-0123456789";

/// Where a scripted answer names the groupId of the request it answers.
const GROUP: &str = "{GROUP}";

/// One scripted answer: status, Content-Type, body (with `GROUP` for the request's groupId).
#[derive(Clone)]
struct Scripted {
    status: u16,
    content_type: String,
    body: String,
}

/// A partner on 127.0.0.1 that answers each POST with the next scripted answer (the last one
/// again once they run out) and records the request bodies.
struct ScriptedPartner {
    url: String,
    requests: mpsc::UnboundedReceiver<String>,
}

async fn scripted_partner(answers: Vec<Scripted>) -> ScriptedPartner {
    let (tx, rx) = mpsc::unbounded_channel();
    let script = Arc::new(Mutex::new((answers, 0usize)));
    let handler = move |_: HeaderMap, body: Bytes| {
        let (tx, script) = (tx.clone(), script.clone());
        async move {
            let request = String::from_utf8_lossy(&body).into_owned();
            let group = group_of(&request);
            let _ = tx.send(request);
            let answer = {
                let mut s = script.lock().expect("script");
                let i = s.1.min(s.0.len() - 1);
                s.1 += 1;
                s.0[i].clone()
            };
            let status = StatusCode::from_u16(answer.status).expect("status");
            let body = answer.body.replace(GROUP, &group);
            (status, [(CONTENT_TYPE, answer.content_type)], body)
        }
    };
    let router = axum::Router::new().route("/partner", axum::routing::post(handler));
    let url = format!("{}/partner", serve_local(router).await);
    ScriptedPartner { url, requests: rx }
}

/// The groupId our request names.
fn group_of(envelope: &str) -> String {
    envelope
        .split_once("groupId=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(g, _)| g.to_owned())
        .unwrap_or_default()
}

impl ScriptedPartner {
    async fn next_request(&mut self) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.requests.recv())
            .await
            .expect("a request within 10 s")
            .expect("partner alive")
    }
}

fn soap11(header: &str, body: &str) -> String {
    format!(
        "<soap:Envelope xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\" \
         xmlns:wsrm=\"http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd\">\
         <soap:Header>{header}</soap:Header><soap:Body>{body}</soap:Body></soap:Envelope>"
    )
}

fn ack11() -> String {
    format!(
        "<wsrm:Response soap:mustUnderstand=\"1\"><wsrm:NonSequenceReply groupId=\"{GROUP}\"/>\
         </wsrm:Response>"
    )
}

const ECHO_RESPONSE: &str = "<e:echoResponse xmlns:e=\"urn:echo\">hello back</e:echoResponse>";

fn with_ack(body: &str) -> Scripted {
    Scripted {
        status: 200,
        content_type: "text/xml; charset=utf-8".into(),
        body: soap11(&ack11(), body),
    }
}

async fn sender_app(adjust: impl FnOnce(&mut wsr_gateway::Config)) -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![
            super::support::producer_token(TOKEN),
            wsr_gateway::config::ApiToken {
                principal: "other".into(),
                ..super::support::producer_token(OTHER)
            },
        ];
        allow_loopback_urls(c);
        adjust(c);
    })
    .await
}

/// Submits a singleton to `to`; its id.
async fn send(app: &TestApp, to: &str, extra: Value) -> String {
    let mut request =
        json!({ "destination": to, "body": "<e:echo xmlns:e=\"urn:echo\">hello</e:echo>" });
    if let (Some(r), Some(extra)) = (request.as_object_mut(), extra.as_object()) {
        r.extend(extra.clone());
    }
    let (status, answer) = submit_as(app, TOKEN, request).await;
    assert_eq!(status, 202, "{answer}");
    answer["id"].as_str().expect("id").to_owned()
}

/// `GET /api/v1/messages/{id}` with `token`.
async fn message(app: &TestApp, token: &str, id: &str) -> (u16, Value) {
    let r = app
        .client
        .get(app.url(&format!("/api/v1/messages/{id}")))
        .bearer_auth(token)
        .send()
        .await
        .expect("API answers");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `GET /api/v1/messages/{id}/response` with `token`: status, Content-Type, bytes.
async fn response(app: &TestApp, token: &str, id: &str) -> (u16, String, Vec<u8>) {
    let r = app
        .client
        .get(app.url(&format!("/api/v1/messages/{id}/response")))
        .bearer_auth(token)
        .send()
        .await
        .expect("API answers");
    let status = r.status().as_u16();
    let ct = r.headers().get(CONTENT_TYPE).map_or(String::new(), |v| {
        v.to_str().expect("ASCII content type").to_owned()
    });
    (status, ct, r.bytes().await.expect("body").to_vec())
}

/// The message once `done` holds of its JSON, moving the test clock so resends come due.
async fn message_when(app: &TestApp, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (_, m) = message(app, TOKEN, id).await;
        if done(&m) {
            return m;
        }
        app.clock.advance(chrono::Duration::milliseconds(100));
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{id} never got there: {}", message(app, TOKEN, id).await.1);
}

fn acked(m: &Value) -> bool {
    m["state"] == "acked"
}

/// The response's events in the store's log, for `id`.
async fn response_events(app: &TestApp, id: &str) -> usize {
    let events = app.store.out_message_events(id, 100).await.expect("events");
    events.iter().filter(|e| e.state == "response").count()
}

/// A business response riding with the ack is kept byte for byte: the API serves it with its
/// Content-Type, the message's JSON describes it, other principals see no more of it than of
/// the message, and a message without one answers 404 and `response: null`.
#[tokio::test]
async fn a_business_response_with_the_ack_is_kept_and_served() {
    let mut partner = scripted_partner(vec![with_ack(ECHO_RESPONSE)]).await;
    let app = sender_app(|_| {}).await;
    let id = send(&app, &partner.url, json!({})).await;
    let group = group_of(&partner.next_request().await);
    let m = message_when(&app, &id, acked).await;
    let expected = soap11(&ack11(), ECHO_RESPONSE).replace(GROUP, &group);
    assert_eq!(m["response"]["size"], expected.len());
    assert_eq!(m["response"]["soap_fault"], false);
    assert!(m["response"]["received_at"].is_string(), "{m}");
    assert_eq!(
        m["response"]["href"],
        format!("/api/v1/messages/{id}/response")
    );
    let (status, ct, body) = response(&app, TOKEN, &id).await;
    assert_eq!(status, 200);
    assert_eq!(ct, "text/xml; charset=utf-8");
    assert_eq!(String::from_utf8(body).expect("UTF-8"), expected);
    // Same access rules as the message itself.
    assert_eq!(message(&app, OTHER, &id).await.0, 404);
    let (status, ct, _) = response(&app, OTHER, &id).await;
    assert_eq!((status, ct.as_str()), (404, "application/json"));
    assert_eq!(response_events(&app, &id).await, 1);

    // An ack with an empty Body: nothing kept.
    let mut bare = scripted_partner(vec![with_ack("")]).await;
    let plain = send(&app, &bare.url, json!({})).await;
    bare.next_request().await;
    let m = message_when(&app, &plain, acked).await;
    assert_eq!(m["response"], Value::Null, "{m}");
    let (status, _, body) = response(&app, TOKEN, &plain).await;
    assert_eq!(status, 404);
    let problem: Value = serde_json::from_slice(&body).expect("problem JSON");
    assert!(
        problem["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no business response")),
        "{problem}"
    );
    app.stop().await;
}

/// An application SOAP Fault (SOAP 1.2, HTTP 500, our ack in its Header) is kept as a fault;
/// the message is acked all the same: the partner received it.
#[tokio::test]
async fn an_application_soap_fault_is_kept_as_a_fault() {
    let fault = format!(
        "<env:Envelope xmlns:env=\"http://www.w3.org/2003/05/soap-envelope\" \
         xmlns:wsrm=\"http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd\">\
         <env:Header><wsrm:Response env:mustUnderstand=\"true\">\
         <wsrm:NonSequenceReply groupId=\"{GROUP}\"/></wsrm:Response></env:Header>\
         <env:Body><env:Fault><env:Code><env:Value>env:Receiver</env:Value></env:Code>\
         <env:Reason><env:Text xml:lang=\"en\">no such order</env:Text></env:Reason>\
         </env:Fault></env:Body></env:Envelope>"
    );
    let answer = Scripted {
        status: 500,
        content_type: "application/soap+xml; charset=utf-8".into(),
        body: fault,
    };
    let mut partner = scripted_partner(vec![answer]).await;
    let app = sender_app(|_| {}).await;
    let id = send(&app, &partner.url, json!({ "soap_version": "1.2" })).await;
    partner.next_request().await;
    let m = message_when(&app, &id, acked).await;
    assert_eq!(m["response"]["soap_fault"], true, "{m}");
    let (status, ct, body) = response(&app, TOKEN, &id).await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/soap+xml; charset=utf-8");
    assert!(String::from_utf8_lossy(&body).contains("no such order"));
    app.stop().await;
}

/// The first exchange of a Holodeck recording: its answer as a script, with the groupId it
/// named replaced by `GROUP`.
fn recorded_answer(file: &str) -> Scripted {
    let path = super::support::repo_root()
        .join("tests/fixtures/holodeck-rr")
        .join(file);
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("recording")).expect("JSON");
    let exchange = &doc["exchanges"][0];
    let recorded_group = group_of(exchange["request"]["body"].as_str().expect("request"));
    let response = &exchange["response"];
    Scripted {
        status: u16::try_from(response["status"].as_u64().expect("status")).expect("u16"),
        content_type: response["headers"]["content-type"]
            .as_str()
            .expect("content type")
            .to_owned(),
        body: response["body"]
            .as_str()
            .expect("body")
            .replace(&recorded_group, GROUP),
    }
}

/// Holodeck's in-out `echo` answers as multipart/related: under Response the ack and the
/// `echoResponse` (acked, response kept as received, the whole MIME package); under Callback
/// the `echoResponse` alone with HTTP 200 (kept; the message waits for the callback ack, and
/// a resend's replayed answer keeps the first one).
#[tokio::test]
async fn holodeck_multipart_answers_are_kept() {
    let app = sender_app(|_| {}).await;
    let singleton = recorded_answer("g2h-singleton-echo.json");
    let mut partner = scripted_partner(vec![singleton.clone()]).await;
    let id = send(&app, &partner.url, json!({})).await;
    let group = group_of(&partner.next_request().await);
    let m = message_when(&app, &id, acked).await;
    assert_eq!(m["response"]["soap_fault"], false, "{m}");
    let (status, ct, body) = response(&app, TOKEN, &id).await;
    assert_eq!(
        (status, ct.as_str()),
        (200, singleton.content_type.as_str())
    );
    let body = String::from_utf8(body).expect("UTF-8");
    assert_eq!(body, singleton.body.replace(GROUP, &group));
    assert!(body.contains("echoResponse"));

    let callback = recorded_answer("g2h-callback-echo.json");
    let mut partner = scripted_partner(vec![callback.clone()]).await;
    let id = send(
        &app,
        &partner.url,
        json!({ "agreement": { "reply_pattern": "Callback" } }),
    )
    .await;
    partner.next_request().await;
    let m = message_when(&app, &id, |m| m["response"].is_object()).await;
    assert_eq!(m["state"], "sent", "the ack comes by callback: {m}");
    let (status, ct, body) = response(&app, TOKEN, &id).await;
    assert_eq!((status, ct.as_str()), (200, callback.content_type.as_str()));
    assert_eq!(
        body,
        callback.body.as_bytes(),
        "no groupId in it: unchanged"
    );
    // A resend gets Holodeck's cached response again: still the one kept, one event.
    message_when(&app, &id, |m| m["attempts"].as_u64() >= Some(2)).await;
    partner.next_request().await;
    assert_eq!(response_events(&app, &id).await, 1);
    app.stop().await;
}

/// An answer longer than `max_message_bytes` is not read further: nothing is kept, and the
/// message says why its attempt failed.
#[tokio::test]
async fn a_response_beyond_max_message_bytes_is_not_kept() {
    let big = format!(
        "<e:echoResponse xmlns:e=\"urn:echo\">{}</e:echoResponse>",
        "x".repeat(20_000)
    );
    let mut partner = scripted_partner(vec![with_ack(&big)]).await;
    let app = sender_app(|c| c.limits.max_bytes = 16 * 1024).await;
    let id = send(&app, &partner.url, json!({})).await;
    partner.next_request().await;
    let m = message_when(&app, &id, |m| m["last_error"].is_string()).await;
    assert!(
        m["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("max_message_bytes")),
        "{m}"
    );
    assert_eq!(m["response"], Value::Null);
    assert_eq!(response(&app, TOKEN, &id).await.0, 404);
    app.stop().await;
}

/// The next event of an SSE stream as (event name, data JSON), at most 10 s away.
async fn next_event(stream: &mut reqwest::Response, seen: &mut String) -> (String, Value) {
    loop {
        if let Some(end) = seen.find("\n\n") {
            let block: String = seen.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start().to_owned())
            };
            if let (Some(event), Some(data)) = (field("event:"), field("data:")) {
                return (event, serde_json::from_str(&data).expect("event JSON"));
            }
            continue;
        }
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.chunk())
            .await
            .expect("events arrive")
            .expect("stream")
            .expect("not closed");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The notify webhook and the event stream carry a small response inline and a large one
/// (beyond 64 KiB) by its link.
#[tokio::test]
async fn the_notify_webhook_and_the_event_stream_carry_the_response() {
    let large = format!(
        "<e:echoResponse xmlns:e=\"urn:echo\">{}</e:echoResponse>",
        "y".repeat(70 * 1024)
    );
    let mut small_partner = scripted_partner(vec![with_ack(ECHO_RESPONSE)]).await;
    let mut large_partner = scripted_partner(vec![with_ack(&large)]).await;
    let app = sender_app(|_| {}).await;
    let mut hook = super::support::mock_partner(vec![200, 200]).await;
    app.register_webhook(&hook.url).await;
    let notify = json!({ "notify_url": hook.url });
    let small = send(&app, &small_partner.url, notify.clone()).await;
    let group = group_of(&small_partner.next_request().await);
    let (_, posted) = hook.next_post().await;
    let notified: Value = serde_json::from_str(&posted).expect("notify JSON");
    assert_eq!(notified["id"], small);
    assert_eq!(notified["state"], "acked");
    let expected = soap11(&ack11(), ECHO_RESPONSE).replace(GROUP, &group);
    assert_eq!(
        notified["response"]["body"],
        expected.as_str(),
        "{notified}"
    );
    assert_eq!(notified["response"]["soap_fault"], false);

    let large_id = send(&app, &large_partner.url, notify).await;
    large_partner.next_request().await;
    let (_, posted) = hook.next_post().await;
    let notified: Value = serde_json::from_str(&posted).expect("notify JSON");
    assert_eq!(notified["id"], large_id);
    assert!(notified["response"]["size"].as_u64() > Some(64 * 1024));
    assert_eq!(notified["response"]["body"], Value::Null, "link only");
    assert_eq!(
        notified["response"]["href"],
        format!("/api/v1/messages/{large_id}/response")
    );

    let mut stream = app
        .client
        .get(app.url("/api/v1/events?after=0"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("event stream");
    let mut seen = String::new();
    let mut responses = Vec::new();
    while responses.len() < 2 {
        let (event, data) = next_event(&mut stream, &mut seen).await;
        if event == "response" {
            responses.push(data);
        }
    }
    assert_eq!(responses[0]["id"], small);
    assert_eq!(responses[0]["response"]["body"], expected.as_str());
    assert_eq!(responses[1]["id"], large_id);
    assert_eq!(responses[1]["response"]["body"], Value::Null);
    assert!(responses[1]["response"]["href"].is_string());
    app.stop().await;
}

/// `wsr-gateway send --wait` prints the message's final state and the partner's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_wait_prints_the_response() {
    let partner = scripted_partner(vec![with_ack(ECHO_RESPONSE)]).await;
    let app = sender_app(|_| {}).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("echo.xml");
    std::fs::write(&file, "<e:echo xmlns:e=\"urn:echo\">hello</e:echo>").expect("write");
    let (api, to) = (app.url(""), partner.url.clone());
    // The sender's clock is the test's: moved along while the CLI waits.
    let clock = app.clock.clone();
    let ticking = tokio::spawn(async move {
        loop {
            clock.advance(chrono::Duration::milliseconds(100));
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"))
            .args([
                "send", "--api", &api, "--token", TOKEN, "--to", &to, "--wait",
            ])
            .arg(&file)
            .output()
            .expect("send runs")
    })
    .await
    .expect("join");
    ticking.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\tacked"), "{stdout}");
    assert!(stdout.contains("response: "), "{stdout}");
    assert!(stdout.contains(ECHO_RESPONSE), "{stdout}");
    app.stop().await;
}
