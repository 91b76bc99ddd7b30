//! Delivery to applications end to end (DESIGN §5, issue 5): partners' messages arrive over
//! WS-R, applications take them through subscriptions — receipts per attempt, stale acks
//! refused, settle modes, shared subscriptions, group ordering, ownership, push, and state
//! that survives SIGKILL.

#[allow(unused_imports)]
use chrono::{Duration, Utc};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use wsr_gateway::config::{ApiToken, Scope};
use wsr_gateway::store::Endpoints;
use wsr_gateway::wsr::{
    GroupId, Headers, MessageId, ReplyPattern, Request, SequenceNum, SoapVersion, write_envelope,
};

use super::support::{ClockExt, TestApp, serve_local, spawn_app_with, start, start_gateway};

pub(crate) const OWNER: &str = "billing-token-0000000001";
pub(crate) const OTHER: &str = "shipping-token-000000002";
pub(crate) const ADMIN: &str = "operator-token-000000003";

pub(crate) fn tokens() -> Vec<ApiToken> {
    vec![
        ApiToken {
            secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(OWNER)),
            principal: "billing".into(),
            scopes: vec![Scope::Consume],
            topics: wsr_gateway::config::all_topics(),
        },
        ApiToken {
            secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(OTHER)),
            principal: "shipping".into(),
            scopes: vec![Scope::Consume],
            topics: wsr_gateway::config::all_topics(),
        },
        ApiToken {
            secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(ADMIN)),
            principal: "operator".into(),
            scopes: vec![Scope::Admin],
            topics: wsr_gateway::config::all_topics(),
        },
    ]
}

pub(crate) async fn gateway() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = tokens();
        super::support::without_source_quota(c);
    })
    .await
}

/// A reliable message for channel `default` whose Body root is `root` (topic `default/{root}`).
pub(crate) fn wsr_message(root: &str, group: &str, number: Option<u64>, ordered: bool) -> String {
    let request = wsr_request(group, number, ordered);
    let body = format!("<p:{root} xmlns:p=\"urn:p\">{group}#{number:?}</p:{root}>");
    write_envelope(
        SoapVersion::Soap11,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        &body,
    )
}

/// A Response-pattern request of `group` (numbered when `number` is given), acked, with
/// duplicate elimination, expiring in two days.
pub(crate) fn wsr_request(group: &str, number: Option<u64>, ordered: bool) -> Request {
    Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group"),
            sequence: number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: Utc::now() + Duration::days(2),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: ordered,
    }
}

/// Delivers one message over WS-R and checks it was acked.
pub(crate) async fn deliver(base: &str, client: &reqwest::Client, xml: String) {
    let r = client
        .post(format!("{base}/wsr/default"))
        .header("content-type", "text/xml; charset=utf-8")
        .header("soapaction", "\"\"")
        .body(xml)
        .send()
        .await
        .expect("gateway answers");
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("Fault"), "{body}");
}

pub(crate) async fn deliver_to(app: &TestApp, xml: String) {
    deliver(&app.url(""), &app.client, xml).await;
}

pub(crate) async fn deliver_singletons(app: &TestApp, root: &str, count: usize) {
    for i in 0..count {
        let group = format!("mid:{root}-{i}-{}@test", uniq());
        deliver_to(app, wsr_message(root, &group, None, false)).await;
    }
}

fn uniq() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The delivery API as one principal.
#[derive(Clone)]
pub(crate) struct Api {
    base: String,
    client: reqwest::Client,
    token: &'static str,
}

impl Api {
    pub(crate) fn of(app: &TestApp, token: &'static str) -> Api {
        Api {
            base: app.url(""),
            client: app.client.clone(),
            token,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.token);
        if let Some(body) = body {
            r = r.json(&body);
        }
        let r = r.send().await.expect("API answers");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn delete(&self, path: &str) -> u16 {
        self.call(reqwest::Method::DELETE, path, None).await.0
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// Asks to create a subscription; the status and answer, whatever they are.
    async fn try_create(&self, body: Value) -> (u16, Value) {
        self.post("/api/v1/subscriptions", body).await
    }

    pub(crate) async fn create(&self, body: Value) -> i64 {
        let (status, answer) = self.try_create(body).await;
        assert_eq!(status, 201, "{answer}");
        answer["id"].as_i64().expect("id")
    }

    pub(crate) async fn join(&self, sub: i64, ttl_ms: u64) -> String {
        let (status, answer) = self
            .post(
                &format!("/api/v1/subscriptions/{sub}/sessions"),
                json!({ "ttl_ms": ttl_ms }),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        answer["session"].as_str().expect("session").to_owned()
    }

    pub(crate) async fn fetch(&self, session: &str, max: usize) -> Vec<Value> {
        let (status, answer) = self.fetch_raw(session, max, 0).await;
        assert_eq!(status, 200, "{answer}");
        answer["messages"].as_array().expect("messages").clone()
    }

    async fn fetch_raw(&self, session: &str, max: usize, wait_ms: u64) -> (u16, Value) {
        self.post(
            &format!("/api/v1/sessions/{session}/fetch"),
            json!({ "max": max, "wait_ms": wait_ms }),
        )
        .await
    }

    async fn settle(&self, message: &Value, outcome: Value) -> (u16, Value) {
        let mut body = json!({ "receipt": message["receipt"] });
        if let Value::Object(extra) = outcome
            && let Value::Object(b) = &mut body
        {
            b.extend(extra);
        }
        self.post("/api/v1/settle", body).await
    }

    pub(crate) async fn accept(&self, message: &Value) -> (u16, Value) {
        self.settle(message, json!({ "outcome": "accepted" })).await
    }
}

fn offsets(messages: &[Value]) -> Vec<i64> {
    messages
        .iter()
        .map(|m| m["offset"].as_i64().expect("offset"))
        .collect()
}

// 1. A late settle of a superseded attempt is refused and the message stays with its holder.
#[tokio::test]
async fn a_stale_ack_is_refused_with_the_current_attempt_and_the_message_stays_with_b() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "invoices", "filter": "default/#", "ack_wait_ms": 10_000 }))
        .await;
    deliver_singletons(&app, "Invoice", 1).await;
    let a = api.join(sub, 3_600_000).await;
    let b = api.join(sub, 3_600_000).await;

    let got_a = api.fetch(&a, 10).await;
    assert_eq!(got_a.len(), 1);
    assert_eq!(got_a[0]["attempt"], 1);
    assert!(api.fetch(&b, 10).await.is_empty(), "leased to A");

    app.clock.advance(Duration::seconds(11));
    let got_b = api.fetch(&b, 10).await;
    assert_eq!(offsets(&got_b), offsets(&got_a));
    assert_eq!(got_b[0]["attempt"], 2);
    assert_ne!(got_b[0]["receipt"], got_a[0]["receipt"]);

    let (status, refusal) = api.accept(&got_a[0]).await;
    assert_eq!(status, 409, "{refusal}");
    assert_eq!(refusal["current_attempt"], 2);
    assert!(
        refusal["reason"]
            .as_str()
            .expect("reason")
            .contains("superseded"),
        "{refusal}"
    );
    let (status, refusal) = api
        .post("/api/v1/extend", json!({ "receipt": got_a[0]["receipt"] }))
        .await;
    assert_eq!(status, 409, "{refusal}");
    assert_eq!(refusal["current_attempt"], 2);

    // Still B's: B extends (a confirmed deadline) and settles.
    let (status, extended) = api
        .post("/api/v1/extend", json!({ "receipt": got_b[0]["receipt"] }))
        .await;
    assert_eq!(status, 200, "{extended}");
    assert!(extended["deadline"].as_str().is_some());
    let (status, settled) = api.accept(&got_b[0]).await;
    assert_eq!(status, 200, "{settled}");
    let (status, _) = api.accept(&got_b[0]).await;
    assert_eq!(status, 409, "a second settle does not count twice");

    // A receipt the gateway never issued, and one whose subscription is gone.
    let mut forged = got_b[0].clone();
    forged["receipt"] = json!(format!("{}0", got_b[0]["receipt"].as_str().expect("r")));
    assert_eq!(api.accept(&forged).await.0, 400);
    assert_eq!(
        api.delete(&format!("/api/v1/subscriptions/{sub}")).await,
        204
    );
    assert_eq!(api.accept(&got_b[0]).await.0, 404);
}

#[tokio::test]
async fn a_batch_of_settlements_answers_each_one_in_order() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "batch", "filter": "default/#" }))
        .await;
    deliver_singletons(&app, "Order", 3).await;
    let session = api.join(sub, 3_600_000).await;
    let got = api.fetch(&session, 10).await;
    assert_eq!(got.len(), 3);
    let (status, answer) = api
        .post(
            "/api/v1/settle",
            json!({ "settlements": [
                { "receipt": got[0]["receipt"], "outcome": "accepted" },
                { "receipt": got[0]["receipt"], "outcome": "accepted" },
                { "receipt": "1.1.31.32.00", "outcome": "accepted" },
                { "receipt": got[1]["receipt"], "outcome": "rejected",
                  "reason": "no such customer" },
                { "receipt": got[2]["receipt"], "outcome": "bogus" },
            ] }),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), 5);
    assert_eq!(results[0]["settled"], true);
    assert_eq!(
        results[1]["status"], 409,
        "the same receipt twice counts once"
    );
    assert_eq!(results[2]["status"], 400, "not issued by us");
    assert_eq!(results[3]["settled"], true);
    assert_eq!(results[4]["status"], 400, "unknown outcome");
    // The third is still leased and settles on its own.
    assert_eq!(api.accept(&got[2]).await.0, 200);
    let dead = dead_letters(&api, sub).await;
    assert_eq!(dead.len(), 1);
    // Who rejected it (the principal, not a session id) and why.
    assert_eq!(
        dead[0]["reason"], "rejected by billing: no such customer",
        "{dead:?}"
    );
}

/// POSTs all the messages at once; their statuses and bodies, in order.
async fn post_all(app: &TestApp, xmls: Vec<String>) -> Vec<(u16, String)> {
    let sends: Vec<_> = xmls
        .into_iter()
        .map(|xml| {
            let (client, url) = (app.client.clone(), app.url("/wsr/default"));
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .header("content-type", "text/xml; charset=utf-8")
                    .body(xml)
                    .send()
                    .await
                    .expect("answer");
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for s in sends {
        answers.push(s.await.expect("send"));
    }
    answers
}

/// A group whose stored state is unreadable fails its own messages, never the others that
/// commit with it (the writer's batch falls back to a savepoint per job).
#[tokio::test]
async fn a_corrupt_group_fails_alone_in_its_batch() {
    let app = gateway().await;
    let base = app.url("");
    let broken = "mid:broken@test";
    deliver(
        &base,
        &app.client,
        wsr_message("Order", broken, Some(0), true),
    )
    .await;
    super::support::execute_with(
        &app.config.database,
        (
            "UPDATE groups SET state = '{not json' WHERE group_id = ?",
            "UPDATE groups SET state_bin = '\\x00'::bytea WHERE group_id = $1",
        ),
        broken,
    )
    .await;
    // Found unreadable when read: at a start (the SQLite writer keeps the state of the open
    // groups it wrote itself, and nothing else writes them while it runs).
    let (config, clock, dir) = app.stop().await;
    let app = start(config, clock).await;
    // One message for `group` and 20 healthy singletons, all at once (so they share batches).
    let together = |group: &str, number: u64, healthy: std::ops::Range<usize>| {
        let mut xmls = vec![wsr_message("Order", group, Some(number), true)];
        xmls.extend(
            healthy.map(|i| wsr_message("Order", &format!("mid:healthy-{i}@test"), None, false)),
        );
        post_all(&app, xmls)
    };
    let answers = together(broken, 1, 0..20).await;
    let (status, body) = &answers[0];
    assert!(
        *status != 200 || body.contains("Fault") || body.contains("fault="),
        "the corrupt group's message is not acked: {status} {body}"
    );
    for (status, body) in &answers[1..] {
        assert_eq!(*status, 200, "{body}");
        assert!(
            body.contains("NonSequenceReply") && !body.contains("fault="),
            "{body}"
        );
    }
    assert_eq!(
        app.inbox().await.len(),
        21,
        "the first of the broken group and the 20 others"
    );

    // A corruption found only after the job has written (a buffered message gone missing when
    // its gap is filled) sends the batch round again job by job: still it fails alone.
    let gapped = "mid:gapped@test";
    post_all(&app, vec![wsr_message("Order", gapped, Some(1), true)]).await;
    super::support::execute_with(
        &app.config.database,
        (
            "DELETE FROM buffered WHERE group_id = ?",
            "DELETE FROM buffered WHERE group_id = $1",
        ),
        gapped,
    )
    .await;
    let answers = together(gapped, 0, 20..40).await;
    for (status, body) in &answers[1..] {
        assert_eq!(*status, 200, "{body}");
        assert!(
            body.contains("NonSequenceReply") && !body.contains("fault="),
            "{body}"
        );
    }
    let inbox = app.inbox().await;
    assert_eq!(
        inbox.len(),
        41,
        "the 20 others; nothing of the gapped group"
    );
    assert!(inbox.iter().all(|e| e.group_id != gapped));
    drop(dir);
}

// 2. Settle mode `settled`: never left acquired, never redelivered; released goes elsewhere.
#[tokio::test]
async fn settled_mode_is_at_most_once_across_a_restart() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "ticks", "filter": "default/Tick", "settle_mode": "settled" }))
        .await;
    deliver_singletons(&app, "Tick", 2).await;
    let a = api.join(sub, 3_600_000).await;
    let got = api.fetch(&a, 10).await;
    assert_eq!(got.len(), 2);
    assert!(got[0]["deadline"].is_null(), "nothing to settle");
    assert_eq!(api.accept(&got[0]).await.0, 409, "already settled at send");

    let (config, clock, dir) = app.stop().await;
    let app = start(config, clock).await;
    let api = Api::of(&app, OWNER);
    let a = api.join(sub, 3_600_000).await;
    assert!(api.fetch(&a, 10).await.is_empty(), "not delivered again");
    drop(dir);
}

#[tokio::test]
async fn settled_mode_with_released_goes_to_another_member_never_back() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({
            "name": "$share/workers/default/Job",
            "settle_mode": "settled",
            "default_outcome": "released",
        }))
        .await;
    deliver_singletons(&app, "Job", 1).await;
    let a = api.join(sub, 3_600_000).await;
    let first = api.fetch(&a, 10).await;
    assert_eq!(first.len(), 1);
    assert!(
        api.fetch(&a, 10).await.is_empty(),
        "never back to the same member, even alone"
    );
    let b = api.join(sub, 3_600_000).await;
    let second = api.fetch(&b, 10).await;
    assert_eq!(offsets(&second), offsets(&first));
    assert_eq!(second[0]["attempt"], 2);
}

#[tokio::test]
async fn received_as_default_outcome_is_400_and_an_unknown_one_501() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let (status, answer) = api
        .try_create(json!({ "name": "x", "filter": "#", "default_outcome": "received" }))
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"], "invalid-field");
    let (status, answer) = api
        .try_create(json!({ "name": "x", "filter": "#", "default_outcome": "transferred" }))
        .await;
    assert_eq!(status, 501, "{answer}");
    assert_eq!(answer["error"], "not-implemented");
    let (status, _) = api
        .try_create(json!({ "name": "x", "filter": "a/#/b" }))
        .await;
    assert_eq!(status, 400, "a bad filter");
}

// 3. Shared subscriptions.
#[tokio::test]
async fn three_members_share_3000_messages_each_handled_exactly_once() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api.create(json!({ "name": "$share/pool/default/+" })).await;
    let base = app.url("");
    let mut senders = Vec::new();
    for worker in 0..16 {
        let (base, client) = (base.clone(), app.client.clone());
        senders.push(tokio::spawn(async move {
            for i in (worker..3000).step_by(16) {
                let group = format!("mid:pool-{i}@test");
                deliver(&base, &client, wsr_message("Item", &group, None, false)).await;
            }
        }));
    }
    for s in senders {
        s.await.expect("sender");
    }
    let handled: Arc<Mutex<Vec<(usize, i64)>>> = Arc::default();
    let mut members = Vec::new();
    for member in 0..3 {
        let api = api.clone();
        let handled = handled.clone();
        members.push(tokio::spawn(async move {
            let session = api.join(sub, 3_600_000).await;
            loop {
                let batch = api.fetch(&session, 50).await;
                if batch.is_empty() {
                    break;
                }
                for m in &batch {
                    let (status, answer) = api.accept(m).await;
                    assert_eq!(status, 200, "{answer}");
                    handled
                        .lock()
                        .expect("lock")
                        .push((member, m["offset"].as_i64().expect("offset")));
                }
            }
        }));
    }
    for m in members {
        m.await.expect("member");
    }
    let handled = handled.lock().expect("lock").clone();
    let distinct: BTreeSet<i64> = handled.iter().map(|(_, o)| *o).collect();
    assert_eq!(handled.len(), 3000, "each handled once");
    assert_eq!(distinct.len(), 3000, "none twice");
    let per_member: BTreeMap<usize, usize> =
        handled.iter().fold(BTreeMap::new(), |mut m, (w, _)| {
            *m.entry(*w).or_default() += 1;
            m
        });
    assert_eq!(per_member.values().sum::<usize>(), 3000);
}

#[tokio::test]
async fn a_member_that_stops_renewing_loses_its_messages_within_its_ttl_not_the_ack_wait() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "$share/pool/default/#", "ack_wait_ms": 3_600_000 }))
        .await;
    deliver_singletons(&app, "Item", 5).await;
    let a = api.join(sub, 3_600_000).await;
    let gone = api.join(sub, 2_000).await;
    let held = api.fetch(&gone, 10).await;
    assert_eq!(held.len(), 5);
    assert!(api.fetch(&a, 10).await.is_empty());
    app.clock.advance(Duration::milliseconds(2_001));
    let taken = api.fetch(&a, 10).await;
    assert_eq!(offsets(&taken), offsets(&held));
    assert!(taken.iter().all(|m| m["attempt"] == 2));
    // The lapsed member's session is gone: it must join again.
    assert_eq!(api.fetch_raw(&gone, 10, 0).await.0, 404);
}

#[tokio::test]
async fn a_nack_goes_to_another_member_with_backoff_and_max_deliveries_dead_letters() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({
            "name": "$share/pool/default/#",
            "max_deliveries": 2,
            "backoff_ms": [5_000],
        }))
        .await;
    deliver_singletons(&app, "Item", 1).await;
    let a = api.join(sub, 3_600_000).await;
    let b = api.join(sub, 3_600_000).await;
    let first = api.fetch(&a, 1).await;
    let too_long = json!({ "outcome": "modified", "delay_ms": 9_000_000_000_000_000u64 });
    assert_eq!(api.settle(&first[0], too_long).await.0, 400);
    let nack = json!({ "outcome": "modified", "delivery_failed": true });
    assert_eq!(api.settle(&first[0], nack.clone()).await.0, 200);
    assert!(api.fetch(&b, 1).await.is_empty(), "backoff first");
    app.clock.advance(Duration::seconds(5));
    assert!(api.fetch(&a, 1).await.is_empty(), "not back to the nacker");
    let second = api.fetch(&b, 1).await;
    assert_eq!(offsets(&second), offsets(&first));
    assert_eq!(api.settle(&second[0], nack).await.0, 200);

    app.clock.advance(Duration::seconds(60));
    assert!(api.fetch(&a, 1).await.is_empty());
    assert!(api.fetch(&b, 1).await.is_empty());
    let (status, dead) = api
        .get(&format!("/api/v1/subscriptions/{sub}/dead-letters"))
        .await;
    assert_eq!(status, 200);
    let letters = dead["dead_letters"].as_array().expect("list");
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0]["reason"]
            .as_str()
            .expect("reason")
            .contains("max_deliveries"),
        "{dead}"
    );
    assert_eq!(letters[0]["message"]["topic"], "default/Item");

    // Replay puts it back; purge drops it for good.
    let path = format!("/api/v1/subscriptions/{sub}/dead-letters");
    let (_, replayed) = api.post(&format!("{path}/replay"), json!({})).await;
    assert_eq!(replayed["replayed"], 1);
    let again = api.fetch(&a, 1).await;
    assert_eq!(offsets(&again), offsets(&first));
    assert_eq!(
        api.settle(&again[0], json!({ "outcome": "rejected" }))
            .await
            .0,
        200
    );
    let (_, purged) = api
        .post(
            &format!("{path}/purge"),
            json!({ "offsets": offsets(&first) }),
        )
        .await;
    assert_eq!(purged["purged"], 1);
    let (_, dead) = api.get(&path).await;
    assert_eq!(dead["dead_letters"], json!([]));
}

// 4. Ordering = group.
#[tokio::test]
async fn four_members_with_a_kill_process_fifty_groups_strictly_in_sequence() {
    const GROUPS: u64 = 50;
    const PER_GROUP: u64 = 6;
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "$share/ordered/default/#", "ordering": "group", "ack_wait_ms": 60_000 }))
        .await;
    // The gateway's clock follows real time here, so that the killed member's session lapses.
    let ticking = {
        let clock = app.clock.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                clock.advance(Duration::milliseconds(20));
            }
        })
    };
    // Groups arrive interleaved; within a group in order (WS-R numbers start at 0).
    for n in 0..PER_GROUP {
        for g in 0..GROUPS {
            deliver_to(
                &app,
                wsr_message("Step", &format!("mid:ordered-{g}@test"), Some(n), true),
            )
            .await;
        }
    }
    let processed: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let total = (GROUPS * PER_GROUP) as usize;
    let mut members = Vec::new();
    for member in 0..4u64 {
        let api = api.clone();
        let processed = processed.clone();
        members.push(tokio::spawn(async move {
            let session = api.join(sub, 1_500).await;
            let mut rng = member.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut handled = 0;
            loop {
                if processed.lock().expect("lock").len() >= total {
                    return;
                }
                let (status, answer) = api.fetch_raw(&session, 4, 200).await;
                assert_eq!(status, 200, "{answer}");
                for m in answer["messages"].as_array().expect("messages") {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    tokio::time::sleep(std::time::Duration::from_millis(rng % 8)).await;
                    // Member 0 is killed midway: it stops, holding what it fetched.
                    if member == 0 && handled == 20 {
                        return;
                    }
                    let (status, answer) = api.accept(m).await;
                    assert_eq!(status, 200, "{answer}");
                    handled += 1;
                    let payload = m["payload"].as_str().expect("payload");
                    let group = m["group_id"].as_str().expect("group").to_owned();
                    let number = m["number"].as_u64().expect("number");
                    assert!(payload.contains(&group));
                    processed.lock().expect("lock").push((group, number));
                }
            }
        }));
    }
    let all = async {
        for m in members {
            m.await.expect("member");
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), all)
        .await
        .expect("all groups processed within 2 minutes");
    ticking.abort();
    let processed = processed.lock().expect("lock").clone();
    assert_eq!(processed.len(), total, "each once");
    let mut by_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (g, n) in processed {
        by_group.entry(g).or_default().push(n);
    }
    assert_eq!(by_group.len(), GROUPS as usize);
    for (g, numbers) in by_group {
        assert_eq!(
            numbers,
            (0..PER_GROUP).collect::<Vec<_>>(),
            "group {g} strictly in sequence, none twice"
        );
    }
}

#[tokio::test]
async fn start_new_skips_what_came_before_and_start_oldest_takes_it() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    deliver_singletons(&app, "Order", 2).await;
    let new = api
        .create(json!({ "name": "new", "filter": "default/#" }))
        .await;
    let oldest = api
        .create(json!({ "name": "oldest", "filter": "default/#", "start": "oldest" }))
        .await;
    deliver_singletons(&app, "Order", 1).await;
    let from_new = api.join(new, 60_000).await;
    let from_oldest = api.join(oldest, 60_000).await;
    assert_eq!(api.fetch(&from_new, 10).await.len(), 1);
    assert_eq!(api.fetch(&from_oldest, 10).await.len(), 3);
}

#[tokio::test]
async fn a_long_poll_returns_the_message_that_arrives_while_it_waits() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "waiting", "filter": "default/#" }))
        .await;
    let session = api.join(sub, 60_000).await;
    let waiting = {
        let (api, session) = (api.clone(), session.clone());
        tokio::spawn(async move { api.fetch_raw(&session, 10, 30_000).await })
    };
    deliver_singletons(&app, "Order", 1).await;
    let (status, answer) = waiting.await.expect("fetch");
    assert_eq!(status, 200);
    assert_eq!(answer["messages"].as_array().expect("messages").len(), 1);
}

#[tokio::test]
async fn in_group_mode_a_dead_letter_lets_the_group_go_on_and_a_replay_waits_for_the_leased_one() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "$share/steps/default/#", "ordering": "group" }))
        .await;
    for n in 0..3 {
        deliver_to(&app, wsr_message("Step", "mid:steps@test", Some(n), true)).await;
    }
    let a = api.join(sub, 3_600_000).await;
    let b = api.join(sub, 3_600_000).await;
    let first = api.fetch(&a, 10).await;
    assert_eq!(first.len(), 1, "one of the group at a time");
    assert_eq!(first[0]["number"], 0);
    assert_eq!(
        api.settle(&first[0], json!({ "outcome": "rejected" }))
            .await
            .0,
        200
    );
    let second = api.fetch(&a, 10).await;
    assert_eq!(second.len(), 1);
    assert_eq!(
        second[0]["number"], 1,
        "the dead letter does not block its group"
    );
    let (_, replayed) = api
        .post(
            &format!("/api/v1/subscriptions/{sub}/dead-letters/replay"),
            json!({}),
        )
        .await;
    assert_eq!(replayed["replayed"], 1);
    assert!(
        api.fetch(&b, 10).await.is_empty(),
        "the replayed #0 waits while #1 is leased"
    );
    assert_eq!(api.accept(&second[0]).await.0, 200);
    assert!(api.fetch(&b, 10).await.is_empty(), "the group stays with A");
    let third = api.fetch(&a, 10).await;
    assert_eq!(third.len(), 1);
    assert_eq!(
        third[0]["number"], 0,
        "the replayed one comes first, being earlier"
    );
    assert_eq!(api.accept(&third[0]).await.0, 200);
    let last = api.fetch(&a, 10).await;
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["number"], 2);
    assert_eq!(api.accept(&last[0]).await.0, 200);
    assert!(api.fetch(&a, 10).await.is_empty());
}

#[tokio::test]
async fn groups_bound_to_another_member_do_not_hide_a_free_group_behind_them() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "$share/bound/default/#", "ordering": "group" }))
        .await;
    let a = api.join(sub, 3_600_000).await;
    let b = api.join(sub, 3_600_000).await;
    let step =
        |g: usize, n: u64| wsr_message("Step", &format!("mid:bound-{g}@test"), Some(n), true);
    for g in 0..40 {
        deliver_to(&app, step(g, 0)).await;
    }
    for m in api.fetch(&a, 100).await {
        assert_eq!(api.accept(&m).await.0, 200);
    }
    // Every group's next message stays with A while A lives; one fetch page (36 rows for
    // max 1) is all A's.
    for g in 0..40 {
        deliver_to(&app, step(g, 1)).await;
    }
    deliver_to(&app, step(40, 0)).await;
    let got = api.fetch(&b, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["group_id"], "mid:bound-40@test");
}

// 5. Overlapping subscriptions each get their copy; a non-matching topic reaches none.
#[tokio::test]
async fn overlapping_subscriptions_each_get_every_matching_message() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let all = api
        .create(json!({ "name": "all", "filter": "default/#" }))
        .await;
    let orders = api
        .create(json!({ "name": "orders", "filter": "default/Order" }))
        .await;
    let any_root = api
        .create(json!({ "name": "any", "filter": "+/Order" }))
        .await;
    let none = api
        .create(json!({ "name": "none", "filter": "default/Nothing" }))
        .await;
    deliver_singletons(&app, "Order", 3).await;
    deliver_singletons(&app, "Invoice", 2).await;
    let mut counts = Vec::new();
    for sub in [all, orders, any_root, none] {
        let session = api.join(sub, 60_000).await;
        let got = api.fetch(&session, 100).await;
        for m in &got {
            assert_eq!(api.accept(m).await.0, 200);
        }
        counts.push(got.len());
    }
    assert_eq!(counts, vec![5, 3, 3, 0]);
}

// 6. Ownership.
#[tokio::test]
async fn without_a_grant_join_fetch_and_settle_are_forbidden_and_a_share_name_cannot_be_taken() {
    let app = gateway().await;
    let owner = Api::of(&app, OWNER);
    let other = Api::of(&app, OTHER);
    let sub = owner
        .create(json!({ "name": "$share/team/default/#" }))
        .await;
    deliver_singletons(&app, "Order", 2).await;
    let session = owner.join(sub, 60_000).await;
    let got = owner.fetch(&session, 1).await;

    let path = format!("/api/v1/subscriptions/{sub}/sessions");
    assert_eq!(other.post(&path, json!({})).await.0, 403, "join");
    assert_eq!(other.fetch_raw(&session, 10, 0).await.0, 403, "fetch");
    assert_eq!(other.accept(&got[0]).await.0, 403, "settle");
    let (status, answer) = other
        .try_create(json!({ "name": "$share/team/default/#" }))
        .await;
    assert_eq!(status, 409, "same share name, other application: {answer}");
    // The operator may look but not take.
    let admin = Api::of(&app, ADMIN);
    assert_eq!(admin.post(&path, json!({})).await.0, 403);
    assert_eq!(
        admin.get(&format!("/api/v1/subscriptions/{sub}")).await.0,
        200
    );

    let grant = format!("/api/v1/subscriptions/{sub}/grants/shipping");
    assert_eq!(
        other.call(reqwest::Method::PUT, &grant, None).await.0,
        403,
        "only the owner grants"
    );
    assert_eq!(owner.call(reqwest::Method::PUT, &grant, None).await.0, 204);
    let theirs = other.join(sub, 60_000).await;
    let got_other = other.fetch(&theirs, 10).await;
    assert_eq!(got_other.len(), 1, "the one not leased to the owner");

    // Revoking ends their session: what they held goes back at once, their receipt is dead.
    assert_eq!(owner.delete(&grant).await, 204);
    assert_eq!(other.accept(&got_other[0]).await.0, 403);
    assert_eq!(other.fetch_raw(&theirs, 10, 0).await.0, 404);
    let back = owner.fetch(&session, 10).await;
    assert_eq!(offsets(&back), offsets(&got_other));
    assert_eq!(back[0]["attempt"], 2);
}

// 7. Push.
pub(crate) struct Webhook {
    pub(crate) url: String,
    received: tokio::sync::mpsc::UnboundedReceiver<Value>,
    max_concurrent: Arc<AtomicUsize>,
}

/// A webhook answering each POST with the next planned answer (a status, or 0: hang for 5 s),
/// then 200.
pub(crate) async fn webhook(plan: Vec<u16>, hold_ms: u64) -> Webhook {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let plan = Arc::new(Mutex::new(plan.into_iter()));
    let current = Arc::new(AtomicUsize::new(0));
    let max_concurrent = Arc::new(AtomicUsize::new(0));
    let (c, m) = (current.clone(), max_concurrent.clone());
    let handler = move |body: axum::body::Bytes| {
        let (tx, plan, c, m) = (tx.clone(), plan.clone(), c.clone(), m.clone());
        async move {
            let now = c.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let _ = tx.send(serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null));
            let next = plan.lock().expect("lock").next().unwrap_or(200);
            let hold = if next == 0 { 5_000 } else { hold_ms };
            tokio::time::sleep(std::time::Duration::from_millis(hold)).await;
            c.fetch_sub(1, Ordering::SeqCst);
            axum::http::StatusCode::from_u16(if next == 0 { 200 } else { next }).expect("status")
        }
    };
    let router = axum::Router::new().route("/hook", axum::routing::post(handler));
    let url = format!("{}/hook", serve_local(router).await);
    Webhook {
        url,
        received: rx,
        max_concurrent,
    }
}

impl Webhook {
    pub(crate) async fn next(&mut self) -> Value {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.received.recv())
            .await
            .expect("a push within 10 s")
            .expect("webhook alive")
    }

    /// Nothing arrives within a bounded look (a backoff still running).
    pub(crate) async fn quiet(&mut self, ms: u64) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(ms), self.received.recv())
            .await
            .is_err()
    }
}

/// Waits (bounded) until the push worker has settled everything it sent, so that moving the
/// clock cannot overtake a settle.
pub(crate) async fn settled(api: &Api, sub: i64) {
    for _ in 0..500 {
        let (_, s) = api.get(&format!("/api/v1/subscriptions/{sub}")).await;
        if s["backlog"]["in_flight"] == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the push worker did not settle within 5 s");
}

pub(crate) async fn dead_letters(api: &Api, sub: i64) -> Vec<Value> {
    let (_, dead) = api
        .get(&format!("/api/v1/subscriptions/{sub}/dead-letters"))
        .await;
    dead["dead_letters"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn push_accepts_on_2xx_rejects_on_4xx_retries_5xx_and_timeouts_with_backoff() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    // 500, then a hang past the timeout, then 200; then a 400 for the second message; 429 and
    // 408 for the third are retried.
    let mut hook = webhook(vec![500, 0, 200, 400, 429, 408, 200], 0).await;
    let create = json!({
        "name": "hooked", "filter": "default/#", "mode": "push", "push_url": hook.url,
        "ack_wait_ms": 1_000, "backoff_ms": [10_000], "max_deliveries": 5,
    });
    let (status, answer) = api.post("/api/v1/subscriptions", create.clone()).await;
    assert_eq!(status, 400, "only registered webhooks: {answer}");
    let (status, _) = Api::of(&app, ADMIN)
        .post(
            "/api/v1/push-endpoints",
            json!({ "url": hook.url, "principal": "billing" }),
        )
        .await;
    assert_eq!(status, 201, "registered over the admin API, for billing");
    let sub = api.create(create).await;

    deliver_singletons(&app, "Order", 1).await;
    let first = hook.next().await;
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["topic"], "default/Order");
    settled(&api, sub).await;
    assert!(hook.quiet(300).await, "the 500 waits out its backoff");
    app.clock.advance(Duration::seconds(10));
    let second = hook.next().await;
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["offset"], first["offset"]);
    // That one hangs: the timeout (0.9 × ack wait, 900 ms) fails the attempt; backoff again.
    settled(&api, sub).await;
    assert!(hook.quiet(300).await);
    app.clock.advance(Duration::seconds(10));
    let third = hook.next().await;
    assert_eq!(third["attempt"], 3);

    deliver_singletons(&app, "Order", 1).await;
    let rejected = hook.next().await;
    assert_ne!(rejected["offset"], first["offset"]);
    deliver_singletons(&app, "Order", 1).await;
    let throttled = hook.next().await;
    settled(&api, sub).await;
    app.clock.advance(Duration::seconds(10));
    assert_eq!(
        hook.next().await["offset"],
        throttled["offset"],
        "429 retried"
    );
    settled(&api, sub).await;
    app.clock.advance(Duration::seconds(10));
    assert_eq!(
        hook.next().await["offset"],
        throttled["offset"],
        "408 retried"
    );
    settled(&api, sub).await;

    // The webhook's health, as the subscription tells it: its last answer and failures.
    let (_, shown) = api.get(&format!("/api/v1/subscriptions/{sub}")).await;
    let health = &shown["push_health"];
    assert_eq!(health["last_status"], 200, "{shown}");
    assert_eq!(health["failures_in_row"], 0, "{shown}");
    assert!(
        health["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 408")),
        "the last failure, kept after a success: {shown}"
    );
    // The 200s accepted, the 400 dead-lettered — its reason names the endpoint's answer.
    let dead = dead_letters(&api, sub).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["offset"], rejected["offset"]);
    let reason = dead[0]["reason"].as_str().expect("a reason");
    assert!(
        reason.starts_with("rejected by push to http://127.0.0.1:") && reason.contains("HTTP 400"),
        "{reason}"
    );
    app.clock.advance(Duration::seconds(60));
    assert!(hook.quiet(300).await, "nothing accepted comes again");
}

/// Pushes `count` singletons through a push subscription of `push_concurrency` to a webhook
/// that holds each POST 100 ms: the most POSTs it saw in flight at once.
async fn most_pushes_at_once(app: &TestApp, push_concurrency: u32, count: usize) -> usize {
    let api = Api::of(app, OWNER);
    let mut hook = webhook(vec![], 100).await;
    app.store
        .add_endpoint(Endpoints::Push, None, &hook.url, app.clock.now_utc())
        .await
        .expect("register");
    api.create(json!({
        "name": "hooked", "filter": "default/#", "mode": "push", "push_url": hook.url,
        "push_concurrency": push_concurrency,
    }))
    .await;
    deliver_singletons(app, "Order", count).await;
    let mut seen = BTreeSet::new();
    while seen.len() < count {
        seen.insert(hook.next().await["offset"].as_i64().expect("offset"));
    }
    hook.max_concurrent.load(Ordering::SeqCst)
}

#[tokio::test]
async fn push_concurrency_is_bounded() {
    let app = gateway().await;
    let max = most_pushes_at_once(&app, 2, 8).await;
    assert!((1..=2).contains(&max), "at most 2 in flight, saw {max}");
}

/// Security review (second round), items 2 and 3: what one fetch answers, and what one push
/// subscription has in flight, is bounded in payload bytes, not only in count.
#[tokio::test]
async fn a_fetch_answers_at_most_max_fetch_bytes_but_always_one_message() {
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        c.delivery.max_fetch_bytes = 150;
    })
    .await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "bytes", "filter": "default/#" }))
        .await;
    deliver_singletons(&app, "Order", 6).await;
    let session = api.join(sub, 30_000).await;
    let payload = |m: &Value| m["payload"].as_str().expect("payload").len();
    let first = api.fetch(&session, 100).await;
    let sizes: Vec<usize> = first.iter().map(payload).collect();
    assert!(sizes.iter().all(|s| (50..=100).contains(s)), "{sizes:?}");
    assert_eq!(first.len(), 2, "150 bytes hold two of these: {sizes:?}");
    // The rest comes with the next fetches, nothing skipped.
    let mut seen: BTreeSet<i64> = first.iter().filter_map(|m| m["offset"].as_i64()).collect();
    for _ in 0..5 {
        seen.extend(
            api.fetch(&session, 100)
                .await
                .iter()
                .filter_map(|m| m["offset"].as_i64()),
        );
    }
    assert_eq!(seen.len(), 6);
    app.stop().await;

    // A message larger than the whole budget is still handed out, alone.
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        c.delivery.max_fetch_bytes = 1;
    })
    .await;
    let api = Api::of(&app, OWNER);
    let sub = api
        .create(json!({ "name": "tiny", "filter": "default/#" }))
        .await;
    deliver_singletons(&app, "Order", 3).await;
    let session = api.join(sub, 30_000).await;
    assert_eq!(api.fetch(&session, 100).await.len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn push_in_flight_is_bounded_in_bytes_as_well_as_in_count() {
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        // Each message's payload is 60-odd bytes: one at a time fits, two do not.
        c.delivery.max_push_bytes_in_flight = 100;
    })
    .await;
    let max = most_pushes_at_once(&app, 8, 5).await;
    assert_eq!(
        max, 1,
        "the byte bound lets one through at a time, saw {max}"
    );
}

/// Runs housekeeping at the app's clock until `done` (at most 50 passes).
async fn maintain_until<F, Fut>(app: &TestApp, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let settings = &app.config.delivery;
    super::support::eventually("housekeeping done", || async {
        if done().await {
            return Some(());
        }
        app.store
            .maintain_deliveries(
                app.clock.now_utc(),
                settings.ephemeral_grace,
                settings.inbox_retention,
            )
            .await
            .expect("maintenance");
        None
    })
    .await;
}

// Ephemeral subscriptions and inbox retention.
#[tokio::test]
async fn an_ephemeral_subscription_goes_after_its_last_member_and_the_inbox_is_purged_when_unneeded()
 {
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        c.delivery.ephemeral_grace = Duration::seconds(30);
        c.delivery.inbox_retention = Duration::hours(1);
    })
    .await;
    let api = Api::of(&app, OWNER);
    let durable = api
        .create(json!({ "name": "keep", "filter": "default/#" }))
        .await;
    let passing = api
        .create(json!({ "name": "passing", "filter": "default/#", "durable": false }))
        .await;
    deliver_singletons(&app, "Order", 2).await;
    let session = api.join(passing, 60_000).await;
    assert_eq!(api.fetch(&session, 10).await.len(), 2);
    assert_eq!(
        api.delete(&format!("/api/v1/sessions/{session}")).await,
        204
    );
    let grace = Duration::seconds(31);
    app.clock.advance(grace);
    // (The background pass may get there first; either way it is gone. On PostgreSQL a pass
    // leaves a subscription, or the purge, that another transaction holds to that one or the
    // next pass — the background pass may hold it with the clock read before the advance — so
    // maintenance runs again until what it should do is done.)
    let path = format!("/api/v1/subscriptions/{passing}");
    maintain_until(&app, || async { api.get(&path).await.0 == 404 }).await;

    // The durable one still needs both; once one is accepted and the retention passed, that
    // one goes and the other stays.
    let session = api.join(durable, 3_600_000).await;
    let got = api.fetch(&session, 10).await;
    assert_eq!(api.accept(&got[0]).await.0, 200);
    // Retention counts from the later of arrival and settling.
    app.clock.advance(Duration::hours(1) + Duration::seconds(1));
    maintain_until(&app, || async { app.inbox().await.len() == 1 }).await;
    let left: Vec<i64> = app.inbox().await.iter().map(|e| e.offset).collect();
    assert_eq!(left, vec![got[1]["offset"].as_i64().expect("offset")]);
}

// 8. Leases, cursors and dead letters survive SIGKILL.
#[tokio::test]
async fn leases_cursors_and_dead_letters_survive_sigkill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = super::support::free_port();
    let config = dir.path().join("gw.toml");
    let database = super::support::fresh_database(dir.path(), "gw.db").await;
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n\
             [[tokens]]\ntoken = \"{OWNER}\"\nprincipal = \"billing\"\nscopes = [\"consume\"]\n",
            database.setting()
        ),
    )
    .expect("config");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let api = Api {
        base: base.clone(),
        client: client.clone(),
        token: OWNER,
    };
    let mut child = start_gateway(&config);
    let sub = api
        .create(json!({ "name": "durable", "filter": "default/#", "ack_wait_ms": 3_600_000, "ordering": "group" }))
        .await;
    for i in 0..4 {
        deliver(
            &base,
            &client,
            wsr_message("Order", &format!("mid:kill-{i}@test"), None, false),
        )
        .await;
    }
    let session = api.join(sub, 3_600_000).await;
    let got = api.fetch(&session, 3).await;
    assert_eq!(got.len(), 3);
    assert_eq!(api.accept(&got[0]).await.0, 200);
    assert_eq!(
        api.settle(&got[1], json!({ "outcome": "rejected" }))
            .await
            .0,
        200
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let mut child = start_gateway(&config);
    // A fresh client: the pooled connections died with the process.
    let api = Api {
        client: reqwest::Client::new(),
        ..api
    };
    // The lease of the third survived (same attempt, same receipt key).
    let (status, extended) = api
        .post("/api/v1/extend", json!({ "receipt": got[2]["receipt"] }))
        .await;
    assert_eq!(status, 200, "{extended}");
    // The cursor too: only the fourth is new; the accepted one is not delivered again.
    let rest = api.fetch(&session, 10).await;
    assert_eq!(
        offsets(&rest),
        vec![got[2]["offset"].as_i64().expect("o") + 1]
    );
    assert_eq!(api.accept(&got[0]).await.0, 409);
    assert_eq!(api.accept(&got[2]).await.0, 200);
    let dead = dead_letters(&api, sub).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["offset"], got[1]["offset"]);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

/// A push subscription whose webhook is broken can be paused: nothing is POSTed while it is,
/// the messages wait, and a resume pushes them; a pull subscription has nothing to pause.
#[tokio::test]
async fn a_paused_push_subscription_holds_its_messages_until_resumed() {
    let app = gateway().await;
    let api = Api::of(&app, OWNER);
    let mut hook = webhook(vec![], 0).await;
    app.store
        .add_endpoint(Endpoints::Push, None, &hook.url, app.clock.now_utc())
        .await
        .expect("register");
    let sub = api
        .create(json!({
            "name": "paused", "filter": "default/#", "mode": "push", "push_url": hook.url,
        }))
        .await;
    let (status, paused) = api
        .post(&format!("/api/v1/subscriptions/{sub}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"], true, "{paused}");
    deliver_singletons(&app, "Order", 1).await;
    assert!(hook.quiet(500).await, "nothing is pushed while paused");
    let (status, resumed) = api
        .post(&format!("/api/v1/subscriptions/{sub}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["paused"], false, "{resumed}");
    assert_eq!(hook.next().await["topic"], "default/Order");
    let pull = api
        .create(json!({ "name": "pulled", "filter": "default/#" }))
        .await;
    let (status, problem) = api
        .post(&format!("/api/v1/subscriptions/{pull}/pause"), json!({}))
        .await;
    assert_eq!(status, 409, "{problem}");
    let (status, _) = api
        .post("/api/v1/subscriptions/999999/pause", json!({}))
        .await;
    assert_eq!(status, 404);
}
