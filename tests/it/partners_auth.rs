//! The partners' guard (D14) over plain HTTP: who may post where, refused before the body is
//! read; per-partner agreements; an unoffered reply pattern refused synchronously.

use std::collections::BTreeSet;

use chrono::{Duration, Utc};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use wsr_gateway::partners::{PartnerConfig, base64_encode};
use wsr_gateway::rmp::agreement::{Agreement, Feature};
use wsr_gateway::secrets::{hash_secret, sha256_hex};
use wsr_gateway::wsr::{GroupId, MessageId, ReplyPattern, ReplyTo, Request};

use super::support::{TestApp, request_envelope, spawn_app_with};

const ACME_PASSWORD: &str = "acme-password-0123";
const GLOBEX_TOKEN: &str = "globex-token-0123456789abcdef";

pub fn singleton(group: &str, pattern: ReplyPattern) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group id"),
            sequence: None,
        },
        expiry_time: Utc::now() + Duration::hours(1),
        reply_pattern: pattern,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    request_envelope(&request, "<p:Order xmlns:p=\"urn:p\">1</p:Order>")
}

/// Channels `orders` (acme, globex), `billing` (acme only, Response only) and `open`
/// (anonymous); acme proves itself with Basic, globex with a bearer token.
async fn gateway() -> TestApp {
    let hash = hash_secret(ACME_PASSWORD).expect("hash");
    spawn_app_with(move |c| {
        c.channels.clear();
        c.anonymous_channels.clear();
        let response_only = Agreement {
            offers: vec![
                Feature::AckRequested,
                Feature::DuplicateElimination,
                Feature::Response,
            ],
            ..Agreement::everything()
        };
        c.channels.insert("orders".into(), Agreement::everything());
        c.channels.insert("billing".into(), response_only);
        c.channels.insert("open".into(), Agreement::everything());
        c.anonymous_channels.insert("open".into());
        let names: BTreeSet<String> = c.channels.keys().cloned().collect();
        let acme = PartnerConfig {
            channels: vec!["orders".into(), "billing".into()],
            password_hash: Some(hash),
            // acme's own agreement: no Poll, whatever the channel offers.
            offers: Some(
                [
                    "AckRequested",
                    "DuplicateElimination",
                    "Response",
                    "Callback",
                ]
                .map(String::from)
                .to_vec(),
            ),
            ..PartnerConfig::default()
        };
        let globex = PartnerConfig {
            channels: vec!["orders".into()],
            token_sha256: Some(sha256_hex(GLOBEX_TOKEN.as_bytes())),
            ..PartnerConfig::default()
        };
        c.partners
            .insert(acme.check("acme", None, &names).expect("acme"));
        c.partners
            .insert(globex.check("globex", None, &names).expect("globex"));
    })
    .await
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64_encode(format!("{user}:{password}").as_bytes())
    )
}

async fn post_as(
    app: &TestApp,
    channel: &str,
    authorization: Option<&str>,
    xml: String,
) -> (u16, Option<String>, String) {
    let mut request = app
        .client
        .post(app.url(&format!("/wsr/{channel}")))
        .header("Content-Type", "text/xml; charset=utf-8")
        .body(xml);
    if let Some(value) = authorization {
        request = request.header("Authorization", value);
    }
    let answer = request.send().await.expect("request reaches the gateway");
    let status = answer.status().as_u16();
    let challenge = answer
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, challenge, answer.text().await.unwrap_or_default())
}

#[tokio::test]
async fn partners_post_only_where_allowed_and_others_are_refused() {
    let app = gateway().await;
    let acme = basic("acme", ACME_PASSWORD);
    let globex = format!("Bearer {GLOBEX_TOKEN}");
    let msg = |n: u32| singleton(&format!("mid:auth-{n}@test"), ReplyPattern::Response);

    let (status, _, body) = post_as(&app, "orders", Some(&acme), msg(1)).await;
    assert_eq!(status, 200, "acme on its channel: {body}");
    assert!(
        body.contains("SequenceReply") || body.contains("Reply"),
        "{body}"
    );
    let (status, _, body) = post_as(&app, "orders", Some(&globex), msg(2)).await;
    assert_eq!(status, 200, "globex by bearer token: {body}");
    let (status, _, _) = post_as(&app, "billing", Some(&globex), msg(3)).await;
    assert_eq!(status, 403, "globex may not use billing");

    for (auth, what) in [
        (None, "no credentials"),
        (Some(basic("acme", "wrong-password")), "wrong password"),
        (Some(basic("nobody", ACME_PASSWORD)), "unknown user"),
        (Some("Bearer not-a-token".to_owned()), "unknown token"),
        (Some("Bearer".to_owned()), "bearer without a token"),
        (Some("Basic !!!".to_owned()), "unreadable Basic"),
    ] {
        let (status, challenge, _) = post_as(&app, "orders", auth.as_deref(), msg(4)).await;
        assert_eq!(status, 401, "{what}");
        let challenge = challenge.unwrap_or_default();
        assert!(
            challenge.contains("Basic") && challenge.contains("Bearer"),
            "{what}: {challenge}"
        );
    }
    let (status, _, _) = post_as(&app, "open", None, msg(5)).await;
    assert_eq!(status, 200, "an anonymous channel takes anyone");
    let (status, _, _) = post_as(&app, "open", Some(&acme), msg(6)).await;
    assert_eq!(status, 200, "and partners too");
    let (status, _, _) = post_as(&app, "nowhere", Some(&acme), msg(7)).await;
    assert_eq!(status, 404);

    let delivered = app.inbox_groups().await;
    assert_eq!(
        delivered,
        [
            "mid:auth-1@test",
            "mid:auth-2@test",
            "mid:auth-5@test",
            "mid:auth-6@test"
        ],
        "nothing refused was stored"
    );
    app.stop().await;
}

/// A refused request is answered from its head alone: the body a hostile client announces is
/// never waited for (nor read).
#[tokio::test]
async fn refusals_come_before_the_body_is_read() {
    let app = gateway().await;
    for (auth, expected) in [
        (String::new(), "401"),
        (
            format!("Authorization: {}\r\n", basic("acme", "wrong")),
            "401",
        ),
        (format!("Authorization: Bearer {GLOBEX_TOKEN}\r\n"), "403"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(app.addr)
            .await
            .expect("connect");
        let channel = if expected == "403" {
            "billing"
        } else {
            "orders"
        };
        let head = format!(
            "POST /wsr/{channel} HTTP/1.1\r\nHost: gw\r\nContent-Type: text/xml\r\n{auth}\
             Content-Length: 10000000\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.expect("send head");
        let mut answer = vec![0u8; 1024];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read(&mut answer))
            .await
            .expect("answered without the body")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {expected}")),
            "{expected}: {answer}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_reply_pattern_nobody_offers_is_a_synchronous_fault() {
    let app = gateway().await;
    let acme = basic("acme", ACME_PASSWORD);
    let callback = ReplyPattern::Callback(ReplyTo::bare("http://127.0.0.1:9/cb"));
    let globex = format!("Bearer {GLOBEX_TOKEN}");
    let cases = [
        // The channel offers only Response: a Callback message's fault cannot go by callback.
        ("billing", &acme, "mid:cb-1@test", callback, 500),
        // The channel offers Poll, but acme's own agreement does not.
        ("orders", &acme, "mid:poll-1@test", ReplyPattern::Poll, 500),
        // globex has no agreement of its own: the channel's Poll is fine.
        (
            "orders",
            &globex,
            "mid:poll-2@test",
            ReplyPattern::Poll,
            202,
        ),
    ];
    for (channel, auth, group, pattern, expected) in cases {
        let (status, _, body) = post_as(&app, channel, Some(auth), singleton(group, pattern)).await;
        assert_eq!(status, expected, "{group}: {body}");
        assert_eq!(
            body.contains("FeatureNotSupported"),
            expected == 500,
            "{body}"
        );
    }
    let delivered = app.inbox_groups().await;
    assert_eq!(delivered, ["mid:poll-2@test"]);
    app.stop().await;
}
