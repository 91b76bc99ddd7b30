//! The sending RMP end to end: one gateway sends to a second gateway in the same test, for
//! each reply pattern and SOAP version, singletons and an ordered group of 100 with `last`.
//! The receiver's inbox holds each message exactly once, in order; the sender shows every
//! message acked.

#[allow(unused_imports)]
use super::support::{TestApp, allow_loopback_urls, spawn_app_with};
use serde_json::{Value, json};
use wsr_gateway::config::{ApiToken, Scope};
use wsr_gateway::store::outbound::OutMessage;

const TOKEN: &str = "producer-token-0123456789";

/// A sender whose ordered groups keep one message in flight.
async fn sender_app_window_1() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![super::support::producer_token(TOKEN)];
        c.send_window = 1;
        allow_loopback_urls(c);
    })
    .await
}

async fn sender_app() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![super::support::producer_token(TOKEN)];
        c.poll_interval = std::time::Duration::from_millis(200);
        // The receivers here are wsr-gateways: they keep delivered IDs an hour past expiry.
        c.partner_id_retention = std::time::Duration::from_secs(3600);
        allow_loopback_urls(c);
    })
    .await
}

async fn submit(app: &TestApp, body: Value) -> (u16, Value) {
    super::support::submit_as(app, TOKEN, body).await
}

/// Waits until every outbound message is final, moving the test clock so that polls and
/// resends come due. Bounded: at most 20 s of wall time.
async fn all_final(app: &TestApp, expected: usize) -> Vec<OutMessage> {
    for _ in 0..2000 {
        let messages = app
            .store
            .out_messages(None, None, None, 1000)
            .await
            .expect("list");
        if messages.len() == expected && messages.iter().all(|m| m.outbound.state.is_final()) {
            return messages;
        }
        app.clock.advance(chrono::Duration::milliseconds(100));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let messages = app
        .store
        .out_messages(None, None, None, 1000)
        .await
        .expect("list");
    panic!(
        "not all final: {:?}",
        messages
            .iter()
            .map(|m| (&m.id, m.outbound.state.name(), m.outbound.attempts))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn singletons_for_every_reply_pattern_and_version() {
    let receiver = spawn_app_with(|_| {}).await;
    let sender = sender_app().await;
    receiver
        .register_callback(&sender.url("/wsr/_callback"))
        .await;
    let mut count = 0;
    for pattern in ["Response", "Callback", "Poll"] {
        for version in ["1.1", "1.2"] {
            let (status, answer) = submit(
                &sender,
                json!({
                    "destination": receiver.url("/wsr/default"),
                    "agreement": { "reply_pattern": pattern },
                    "soap_version": version,
                    "body": format!("<o:Order xmlns:o=\"urn:o\">{pattern} {version}</o:Order>"),
                }),
            )
            .await;
            assert_eq!(status, 202, "{answer}");
            assert!(
                answer["status_url"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("/api/v1/messages/"))
            );
            assert!(answer["number"].is_null(), "a singleton");
            count += 1;
        }
    }
    let messages = all_final(&sender, count).await;
    for m in &messages {
        assert_eq!(m.outbound.state.name(), "acked", "{} via {}", m.id, m.reply);
    }
    let inbox = receiver.inbox().await;
    assert_eq!(inbox.len(), count, "each delivered exactly once");
    sender.stop().await;
    receiver.stop().await;
}

#[tokio::test]
async fn ordered_group_of_100_with_last() {
    let combinations = ["Response", "Callback", "Poll"]
        .into_iter()
        .flat_map(|p| ["1.1", "1.2"].map(move |v| (p, v)));
    for (pattern, version) in combinations {
        let receiver = spawn_app_with(|_| {}).await;
        let sender = sender_app().await;
        receiver
            .register_callback(&sender.url("/wsr/_callback"))
            .await;
        let agreement = json!({ "reply_pattern": pattern, "message_order": true });
        let mut group: Option<String> = None;
        for n in 0..100u64 {
            let mut g = json!({ "last": n == 99 });
            if let Some(id) = &group {
                g["id"] = json!(id);
            }
            let (status, answer) = submit(
                &sender,
                json!({
                    "destination": receiver.url("/wsr/default"),
                    "agreement": agreement,
                    "group": g,
                    "soap_version": version,
                    "body": format!("<o:Line xmlns:o=\"urn:o\">{n}</o:Line>"),
                }),
            )
            .await;
            assert_eq!(status, 202, "{answer}");
            assert_eq!(answer["number"], json!(n), "numbers in submit order");
            group.get_or_insert_with(|| answer["group_id"].as_str().expect("group id").to_owned());
        }
        let messages = all_final(&sender, 100).await;
        assert!(
            messages.iter().all(|m| m.outbound.state.name() == "acked"),
            "{pattern}"
        );
        let numbers: Vec<Option<u64>> = receiver
            .inbox()
            .await
            .into_iter()
            .map(|e| e.number)
            .collect();
        assert_eq!(
            numbers,
            (0..100).map(Some).collect::<Vec<_>>(),
            "{pattern}: once each, in order"
        );
        let state = receiver
            .store
            .group("", group.as_deref().expect("group"))
            .await
            .expect("read")
            .expect("group");
        assert_eq!(
            state.status.as_str(),
            "complete",
            "last=true ended the group"
        );
        // The group is closed for further submissions.
        let (status, _) = submit(
            &sender,
            json!({ "destination": receiver.url("/wsr/default"), "agreement": agreement,
                    "group": { "id": group }, "body": "<o:Late xmlns:o=\"urn:o\"/>" }),
        )
        .await;
        assert_eq!(status, 409);
        sender.stop().await;
        receiver.stop().await;
    }
}

#[tokio::test]
async fn bad_submissions_are_refused_with_the_field_and_nothing_stored() {
    let sender = sender_app().await;
    let url = "http://127.0.0.1:9/wsr/default";
    for (body, field) in [
        (
            json!({ "destination": "ftp://x", "body": "<a/>" }),
            "destination",
        ),
        (json!({ "destination": url, "body": "<a>" }), "body"),
        (
            json!({ "destination": url, "body": "<a/>", "soap_version": "2.0" }),
            "soap_version",
        ),
        (
            json!({ "destination": url, "body": "<a/>", "agreement": { "reply_pattern": "Fax" } }),
            "reply_pattern",
        ),
        (
            json!({ "destination": url, "body": "<a/>", "agreement": { "message_order": true, "ack_requested": false } }),
            "message_order",
        ),
        (
            json!({ "destination": url, "body": "<a/>", "agreement": "nope" }),
            "agreement",
        ),
        (
            json!({ "destination": url, "body": "<a/>", "colour": "blue" }),
            "body",
        ),
    ] {
        let (status, answer) = submit(&sender, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"], "invalid-field");
        assert!(
            answer["reason"].as_str().is_some_and(|r| r.contains(field)),
            "{body}: {answer}"
        );
    }
    let unauthorized = sender
        .client
        .post(sender.url("/api/v1/messages"))
        .json(&json!({ "destination": url, "body": "<a/>" }))
        .send()
        .await
        .expect("answer");
    assert_eq!(unauthorized.status(), 401);
    assert!(
        sender
            .store
            .out_messages(None, None, None, 10)
            .await
            .expect("list")
            .is_empty()
    );
    sender.stop().await;
}

#[tokio::test]
async fn exhausted_and_expired_messages_end_failed_with_a_reason_and_an_event() {
    let sender = sender_app().await;
    // Nothing listens on port 9: every attempt fails.
    let (status, answer) = submit(
        &sender,
        json!({
            "destination": "http://127.0.0.1:9/wsr/default",
            "agreement": { "max_attempts": 2, "interval_ms": 100, "backoff": 1, "expiry_seconds": 5 },
            "body": "<a/>",
        }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let (_, expiring) = submit(
        &sender,
        json!({
            "destination": "http://127.0.0.1:9/wsr/default",
            "agreement": { "expiry_seconds": 1, "waits_ms": [5000] },
            "body": "<b/>",
        }),
    )
    .await;
    let messages = all_final(&sender, 2).await;
    for m in &messages {
        assert_eq!(m.outbound.state.name(), "failed");
    }
    let reasons: Vec<String> = messages
        .iter()
        .map(|m| match &m.outbound.state {
            wsr_gateway::rmp::sender::OutState::Failed(r) => r.clone(),
            _ => String::new(),
        })
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("after 2 attempts")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("expired")), "{reasons:?}");
    let expiring_id = expiring["id"].as_str().expect("id");
    let m = messages
        .iter()
        .find(|m| m.id == expiring_id)
        .expect("message");
    assert_eq!(m.outbound.attempts, 1, "nothing sent after ExpiryTime");
    let events = sender.store.out_events(0, 100).await.expect("events");
    assert_eq!(events.iter().filter(|e| e.state == "failed").count(), 2);
    let r = sender
        .client
        .get(sender.url(&format!("/api/v1/messages/{expiring_id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("answer");
    let shown: Value = r.json().await.expect("json");
    assert_eq!(shown["state"], "failed");
    assert!(
        shown["reason"]
            .as_str()
            .is_some_and(|r| r.contains("expired"))
    );
    sender.stop().await;
}

/// A proxy in front of the receiver that loses 30 % of requests (never forwarded) and 30 % of
/// responses (forwarded, answer replaced by a bare 503): every message still ends acked, and
/// none is delivered twice.
#[tokio::test]
async fn lossy_path_loses_and_doubles_nothing() {
    let receiver = spawn_app_with(|_| {}).await;
    let proxy = LossyProxy::start(receiver.url("/wsr/default"), 30).await;

    let sender = sender_app().await;
    let fast =
        json!({ "max_attempts": 1000, "interval_ms": 200, "backoff": 1, "expiry_seconds": 86400 });
    for i in 0..60 {
        let (status, answer) = submit(&sender, json!({ "destination": proxy.url, "agreement": fast, "body": format!("<s:One xmlns:s=\"urn:s\">{i}</s:One>") })).await;
        assert_eq!(status, 202, "{answer}");
    }
    let mut ordered = fast.clone();
    ordered["message_order"] = json!(true);
    let mut group: Option<String> = None;
    for n in 0..40u64 {
        let mut g = json!({ "last": n == 39 });
        if let Some(id) = &group {
            g["id"] = json!(id);
        }
        let (status, answer) = submit(&sender, json!({ "destination": proxy.url, "agreement": ordered, "group": g, "body": format!("<s:Seq xmlns:s=\"urn:s\">{n}</s:Seq>") })).await;
        assert_eq!(status, 202, "{answer}");
        group.get_or_insert_with(|| answer["group_id"].as_str().expect("group").to_owned());
    }
    let messages = all_final(&sender, 100).await;
    assert!(messages.iter().all(|m| m.outbound.state.name() == "acked"));
    let inbox = receiver.inbox().await;
    let mut keys: Vec<(String, Option<u64>)> = inbox
        .iter()
        .map(|e| (e.group_id.clone(), e.number))
        .collect();
    let total = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), total, "nothing delivered twice");
    assert_eq!(total, 100, "everything delivered");
    let ordered_numbers: Vec<u64> = inbox
        .iter()
        .filter(|e| Some(&e.group_id) == group.as_ref())
        .filter_map(|e| e.number)
        .collect();
    assert_eq!(
        ordered_numbers,
        (0..40).collect::<Vec<_>>(),
        "the ordered group in order"
    );
    let (lost_req, lost_resp) = proxy.losses();
    assert!(
        lost_req > 10 && lost_resp > 10,
        "the path really lost requests ({lost_req}) and responses ({lost_resp})"
    );
    sender.stop().await;
    receiver.stop().await;
}

/// An HTTP proxy that loses a share of requests (never forwarded) and of responses (forwarded,
/// but the answer replaced by a bare 503), decided by a deterministic generator.
/// For the test proxies: POSTs `body` on to `upstream` (with its Content-Type) and returns
/// the upstream's answer as the proxy's own (502 when it cannot be reached).
async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let mut request = client.post(upstream).body(body);
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        request = request.header(header::CONTENT_TYPE, ct.clone());
    }
    let Ok(answer) = request.send().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = answer.status();
    let ct = answer.headers().get(header::CONTENT_TYPE).cloned();
    let text = answer.text().await.unwrap_or_default();
    let mut response = (status, text).into_response();
    if let Some(ct) = ct {
        response.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    response
}

struct LossyProxy {
    url: String,
    lost_requests: std::sync::Arc<std::sync::atomic::AtomicU64>,
    lost_responses: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LossyProxy {
    async fn start(upstream: String, percent: u64) -> LossyProxy {
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::IntoResponse;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};

        let state = Arc::new(AtomicU64::new(0x2545_F491_4F6C_DD1D));
        let lost_requests = Arc::new(AtomicU64::new(0));
        let lost_responses = Arc::new(AtomicU64::new(0));
        let client = reqwest::Client::new();
        let (lreq, lresp) = (lost_requests.clone(), lost_responses.clone());
        let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
            let (client, upstream, state, lreq, lresp) = (
                client.clone(),
                upstream.clone(),
                state.clone(),
                lreq.clone(),
                lresp.clone(),
            );
            async move {
                let roll = || {
                    let mut x = state.load(Ordering::SeqCst);
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    state.store(x, Ordering::SeqCst);
                    x % 100 < percent
                };
                let (lose_request, lose_response) = (roll(), roll());
                if lose_request {
                    lreq.fetch_add(1, Ordering::SeqCst);
                    return StatusCode::SERVICE_UNAVAILABLE.into_response();
                }
                let relayed = forward(&client, &upstream, &headers, body).await;
                if lose_response {
                    lresp.fetch_add(1, Ordering::SeqCst);
                    return StatusCode::SERVICE_UNAVAILABLE.into_response();
                }
                relayed
            }
        };
        let router = axum::Router::new().route("/", axum::routing::post(handler));
        let url = format!("{}/", super::support::serve_local(router).await);
        LossyProxy {
            url,
            lost_requests,
            lost_responses,
        }
    }

    fn losses(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.lost_requests.load(Ordering::SeqCst),
            self.lost_responses.load(Ordering::SeqCst),
        )
    }
}

/// The sending gateway as a child process, SIGKILLed three times mid-stream and restarted on
/// the same file: every pending message resumes with the same identity (delivered exactly
/// once, the ordered group in order), and a message that cannot be delivered stops at its
/// ExpiryTime — nothing goes out after it — ending `failed` with its reason and an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_sender_resumes_every_pending_message_with_the_same_identity() {
    use super::support::{mock_partner, start_gateway};

    let receiver = spawn_app_with(|_| {}).await;
    let mut dead_end = mock_partner(vec![500; 1000]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = super::support::free_port();
    let config = dir.path().join("sender.toml");
    let database = super::support::fresh_database(dir.path(), "sender.db").await;
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\nsend_window = 8\n\
             resolve_in_doubt_seconds = 1\npoll_interval_ms = 200\n\
             allow_url_destinations = true\nallowed_destination_hosts = [\"127.0.0.1\"]\n\
             [default_agreement]\nmax_attempts = 1000\ninterval_ms = 100\nbackoff = 1\nexpiry_seconds = 3600\n\
             [[tokens]]\ntoken = \"{TOKEN}\"\nprincipal = \"app\"\nscopes = [\"produce\"]\n",
            database.setting()
        ),
    )
    .expect("config");
    let api = format!("http://127.0.0.1:{port}/api/v1/messages");
    let client = reqwest::Client::new();
    let post = |body: Value| {
        let (client, api) = (client.clone(), api.clone());
        async move {
            let r = client
                .post(&api)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .expect("API answers");
            assert_eq!(r.status().as_u16(), 202);
            r.json::<Value>().await.expect("json")
        }
    };
    let mut child = start_gateway(&config);

    let destination = receiver.url("/wsr/default");
    let mut expected = std::collections::BTreeSet::new();
    for i in 0..60 {
        let a = post(json!({ "destination": destination, "body": format!("<r:One xmlns:r=\"urn:r\">{i}</r:One>") })).await;
        expected.insert((a["group_id"].as_str().expect("group").to_owned(), None));
    }
    let mut group: Option<String> = None;
    for n in 0..60u64 {
        let mut g = json!({ "last": n == 59 });
        if let Some(id) = &group {
            g["id"] = json!(id);
        }
        let a = post(json!({ "destination": destination, "agreement": { "message_order": true, "max_attempts": 1000, "interval_ms": 100, "backoff": 1 }, "group": g, "body": format!("<r:Seq xmlns:r=\"urn:r\">{n}</r:Seq>") })).await;
        let id = a["group_id"].as_str().expect("group").to_owned();
        expected.insert((id.clone(), Some(n)));
        group.get_or_insert(id);
    }
    let doomed = post(json!({ "destination": dead_end.url, "agreement": { "expiry_seconds": 2, "waits_ms": vec![200; 100] }, "body": "<r:Never xmlns:r=\"urn:r\"/>" })).await;
    let doomed_id = doomed["id"].as_str().expect("id").to_owned();
    let expiry_wall = chrono::Utc::now() + chrono::Duration::seconds(2);

    let mut killed_with_pending = 0;
    for pause in [150u64, 350, 250] {
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
        child.kill().expect("SIGKILL the sender");
        child.wait().expect("reaped");
        // Pending: messages not yet at the receiver, or the doomed one still being retried
        // (until its expiry). A fast sender may deliver the rest before the first kill.
        let undelivered = receiver.inbox().await.len() < expected.len();
        if undelivered || chrono::Utc::now() < expiry_wall {
            killed_with_pending += 1;
        }
        child = start_gateway(&config);
    }
    assert!(killed_with_pending >= 1, "at least one kill hit the stream");

    // Wait (bounded) until every message is final, reading the sender's own API.
    let mut finals = Vec::new();
    for _ in 0..600 {
        let r = client
            .get(format!("{api}?limit=1000"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("list");
        let list: Value = r.json().await.expect("json");
        finals = list["messages"].as_array().cloned().unwrap_or_default();
        if finals.len() == 121
            && finals.iter().all(|m| {
                ["acked", "failed", "faulted"].contains(&m["state"].as_str().unwrap_or(""))
            })
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    child.kill().expect("stop the sender");
    child.wait().expect("reaped");

    let acked = finals.iter().filter(|m| m["state"] == "acked").count();
    assert_eq!(acked, 120, "every deliverable message acked");
    let doomed = finals
        .iter()
        .find(|m| m["id"] == doomed_id.as_str())
        .expect("doomed message");
    assert_eq!(doomed["state"], "failed");
    assert!(
        doomed["reason"]
            .as_str()
            .is_some_and(|r| r.contains("expired")),
        "{doomed}"
    );
    // The message did not go out after its ExpiryTime (allowing the partner's clock reading a
    // moment). PollRequests asking what became of it may, and get 500s too: the partner never
    // said whether it had it, so it failed as "delivery unknown" after resolve_in_doubt.
    let mut posts = 0;
    while let Ok((headers, body)) = dead_end.received.try_recv() {
        if body.contains("PollRequest") {
            continue;
        }
        let at = headers
            .get("x-received-at")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| chrono::DateTime::parse_from_rfc3339(v).ok())
            .expect("arrival time");
        assert!(
            at < expiry_wall,
            "an attempt at {at} came after the ExpiryTime {expiry_wall}"
        );
        posts += 1;
    }
    assert!(
        posts >= 2,
        "the doomed message was tried, and resent ({posts})"
    );
    assert!(chrono::Utc::now() > expiry_wall, "checked after its expiry");

    let inbox = receiver.inbox().await;
    let delivered: Vec<(String, Option<u64>)> = inbox
        .iter()
        .map(|e| (e.group_id.clone(), e.number))
        .collect();
    let unique: std::collections::BTreeSet<_> = delivered.iter().cloned().collect();
    assert_eq!(unique.len(), delivered.len(), "nothing delivered twice");
    assert_eq!(unique, expected, "the same identities as submitted");
    let ordered: Vec<u64> = inbox
        .iter()
        .filter(|e| Some(&e.group_id) == group.as_ref())
        .filter_map(|e| e.number)
        .collect();
    assert_eq!(
        ordered,
        (0..60).collect::<Vec<_>>(),
        "the ordered group in order"
    );
    receiver.stop().await;
}

/// `wsr-gateway send` and `wsr-gateway status` against a running gateway's API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_and_status() {
    let receiver = spawn_app_with(|_| {}).await;
    let sender = sender_app().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let files: Vec<std::path::PathBuf> = (0..3)
        .map(|i| {
            let path = dir.path().join(format!("m{i}.xml"));
            std::fs::write(&path, format!("<c:Cli xmlns:c=\"urn:c\">{i}</c:Cli>")).expect("write");
            path
        })
        .collect();
    let (api, to) = (sender.url(""), receiver.url("/wsr/default"));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"))
            .args([
                "send",
                "--api",
                &api,
                "--token",
                TOKEN,
                "--to",
                &to,
                "--ordered",
                "--last",
                "--soap",
                "1.2",
            ])
            .args(&files)
            .output()
            .expect("send runs")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let numbers: Vec<&str> = lines
        .iter()
        .map(|l| l.split('\t').nth(2).expect("number"))
        .collect();
    assert_eq!(numbers, vec!["0", "1", "2"]);
    let messages = all_final(&sender, 3).await;
    assert!(messages.iter().all(|m| m.outbound.state.name() == "acked"));
    let first_id = lines[0].split('\t').next().expect("id").to_owned();
    let api = sender.url("");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"))
            .args([
                "status", "--api", &api, "--token", TOKEN, "-o", "json", &first_id,
            ])
            .output()
            .expect("status runs")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).expect("status prints JSON");
    assert_eq!(shown["state"], "acked");
    assert_eq!(shown["soap_version"], "1.2");
    let numbers: Vec<Option<u64>> = receiver
        .inbox()
        .await
        .into_iter()
        .map(|e| e.number)
        .collect();
    assert_eq!(numbers, vec![Some(0), Some(1), Some(2)]);
    sender.stop().await;
    receiver.stop().await;
}

/// State changes reach the notify webhook of the submission and the event stream.
#[tokio::test]
async fn notify_webhook_and_event_stream() {
    use super::support::mock_partner;
    let receiver = spawn_app_with(|_| {}).await;
    let sender = sender_app().await;
    let mut hook = mock_partner(vec![]).await;
    // Notify URLs are registered webhooks (D15).
    sender
        .store
        .add_endpoint(
            wsr_gateway::store::Endpoints::Push,
            None,
            &hook.url,
            chrono::Utc::now(),
        )
        .await
        .expect("register the webhook");
    let (status, answer) = submit(
        &sender,
        json!({ "destination": receiver.url("/wsr/default"), "body": "<n:N xmlns:n=\"urn:n\"/>", "notify_url": hook.url }),
    )
    .await;
    assert_eq!(status, 202);
    let id = answer["id"].as_str().expect("id").to_owned();
    let (_, body) = hook.next_post().await;
    let notified: Value = serde_json::from_str(&body).expect("notify JSON");
    assert_eq!(
        (notified["id"].as_str(), notified["state"].as_str()),
        (Some(id.as_str()), Some("acked"))
    );

    let mut events = sender
        .client
        .get(sender.url("/api/v1/events?after=0"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("event stream");
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let mut seen = String::new();
    while !seen.contains("\"state\":\"acked\"") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), events.chunk())
            .await
            .expect("events arrive")
            .expect("stream")
            .expect("not closed");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    for state in ["queued", "sent", "acked"] {
        assert!(
            seen.contains(&format!("\"state\":\"{state}\"")),
            "{state} in {seen}"
        );
    }
    sender.stop().await;
    receiver.stop().await;
}

/// Closing a group marks its latest message `last` while it is unsent; afterwards the group
/// takes no more messages, and a group whose latest message already went out cannot be closed
/// after the fact.
#[tokio::test]
async fn closing_a_group() {
    // A window of one: a later message of an ordered group waits until the earlier is acked.
    let sender = sender_app_window_1().await;
    // Nothing listens on port 9, but the first attempt is what matters here.
    let far = "http://127.0.0.1:9/wsr/default";
    let (_, first) = submit(
        &sender,
        json!({ "destination": far, "group": {}, "body": "<a/>",
        "agreement": { "waits_ms": [600000] } }),
    )
    .await;
    let group = first["group_id"].as_str().expect("group").to_owned();
    // Let the first go out, so it cannot be closed any more.
    for _ in 0..200 {
        let m = sender
            .store
            .out_message(first["id"].as_str().expect("id"))
            .await
            .expect("read")
            .expect("message");
        if m.outbound.attempts > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let close = |g: &str| {
        sender
            .client
            .post(sender.url(&format!("/api/v1/groups/{g}/close")))
            .bearer_auth(TOKEN)
            .send()
    };
    assert_eq!(
        close(&group).await.expect("answer").status(),
        409,
        "already sent without last"
    );
    // A second group whose latest message waits for its turn: it can be closed.
    let (_, held) = submit(
        &sender,
        json!({ "destination": far, "group": {}, "body": "<b/>",
        "agreement": { "message_order": true, "waits_ms": [600000] } }),
    )
    .await;
    let g2 = held["group_id"].as_str().expect("group").to_owned();
    let (_, second) = submit(
        &sender,
        json!({ "destination": far, "group": { "id": g2 }, "body": "<c/>",
        "agreement": { "message_order": true, "waits_ms": [600000] } }),
    )
    .await;
    let answer = close(&g2).await.expect("answer");
    assert_eq!(answer.status(), 200);
    let closed: Value = answer.json().await.expect("json");
    assert_eq!(closed["last"], json!(second["number"]));
    let stored = sender
        .store
        .out_message(second["id"].as_str().expect("id"))
        .await
        .expect("read")
        .expect("message");
    assert!(
        stored.envelope.contains(r#"last="true""#),
        "{}",
        stored.envelope
    );
    let (status, _) = submit(
        &sender,
        json!({ "destination": far, "group": { "id": g2 }, "body": "<d/>",
        "agreement": { "message_order": true } }),
    )
    .await;
    assert_eq!(status, 409, "a closed group takes no more messages");
    sender.stop().await;
}

/// Acks count only from where the message went: a callback cannot ack a message sent with the
/// Response pattern, and nothing acks a message never sent. A failed ordered group takes no
/// more messages.
#[tokio::test]
async fn acks_from_the_wrong_source_are_ignored_and_failed_groups_refuse_more() {
    use wsr_gateway::wsr::{Headers, Reply, Response, SoapVersion, write_envelope};
    let sender = sender_app_window_1().await;
    let far = "http://127.0.0.1:9/wsr/default";
    let ordered = json!({ "message_order": true, "expiry_seconds": 2, "waits_ms": [100000] });
    let (_, first) = submit(
        &sender,
        json!({ "destination": far, "group": {}, "agreement": ordered, "body": "<a/>" }),
    )
    .await;
    let group = first["group_id"].as_str().expect("group").to_owned();
    let (_, second) = submit(&sender, json!({ "destination": far, "group": { "id": group }, "agreement": ordered, "body": "<b/>" })).await;
    // A forged callback ack for both: the first was sent by Response, the second never sent.
    let ack = Response {
        replies: vec![Reply::Sequence {
            group_id: wsr_gateway::wsr::GroupId::parse(&group).expect("group"),
            ranges: vec![wsr_gateway::wsr::ReplyRange {
                range: wsr_gateway::wsr::SeqRange::new(0, 1).expect("range"),
                fault: None,
            }],
        }],
    };
    let xml = write_envelope(
        SoapVersion::Soap11,
        Headers {
            response: Some(&ack),
            ..Headers::default()
        },
        "",
    );
    let answer = sender.post("/wsr/_callback", "text/xml", xml).await;
    assert_eq!(answer.status, 202);
    for id in [&first["id"], &second["id"]] {
        let m = sender
            .store
            .out_message(id.as_str().expect("id"))
            .await
            .expect("read")
            .expect("message");
        assert_ne!(
            m.outbound.state.name(),
            "acked",
            "{id} acked from the wrong source"
        );
    }
    // The first expires unacknowledged; the group fails, and takes no more.
    let messages = all_final(&sender, 2).await;
    assert!(messages.iter().all(|m| m.outbound.state.name() == "failed"));
    let (status, _) = submit(&sender, json!({ "destination": far, "group": { "id": group }, "agreement": ordered, "body": "<c/>" })).await;
    assert_eq!(status, 409);
    sender.stop().await;
}

/// A second application's token, for keys scoped by principal.
const OTHER_TOKEN: &str = "other-producer-token-0123456789";

/// A sender with two applications: `app` (TOKEN) and `other` (OTHER_TOKEN).
async fn two_app_sender() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![
            ApiToken {
                secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(
                    TOKEN,
                )),
                principal: "app".into(),
                scopes: vec![Scope::Produce],
                topics: wsr_gateway::config::all_topics(),
            },
            ApiToken {
                secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(
                    OTHER_TOKEN,
                )),
                principal: "other".into(),
                scopes: vec![Scope::Produce],
                topics: wsr_gateway::config::all_topics(),
            },
        ];
        c.send_window = 1;
        c.partners
            .insert_address("far", "http://127.0.0.1:9/wsr/default");
        allow_loopback_urls(c);
    })
    .await
}

/// A submit with an `Idempotency-Key`: status, whether it was answered as a replay, answer.
async fn submit_keyed(app: &TestApp, token: &str, key: &str, body: &Value) -> (u16, bool, Value) {
    let r = app
        .client
        .post(app.url("/api/v1/messages"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("API answers");
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (status, replayed, r.json().await.unwrap_or(Value::Null))
}

/// The messages `GET /api/v1/messages` lists.
async fn listed(app: &TestApp) -> Vec<Value> {
    let list: Value = app
        .client
        .get(app.url("/api/v1/messages?limit=1000"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    list["messages"].as_array().cloned().unwrap_or_default()
}

/// A retried submit (same key, same request) answers the message stored the first time, as
/// the first answer did and marked `Idempotent-Replayed`; one message exists, and the partner
/// receives one WS-R identity once.
#[tokio::test]
async fn a_retried_submit_with_the_same_key_stores_and_sends_one_message() {
    let receiver = spawn_app_with(|_| {}).await;
    let sender = two_app_sender().await;
    let body = json!({ "destination": receiver.url("/wsr/default"), "group": {},
        "body": "<o:Order xmlns:o=\"urn:o\">1</o:Order>" });
    let (status, replayed, first) = submit_keyed(&sender, TOKEN, "order-1", &body).await;
    assert_eq!((status, replayed), (202, false), "{first}");
    for _ in 0..2 {
        let (status, replayed, again) = submit_keyed(&sender, TOKEN, "order-1", &body).await;
        assert_eq!((status, replayed), (202, true), "{again}");
        assert_eq!(again, first, "the same id, group, number and status URL");
    }
    let messages = all_final(&sender, 1).await;
    assert_eq!(messages[0].id, first["id"].as_str().expect("id"));
    assert_eq!(messages[0].outbound.state.name(), "acked");
    let shown = listed(&sender).await;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["idempotency_key"], "order-1");
    let inbox = receiver.inbox().await;
    let identities: Vec<(String, Option<u64>)> = inbox
        .iter()
        .map(|e| (e.group_id.clone(), e.number))
        .collect();
    assert_eq!(
        identities,
        vec![(
            first["group_id"].as_str().expect("group").to_owned(),
            Some(0)
        )],
        "the partner got one message identity"
    );
    sender.stop().await;
    receiver.stop().await;
}

/// A key used again for a different request is refused (422, `idempotency-key-reused`) and
/// nothing new is stored.
#[tokio::test]
async fn a_key_reused_for_a_different_request_is_refused() {
    let sender = two_app_sender().await;
    let far = "http://127.0.0.1:9/wsr/default";
    let agreement = json!({ "waits_ms": [600000] });
    let first = json!({ "destination": far, "agreement": agreement, "body": "<a/>" });
    let (status, _, stored) = submit_keyed(&sender, TOKEN, "k-1", &first).await;
    assert_eq!(status, 202, "{stored}");
    for other in [
        json!({ "destination": far, "agreement": agreement, "body": "<b/>" }),
        json!({ "destination": far, "agreement": agreement, "body": "<a/>", "soap_version": "1.2" }),
        json!({ "destination": far, "agreement": { "waits_ms": [1000] }, "body": "<a/>" }),
        json!({ "destination": far, "agreement": agreement, "body": "<a/>", "group": {} }),
    ] {
        let (status, replayed, answer) = submit_keyed(&sender, TOKEN, "k-1", &other).await;
        assert_eq!((status, replayed), (422, false), "{other}: {answer}");
        assert_eq!(answer["error"], "idempotency-key-reused", "{answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.contains("Idempotency-Key") && r.contains("k-1")),
            "{answer}"
        );
    }
    let shown = listed(&sender).await;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["id"], stored["id"]);
    sender.stop().await;
}

/// The retry of a submit that started a new group answers that group (the application does
/// not know it yet) and takes no number: the next message of the group is number 1. And once
/// the ordered group failed, a retry of a message it had accepted still answers that message.
#[tokio::test]
async fn a_retried_first_message_of_a_new_group_answers_its_group_and_takes_no_number() {
    let sender = two_app_sender().await;
    let far = "http://127.0.0.1:9/wsr/default";
    let ordered = json!({ "message_order": true, "expiry_seconds": 2, "waits_ms": [100000] });
    let first = json!({ "destination": far, "group": {}, "agreement": ordered, "body": "<a/>" });
    let (status, _, original) = submit_keyed(&sender, TOKEN, "g-first", &first).await;
    assert_eq!(status, 202, "{original}");
    assert_eq!(original["number"], 0);
    let (status, replayed, again) = submit_keyed(&sender, TOKEN, "g-first", &first).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(
        again["group_id"], original["group_id"],
        "the group it started"
    );
    assert_eq!(again["id"], original["id"]);
    assert_eq!(again["number"], 0);
    let group = original["group_id"].as_str().expect("group").to_owned();
    let second = json!({ "destination": far, "group": { "id": group }, "agreement": ordered,
        "body": "<b/>" });
    let (status, _, next) = submit_keyed(&sender, TOKEN, "g-second", &second).await;
    assert_eq!(status, 202, "{next}");
    assert_eq!(next["number"], 1, "the replay took no number");
    assert_eq!(next["group_id"], original["group_id"]);
    // The first expires unacknowledged: the ordered group fails, and takes no new message…
    let messages = all_final(&sender, 2).await;
    assert!(messages.iter().all(|m| m.outbound.state.name() == "failed"));
    let third = json!({ "destination": far, "group": { "id": group }, "agreement": ordered,
        "body": "<c/>" });
    let (status, _, refused) = submit_keyed(&sender, TOKEN, "g-third", &third).await;
    assert_eq!(status, 409, "{refused}");
    // …but a retry of one it accepted is still answered with that message.
    let (status, replayed, again) = submit_keyed(&sender, TOKEN, "g-second", &second).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(again, next);
    assert_eq!(listed(&sender).await.len(), 2);
    sender.stop().await;
}

/// Keys are scoped by principal: two applications using the same key get two messages.
#[tokio::test]
async fn the_same_key_from_two_applications_is_two_messages() {
    let sender = two_app_sender().await;
    let body = json!({ "destination": "http://127.0.0.1:9/wsr/default",
        "agreement": { "waits_ms": [600000] }, "body": "<a/>" });
    let (status, replayed, mine) = submit_keyed(&sender, TOKEN, "shared-key", &body).await;
    assert_eq!((status, replayed), (202, false), "{mine}");
    let (status, replayed, theirs) = submit_keyed(&sender, OTHER_TOKEN, "shared-key", &body).await;
    assert_eq!((status, replayed), (202, false), "{theirs}");
    assert_ne!(mine["id"], theirs["id"]);
    assert_ne!(mine["group_id"], theirs["group_id"]);
    // Each application's retry answers its own message.
    let (_, replayed, again) = submit_keyed(&sender, OTHER_TOKEN, "shared-key", &body).await;
    assert!(replayed);
    assert_eq!(again, theirs);
    // Two messages stored; each application lists only its own.
    let stored = sender.store.out_messages(None, None, None, 1000).await;
    assert_eq!(stored.expect("stored").len(), 2);
    assert_eq!(listed(&sender).await.len(), 1);
    sender.stop().await;
}

/// A key must be 1–255 visible ASCII characters; otherwise a 400 names the header and
/// nothing is stored.
#[tokio::test]
async fn a_malformed_idempotency_key_is_a_400_naming_the_header() {
    use axum::http::HeaderValue;
    let sender = two_app_sender().await;
    let body = json!({ "destination": "http://127.0.0.1:9/wsr/default",
        "agreement": { "waits_ms": [600000] }, "body": "<a/>" });
    let long = "k".repeat(256);
    let bad: Vec<HeaderValue> = vec![
        HeaderValue::from_static(""),
        HeaderValue::from_static("two words"),
        HeaderValue::from_static("tab\there"),
        HeaderValue::from_str(&long).expect("header"),
        HeaderValue::from_bytes("caf\u{e9}".as_bytes()).expect("obs-text header"),
    ];
    for key in bad {
        let r = sender
            .client
            .post(sender.url("/api/v1/messages"))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", key.clone())
            .json(&body)
            .send()
            .await
            .expect("API answers");
        assert_eq!(r.status().as_u16(), 400, "{key:?}");
        let answer: Value = r.json().await.expect("json");
        assert_eq!(answer["error"], "invalid-field", "{key:?}: {answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("Idempotency-Key:")),
            "{key:?}: {answer}"
        );
    }
    // Twice is ambiguous too.
    let r = sender
        .client
        .post(sender.url("/api/v1/messages"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "one")
        .header("Idempotency-Key", "two")
        .json(&body)
        .send()
        .await
        .expect("API answers");
    assert_eq!(r.status().as_u16(), 400);
    assert!(listed(&sender).await.is_empty(), "nothing stored");
    // The longest key, and every visible character, are fine.
    let visible: String = (0x21u8..=0x7E).map(char::from).collect();
    for key in ["k".repeat(255), visible] {
        let (status, _, answer) = submit_keyed(&sender, TOKEN, &key, &body).await;
        assert_eq!(status, 202, "{key}: {answer}");
    }
    sender.stop().await;
}

/// The key is stored with the message: a retry after the gateway restarted on the same
/// database is still a replay.
#[tokio::test]
async fn a_retry_after_a_restart_is_still_a_replay() {
    use super::support::start;
    let sender = two_app_sender().await;
    let body = json!({ "destination": "far", "group": {},
        "agreement": { "waits_ms": [600000] }, "body": "<a/>" });
    let (status, _, original) = submit_keyed(&sender, TOKEN, "durable", &body).await;
    assert_eq!(status, 202, "{original}");
    let (mut config, clock, dir) = sender.stop().await;
    // The partner it named is gone from the configuration since: the retry still gets its
    // message back (the key is looked up before the request is checked).
    config.partners.clear();
    let sender = start(config, clock).await;
    let (status, replayed, again) = submit_keyed(&sender, TOKEN, "durable", &body).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(again, original);
    assert_eq!(listed(&sender).await.len(), 1);
    sender.stop().await;
    drop(dir);
}

/// Chaos-harness finding: a message delivered by the partner whose every ack was lost was
/// reported `failed` at its ExpiryTime (and, in an ordered group, took the rest of the group
/// with it) although the partner's application had processed it. Now a message that went out
/// without a verdict is in doubt, and the sender polls: the partner's ack makes it `acked`; a
/// poll answer that does not name it, asked after its expiry, proves it was never delivered.
#[tokio::test]
async fn a_message_whose_acks_were_lost_is_settled_by_poll_not_failed() {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;

    let receiver = spawn_app_with(|_| {}).await;
    let upstream = receiver.url("/wsr/default");
    // Polls pass; "Lost" messages reach the receiver but their answers are lost; "Never"
    // messages never reach it.
    let client = reqwest::Client::new();
    let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
        let (client, upstream) = (client.clone(), upstream.clone());
        async move {
            let text = String::from_utf8_lossy(&body).into_owned();
            if text.contains("Never") {
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            let relayed = forward(&client, &upstream, &headers, body).await;
            if !text.contains("PollRequest") {
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            relayed
        }
    };
    let router = axum::Router::new().route("/wsr/default", axum::routing::post(handler));
    let proxy = format!("{}/wsr/default", super::support::serve_local(router).await);

    let sender = sender_app().await;
    let mut ids = Vec::new();
    let mut group: Option<String> = None;
    // A singleton, an ordered group of two (whose later message would have been failed with
    // the first), and one that never arrives.
    for (body, ordered, last) in [
        ("<t:Lost xmlns:t=\"urn:t\"/>", false, false),
        ("<t:Lost xmlns:t=\"urn:t\">0</t:Lost>", true, false),
        ("<t:Lost xmlns:t=\"urn:t\">1</t:Lost>", true, true),
        ("<t:Never xmlns:t=\"urn:t\"/>", false, false),
    ] {
        let mut request = json!({
            "destination": proxy,
            "agreement": { "message_order": ordered, "expiry_seconds": 3, "waits_ms": [100] },
            "body": body,
        });
        if ordered {
            request["group"] = json!({ "id": group, "last": last });
        }
        let (status, answer) = submit(&sender, request).await;
        assert_eq!(status, 202, "{answer}");
        if ordered {
            group = answer["group_id"].as_str().map(str::to_owned);
        }
        ids.push(answer["id"].as_str().expect("id").to_owned());
    }
    let messages = all_final(&sender, 4).await;
    let state = |id: &str| {
        let m = messages.iter().find(|m| m.id == id).expect("message");
        m.outbound.state.clone()
    };
    use wsr_gateway::rmp::sender::OutState;
    for id in &ids[..3] {
        assert_eq!(state(id), OutState::Acked, "delivered: acked by poll");
    }
    assert!(
        matches!(state(&ids[3]), OutState::Failed(ref r) if r.contains("confirms it was not delivered")),
        "{:?}",
        state(&ids[3])
    );
    assert_eq!(receiver.inbox().await.len(), 3, "each delivered once");
    sender.stop().await;
    receiver.stop().await;
}

/// Chaos-harness finding: the poll pass ran between send passes, so a slow poll (a partner
/// that takes its time to answer PollRequests, or many messages waiting on polls) held up
/// first attempts until they expired ("expired before it was sent"). Polls now run beside
/// the sends: with a poll hanging, a new message still goes out and is acked.
#[tokio::test]
async fn a_hanging_poll_does_not_hold_up_sending() {
    use axum::http::StatusCode;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let polled = Arc::new(AtomicBool::new(false));
    let seen = polled.clone();
    // Takes every message (202, no ack: Poll pattern) and never answers a PollRequest.
    let handler = move |body: axum::body::Bytes| {
        let seen = seen.clone();
        async move {
            if String::from_utf8_lossy(&body).contains("PollRequest") {
                seen.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            StatusCode::ACCEPTED
        }
    };
    let router = axum::Router::new().route("/wsr/slow", axum::routing::post(handler));
    let slow = format!("{}/wsr/slow", super::support::serve_local(router).await);
    let receiver = spawn_app_with(|_| {}).await;
    let sender = sender_app().await;

    let (status, _) = submit(
        &sender,
        json!({ "destination": slow, "agreement": { "reply_pattern": "Poll" }, "body": "<p/>" }),
    )
    .await;
    assert_eq!(status, 202);
    // Move the clock until a poll is under way (and hangs).
    for _ in 0..200 {
        if polled.load(Ordering::SeqCst) {
            break;
        }
        sender.clock.advance(chrono::Duration::milliseconds(100));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(polled.load(Ordering::SeqCst), "a poll went out");

    let (status, answer) = submit(
        &sender,
        json!({ "destination": receiver.url("/wsr/default"), "body": "<now/>" }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id").to_owned();
    let mut state = String::new();
    // Bounded: the hanging poll would block for the 30 s request timeout.
    for _ in 0..100 {
        let m = sender
            .store
            .out_message(&id)
            .await
            .expect("read")
            .expect("message");
        state = m.outbound.state.name().to_owned();
        if state == "acked" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(state, "acked", "sent and acked while the poll hangs");
    receiver.stop().await;
}

/// Chaos-harness finding: due messages were taken 500 at a time in group-id order, and group
/// ids grow with time, so while older messages kept coming due for resends (Poll and Callback
/// messages waiting for their acks), new short-lived ones waited behind them until they expired
/// ("expired before it was sent": 1,534 of 20,000 in a long run). Due messages are now taken
/// longest due first.
#[tokio::test]
async fn the_longest_due_message_goes_first_whatever_its_group() {
    use wsr_gateway::clock::Clock;
    let sender = sender_app().await;
    let far = "http://127.0.0.1:9/wsr/default";
    let attempted = |id: String| {
        let store = sender.store.clone();
        async move {
            for _ in 0..200 {
                let m = store
                    .out_message(&id)
                    .await
                    .expect("read")
                    .expect("message");
                if m.outbound.attempts == 1 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("{id} was not attempted");
        }
    };
    // An old message resent every minute, a new one every second; each tried once.
    let t0 = sender.clock.now();
    let slow = json!({ "waits_ms": [60000, 60000] });
    let (_, old) = submit(
        &sender,
        json!({ "destination": far, "agreement": slow, "body": "<old/>" }),
    )
    .await;
    attempted(old["id"].as_str().expect("id").to_owned()).await;
    sender.clock.advance(chrono::Duration::seconds(1));
    let quick = json!({ "waits_ms": [1000, 1000] });
    let (_, new) = submit(
        &sender,
        json!({ "destination": far, "agreement": quick, "body": "<new/>" }),
    )
    .await;
    let new_id = new["id"].as_str().expect("id").to_owned();
    attempted(new_id.clone()).await;
    // A minute on, both are due: the new one since t0 + 2 s, the old one since t0 + 60 s.
    let now = t0 + chrono::Duration::seconds(61);
    let first = sender
        .store
        .due_outbound(now, 8, &Default::default(), 1)
        .await
        .expect("due");
    assert_eq!(
        first
            .messages
            .iter()
            .map(|m| m.id.as_str())
            .collect::<Vec<_>>(),
        vec![new_id.as_str()],
        "the longest due goes first"
    );
    sender.stop().await;
}

/// Waiting is by notification: with a window of 1, each message of an ordered group goes out
/// when the ack of the one before it is committed — the test clock never moves, so no timer
/// of the gateway's clock can be what sends them.
#[tokio::test]
async fn an_ack_opens_the_window_without_the_clock_moving() {
    let receiver = spawn_app_with(|_| {}).await;
    let sender = sender_app_window_1().await;
    let agreement = json!({ "reply_pattern": "Response", "message_order": true });
    let mut group: Option<String> = None;
    for n in 0..10u64 {
        let mut g = json!({ "last": n == 9 });
        if let Some(id) = &group {
            g["id"] = json!(id);
        }
        let (status, answer) = submit(
            &sender,
            json!({ "destination": receiver.url("/wsr/default"), "agreement": agreement, "group": g, "body": format!("<o:Line xmlns:o=\"urn:o\">{n}</o:Line>") }),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
        group.get_or_insert_with(|| answer["group_id"].as_str().expect("group id").to_owned());
    }
    // Bounded: at most 20 s of wall time; the clock stays where it was.
    let mut states = Vec::new();
    for _ in 0..400 {
        states = sender
            .store
            .out_messages(None, None, None, 100)
            .await
            .expect("list")
            .into_iter()
            .map(|m| m.outbound.state.name())
            .collect::<Vec<_>>();
        if states.len() == 10 && states.iter().all(|s| *s == "acked") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(states, vec!["acked"; 10]);
    let numbers: Vec<Option<u64>> = receiver
        .inbox()
        .await
        .into_iter()
        .map(|e| e.number)
        .collect();
    assert_eq!(numbers, (0..10).map(Some).collect::<Vec<_>>());
    receiver.stop().await;
    sender.stop().await;
}

/// An operator's resend and fail (`POST /api/v1/messages/{id}/resend|fail`, admin only): a
/// message in doubt — its one attempt went out, no verdict came — is resent at once with the
/// same identity and acked; another is failed with the operator's reason; a final message
/// refuses both.
#[tokio::test]
async fn an_operator_resends_a_message_in_doubt_and_fails_another() {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use wsr_gateway::rmp::sender::OutState;

    const ADMIN: &str = "operator-token-0123456789";
    let receiver = spawn_app_with(|_| {}).await;
    let upstream = receiver.url("/wsr/default");
    // Down (503: the POST reached it, so it may have been delivered) until the test says up.
    let up = Arc::new(AtomicBool::new(false));
    let client = reqwest::Client::new();
    let is_up = up.clone();
    let handler = move |headers: HeaderMap, body: axum::body::Bytes| {
        let (client, upstream, is_up) = (client.clone(), upstream.clone(), is_up.clone());
        async move {
            if !is_up.load(Ordering::SeqCst) {
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            forward(&client, &upstream, &headers, body).await
        }
    };
    let router = axum::Router::new().route("/wsr/default", axum::routing::post(handler));
    let proxy = format!("{}/wsr/default", super::support::serve_local(router).await);
    let sender = spawn_app_with(|c| {
        c.tokens = vec![
            super::support::producer_token(TOKEN),
            ApiToken::plain(ADMIN, "ops", vec![Scope::Admin]),
        ];
        allow_loopback_urls(c);
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, answer) = submit(
            &sender,
            json!({
                "destination": proxy,
                "agreement": { "expiry_seconds": 3600, "max_attempts": 1, "interval_ms": 100, "backoff": 1 },
                "body": "<t:Doubt xmlns:t=\"urn:t\"/>",
            }),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
        ids.push(answer["id"].as_str().expect("id").to_owned());
    }
    let in_doubt = |id: String| {
        let store = sender.store.clone();
        async move {
            let m = store.out_message(&id).await.expect("read")?;
            m.outbound.in_doubt().then_some(m)
        }
    };
    for id in &ids {
        super::support::eventually("the attempt went out", || in_doubt(id.clone())).await;
    }
    let operate = |id: &str, action: &str, token: &str, body: Option<Value>| {
        let mut request = sender
            .client
            .post(sender.url(&format!("/api/v1/messages/{id}/{action}")))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let answer = request.send().await.expect("answer");
            let status = answer.status().as_u16();
            (status, answer.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, _) = operate(&ids[0], "resend", TOKEN, None).await;
    assert_eq!(status, 403, "operators only");
    let (status, _) = operate("no-such-message", "resend", ADMIN, None).await;
    assert_eq!(status, 404);

    up.store(true, Ordering::SeqCst);
    let (status, answer) = operate(&ids[0], "resend", ADMIN, None).await;
    assert_eq!(status, 200, "{answer}");
    let acked = |id: String| {
        let store = sender.store.clone();
        async move {
            let m = store.out_message(&id).await.expect("read")?;
            (m.outbound.state == OutState::Acked).then_some(m)
        }
    };
    let resent = super::support::eventually("the resend is acked", || acked(ids[0].clone())).await;
    assert_eq!(
        resent.outbound.attempts, 2,
        "one attempt beyond its schedule"
    );
    assert_eq!(receiver.inbox().await.len(), 1, "delivered once");

    let (status, answer) = operate(
        &ids[1],
        "fail",
        ADMIN,
        Some(json!({ "reason": "acme lost it; resubmitted by hand" })),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["state"], "failed", "{answer}");
    let failed = sender
        .store
        .out_message(&ids[1])
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(
        failed.outbound.state,
        OutState::Failed("failed by operator ops: acme lost it; resubmitted by hand".into())
    );
    for (id, action) in [(&ids[0], "fail"), (&ids[1], "resend"), (&ids[1], "fail")] {
        let (status, answer) = operate(id, action, ADMIN, None).await;
        assert_eq!(status, 409, "{action} of a final message: {answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.contains("final")),
            "{answer}"
        );
    }
    let (status, answer) = operate(&ids[1], "fail", ADMIN, Some(json!({ "why": "x" }))).await;
    assert_eq!(status, 400, "unknown field: {answer}");
    sender.stop().await;
    receiver.stop().await;
}
