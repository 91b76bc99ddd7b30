//! The storage quota per source (D13) as every backend keeps it: a source's stored bytes grow
//! as its messages are delivered or buffered, stay as buffered ones are released into the
//! inbox, and shrink as the sweeper discards them or the inbox is purged; its messages per
//! second are counted on the decision's clock.

use chrono::{Duration, Utc};
use wsr_gateway::rmp::quota::{HeldBack, SourceQuota};
use wsr_gateway::rmp::receiver::Verdict;
use wsr_gateway::store::{Payload, Received, ReceivedMessage, Store};
use wsr_gateway::wsr::{FaultCode, ReplyPattern};

use super::backends;
use super::receiver::message;

/// A payload of exactly `bytes` bytes.
fn sized(bytes: usize) -> Payload {
    Payload::from(format!("<a>{}</a>", "x".repeat(bytes - 7)))
}

fn from(
    source: &str,
    group: &str,
    number: Option<u64>,
    bytes: usize,
    quota: SourceQuota,
) -> ReceivedMessage {
    ReceivedMessage {
        source: source.into(),
        quota,
        ..message(group, number, ReplyPattern::Response, sized(bytes))
    }
}

fn bytes_quota(max_stored_bytes: u64) -> SourceQuota {
    SourceQuota {
        max_stored_bytes,
        max_messages_per_second: 0,
    }
}

async fn receive(store: &Store, m: ReceivedMessage) -> Received {
    store.receive(m).await.expect("decided")
}

fn held_back(r: &Received) -> bool {
    matches!(
        &r.verdict,
        Verdict::Fault(FaultCode::MessageProcessingFailure, _)
    ) && r.held_back == Some(HeldBack::StoredBytes)
}

#[tokio::test]
async fn a_sources_stored_bytes_hold_it_back_until_its_messages_are_purged() {
    for b in backends().await {
        let q = bytes_quota(1000);
        let first = from("192.0.2.1", "mid:q1@contract", None, 600, q);
        assert_eq!(
            receive(&b.store, first.clone()).await.verdict,
            Verdict::Ack,
            "{}",
            b.name
        );
        let second = from("192.0.2.1", "mid:q2@contract", None, 600, q);
        let refused = receive(&b.store, second.clone()).await;
        assert!(held_back(&refused), "{}: {refused:?}", b.name);
        assert_eq!(
            receive(&b.store, from("192.0.2.2", "mid:q3@contract", None, 600, q))
                .await
                .verdict,
            Verdict::Ack,
            "{}: another source has its own quota",
            b.name
        );
        assert_eq!(
            receive(&b.store, first).await.verdict,
            Verdict::Ack,
            "{}: a duplicate stores nothing and is acked",
            b.name
        );
        let purged = b
            .store
            .maintain_deliveries(
                Utc::now() + Duration::hours(3),
                Duration::seconds(30),
                Duration::hours(1),
            )
            .await
            .expect("maintained");
        assert_eq!(purged.inbox_purged, 2, "{}", b.name);
        assert_eq!(
            receive(&b.store, second).await.verdict,
            Verdict::Ack,
            "{}: room again once purged",
            b.name
        );
    }
}

#[tokio::test]
async fn buffered_messages_count_once_released_and_are_freed_when_discarded() {
    for b in backends().await {
        let q = bytes_quota(2000);
        let g = "mid:ordered-q@contract";
        let ahead = receive(&b.store, from("192.0.2.9", g, Some(1), 600, q)).await;
        assert_eq!(
            ahead.verdict,
            Verdict::NoAck,
            "{}: buffered ahead of its gap",
            b.name
        );
        let first = receive(&b.store, from("192.0.2.9", g, Some(0), 600, q)).await;
        assert_eq!(
            first.verdict,
            Verdict::Ack,
            "{}: fills the gap, releases 1",
            b.name
        );
        // 1200 stored: 800 more fill the quota exactly; one byte more does not fit.
        let fill = from("192.0.2.9", "mid:fill@contract", None, 800, q);
        assert_eq!(
            receive(&b.store, fill).await.verdict,
            Verdict::Ack,
            "{}",
            b.name
        );
        let over = receive(&b.store, from("192.0.2.9", "mid:over@contract", None, 8, q)).await;
        assert!(held_back(&over), "{}: {over:?}", b.name);

        // A group whose buffer is discarded frees its bytes.
        let other = "mid:ordered-r@contract";
        let r = receive(&b.store, from("192.0.2.10", other, Some(3), 1500, q)).await;
        assert_eq!(r.verdict, Verdict::NoAck, "{}", b.name);
        let over = receive(
            &b.store,
            from("192.0.2.10", "mid:r1@contract", None, 600, q),
        )
        .await;
        assert!(held_back(&over), "{}: the buffered message counts", b.name);
        for days in [2, 40] {
            b.store
                .sweep(Utc::now() + Duration::days(days))
                .await
                .expect("swept");
        }
        let after = receive(
            &b.store,
            from("192.0.2.10", "mid:r2@contract", None, 600, q),
        )
        .await;
        assert_eq!(
            after.verdict,
            Verdict::Ack,
            "{}: the discarded buffer freed its bytes",
            b.name
        );
    }
}

#[tokio::test]
async fn a_sources_messages_per_second_are_counted_on_the_decisions_clock() {
    for b in backends().await {
        let q = SourceQuota {
            max_stored_bytes: 0,
            max_messages_per_second: 2,
        };
        let t = Utc::now();
        let at = |group: &str, now| ReceivedMessage {
            now,
            ..from("192.0.2.20", group, None, 100, q)
        };
        for g in ["mid:rate-1@contract", "mid:rate-2@contract"] {
            assert_eq!(
                receive(&b.store, at(g, t)).await.verdict,
                Verdict::Ack,
                "{}",
                b.name
            );
        }
        let third = receive(&b.store, at("mid:rate-3@contract", t)).await;
        assert_eq!(
            third.held_back,
            Some(HeldBack::MessagesPerSecond),
            "{}: {third:?}",
            b.name
        );
        assert!(
            matches!(
                third.verdict,
                Verdict::Fault(FaultCode::MessageProcessingFailure, _)
            ),
            "{}",
            b.name
        );
        let later = receive(
            &b.store,
            at("mid:rate-3@contract", t + Duration::milliseconds(600)),
        )
        .await;
        assert_eq!(
            later.verdict,
            Verdict::Ack,
            "{}: a message's worth refilled",
            b.name
        );
    }
}

#[tokio::test]
async fn a_message_every_subscription_settled_is_consumed_and_frees_its_bytes() {
    use wsr_gateway::delivery::fetch::Take;
    use wsr_gateway::delivery::lease::Outcome;
    use wsr_gateway::delivery::subscription::CreateRequest;

    for b in backends().await {
        let store = &b.store;
        let subscribe = |name: &str| {
            let request: CreateRequest = serde_json::from_value(
                serde_json::json!({ "name": name, "filter": "default/#", "start": "oldest" }),
            )
            .expect("create request");
            request.check().expect("valid spec")
        };
        let now = Utc::now();
        let first = store
            .create_subscription(&subscribe("eager"), "app", now)
            .await
            .expect("create")
            .0;
        let second = store
            .create_subscription(&subscribe("late"), "app", now)
            .await
            .expect("create")
            .0;
        let q = bytes_quota(1000);
        let m = from("192.0.2.30", "mid:consumed-1@contract", None, 600, q);
        assert_eq!(receive(store, m).await.verdict, Verdict::Ack, "{}", b.name);
        let next = from("192.0.2.30", "mid:consumed-2@contract", None, 600, q);

        let take = Take::pull(10, usize::MAX);
        // After the message's arrival, as a consumer fetches.
        let now = Utc::now() + Duration::seconds(1);
        let settle_all = async |subscription: i64, member: &str| {
            store
                .join(subscription, member, "app", Duration::hours(1), now)
                .await
                .expect("join");
            let got = store.fetch(member, take, now).await.expect("fetch");
            assert_eq!(got.len(), 1, "{}", b.name);
            store
                .settle(&got[0].receipt, Some(Outcome::Accepted), now)
                .await
                .expect("settle");
        };
        settle_all(first.id, "a").await;
        let refused = receive(store, next.clone()).await;
        assert!(
            held_back(&refused),
            "{}: the other subscription has not taken it yet: {refused:?}",
            b.name
        );
        settle_all(second.id, "b").await;
        assert_eq!(
            receive(store, next).await.verdict,
            Verdict::Ack,
            "{}: consumed by every subscription, its bytes are free",
            b.name
        );
        let purged = store
            .maintain_deliveries(
                now + Duration::hours(3),
                Duration::seconds(30),
                Duration::hours(1),
            )
            .await
            .expect("maintained");
        assert!(purged.inbox_purged >= 1, "{}", b.name);
        // The purge frees nothing twice: the source holds the second message's 600 bytes.
        let third = from("192.0.2.30", "mid:consumed-3@contract", None, 500, q);
        assert!(held_back(&receive(store, third).await), "{}", b.name);
    }
}
