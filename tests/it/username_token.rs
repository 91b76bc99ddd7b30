//! WS-Security UsernameToken partners (issue 32, D14): a partner proves itself in the
//! envelope — PasswordDigest over the nonce and `Created`, or PasswordText where the
//! password cannot be read on the way (TLS, loopback) — and is then held to its channels like
//! any partner; a stale token and a replayed nonce (also after a restart) are refused; a
//! Security block with what we do not process still gets MustUnderstand; and our own token
//! goes to a partner that requires one. Both backends (`it`, `it-postgres`).

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use wsr_gateway::Config;
use wsr_gateway::partners::PartnerConfig;
use wsr_gateway::rmp::agreement::Agreement;
use wsr_gateway::wsr::write::with_security;
use wsr_gateway::wsr::{ReplyPattern, SoapVersion, UsernameToken};
use wsr_gateway::wss::our_token;

use super::hostile::fault_of;
use super::partners_auth::singleton;
use super::support::{Answer, ClockExt, TestApp, spawn_app_with, start};

pub(crate) const PASSWORD: &str = "acme-wss-password-0123";

/// `orders` is acme's (a UsernameToken partner), `billing` globex's; neither is anonymous.
pub(crate) fn token_partners(c: &mut Config) {
    c.channels.clear();
    c.anonymous_channels.clear();
    c.channels.insert("orders".into(), Agreement::everything());
    c.channels.insert("billing".into(), Agreement::everything());
    let names: BTreeSet<String> = c.channels.keys().cloned().collect();
    let acme = PartnerConfig {
        channels: vec!["orders".into()],
        wss_username: Some("acme-user".into()),
        wss_password: Some(PASSWORD.into()),
        ..PartnerConfig::default()
    };
    // globex proves itself by a UsernameToken too, checked as PasswordText against a hash.
    let globex = PartnerConfig {
        channels: vec!["billing".into()],
        wss_username: Some("globex-user".into()),
        wss_password_hash: Some(
            wsr_gateway::secrets::hash_secret("globex-password-0123").expect("hash"),
        ),
        ..PartnerConfig::default()
    };
    c.partners
        .insert(acme.check("acme", None, &names).expect("acme"));
    c.partners
        .insert(globex.check("globex", None, &names).expect("globex"));
}

pub(crate) fn token(password: &str, digest: bool, at: DateTime<Utc>) -> UsernameToken {
    our_token("acme-user", password, digest, at)
}

/// A Response-pattern singleton of `group` carrying `token`.
pub(crate) fn secured(group: &str, token: &UsernameToken) -> String {
    let xml = singleton(group, ReplyPattern::Response);
    with_security(&xml, SoapVersion::Soap11, token).expect("a Header")
}

pub(crate) async fn post(app: &TestApp, channel: &str, xml: String) -> Answer {
    app.post(
        &format!("/wsr/{channel}"),
        SoapVersion::Soap11.content_type(),
        xml,
    )
    .await
}

#[tokio::test]
async fn a_digest_or_text_token_proves_its_partner_and_wrong_ones_are_refused() {
    let app = spawn_app_with(token_partners).await;
    let now = app.clock.now_utc();
    // Digest, and text (we are on loopback): acked, as acme's.
    for (i, digest) in [(1, true), (2, false)] {
        let group = format!("mid:token-{i}@wss");
        let answer = post(
            &app,
            "orders",
            secured(&group, &token(PASSWORD, digest, now)),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(fault_of(&answer), None, "{}", answer.body);
    }
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 2);
    assert!(inbox.iter().all(|m| m.partner == "acme"), "{inbox:?}");

    // Another partner's channel: 403; nothing stored.
    let other = post(
        &app,
        "billing",
        secured("mid:token-3@wss", &token(PASSWORD, true, now)),
    )
    .await;
    assert_eq!(other.status, 403, "{}", other.body);
    // globex's password is kept as a hash: its text goes, its digest cannot be checked.
    let globex = |digest| our_token("globex-user", "globex-password-0123", digest, now);
    let text = post(&app, "billing", secured("mid:globex-1@wss", &globex(false))).await;
    assert_eq!(fault_of(&text), None, "{}", text.body);
    let digest = post(&app, "billing", secured("mid:globex-2@wss", &globex(true))).await;
    assert_eq!(digest.status, 401, "{}", digest.body);
    // A wrong password, a stale or future Created, no token at all: 401.
    let refused = [
        (
            "wrong password",
            secured("mid:token-4@wss", &token("wrong", true, now)),
        ),
        (
            "stale",
            secured(
                "mid:token-5@wss",
                &token(PASSWORD, true, now - Duration::minutes(6)),
            ),
        ),
        (
            "future",
            secured(
                "mid:token-6@wss",
                &token(PASSWORD, true, now + Duration::minutes(6)),
            ),
        ),
        ("none", singleton("mid:token-7@wss", ReplyPattern::Response)),
    ];
    for (what, xml) in refused {
        let answer = post(&app, "orders", xml).await;
        assert_eq!(answer.status, 401, "{what}: {}", answer.body);
    }
    assert_eq!(app.inbox().await.len(), 3, "nothing refused was stored");
    app.stop().await;
}

#[tokio::test]
async fn a_replayed_nonce_is_refused_also_after_a_restart() {
    let app = spawn_app_with(token_partners).await;
    let now = app.clock.now_utc();
    let once = token(PASSWORD, true, now);
    let first = post(&app, "orders", secured("mid:replay-1@wss", &once)).await;
    assert_eq!(fault_of(&first), None, "{}", first.body);
    // The same token on another message: a replay.
    let again = post(&app, "orders", secured("mid:replay-2@wss", &once)).await;
    assert_eq!(again.status, 401, "{}", again.body);
    assert!(again.body.contains("used already"), "{}", again.body);
    let (config, clock, kept) = app.stop().await;
    let app = start(config, clock).await;
    let after = post(&app, "orders", secured("mid:replay-3@wss", &once)).await;
    assert_eq!(after.status, 401, "after a restart: {}", after.body);
    // A fresh token still goes.
    let fresh = post(
        &app,
        "orders",
        secured("mid:replay-4@wss", &token(PASSWORD, true, now)),
    )
    .await;
    assert_eq!(fault_of(&fresh), None, "{}", fresh.body);
    app.stop().await;
    drop(kept);
}

#[tokio::test]
async fn a_security_block_with_a_signature_still_gets_must_understand() {
    let app = spawn_app_with(token_partners).await;
    let xml = singleton("mid:signed@wss", ReplyPattern::Response).replacen(
        "<soap:Header>",
        "<soap:Header><wsse:Security soap:mustUnderstand=\"1\" xmlns:wsse=\"http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd\"><ds:Signature xmlns:ds=\"http://www.w3.org/2000/09/xmldsig#\"/></wsse:Security>",
        1,
    );
    // On a token partner's channel the request reads on, and an envelope whose Security we
    // do not understand proves nobody.
    let answer = post(&app, "orders", xml).await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    // On an anonymous channel the SOAP fault itself is the answer.
    let open = spawn_app_with(|_| {}).await;
    let xml = singleton("mid:signed-2@wss", ReplyPattern::Response).replacen(
        "<soap:Header>",
        "<soap:Header><wsse:Security soap:mustUnderstand=\"1\" xmlns:wsse=\"http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd\"><ds:Signature xmlns:ds=\"http://www.w3.org/2000/09/xmldsig#\"/></wsse:Security>",
        1,
    );
    let answer = open.send(SoapVersion::Soap11, xml).await;
    assert_eq!(answer.status, 500, "{}", answer.body);
    assert!(answer.body.contains("MustUnderstand"), "{}", answer.body);
    assert!(open.inbox().await.is_empty());
    app.stop().await;
    open.stop().await;
}

#[tokio::test]
async fn our_token_goes_to_a_partner_that_requires_one() {
    // B takes acme's messages only with acme's UsernameToken; A sends to B as acme.
    let b = spawn_app_with(token_partners).await;
    let b_orders = b.url("/wsr/orders");
    let token_secret = wsr_gateway::secrets::Secret::new("a-producer-token-0123");
    let a = spawn_app_with(move |c| {
        c.tokens = vec![wsr_gateway::config::ApiToken {
            secret: wsr_gateway::secrets::Stored::Plain(token_secret),
            principal: "app".into(),
            scopes: vec![wsr_gateway::config::Scope::Produce],
            topics: wsr_gateway::config::all_topics(),
        }];
        let names: BTreeSet<String> = c.channels.keys().cloned().collect();
        let b = PartnerConfig {
            address: Some(b_orders),
            our_wss_username: Some("acme-user".into()),
            our_wss_password: Some(PASSWORD.into()),
            ..PartnerConfig::default()
        };
        c.partners.insert(b.check("b", None, &names).expect("b"));
        super::support::allow_loopback_urls(c);
    })
    .await;
    let (status, answer) = super::support::submit_as(
        &a,
        "a-producer-token-0123",
        serde_json::json!({
            "destination": "b",
            "agreement": { "reply_pattern": "Response" },
            "body": "<p:Order xmlns:p=\"urn:p\">signed in</p:Order>"
        }),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id").to_owned();
    let state = super::support::eventually("the message acked by B", || {
        let (a, id) = (&a, id.clone());
        async move {
            let shown: serde_json::Value = a
                .client
                .get(a.url(&format!("/api/v1/messages/{id}")))
                .bearer_auth("a-producer-token-0123")
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let state = shown["state"].as_str()?.to_owned();
            (state != "queued" && state != "sent").then_some(state)
        }
    })
    .await;
    assert_eq!(state, "acked");
    let inbox = b.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].partner, "acme", "B took it as acme's");
    assert!(
        !inbox[0].payload.contains(PASSWORD),
        "no credentials in the payload"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_text_password_from_beyond_loopback_without_tls_is_refused() {
    // A proxy on this host passes the client's address: the client is not on loopback, and
    // the listener is plain HTTP, so a PasswordText could have been read on its way.
    let app = spawn_app_with(|c| {
        token_partners(c);
        c.trusted_proxy = Some(wsr_gateway::config::TrustedProxy {
            networks: vec![("127.0.0.0".parse().expect("ip"), 8)],
            client_cert_header: None,
            peer_address_header: Some("x-forwarded-for".parse().expect("name")),
            host_header: None,
        });
    })
    .await;
    let now = app.clock.now_utc();
    let from_afar = |xml: String| {
        app.client
            .post(app.url("/wsr/orders"))
            .header("Content-Type", SoapVersion::Soap11.content_type())
            .header("X-Forwarded-For", "203.0.113.9")
            .body(xml)
            .send()
    };
    let text = from_afar(secured("mid:afar-1@wss", &token(PASSWORD, false, now)))
        .await
        .expect("answers");
    assert_eq!(text.status(), 401);
    let why = text.text().await.expect("body");
    assert!(why.contains("only over TLS"), "{why}");
    let digest = from_afar(secured("mid:afar-2@wss", &token(PASSWORD, true, now)))
        .await
        .expect("answers");
    let answer = Answer::read(digest).await;
    assert_eq!(fault_of(&answer), None, "a digest goes: {}", answer.body);
    app.stop().await;
}

#[tokio::test]
async fn a_callback_may_prove_its_partner_by_token_too() {
    let app = spawn_app_with(token_partners).await;
    let now = app.clock.now_utc();
    // An ack for a message of ours nobody knows: it settles nothing, but is taken.
    let acks = super::support::response_envelope(vec![wsr_gateway::wsr::Reply::NonSequence {
        group_id: wsr_gateway::wsr::GroupId::parse("mid:unknown@wss").expect("group id"),
        fault: None,
    }]);
    let with = |t: &UsernameToken| with_security(&acks, SoapVersion::Soap11, t).expect("Header");
    let wrong = post(&app, "_callback", with(&token("wrong", true, now))).await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    let right = post(&app, "_callback", with(&token(PASSWORD, true, now))).await;
    assert!(right.status < 300, "{}: {}", right.status, right.body);
    app.stop().await;
}
