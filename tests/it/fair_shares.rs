//! Fair shares (security review, second round, item 1): long polls, and any one client, hold
//! at most their class's budget and their share of it — partners, applications and operators
//! are served while they do.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinSet;
use wsr_gateway::wsr::{Headers, SoapVersion, write_envelope};

use super::delivery::{ADMIN, Api, OTHER, OWNER, tokens, wsr_request};
use super::support::{TestApp, spawn_app_with};

const BOUND: Duration = Duration::from_secs(10);

/// A session on a subscription nothing matches: its long polls wait their whole wait.
async fn idle_session(api: &Api, name: &str) -> String {
    let sub = api
        .create(json!({ "name": name, "filter": "nothing/#" }))
        .await;
    api.join(sub, 60_000).await
}

/// Long polls of `session`, each waiting up to 20 s, spread over one client per source
/// address; the probes of `until_refused` go from 127.0.0.1.
struct LongPolls {
    app_url: String,
    clients: Vec<reqwest::Client>,
    probe: reqwest::Client,
    token: &'static str,
    session: String,
    count: usize,
    polls: JoinSet<u16>,
}

/// `count` long polls from 127.0.0.1.
fn long_polls(app: &TestApp, token: &'static str, session: &str, count: usize) -> LongPolls {
    long_polls_from(app, token, session, count, &["127.0.0.1"])
}

/// `count` long polls spread over `sources` (all loopback addresses: 127.0.0.0/8 is).
fn long_polls_from(
    app: &TestApp,
    token: &'static str,
    session: &str,
    count: usize,
    sources: &[&str],
) -> LongPolls {
    let clients = sources
        .iter()
        .map(|source| {
            let address: std::net::IpAddr = source.parse().expect("an address");
            reqwest::Client::builder()
                .local_address(address)
                .build()
                .expect("a client")
        })
        .collect();
    LongPolls {
        app_url: app.url(""),
        clients,
        probe: app.client.clone(),
        token,
        session: session.to_owned(),
        count,
        polls: JoinSet::new(),
    }
}

impl LongPolls {
    /// Starts polls until `count` are out (a poll may be refused itself while a probe holds
    /// a slot: it is started again).
    fn top_up(&mut self) {
        while self.polls.try_join_next().is_some() {}
        while self.polls.len() < self.count {
            let client = &self.clients[self.polls.len() % self.clients.len()];
            let request = client
                .post(format!(
                    "{}/api/v1/sessions/{}/fetch",
                    self.app_url, self.session
                ))
                .bearer_auth(self.token)
                .json(&json!({ "max": 1, "wait_ms": 20_000 }));
            self.polls
                .spawn(async move { request.send().await.map_or(0, |r| r.status().as_u16()) });
        }
    }

    /// Fetches of the session waiting `wait_ms`, with the polls out, until one is answered
    /// `status` (bounded): its Retry-After, and its body.
    async fn until_refused(
        &mut self,
        token: &str,
        wait_ms: u64,
        status: u16,
    ) -> (Option<String>, String) {
        let url = format!("{}/api/v1/sessions/{}/fetch", self.app_url, self.session);
        tokio::time::timeout(BOUND, async {
            loop {
                self.top_up();
                tokio::time::sleep(Duration::from_millis(20)).await;
                let r = self
                    .probe
                    .post(&url)
                    .bearer_auth(token)
                    .json(&json!({ "max": 1, "wait_ms": wait_ms }))
                    .send()
                    .await
                    .expect("answer");
                if r.status().as_u16() == status {
                    let retry_after = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    return (retry_after, r.text().await.unwrap_or_default());
                }
            }
        })
        .await
        .expect("refused once the others are waiting")
    }

    /// Whether every poll still waits.
    fn all_waiting(&mut self) -> bool {
        self.polls.try_join_next().is_none() && self.polls.len() == self.count
    }
}

/// A partner's reliable message to `/wsr/default` is acked.
async fn partner_is_acked(app: &TestApp, group: &str) {
    let request = wsr_request(group, None, false);
    let xml = write_envelope(
        SoapVersion::Soap11,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        "<p:Order xmlns:p=\"urn:p\">1</p:Order>",
    );
    let r = tokio::time::timeout(
        BOUND,
        app.client
            .post(app.url("/wsr/default"))
            .header("content-type", "text/xml; charset=utf-8")
            .body(xml)
            .send(),
    )
    .await
    .expect("answered at once")
    .expect("answer");
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("AckRequested") || body.contains("Response"),
        "{body}"
    );
    assert!(!body.contains("Fault"), "{body}");
}

#[tokio::test]
async fn long_polls_fill_only_their_class_partners_and_operators_are_still_served() {
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        c.perimeter.max_waiting_requests = 4;
    })
    .await;
    let api = Api::of(&app, OWNER);
    let session = idle_session(&api, "never").await;
    // Four sources (a source holds at most a quarter of a class): the class is full.
    let sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let mut polls = long_polls_from(&app, OWNER, &session, 4, &sources);
    let (retry_after, refused) = polls.until_refused(OWNER, 0, 503).await;
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(refused.contains("waiting"), "{refused}");

    partner_is_acked(&app, "mid:fair-1@test").await;
    let (status, _) = Api::of(&app, ADMIN).get("/api/v1/inbox").await;
    assert_eq!(status, 200, "operators are served");
    let (status, _) = api.get("/api/v1/subscriptions").await;
    assert_eq!(status, 200, "the application API is served");
    // Operators see the refusals.
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("wsr_requests_refused_total")
                && l.contains("class=\"waiting\"")
                && l.contains("reason=\"class_full\"")),
        "{metrics}"
    );
    assert!(polls.all_waiting(), "the long polls still wait");
    polls.polls.abort_all();
    app.stop().await;
}

#[tokio::test]
async fn one_source_holds_only_its_share_of_a_class() {
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        c.perimeter.max_requests_in_flight_per_source = 2;
    })
    .await;
    let api = Api::of(&app, OWNER);
    let session = idle_session(&api, "never").await;
    let mut polls = long_polls(&app, OWNER, &session, 2);
    let (retry_after, refused) = polls.until_refused(OWNER, 0, 429).await;
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(refused.contains("share"), "{refused}");
    // The same address still has its share of the partners' class.
    partner_is_acked(&app, "mid:fair-2@test").await;
    polls.polls.abort_all();
    app.stop().await;
}

#[tokio::test]
async fn one_principal_has_at_most_its_waiting_fetches() {
    let app = spawn_app_with(|c| c.tokens = tokens()).await;
    let api = Api::of(&app, OWNER);
    let session = idle_session(&api, "never").await;
    let max = wsr_gateway::http::slots::MAX_WAITING_FETCHES;
    let mut polls = long_polls(&app, OWNER, &session, max);
    let (_, refused) = polls.until_refused(OWNER, 1, 429).await;
    let problem: Value = serde_json::from_str(&refused).expect("a problem");
    assert_eq!(problem["error"], "too-many-waiting-fetches", "{problem}");
    // Fetching without waiting, and another principal's long poll, are still served.
    let (status, _) = api
        .post(
            &format!("/api/v1/sessions/{session}/fetch"),
            json!({ "max": 1 }),
        )
        .await;
    assert_eq!(status, 200);
    let other = Api::of(&app, OTHER);
    let theirs = idle_session(&other, "never-either").await;
    let (status, _) = other
        .post(
            &format!("/api/v1/sessions/{theirs}/fetch"),
            json!({ "max": 1, "wait_ms": 1 }),
        )
        .await;
    assert_eq!(status, 200);
    polls.polls.abort_all();
    app.stop().await;
}

/// Security review (second round), item 6: subscriptions per principal and sessions per
/// subscription are capped.
#[tokio::test]
async fn subscriptions_per_principal_and_sessions_per_subscription_are_capped() {
    let app = spawn_app_with(|c| {
        c.tokens = tokens();
        c.delivery.max_subscriptions_per_principal = 3;
        c.delivery.max_sessions_per_subscription = 2;
    })
    .await;
    let api = Api::of(&app, OWNER);
    let create = |n: usize| json!({ "name": format!("s{n}"), "filter": "default/#" });
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(api.create(create(n)).await);
    }
    let (status, problem) = api.post("/api/v1/subscriptions", create(3)).await;
    assert_eq!(status, 429, "{problem}");
    assert_eq!(problem["error"], "too-many-subscriptions", "{problem}");
    let (status, _) = api.post("/api/v1/subscriptions", create(0)).await;
    assert_eq!(status, 200, "asking again for one it owns is no new one");
    let (status, _) = Api::of(&app, OTHER)
        .post("/api/v1/subscriptions", create(9))
        .await;
    assert_eq!(status, 201, "another principal has its own cap");

    let first = api.join(ids[0], 30_000).await;
    api.join(ids[0], 30_000).await;
    let path = format!("/api/v1/subscriptions/{}/sessions", ids[0]);
    let (status, problem) = api.post(&path, json!({})).await;
    assert_eq!(status, 429, "{problem}");
    assert_eq!(problem["error"], "too-many-sessions", "{problem}");
    let left = app
        .client
        .delete(app.url(&format!("/api/v1/sessions/{first}")))
        .bearer_auth(OWNER)
        .send()
        .await
        .expect("leave");
    assert!(left.status().is_success(), "{}", left.status());
    api.join(ids[0], 30_000).await;

    let deleted = app
        .client
        .delete(app.url(&format!("/api/v1/subscriptions/{}", ids[1])))
        .bearer_auth(OWNER)
        .send()
        .await
        .expect("delete");
    assert!(deleted.status().is_success(), "{}", deleted.status());
    api.create(create(3)).await;
    app.stop().await;
}

/// Security review (second round), item 7: a push webhook is registered for the principals
/// that may aim push subscriptions at it; no other token can.
#[tokio::test]
async fn a_push_webhook_serves_only_the_principals_it_is_registered_for() {
    let app = spawn_app_with(|c| c.tokens = tokens()).await;
    let admin = Api::of(&app, ADMIN);
    let url = "http://127.0.0.1:9/billing-hook";
    let (status, problem) = admin
        .post("/api/v1/push-endpoints", json!({ "url": url }))
        .await;
    assert_eq!(
        status, 400,
        "the principal is the operator's decision: {problem}"
    );
    assert!(
        problem["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("principal:"),
        "{problem}"
    );
    let (status, _) = admin
        .post(
            "/api/v1/push-endpoints",
            json!({ "url": url, "principal": "nobody-has-it" }),
        )
        .await;
    assert_eq!(status, 400, "a typo would grant nobody");
    let (status, registered) = admin
        .post(
            "/api/v1/push-endpoints",
            json!({ "url": url, "principal": "billing" }),
        )
        .await;
    assert_eq!(status, 201, "{registered}");
    assert_eq!(registered["principal"], "billing");

    let push_to = |name: &str| json!({ "name": name, "filter": "default/#", "mode": "push", "push_url": url });
    let (status, refused) = Api::of(&app, OTHER)
        .post("/api/v1/subscriptions", push_to("theirs"))
        .await;
    assert_eq!(
        status, 400,
        "shipping may not aim at billing's webhook: {refused}"
    );
    Api::of(&app, OWNER).create(push_to("mine")).await;

    let (status, listed) = admin.get("/api/v1/push-endpoints").await;
    assert_eq!(status, 200);
    assert_eq!(
        listed["registrations"],
        json!([{ "url": url, "principal": "billing" }])
    );

    // Granted to every principal, shipping may; withdrawn, it may no longer.
    let (status, _) = admin
        .post(
            "/api/v1/push-endpoints",
            json!({ "url": url, "principal": "*" }),
        )
        .await;
    assert_eq!(status, 201);
    Api::of(&app, OTHER).create(push_to("theirs")).await;
    let withdrawn = app
        .client
        .delete(app.url("/api/v1/push-endpoints"))
        .bearer_auth(ADMIN)
        .json(&json!({ "url": url, "principal": "*" }))
        .send()
        .await
        .expect("answer");
    assert_eq!(withdrawn.status(), 204);
    let (status, _) = Api::of(&app, OTHER)
        .post("/api/v1/subscriptions", push_to("theirs-again"))
        .await;
    assert_eq!(status, 400);
    let (_, listed) = admin.get("/api/v1/push-endpoints").await;
    assert_eq!(
        listed["endpoints"],
        json!([url]),
        "billing's grant keeps it"
    );
    app.stop().await;
}

/// A grant withdrawn stops that principal's pushes at once, while the webhook stays
/// registered for another.
#[tokio::test]
async fn a_withdrawn_grant_stops_the_principals_pushes() {
    let app = spawn_app_with(|c| c.tokens = tokens()).await;
    let admin = Api::of(&app, ADMIN);
    let mut hook = super::delivery::webhook(vec![], 0).await;
    for principal in ["shipping", "billing"] {
        let (status, _) = admin
            .post(
                "/api/v1/push-endpoints",
                json!({ "url": hook.url, "principal": principal }),
            )
            .await;
        assert_eq!(status, 201);
    }
    Api::of(&app, OTHER)
        .create(json!({
            "name": "shipped", "filter": "default/#", "mode": "push", "push_url": hook.url,
        }))
        .await;
    super::delivery::deliver_singletons(&app, "Order", 1).await;
    hook.next().await;
    let withdrawn = app
        .client
        .delete(app.url("/api/v1/push-endpoints"))
        .bearer_auth(ADMIN)
        .json(&json!({ "url": hook.url, "principal": "shipping" }))
        .send()
        .await
        .expect("answer");
    assert_eq!(withdrawn.status(), 204);
    super::delivery::deliver_singletons(&app, "Order", 1).await;
    assert!(hook.quiet(500).await, "shipping's pushes stopped");
    app.stop().await;
}
