//! Visibility and hardening of `/api/v1` (issue 12, item 8): authentication before any body or
//! query is read, registered URLs that can always be unregistered, consume principals bound to
//! their tokens' topics, produce principals that see only their own outbound messages, and a
//! bound on event streams per principal.

use chrono::{Duration, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use wsr_gateway::config::{ApiToken, Config, Scope, all_topics};
use wsr_gateway::endpoint::MAX_URL_BYTES;
use wsr_gateway::rmp::agreement::Agreement;
use wsr_gateway::wsr::{
    GroupId, Headers, MessageId, ReplyPattern, Request, SoapVersion, write_envelope,
};

use super::support::{TestApp, spawn_app_with};

const ADMIN: &str = "operator-token-0000000001";
const PRODUCE_ALICE: &str = "alice-producer-000000002";
const PRODUCE_BOB: &str = "bob-producer-00000000003";
const CONSUME_ALICE: &str = "alice-consumer-000000004";
const CONSUME_BOB: &str = "bob-consumer-00000000005";

fn token(token: &str, principal: &str, scopes: &[Scope], topics: &[&str]) -> ApiToken {
    ApiToken {
        secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(token)),
        principal: principal.into(),
        scopes: scopes.to_vec(),
        topics: if topics.is_empty() {
            all_topics()
        } else {
            topics.iter().map(|t| (*t).to_owned()).collect()
        },
    }
}

/// Operators, two producers, two consumers (bob's allowed only `bob/#`), channels `alice` and
/// `bob`, and a partner nobody listens at (the port-9 discard service, refused locally).
fn configure(c: &mut Config) {
    c.tokens = vec![
        token(ADMIN, "operator", &[Scope::Admin], &[]),
        token(PRODUCE_ALICE, "alice", &[Scope::Produce], &[]),
        token(PRODUCE_BOB, "bob", &[Scope::Produce], &[]),
        token(CONSUME_ALICE, "alice", &[Scope::Consume], &[]),
        token(CONSUME_BOB, "bob", &[Scope::Consume], &["bob/#"]),
    ];
    for channel in ["alice", "bob"] {
        c.channels.insert(channel.into(), Agreement::everything());
        c.anonymous_channels.insert(channel.into());
    }
    c.partners
        .insert_address("nowhere", "http://127.0.0.1:9/wsr");
}

async fn gateway() -> TestApp {
    spawn_app_with(configure).await
}

async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = app.client.request(method, app.url(path));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.expect("API answers");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Every `/api/v1` route and method, with a request that is malformed in its path, query or
/// body, and a token whose scope does not allow the route. (`openapi.rs` holds the OpenAPI
/// document to this table.)
pub(crate) fn routes() -> Vec<(Method, &'static str, &'static str)> {
    use Method as M;
    let admin_only = PRODUCE_ALICE;
    let produce_only = CONSUME_ALICE;
    let consume_only = PRODUCE_ALICE;
    vec![
        (M::GET, "/api/v1/messages?limit=many", produce_only),
        (M::POST, "/api/v1/messages", produce_only),
        (M::GET, "/api/v1/messages/x?limit=many", produce_only),
        (M::GET, "/api/v1/messages/x/response", produce_only),
        (M::GET, "/api/v1/messages/x/attempts", produce_only),
        (M::POST, "/api/v1/messages/x/resend?limit=many", admin_only),
        (M::POST, "/api/v1/messages/x/fail", admin_only),
        (M::POST, "/api/v1/messages/x/send-again", admin_only),
        (M::GET, "/api/v1/partners?x=1", admin_only),
        (M::GET, "/api/v1/audit?before=soon", admin_only),
        (M::POST, "/api/v1/groups/%20/close", produce_only),
        (M::GET, "/api/v1/events?after=soon", produce_only),
        (M::GET, "/api/v1/callback-endpoints?x=1", admin_only),
        (M::POST, "/api/v1/callback-endpoints", admin_only),
        (M::DELETE, "/api/v1/callback-endpoints?nourl=1", admin_only),
        (M::GET, "/api/v1/push-endpoints?x=1", admin_only),
        (M::POST, "/api/v1/push-endpoints", admin_only),
        (M::DELETE, "/api/v1/push-endpoints?nourl=1", admin_only),
        (M::GET, "/api/v1/groups?limit=many", admin_only),
        (M::GET, "/api/v1/groups/x?limit=many", admin_only),
        (M::POST, "/api/v1/groups/x/abort", admin_only),
        (M::GET, "/api/v1/inbox?after=soon", admin_only),
        (M::GET, "/api/v1/subscriptions?x=1", consume_only),
        (M::POST, "/api/v1/subscriptions", consume_only),
        (M::GET, "/api/v1/subscriptions/NaN", consume_only),
        (M::DELETE, "/api/v1/subscriptions/NaN", consume_only),
        (M::POST, "/api/v1/subscriptions/NaN/pause", consume_only),
        (M::POST, "/api/v1/subscriptions/NaN/resume", consume_only),
        (M::PUT, "/api/v1/subscriptions/NaN/grants/x", consume_only),
        (
            M::DELETE,
            "/api/v1/subscriptions/NaN/grants/x",
            consume_only,
        ),
        (M::POST, "/api/v1/subscriptions/NaN/sessions", consume_only),
        (
            M::GET,
            "/api/v1/subscriptions/NaN/dead-letters?after=x",
            consume_only,
        ),
        (
            M::POST,
            "/api/v1/subscriptions/NaN/dead-letters/replay",
            consume_only,
        ),
        (
            M::POST,
            "/api/v1/subscriptions/NaN/dead-letters/purge",
            consume_only,
        ),
        (M::DELETE, "/api/v1/sessions/x", consume_only),
        (M::POST, "/api/v1/sessions/x/fetch", consume_only),
        (M::POST, "/api/v1/sessions/x/heartbeat", consume_only),
        (M::POST, "/api/v1/settle", consume_only),
        (M::POST, "/api/v1/respond", consume_only),
        (M::POST, "/api/v1/extend", consume_only),
    ]
}

#[tokio::test]
async fn every_api_route_answers_401_or_403_before_reading_its_path_query_or_body() {
    let app = gateway().await;
    let mut wrong = Vec::new();
    for (method, path, wrong_scope) in routes() {
        for (token, expected) in [
            (None, 401),
            (Some("not-a-configured-token-0"), 401),
            (Some(wrong_scope), 403),
        ] {
            // Not JSON, under a JSON media type and under none.
            for content_type in [Some("application/json"), None] {
                let mut r = app
                    .client
                    .request(method.clone(), app.url(path))
                    .body("{not json");
                if let Some(ct) = content_type {
                    r = r.header("content-type", ct);
                }
                if let Some(t) = token {
                    r = r.bearer_auth(t);
                }
                let answer = r.send().await.expect("API answers");
                let status = answer.status().as_u16();
                if status != expected {
                    wrong.push(format!(
                        "{method} {path} token={token:?} content-type={content_type:?}: \
                         {status}, not {expected}"
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn an_endpoint_url_beyond_the_cap_is_refused_and_one_at_the_cap_registers_and_unregisters() {
    let app = gateway().await;
    for kind in ["callback-endpoints", "push-endpoints"] {
        let path = format!("/api/v1/{kind}");
        let long = format!("http://127.0.0.1:9/{}", "a".repeat(100_000));
        let (status, answer) = call(
            &app,
            Method::POST,
            &path,
            Some(ADMIN),
            Some(json!({ "url": long })),
        )
        .await;
        let reason = answer["reason"].as_str().unwrap_or_default();
        let shown: String = answer.to_string().chars().take(300).collect();
        assert_eq!(status, 400, "{shown}");
        assert!(
            reason.starts_with("url:"),
            "the reason names the field: {shown}"
        );

        let prefix = "http://127.0.0.1:9/";
        let at_cap = format!("{prefix}{}", "b".repeat(MAX_URL_BYTES - prefix.len()));
        assert_eq!(at_cap.len(), MAX_URL_BYTES);
        // A push endpoint names whose subscriptions may use it.
        let registration = match kind {
            "push-endpoints" => json!({ "url": at_cap, "principal": "*" }),
            _ => json!({ "url": at_cap }),
        };
        let register = || {
            call(
                &app,
                Method::POST,
                &path,
                Some(ADMIN),
                Some(registration.clone()),
            )
        };
        assert_eq!(register().await.0, 201);
        // Removed by a JSON body …
        let (status, answer) = call(
            &app,
            Method::DELETE,
            &path,
            Some(ADMIN),
            Some(json!({ "url": at_cap })),
        )
        .await;
        assert_eq!(status, 204, "{answer}");
        let (_, listed) = call(&app, Method::GET, &path, Some(ADMIN), None).await;
        assert_eq!(listed["endpoints"], json!([]));
        // … or by the query.
        assert_eq!(register().await.0, 201);
        let (status, answer) = call(
            &app,
            Method::DELETE,
            &format!("{path}?url={at_cap}"),
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(status, 204, "{answer}");
        let (status, _) = call(
            &app,
            Method::DELETE,
            &path,
            Some(ADMIN),
            Some(json!({ "url": at_cap })),
        )
        .await;
        assert_eq!(status, 404, "gone");
    }
}

/// A reliable singleton on `channel` whose Body root is `Order` (topic `{channel}/Order`).
pub(crate) async fn deliver(app: &TestApp, channel: &str, n: usize) {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(&format!("mid:{channel}-{n}@api-security")).expect("group"),
            sequence: None,
        },
        expiry_time: Utc::now() + Duration::days(1),
        reply_pattern: ReplyPattern::Response,
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
        &format!("<p:Order xmlns:p=\"urn:p\">{channel} {n}</p:Order>"),
    );
    let answer = app
        .post(&format!("/wsr/{channel}"), "text/xml; charset=utf-8", xml)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(!answer.body.contains("Fault"), "{}", answer.body);
}

async fn create(app: &TestApp, token: &str, name: &str, filter: &str) -> (u16, Value) {
    call(
        app,
        Method::POST,
        "/api/v1/subscriptions",
        Some(token),
        Some(json!({ "name": name, "filter": filter })),
    )
    .await
}

async fn join(app: &TestApp, token: &str, sub: i64) -> (u16, Value) {
    let path = format!("/api/v1/subscriptions/{sub}/sessions");
    call(app, Method::POST, &path, Some(token), Some(json!({}))).await
}

async fn fetch_topics(app: &TestApp, token: &str, session: &str) -> Vec<String> {
    let path = format!("/api/v1/sessions/{session}/fetch");
    let (status, answer) = call(
        app,
        Method::POST,
        &path,
        Some(token),
        Some(json!({ "max": 100 })),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["topic"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_consume_token_reads_only_its_topics_through_own_or_granted_subscriptions() {
    let app = gateway().await;
    // Bob (topics bob/#) cannot subscribe beyond them, nor read the raw inbox.
    for filter in ["#", "+/Order", "alice/#", "+/+"] {
        let (status, answer) = create(&app, CONSUME_BOB, "wide", filter).await;
        assert_eq!(status, 403, "{filter}: {answer}");
    }
    let (status, _) = call(&app, Method::GET, "/api/v1/inbox", Some(CONSUME_BOB), None).await;
    assert_eq!(status, 403, "the raw inbox is for operators");
    let (status, _) = call(
        &app,
        Method::GET,
        "/api/v1/inbox",
        Some(CONSUME_ALICE),
        None,
    )
    .await;
    assert_eq!(status, 403, "for operators, whatever a consumer's topics");
    let (status, _) = call(&app, Method::GET, "/api/v1/inbox", Some(ADMIN), None).await;
    assert_eq!(status, 200);

    // Alice (every topic) subscribes to everything and to bob's topics, and grants bob both.
    let (status, everything) = create(&app, CONSUME_ALICE, "everything", "#").await;
    assert_eq!(status, 201, "{everything}");
    let everything = everything["id"].as_i64().expect("id");
    let (status, for_bob) = create(&app, CONSUME_ALICE, "for-bob", "bob/#").await;
    assert_eq!(status, 201, "{for_bob}");
    let for_bob = for_bob["id"].as_i64().expect("id");
    for sub in [everything, for_bob] {
        let path = format!("/api/v1/subscriptions/{sub}/grants/bob");
        let (status, answer) = call(&app, Method::PUT, &path, Some(CONSUME_ALICE), None).await;
        assert_eq!(status, 204, "{answer}");
    }
    for n in 0..3 {
        deliver(&app, "alice", n).await;
        deliver(&app, "bob", n).await;
    }

    // The grant does not widen bob's topics: the `#` subscription is closed to him.
    let (status, answer) = join(&app, CONSUME_BOB, everything).await;
    assert_eq!(status, 403, "{answer}");
    let path = format!("/api/v1/subscriptions/{everything}");
    assert_eq!(
        call(&app, Method::GET, &path, Some(CONSUME_BOB), None)
            .await
            .0,
        403
    );
    let dead = format!("/api/v1/subscriptions/{everything}/dead-letters");
    assert_eq!(
        call(&app, Method::GET, &dead, Some(CONSUME_BOB), None)
            .await
            .0,
        403
    );
    let (_, listed) = call(
        &app,
        Method::GET,
        "/api/v1/subscriptions",
        Some(CONSUME_BOB),
        None,
    )
    .await;
    let ids: Vec<i64> = listed["subscriptions"]
        .as_array()
        .expect("subscriptions")
        .iter()
        .filter_map(|s| s["id"].as_i64())
        .collect();
    assert_eq!(ids, vec![for_bob], "bob lists only what he may read");

    // Through the granted subscription within his topics he gets bob's messages, no others.
    let (status, session) = join(&app, CONSUME_BOB, for_bob).await;
    assert_eq!(status, 201, "{session}");
    let session = session["session"].as_str().expect("session").to_owned();
    let topics = fetch_topics(&app, CONSUME_BOB, &session).await;
    assert_eq!(topics, vec!["bob/Order"; 3]);

    // Alice, allowed every topic, takes all six through hers.
    let (status, session) = join(&app, CONSUME_ALICE, everything).await;
    assert_eq!(status, 201, "{session}");
    let session = session["session"].as_str().expect("session").to_owned();
    let mut topics = fetch_topics(&app, CONSUME_ALICE, &session).await;
    topics.sort();
    assert_eq!(topics.len(), 6, "{topics:?}");
    assert_eq!(topics[0], "alice/Order");
    assert_eq!(topics[5], "bob/Order");
}

async fn submit(app: &TestApp, token: &str, group: Option<Value>) -> Value {
    let mut body = json!({
        "destination": "nowhere",
        "body": "<p:Note xmlns:p=\"urn:p\">hello</p:Note>",
    });
    if let Some(group) = group {
        body["group"] = group;
    }
    let (status, answer) = call(
        app,
        Method::POST,
        "/api/v1/messages",
        Some(token),
        Some(body),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    answer
}

fn listed_ids(answer: &Value) -> Vec<String> {
    answer["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_produce_principal_sees_lists_continues_and_streams_only_its_own_messages() {
    let app = gateway().await;
    let alices = submit(&app, PRODUCE_ALICE, Some(json!({}))).await;
    let bobs = submit(&app, PRODUCE_BOB, None).await;
    let alice_id = alices["id"].as_str().expect("id").to_owned();
    let bob_id = bobs["id"].as_str().expect("id").to_owned();
    let alice_group = alices["group_id"].as_str().expect("group").to_owned();

    let list = |token: &'static str| call(&app, Method::GET, "/api/v1/messages", Some(token), None);
    assert_eq!(listed_ids(&list(PRODUCE_BOB).await.1), vec![bob_id.clone()]);
    assert_eq!(
        listed_ids(&list(PRODUCE_ALICE).await.1),
        vec![alice_id.clone()]
    );
    let mut all = listed_ids(&list(ADMIN).await.1);
    all.sort();
    let mut both = vec![alice_id.clone(), bob_id.clone()];
    both.sort();
    assert_eq!(all, both, "operators see every message");

    // Another's message answers exactly as one that does not exist.
    let (status, foreign) = call(
        &app,
        Method::GET,
        &format!("/api/v1/messages/{alice_id}"),
        Some(PRODUCE_BOB),
        None,
    )
    .await;
    let (missing_status, missing) = call(
        &app,
        Method::GET,
        "/api/v1/messages/no-such-message",
        Some(PRODUCE_BOB),
        None,
    )
    .await;
    assert_eq!((status, missing_status), (404, 404), "{foreign}");
    assert_eq!(foreign["error"], missing["error"]);
    let path = format!("/api/v1/messages/{alice_id}");
    assert_eq!(
        call(&app, Method::GET, &path, Some(PRODUCE_ALICE), None)
            .await
            .0,
        200
    );
    assert_eq!(
        call(&app, Method::GET, &path, Some(ADMIN), None).await.0,
        200
    );

    // Nor can bob close or continue alice's group: it answers as an unknown group.
    let close = format!("/api/v1/groups/{}/close", urlencode(&alice_group));
    let (status, answer) = call(&app, Method::POST, &close, Some(PRODUCE_BOB), None).await;
    let unknown = format!("/api/v1/groups/{}/close", urlencode("mid:unknown@nowhere"));
    let (unknown_status, _) = call(&app, Method::POST, &unknown, Some(PRODUCE_BOB), None).await;
    assert_eq!(status, unknown_status, "{answer}");
    assert!(
        answer["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no outbound group"))
    );
    let body = json!({
        "destination": "nowhere",
        "body": "<p:Note xmlns:p=\"urn:p\">more</p:Note>",
        "group": { "id": alice_group },
    });
    let (status, answer) = call(
        &app,
        Method::POST,
        "/api/v1/messages",
        Some(PRODUCE_BOB),
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no outbound group"))
    );
    let (status, answer) = call(
        &app,
        Method::POST,
        "/api/v1/messages",
        Some(PRODUCE_ALICE),
        Some(body),
    )
    .await;
    assert_eq!(status, 202, "alice continues her own group: {answer}");

    // Bob's event stream starts with his own message's first event, not alice's earlier one.
    let mut stream = app
        .client
        .get(app.url("/api/v1/events?after=0"))
        .bearer_auth(PRODUCE_BOB)
        .send()
        .await
        .expect("stream opens");
    assert_eq!(stream.status().as_u16(), 200);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.chunk())
            .await
            .expect("an event within 10 s")
            .expect("stream reads")
            .expect("stream open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let first = text
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .expect("an event with data");
    let event: Value = serde_json::from_str(first.trim()).expect("event JSON");
    assert_eq!(event["id"], json!(bob_id), "{text}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn event_streams_are_capped_per_principal() {
    let app = gateway().await;
    let open = |token: &'static str| {
        app.client
            .get(app.url("/api/v1/events"))
            .bearer_auth(token)
            .send()
    };
    let max = wsr_gateway::http::slots::MAX_EVENT_STREAMS;
    let mut streams = Vec::new();
    for _ in 0..max {
        let stream = open(PRODUCE_BOB).await.expect("stream opens");
        assert_eq!(stream.status().as_u16(), 200);
        streams.push(stream);
    }
    let refused = open(PRODUCE_BOB).await.expect("answer");
    assert_eq!(refused.status().as_u16(), 429);
    let other = open(PRODUCE_ALICE).await.expect("answer");
    assert_eq!(other.status().as_u16(), 200, "the cap is per principal");

    // A stream the client closes gives its slot back.
    drop(streams.pop());
    let mut reopened = None;
    for _ in 0..100 {
        let answer = open(PRODUCE_BOB).await.expect("answer");
        if answer.status().as_u16() == 200 {
            reopened = Some(answer);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(reopened.is_some(), "the slot came back within 5 s");
}

/// Review item 9: a flood of wrong argon2-hashed tokens keeps the gateway's memory flat.
/// Before the fix every check allocated argon2's 19 MiB afresh on whichever blocking thread
/// ran it and the allocator kept it: 41 wrong tokens one at a time took a fresh gateway from
/// 27 to 261 MiB. Now at most two hashes run at once, on two threads that reuse their memory,
/// so after a warm-up attempt 40 sequential and 40 more (8 at a time) wrong tokens grow the
/// child gateway's RSS and peak RSS by less than 80 MiB; the right token still signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_hashed_tokens_are_checked_in_bounded_memory() {
    use super::support::{free_port, proc_status_kib, start_gateway};
    const RIGHT: &str = "ops-token-hashed-0123456789";
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let database = super::support::fresh_database(dir.path(), "gw.db").await;
    let hash = wsr_gateway::secrets::hash_secret(RIGHT).expect("hash");
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n\n[[tokens]]\ntoken_hash = {hash:?}\n\
             principal = \"ops\"\nscopes = [\"admin\"]\n",
            database.setting()
        ),
    )
    .expect("config");
    let mut child = start_gateway(&config);
    let pid = child.id();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .expect("client");
    let url = format!("http://127.0.0.1:{port}/api/v1/groups");
    let status_of = |token: String| {
        let request = client.get(&url).bearer_auth(token);
        async move {
            request
                .send()
                .await
                .expect("the gateway answers")
                .status()
                .as_u16()
        }
    };
    assert_eq!(status_of("warm-up-wrong-token".into()).await, 401);
    assert_eq!(status_of(RIGHT.into()).await, 200);
    let rss_before = proc_status_kib(pid, "VmRSS");
    let peak_before = proc_status_kib(pid, "VmHWM");
    for i in 0..40 {
        assert_eq!(status_of(format!("wrong-token-{i}")).await, 401);
    }
    let rss_sequential = proc_status_kib(pid, "VmRSS");
    let mut refused = 0;
    for round in 0..5 {
        let tries = (0..8).map(|i| status_of(format!("wrong-token-{round}-{i}")));
        for status in futures_util::future::join_all(tries).await {
            assert!(matches!(status, 401 | 429 | 503), "{status}");
            refused += usize::from(status == 401);
        }
    }
    assert_eq!(
        status_of(RIGHT.into()).await,
        200,
        "the right token still works"
    );
    let rss_after = proc_status_kib(pid, "VmRSS");
    let peak_after = proc_status_kib(pid, "VmHWM");
    child.kill().expect("stop the gateway");
    child.wait().expect("reaped");
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "wrong hashed tokens: 40 sequential, then {refused} of 40 concurrent checked; VmRSS \
         {:.1} -> {:.1} -> {:.1} MiB, VmHWM {:.1} -> {:.1} MiB",
        mib(rss_before),
        mib(rss_sequential),
        mib(rss_after),
        mib(peak_before),
        mib(peak_after)
    );
    assert!(refused > 0, "some concurrent attempts were checked");
    for (what, before, after) in [
        ("RSS", rss_before, rss_sequential.max(rss_after)),
        ("peak RSS", peak_before, peak_after),
    ] {
        let grown = mib(after.saturating_sub(before));
        assert!(grown < 80.0, "{what} grew by {grown:.1} MiB");
    }
}
