//! Per-partner scoping (D14): two partners using the same groupId never touch each other's
//! state — duplicates, order, polls, ordering groups in subscriptions — and a callback caller
//! settles only the messages it may speak for. Partners authenticate by bearer token; the
//! built-in `default` channel is anonymous on loopback, so anonymous callers are tested too.

use chrono::{Duration, Utc};
use serde_json::{Value, json};
use wsr_gateway::config::{ApiToken, Scope};
use wsr_gateway::partners::{Inbound, Outbound, Partner};
use wsr_gateway::rmp::replies::reply_for;
use wsr_gateway::secrets::{Secret, Stored};
#[allow(unused_imports)]
use wsr_gateway::wsr::{
    GroupId, MessageId, MessageKey, RefToMessageIds, Reply, ReplyPattern, Request, SeqRange,
    SequenceNum, SoapVersion,
};

use super::support::{
    Answer, ClockExt as _, MockPartner, TestApp, allow_loopback_urls, mock_partner, poll_envelope,
    request_envelope, spawn_app_with, submit_as,
};

pub(crate) const GROUP: &str = "mid:shared@partners";
const PRODUCER: &str = "producer-token-000000001";
const CONSUMER: &str = "consumer-token-000000002";
const ADMIN: &str = "operator-token-000000003";

/// POSTs `xml` to `path` as `partner` (`None`: anonymous), authenticated by its bearer token
/// (`credentialed` below) through the guard.
async fn post_as(app: &TestApp, partner: Option<&str>, path: &str, xml: String) -> Answer {
    let mut request = app
        .client
        .post(app.url(path))
        .header("content-type", SoapVersion::Soap11.content_type())
        .body(xml);
    if let Some(name) = partner {
        request = request.bearer_auth(inbound_token(name));
    }
    Answer::read(request.send().await.expect("request reaches the gateway")).await
}

fn inbound_token(partner: &str) -> String {
    format!("{partner}-inbound-token")
}

/// A reliable message of group `GROUP` (numbered, and ordered, when `number` is given).
pub(crate) fn message(
    app: &TestApp,
    number: Option<u64>,
    pattern: ReplyPattern,
    body: &str,
) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(GROUP).expect("group"),
            sequence: number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: app.clock.now_utc() + Duration::hours(1),
        reply_pattern: pattern,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: number.is_some(),
    };
    request_envelope(
        &request,
        &format!("<p:Order xmlns:p=\"urn:p\">{body}</p:Order>"),
    )
}

fn token(secret: &str, principal: &str, scope: Scope) -> ApiToken {
    ApiToken {
        secret: Stored::Plain(Secret::new(secret)),
        principal: principal.into(),
        scopes: vec![scope],
        topics: wsr_gateway::config::all_topics(),
    }
}

/// A partner that can authenticate (a bearer token), reached at `address`.
fn credentialed(name: &str, address: Option<&str>) -> Partner {
    Partner {
        name: name.into(),
        inbound: Inbound {
            token: Some(Stored::Plain(Secret::new(inbound_token(name)))),
            ..Inbound::default()
        },
        outbound: Outbound {
            address: address.map(str::to_owned),
            ..Outbound::default()
        },
    }
}

async fn gateway() -> TestApp {
    spawn_app_with(|c| {
        // Answer at once instead of holding a buffered message's request.
        c.hold = std::time::Duration::ZERO;
        c.tokens = vec![
            token(CONSUMER, "reader", Scope::Consume),
            token(ADMIN, "operator", Scope::Admin),
        ];
        let mut alpha = credentialed("alpha", None);
        alpha.inbound.callback_endpoints = vec![CONFIGURED_CALLBACK.into()];
        c.partners.insert(alpha);
        c.partners.insert(credentialed("beta", None));
    })
    .await
}

/// alpha's `inbound.callback_endpoints` in the configuration.
const CONFIGURED_CALLBACK: &str = "http://127.0.0.1:9/alpha-configured";

/// The replies of an answer's wsrm:Response (none without one).
fn replies(answer: &Answer) -> Vec<Reply> {
    answer
        .envelope()
        .response
        .map(|r| r.replies)
        .unwrap_or_default()
}

#[tokio::test]
async fn a_partner_reusing_another_partners_group_id_gets_its_own_message_delivered() {
    let app = gateway().await;
    // A subscription reads what arrives after it was created.
    let sub = subscribe(&app, "all", "none").await;
    let from_alpha = message(&app, None, ReplyPattern::Response, "alpha's");
    let from_beta = message(&app, None, ReplyPattern::Response, "beta's");
    let answer = post_as(&app, Some("alpha"), "/wsr/default", from_alpha.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = post_as(&app, Some("beta"), "/wsr/default", from_beta).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // The anonymous caller is a third party with the same id.
    let anonymous = message(&app, None, ReplyPattern::Response, "anonymous");
    let answer = post_as(&app, None, "/wsr/default", anonymous).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // alpha's own resend is still a duplicate.
    let answer = post_as(&app, Some("alpha"), "/wsr/default", from_alpha).await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    let inbox = app.inbox().await;
    let seen: Vec<(&str, bool)> = inbox
        .iter()
        .map(|e| (e.partner.as_str(), e.payload.contains("alpha's")))
        .collect();
    assert_eq!(
        seen,
        [("alpha", true), ("beta", false), ("", false)],
        "each partner's message once, under its own name"
    );
    assert!(inbox[1].payload.contains("beta's"));
    for partner in ["alpha", "beta", ""] {
        assert!(
            app.store
                .group(partner, GROUP)
                .await
                .expect("read")
                .is_some(),
            "{partner:?} has its own group"
        );
    }
    // Applications see who sent each message.
    let session = join(&app, sub).await;
    let fetched = fetch(&app, &session).await;
    let partners: Vec<&str> = fetched
        .iter()
        .map(|m| m["partner"].as_str().expect("partner"))
        .collect();
    assert_eq!(partners, ["alpha", "beta", ""]);
    app.stop().await;
}

#[tokio::test]
async fn another_partners_ordered_group_of_the_same_id_neither_unblocks_nor_advances_it() {
    let app = gateway().await;
    // alpha's #1 waits for alpha's #0.
    let answer = post_as(
        &app,
        Some("alpha"),
        "/wsr/default",
        message(&app, Some(1), ReplyPattern::Response, "alpha#1"),
    )
    .await;
    assert_eq!(answer.status, 202, "buffered: {}", answer.body);
    // beta's #0 of the same id is beta's alone.
    let answer = post_as(
        &app,
        Some("beta"),
        "/wsr/default",
        message(&app, Some(0), ReplyPattern::Response, "beta#0"),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let delivered: Vec<String> = app.inbox().await.into_iter().map(|e| e.payload).collect();
    assert_eq!(delivered.len(), 1, "alpha's #1 still waits: {delivered:?}");
    assert!(delivered[0].contains("beta#0"));
    let alpha = app
        .store
        .group("alpha", GROUP)
        .await
        .expect("read")
        .expect("alpha's group");
    assert_eq!(alpha.next_expected, 0, "alpha's group did not advance");
    assert_eq!(alpha.buffered.keys().copied().collect::<Vec<_>>(), [1]);

    // alpha's own #0 releases its #1.
    let answer = post_as(
        &app,
        Some("alpha"),
        "/wsr/default",
        message(&app, Some(0), ReplyPattern::Response, "alpha#0"),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let delivered: Vec<(String, String)> = app
        .inbox()
        .await
        .into_iter()
        .map(|e| (e.partner, e.payload))
        .collect();
    assert_eq!(delivered.len(), 3, "{delivered:?}");
    assert!(delivered[1].0 == "alpha" && delivered[1].1.contains("alpha#0"));
    assert!(delivered[2].0 == "alpha" && delivered[2].1.contains("alpha#1"));
    app.stop().await;
}

#[tokio::test]
async fn a_group_ordered_subscription_keeps_two_partners_groups_of_one_id_apart() {
    let app = gateway().await;
    // A subscription reads what arrives after it was created.
    let sub = subscribe(&app, "ordered", "group").await;
    for (partner, n) in [("alpha", 0), ("alpha", 1), ("beta", 0)] {
        let xml = message(
            &app,
            Some(n),
            ReplyPattern::Response,
            &format!("{partner}#{n}"),
        );
        let answer = post_as(&app, Some(partner), "/wsr/default", xml).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let session = join(&app, sub).await;
    // One message per group at a time: alpha's head and beta's head, as two groups. Merged
    // into one group they would be one head (alpha#0) and nothing else.
    let fetched = fetch(&app, &session).await;
    let got: Vec<(&str, &str)> = fetched
        .iter()
        .map(|m| {
            (
                m["partner"].as_str().expect("partner"),
                m["payload"].as_str().expect("payload"),
            )
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, "alpha");
    assert!(got[0].1.contains("alpha#0"));
    assert_eq!(got[1].0, "beta");
    assert!(got[1].1.contains("beta#0"));
    app.stop().await;
}

#[tokio::test]
async fn a_poll_for_another_partners_group_learns_nothing_and_the_owners_poll_does() {
    let app = gateway().await;
    let answer = post_as(
        &app,
        Some("alpha"),
        "/wsr/default",
        message(&app, None, ReplyPattern::Poll, "alpha's"),
    )
    .await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    let poll = || {
        poll_envelope(vec![RefToMessageIds {
            group_id: GroupId::parse(GROUP).expect("group"),
            ranges: Vec::new(),
        }])
    };
    // Answered as for a group never heard of: nothing to say (202, no wsrm:Response).
    let beta = post_as(&app, Some("beta"), "/wsr/default", poll()).await;
    assert_eq!(
        beta.status, 202,
        "beta learns nothing of alpha's group: {}",
        beta.body
    );
    let anonymous = post_as(&app, None, "/wsr/default", poll()).await;
    assert_eq!(anonymous.status, 202, "{}", anonymous.body);
    assert!(!beta.body.contains(GROUP) && !anonymous.body.contains(GROUP));
    let alpha = post_as(&app, Some("alpha"), "/wsr/default", poll()).await;
    assert_eq!(alpha.status, 200, "{}", alpha.body);
    let acked = replies(&alpha);
    assert!(
        acked
            .iter()
            .any(|r| matches!(r, Reply::NonSequence { group_id, fault: None } if group_id.as_str() == GROUP)),
        "alpha's poll gets its ack: {}",
        alpha.body
    );
    app.stop().await;
}

#[tokio::test]
async fn a_partner_may_name_only_its_own_callback_endpoints() {
    let app = gateway().await;
    let alpha_cb = "http://127.0.0.1:9/alpha-callback";
    app.store
        .add_endpoint(
            wsr_gateway::store::Endpoints::Callback,
            Some("alpha"),
            alpha_cb,
            Utc::now(),
        )
        .await
        .expect("register");
    assert!(
        app.store
            .is_callback_endpoint("alpha", alpha_cb)
            .await
            .expect("read")
    );
    assert!(
        !app.store
            .is_callback_endpoint("beta", alpha_cb)
            .await
            .expect("read")
    );
    assert!(
        !app.store
            .is_callback_endpoint("", alpha_cb)
            .await
            .expect("read")
    );
    // A partner's configured endpoints are registered for it alone at startup.
    let configured = |p: &'static str| app.store.is_callback_endpoint(p, CONFIGURED_CALLBACK);
    assert!(configured("alpha").await.expect("read"));
    assert!(!configured("").await.expect("read"));
    let callback = |partner: Option<&'static str>| {
        let xml = message(
            &app,
            None,
            ReplyPattern::Callback(wsr_gateway::wsr::ReplyTo::bare(alpha_cb)),
            "cb",
        );
        post_as(&app, partner, "/wsr/default", xml)
    };
    let beta = callback(Some("beta")).await;
    assert_eq!(beta.status, 500, "refused: {}", beta.body);
    assert!(beta.body.contains("InvalidReplyPattern"), "{}", beta.body);
    let alpha = callback(Some("alpha")).await;
    assert_eq!(alpha.status, 202, "{}", alpha.body);
    // The owed ack names the partner whose message it answers. (On PostgreSQL the gateway's
    // own callback worker may be claiming it at this very moment, and a claim skips rows
    // another claim holds: look again until that statement is over.)
    let due = super::support::eventually("the owed callback", || async {
        let due = app
            .store
            .due_callbacks(Utc::now() + Duration::hours(1), 10)
            .await
            .expect("due");
        (!due.is_empty()).then_some(due)
    })
    .await;
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].partner, "alpha");
    app.stop().await;
}

/// A sending gateway with partners `alpha` (credentialed) and `gamma` (address only, so it
/// can only call in anonymously), both at `partner`.
async fn sender(partner: &MockPartner) -> TestApp {
    let url = partner.url.clone();
    spawn_app_with(move |c| {
        c.tokens = vec![super::support::producer_token(PRODUCER)];
        allow_loopback_urls(c);
        c.partners.insert(credentialed("alpha", Some(&url)));
        c.partners.insert(credentialed("beta", None));
        c.partners.insert_address("gamma", url.clone());
    })
    .await
}

/// Submits a Callback-pattern singleton to `destination`; returns its id once it was sent
/// (the attempt is stored as sent before the POST leaves, so the POST's arrival suffices).
async fn sent_to(app: &TestApp, partner: &mut MockPartner, destination: &str) -> String {
    let (status, answer) = submit_as(
        app,
        PRODUCER,
        json!({
            "destination": destination,
            "agreement": { "reply_pattern": "Callback" },
            "body": "<o:Order xmlns:o=\"urn:o\">x</o:Order>",
        }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    partner.next_post().await;
    answer["id"].as_str().expect("id").to_owned()
}

fn ack_for(app_message: &wsr_gateway::store::outbound::OutMessage) -> String {
    verdict_for(app_message, None)
}

/// A callback faulting the message (as a partner refusing it would).
fn fault_for(app_message: &wsr_gateway::store::outbound::OutMessage) -> String {
    verdict_for(
        app_message,
        Some(wsr_gateway::wsr::FaultCode::InvalidMessageParameters),
    )
}

fn verdict_for(
    app_message: &wsr_gateway::store::outbound::OutMessage,
    fault: Option<wsr_gateway::wsr::FaultCode>,
) -> String {
    let key: MessageKey = app_message.key();
    super::support::response_envelope(vec![reply_for(&key, fault)])
}

async fn state(app: &TestApp, id: &str) -> wsr_gateway::store::outbound::OutMessage {
    app.store
        .out_message(id)
        .await
        .expect("read")
        .expect("message")
}

#[tokio::test]
async fn a_callback_ack_settles_only_messages_to_partners_the_caller_speaks_for() {
    let mut partner = mock_partner(Vec::new()).await;
    let app = sender(&partner).await;
    let to_alpha = sent_to(&app, &mut partner, "alpha").await;
    let to_gamma = sent_to(&app, &mut partner, "gamma").await;
    let alpha_message = state(&app, &to_alpha).await;
    assert_eq!(alpha_message.partner, "alpha");
    assert_eq!(alpha_message.outbound.state.name(), "sent");
    let gamma_message = state(&app, &to_gamma).await;
    assert_eq!(gamma_message.partner, "gamma");

    // beta can neither ack nor fault alpha's message, nor can an anonymous caller (alpha can
    // authenticate): the forged-callback attack changes nothing.
    for caller in [Some("beta"), None] {
        for forged in [ack_for(&alpha_message), fault_for(&alpha_message)] {
            let answer = post_as(&app, caller, "/wsr/_callback", forged).await;
            assert_eq!(answer.status, 202, "{}", answer.body);
            assert_eq!(
                state(&app, &to_alpha).await.outbound.state.name(),
                "sent",
                "{caller:?} changed nothing"
            );
        }
    }
    // Wrong credentials are refused outright.
    let refused = app
        .client
        .post(app.url("/wsr/_callback"))
        .header("content-type", SoapVersion::Soap11.content_type())
        .bearer_auth("not-anybodys-token")
        .body(ack_for(&alpha_message))
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 401);
    assert_eq!(state(&app, &to_alpha).await.outbound.state.name(), "sent");
    // alpha can.
    let answer = post_as(
        &app,
        Some("alpha"),
        "/wsr/_callback",
        ack_for(&alpha_message),
    )
    .await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(state(&app, &to_alpha).await.outbound.state.name(), "acked");

    // gamma has no credentials: it calls in anonymously, and alpha cannot speak for it.
    let answer = post_as(
        &app,
        Some("alpha"),
        "/wsr/_callback",
        ack_for(&gamma_message),
    )
    .await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(state(&app, &to_gamma).await.outbound.state.name(), "sent");
    let answer = post_as(&app, None, "/wsr/_callback", ack_for(&gamma_message)).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(state(&app, &to_gamma).await.outbound.state.name(), "acked");

    // The API shows whom a message goes to.
    let (status, shown) = get_json(&app, &format!("/api/v1/messages/{to_alpha}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["partner"], "alpha");
    app.stop().await;
}

async fn get_json(app: &TestApp, path: &str) -> (u16, Value) {
    let r = app
        .client
        .get(app.url(path))
        .bearer_auth(PRODUCER)
        .send()
        .await
        .expect("answer");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn consume(app: &TestApp, path: &str, body: Value) -> Value {
    let r = app
        .client
        .post(app.url(path))
        .bearer_auth(CONSUMER)
        .json(&body)
        .send()
        .await
        .expect("answer");
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap_or(Value::Null);
    assert!((200..300).contains(&status), "{path}: {status} {answer}");
    answer
}

async fn subscribe(app: &TestApp, name: &str, ordering: &str) -> i64 {
    let answer = consume(
        app,
        "/api/v1/subscriptions",
        json!({ "name": name, "filter": "default/#", "ordering": ordering }),
    )
    .await;
    answer["id"].as_i64().expect("id")
}

async fn join(app: &TestApp, sub: i64) -> String {
    let answer = consume(
        app,
        &format!("/api/v1/subscriptions/{sub}/sessions"),
        json!({ "ttl_ms": 60_000 }),
    )
    .await;
    answer["session"].as_str().expect("session").to_owned()
}

async fn fetch(app: &TestApp, session: &str) -> Vec<Value> {
    let answer = consume(
        app,
        &format!("/api/v1/sessions/{session}/fetch"),
        json!({ "max": 10, "wait_ms": 0 }),
    )
    .await;
    answer["messages"].as_array().expect("messages").clone()
}

#[tokio::test]
async fn the_admin_api_registers_lists_and_removes_a_partners_callback_endpoints() {
    let app = gateway().await;
    let url = "http://127.0.0.1:9/alpha-cb";
    let call = |method: reqwest::Method, body: Value| {
        app.client
            .request(method, app.url("/api/v1/callback-endpoints"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    let post = call(
        reqwest::Method::POST,
        json!({ "url": url, "partner": "alpha" }),
    );
    assert_eq!(status(post.await.expect("answer")), 201);
    let unknown = call(
        reqwest::Method::POST,
        json!({ "url": url, "partner": "nobody" }),
    );
    assert_eq!(status(unknown.await.expect("answer")), 400, "not a partner");
    assert!(
        app.store
            .is_callback_endpoint("alpha", url)
            .await
            .expect("read")
    );
    assert!(!app.store.is_callback_endpoint("", url).await.expect("read"));
    let listed: Value = app
        .client
        .get(app.url("/api/v1/callback-endpoints"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(listed["endpoints"], json!([url, CONFIGURED_CALLBACK]));
    assert_eq!(
        listed["registrations"],
        json!([
            { "partner": "alpha", "url": url },
            { "partner": "alpha", "url": CONFIGURED_CALLBACK },
        ])
    );
    // Without a partner, the anonymous callers' registration is meant: there is none.
    let anonymous = call(reqwest::Method::DELETE, json!({ "url": url }));
    assert_eq!(status(anonymous.await.expect("answer")), 404);
    let alpha = call(
        reqwest::Method::DELETE,
        json!({ "url": url, "partner": "alpha" }),
    );
    assert_eq!(status(alpha.await.expect("answer")), 204);
    assert!(
        !app.store
            .is_callback_endpoint("alpha", url)
            .await
            .expect("read")
    );
    app.stop().await;
}
