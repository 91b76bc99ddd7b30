//! The storage quota per source over HTTP (issue 31 item 5, D13): one source that keeps
//! storing is told `MessageProcessingFailure` (transient: resend later) once its stored bytes
//! or its messages per second are used up, while every other source is still acked; a
//! partner's own quota replaces the channel's; the refusals are counted in `/metrics`.

use std::collections::BTreeSet;

use chrono::Duration;
use wsr_gateway::partners::{PartnerConfig, base64_encode};
use wsr_gateway::rmp::agreement::Agreement;
use wsr_gateway::rmp::quota::SourceQuota;
use wsr_gateway::secrets::hash_secret;
use wsr_gateway::wsr::{FaultCode, GroupId, MessageId, ReplyPattern, Request, SoapVersion};

use super::hostile::fault_of;
use super::metrics::{sample, text};
use super::support::{Answer, ClockExt, TestApp, request_envelope, spawn_app_with};

/// The channel of these tests (the metrics recorder is the binary's: its label is ours).
const CHANNEL: &str = "quota-open";
const ACME_PASSWORD: &str = "acme-quota-password-0123";

/// `quota-open` (anonymous) keeps at most 2 000 bytes and 3 messages a second per source;
/// partner acme, which may post there too, has no byte quota of its own.
async fn gateway() -> TestApp {
    let hash = hash_secret(ACME_PASSWORD).expect("hash");
    spawn_app_with(move |c| {
        let quota = SourceQuota {
            max_stored_bytes: 2000,
            max_messages_per_second: 3,
        };
        c.channels.insert(
            CHANNEL.into(),
            Agreement {
                quota,
                ..Agreement::everything()
            },
        );
        c.anonymous_channels.insert(CHANNEL.into());
        let names: BTreeSet<String> = c.channels.keys().cloned().collect();
        let acme = PartnerConfig {
            channels: vec![CHANNEL.into()],
            password_hash: Some(hash),
            max_stored_bytes: Some(0),
            ..PartnerConfig::default()
        };
        c.partners
            .insert(acme.check("acme", None, &names).expect("acme"));
    })
    .await
}

/// A Response-pattern singleton whose payload takes `bytes` bytes.
fn singleton(app: &TestApp, group: &str, bytes: usize) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group id"),
            sequence: None,
        },
        expiry_time: app.clock.now_utc() + Duration::hours(1),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    let head = "<p:Order xmlns:p=\"urn:p\">";
    let tail = "</p:Order>";
    let filler = "x".repeat(bytes - head.len() - tail.len());
    request_envelope(&request, &format!("{head}{filler}{tail}"))
}

async fn post(app: &TestApp, xml: String, basic: Option<&str>) -> Answer {
    let mut post = app
        .client
        .post(app.url(&format!("/wsr/{CHANNEL}")))
        .header("Content-Type", SoapVersion::Soap11.content_type())
        .body(xml);
    if let Some(credentials) = basic {
        post = post.header(
            "Authorization",
            format!("Basic {}", base64_encode(credentials.as_bytes())),
        );
    }
    Answer::read(post.send().await.expect("answers")).await
}

fn refused(answer: &Answer) -> bool {
    fault_of(answer) == Some(FaultCode::MessageProcessingFailure)
}

#[tokio::test]
async fn a_source_over_its_stored_bytes_is_held_back_while_other_sources_are_acked() {
    let app = gateway().await;
    let acme = format!("acme:{ACME_PASSWORD}");
    for (i, expected_refused) in [(1, false), (2, false), (3, true)] {
        let answer = post(
            &app,
            singleton(&app, &format!("mid:bytes-{i}@q"), 800),
            None,
        )
        .await;
        assert_eq!(
            refused(&answer),
            expected_refused,
            "message {i}: {}",
            answer.body
        );
        // A fault is a SOAP Fault (500) with the wsrm:Response naming the message.
        let status = if expected_refused { 500 } else { 200 };
        assert_eq!(answer.status, status, "{}", answer.body);
        // Room for the next second's messages: the rate is not what this test is about.
        app.clock.advance(Duration::seconds(1));
    }
    let answer = post(&app, singleton(&app, "mid:bytes-3@q", 800), None).await;
    assert!(
        answer.body.contains("2000 bytes"),
        "the reason names the quota: {}",
        answer.body
    );
    // Another source — a partner whose own quota has no byte limit — is served meanwhile.
    for i in 1..=3 {
        let answer = post(
            &app,
            singleton(&app, &format!("mid:acme-{i}@q"), 800),
            Some(&acme),
        )
        .await;
        assert_eq!(
            fault_of(&answer),
            None,
            "acme's message {i}: {}",
            answer.body
        );
        app.clock.advance(Duration::seconds(1));
    }
    assert_eq!(
        app.inbox().await.len(),
        5,
        "two of the anonymous source's, acme's three"
    );
    let metrics = text(&app).await;
    let held = sample(
        &metrics,
        "wsr_source_quota_refusals_total",
        &[
            ("channel", CHANNEL),
            ("partner", "anonymous"),
            ("quota", "stored_bytes"),
        ],
    );
    assert!(held >= 2.0, "both refusals counted: {held}");
    app.stop().await;
}

#[tokio::test]
async fn a_flood_of_singletons_is_held_to_the_sources_rate_and_resent_ones_are_taken_later() {
    let app = gateway().await;
    let mut refused_groups = Vec::new();
    for i in 0..10 {
        let group = format!("mid:flood-{i}@q");
        let answer = post(&app, singleton(&app, &group, 100), None).await;
        if refused(&answer) {
            refused_groups.push(group);
        }
    }
    // The clock stands still: a second's worth (3) is stored, the rest told to come back.
    assert_eq!(refused_groups.len(), 7, "{refused_groups:?}");
    assert_eq!(app.inbox().await.len(), 3);
    app.clock.advance(Duration::seconds(1));
    for group in refused_groups.iter().take(3) {
        let answer = post(&app, singleton(&app, group, 100), None).await;
        assert_eq!(
            fault_of(&answer),
            None,
            "{group}, resent a second later: {}",
            answer.body
        );
    }
    assert_eq!(app.inbox().await.len(), 6);
    let metrics = text(&app).await;
    let held = sample(
        &metrics,
        "wsr_source_quota_refusals_total",
        &[("channel", CHANNEL), ("quota", "messages_per_second")],
    );
    assert!(held >= 7.0, "{held}");
    app.stop().await;
}
