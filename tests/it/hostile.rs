//! Hostile input against the running gateway (issue 12): dates and durations at the edge of
//! the representable range, a writer job that panics, ids that must not be guessable. (A full
//! disk, a second gateway on one SQLite file, a file that is not ours: `sqlite_file.rs`.)

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::{Value, json};
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, ReceiverStore as _, TestHooks as _};
use wsr_gateway::wsr::datetime::XsDuration;
use wsr_gateway::wsr::{
    FaultCode, GroupId, GroupLimit, MessageId, ReplyPattern, Request, SequenceNum, SoapVersion,
};

use super::support::{Answer, ClockExt, TestApp, spawn_app, spawn_app_with};

const V: SoapVersion = SoapVersion::Soap11;

/// A Response-pattern message on `default`: singleton unless `number` is given.
pub(crate) fn message(
    group: &str,
    number: Option<u64>,
    expiry: DateTime<Utc>,
    limit: Option<GroupLimit>,
) -> String {
    message_last(group, number, false, expiry, limit)
}

fn message_last(
    group: &str,
    number: Option<u64>,
    last: bool,
    expiry: DateTime<Utc>,
    limit: Option<GroupLimit>,
) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group id"),
            sequence: number.map(|number| SequenceNum {
                number,
                last,
                group_limit: limit,
            }),
        },
        expiry_time: expiry,
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    super::support::request_envelope(&request, "<p:Order xmlns:p=\"urn:p\">hostile</p:Order>")
}

pub(crate) fn fault_of(answer: &Answer) -> Option<FaultCode> {
    let env = answer.envelope();
    let replies = env.response?.replies;
    replies.into_iter().find_map(|r| match r {
        wsr_gateway::wsr::Reply::NonSequence { fault, .. } => fault,
        wsr_gateway::wsr::Reply::Sequence { ranges, .. } => ranges.iter().find_map(|r| r.fault),
    })
}

pub(crate) async fn acked(app: &TestApp, group: &str) {
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let answer = app.send(V, message(group, None, expiry, None)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(fault_of(&answer), None, "{}", answer.body);
}

pub(crate) async fn readyz(app: &TestApp) -> (u16, String) {
    let r = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("readyz answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Item 1: the year 262142 made the writer panic on the retention arithmetic, and every later
/// message failed. Now it is refused by the channel's horizon and the gateway carries on.
#[tokio::test]
async fn an_expiry_at_the_end_of_time_is_refused_and_the_store_carries_on() {
    let app = spawn_app().await;
    let far = DateTime::parse_from_rfc3339("+262142-12-31T23:30:00Z")
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or(DateTime::<Utc>::MAX_UTC - Duration::minutes(30));
    for (i, expiry) in [
        far,
        Utc.with_ymd_and_hms(9999, 12, 31, 0, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(200_000, 1, 1, 0, 0, 0).unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        let single = app
            .send(V, message(&format!("mid:far-{i}@test"), None, expiry, None))
            .await;
        assert_eq!(
            fault_of(&single),
            Some(FaultCode::InvalidExpiryTime),
            "{}",
            single.body
        );
        let ordered = app
            .send(
                V,
                message(&format!("mid:far-seq-{i}@test"), Some(0), expiry, None),
            )
            .await;
        assert_eq!(fault_of(&ordered), Some(FaultCode::InvalidExpiryTime));
    }
    // The sweeper's arithmetic on what was stored must not panic either.
    app.clock.advance(Duration::days(400));
    app.sweep().await;
    acked(&app, "mid:after-far@test").await;
    assert_eq!(readyz(&app).await.0, 200);
    assert!(
        app.inbox()
            .await
            .iter()
            .all(|m| m.group_id.as_str() == "mid:after-far@test")
    );
    app.stop().await;
}

/// Item 8: a group's own limits reach at most the channel's group lifetime ahead; an idle
/// limit too large to compute is refused, not read as "no limit".
#[tokio::test]
async fn group_limits_beyond_the_lifetime_are_refused() {
    let app = spawn_app().await;
    let now = app.clock.now_utc();
    let expiry = now + Duration::hours(1);
    let idle = |s: &str| {
        Some(GroupLimit::MaxIdleDuration(
            XsDuration::parse(s).expect("xs"),
        ))
    };
    for (group, limit) in [
        ("mid:idle-300000y@test", idle("P300000Y")),
        ("mid:idle-31d@test", idle("P31D")),
        (
            "mid:expiry-far@test",
            Some(GroupLimit::ExpiryTime(now + Duration::days(365))),
        ),
    ] {
        let answer = app.send(V, message(group, Some(0), expiry, limit)).await;
        assert_eq!(
            fault_of(&answer),
            Some(FaultCode::InvalidMessageParameters),
            "{group}: {}",
            answer.body
        );
    }
    let fine = app
        .send(V, message("mid:idle-1d@test", Some(0), expiry, idle("P1D")))
        .await;
    assert_eq!(fault_of(&fine), None, "{}", fine.body);
    assert_eq!(app.inbox().await.len(), 1);
    app.stop().await;
}

/// The horizon is the operator's: a channel may allow less (or more) than the default.
#[tokio::test]
async fn the_expiry_horizon_is_configurable() {
    let app = spawn_app_with(|c| {
        for agreement in c.channels.values_mut() {
            agreement.expiry_horizon = Duration::minutes(10);
        }
    })
    .await;
    let now = app.clock.now_utc();
    let too_far = app
        .send(
            V,
            message("mid:h1@test", None, now + Duration::minutes(11), None),
        )
        .await;
    assert_eq!(fault_of(&too_far), Some(FaultCode::InvalidExpiryTime));
    let near = app
        .send(
            V,
            message("mid:h2@test", None, now + Duration::minutes(9), None),
        )
        .await;
    assert_eq!(fault_of(&near), None, "{}", near.body);
    app.stop().await;
}

/// A panic inside a writer job (a bug) fails that job alone; the writer lives on.
#[tokio::test]
async fn a_panicking_writer_job_fails_alone_and_the_writer_carries_on() {
    let app = spawn_app().await;
    app.store.panic_on_group(Some("mid:doomed@test"));
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let doomed = app
        .send(V, message("mid:doomed@test", None, expiry, None))
        .await;
    assert_eq!(
        fault_of(&doomed),
        Some(FaultCode::MessageProcessingFailure),
        "{}",
        doomed.body
    );
    acked(&app, "mid:next@test").await;
    // The doomed message was not half-stored: once the bug is gone, its resend is delivered.
    app.store.panic_on_group(None);
    acked(&app, "mid:doomed@test").await;
    assert_eq!(app.inbox().await.len(), 2);
    assert_eq!(readyz(&app).await.0, 200);
    app.stop().await;
}

const TOKEN: &str = "producer-token-0123456789";

async fn producer() -> TestApp {
    spawn_app_with(|c| {
        c.tokens = vec![super::support::producer_token(TOKEN)];
        c.partners
            .insert_address("peer", "http://127.0.0.1:9/wsr/default");
    })
    .await
}

async fn submit(app: &TestApp, body: Value) -> (u16, Value) {
    super::support::submit_as(app, TOKEN, body).await
}

/// Item 2: retry schedules are bounded at submit, with a 400 naming the field.
#[tokio::test]
async fn retry_schedules_beyond_their_bounds_are_refused_naming_the_field() {
    let app = producer().await;
    for (agreement, field) in [
        (
            json!({ "waits_ms": [9_000_000_000_000_000_000u64] }),
            "waits_ms",
        ),
        // JSON's float spelling is not a number of milliseconds at all.
        (json!({ "waits_ms": [9e18] }), "agreement"),
        (json!({ "waits_ms": [1000, 86_400_001] }), "waits_ms"),
        (
            json!({ "interval_ms": 9_000_000_000_000_000_000u64 }),
            "interval_ms",
        ),
        (json!({ "backoff": 4_000_000_000u64 }), "backoff"),
    ] {
        let body = json!({ "destination": "peer", "body": "<a/>", "agreement": agreement });
        let (status, answer) = submit(&app, body).await;
        assert_eq!(status, 400, "{agreement}: {answer}");
        assert!(
            answer["reason"].as_str().is_some_and(|r| r.contains(field)),
            "{agreement}: {answer}"
        );
    }
    let ok =
        json!({ "destination": "peer", "body": "<a/>", "agreement": { "waits_ms": [86_400_000] } });
    assert_eq!(submit(&app, ok).await.0, 202);
    app.stop().await;
}

/// Item 12: our ids are UUIDs with random bits, so neither a neighbour nor another gateway's
/// id can be derived from one.
#[tokio::test]
async fn message_and_group_ids_are_random_uuids() {
    let app = producer().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, answer) = submit(&app, json!({ "destination": "peer", "body": "<a/>" })).await;
        assert_eq!(status, 202, "{answer}");
        let id = answer["id"].as_str().expect("id").to_owned();
        let uuid = uuid::Uuid::parse_str(&id).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 7);
        let group = answer["group_id"].as_str().expect("group id");
        assert!(group.contains(&id), "{group}");
        ids.push(uuid);
    }
    // The random parts of ids minted in the same moment differ widely, not by a counter.
    let tails: Vec<u64> = ids
        .iter()
        .map(|u| u64::from_be_bytes(u.as_bytes()[8..16].try_into().expect("8 bytes")))
        .collect();
    for pair in tails.windows(2) {
        assert!(pair[0].abs_diff(pair[1]) > 1 << 20, "{ids:?}");
    }
    app.stop().await;
}

/// Item 8: a groupId is at most 1 024 bytes (a 16 KB one cost 78 KiB of disk per group).
#[tokio::test]
async fn an_overlong_group_id_is_refused_with_invalid_message_id() {
    let app = spawn_app().await;
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let long = format!("mid:{}@test", "g".repeat(8 * 1024));
    let xml =
        message("mid:placeholder@test", None, expiry, None).replace("mid:placeholder@test", &long);
    let answer = app.send(V, xml).await;
    assert_eq!(answer.status, 500, "{}", answer.body);
    assert!(answer.body.contains("InvalidMessageId"), "{}", answer.body);
    assert!(app.inbox().await.is_empty());
    let fits = format!("mid:{}@t", "g".repeat(1024 - 6));
    assert_eq!(fits.len(), 1024);
    acked(&app, &fits).await;
    app.stop().await;
}

/// Item 8: one source may keep only so many groups open (each is kept until it ends); beyond
/// the quota a new group is refused transiently, and room comes back as groups end.
#[tokio::test]
async fn new_groups_beyond_the_per_source_quota_are_refused_until_one_ends() {
    let app = spawn_app_with(|c| c.policy.max_open_groups_per_source = 2).await;
    let expiry = app.clock.now_utc() + Duration::hours(1);
    let send = |group: &str, n: u64, last: bool| {
        app.send(V, message_last(group, Some(n), last, expiry, None))
    };
    assert_eq!(fault_of(&send("mid:q-a@test", 0, false).await), None);
    assert_eq!(fault_of(&send("mid:q-b@test", 0, false).await), None);
    let third = send("mid:q-c@test", 0, false).await;
    assert_eq!(
        fault_of(&third),
        Some(FaultCode::MessageProcessingFailure),
        "{}",
        third.body
    );
    // Open groups still take their messages, and singletons are not groups that stay open.
    assert_eq!(fault_of(&send("mid:q-b@test", 1, false).await), None);
    acked(&app, "mid:q-single@test").await;
    // Group a ends: the resend of c's first message is taken.
    assert_eq!(fault_of(&send("mid:q-a@test", 1, true).await), None);
    assert_eq!(fault_of(&send("mid:q-c@test", 0, false).await), None);
    let groups: Vec<String> = app
        .inbox()
        .await
        .iter()
        .map(|m| m.group_id.to_string())
        .collect();
    assert_eq!(
        groups
            .iter()
            .filter(|g| g.as_str() == "mid:q-c@test")
            .count(),
        1
    );
    app.stop().await;
}

/// Issue 32 item 6: a partner's address may carry credentials (userinfo, an API key in the
/// query); what the API shows every reader of the message has neither.
#[tokio::test]
async fn a_partners_address_is_shown_without_its_userinfo_and_query() {
    let app = spawn_app_with(|c| {
        c.tokens = vec![super::support::producer_token(TOKEN)];
        c.partners.insert_address(
            "keyed",
            "http://user:s3cret@127.0.0.1:9/wsr/default?apikey=k3y",
        );
    })
    .await;
    let (status, answer) = submit(&app, json!({ "destination": "keyed", "body": "<a/>" })).await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id");
    let shown: Value = app
        .client
        .get(app.url(&format!("/api/v1/messages/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("json");
    let text = shown.to_string();
    assert_eq!(
        shown["destination"], "http://127.0.0.1:9/wsr/default",
        "{text}"
    );
    assert!(!text.contains("s3cret") && !text.contains("k3y"), "{text}");
    app.stop().await;
}
