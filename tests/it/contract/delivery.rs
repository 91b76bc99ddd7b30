//! The delivery store trait's contract (see `contract/mod.rs`): subscriptions and their
//! owners, grants, members joining, fetching, settling and extending (stale receipts refused
//! with the current attempt), ordering = group, shared members and what a member that leaves or
//! lapses gives back, outcomes and dead letters, settle modes, backlogs and deadlines. Messages
//! come in through the receiver side (`receive`), as on the wire.

use chrono::{DateTime, Duration, TimeZone, Utc};
use wsr_gateway::delivery::fetch::Take;
use wsr_gateway::delivery::lease::{Outcome, Stale};
use wsr_gateway::delivery::subscription::{CreateRequest, Mode, Ordering, SettleMode, Spec, Start};
use wsr_gateway::store::delivery::{DeadLetterChange, DeliveryError, Handed, Subscription};
use wsr_gateway::store::{Payload, ReceivedMessage, Store};
use wsr_gateway::wsr::{GroupId, MessageId, ReplyPattern, Request, SequenceNum};

use super::backends;

const OWNER: &str = "app";

/// A fetch of at most `max` messages, with no byte bound.
fn take(max: usize) -> Take {
    Take::pull(max, usize::MAX)
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .expect("date")
}

fn secs(s: i64) -> Duration {
    Duration::seconds(s)
}

/// Receives one reliable message on channel `orders` with Body root `root` (topic
/// `orders/{root}`), of `group` (numbered when `number` is given).
async fn receive(store: &Store, root: &str, group: &str, number: Option<u64>, now: DateTime<Utc>) {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(group).expect("group"),
            sequence: number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: now + Duration::days(2),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    store
        .receive(ReceivedMessage {
            partner: String::new(),
            channel: "orders".into(),
            request,
            payload: Payload::from(format!("<p:{root} xmlns:p=\"urn:p\">{group}</p:{root}>")),
            namespaces: "[]".into(),
            topic: format!("orders/{root}"),
            source: "127.0.0.1".into(),
            quota: wsr_gateway::rmp::quota::SourceQuota::UNLIMITED,
            soap12: false,
            now,
            inbox: true,
            answer: None,
        })
        .await
        .expect("received");
}

/// `n` singletons of root `Order`, each of a group of its own.
async fn singletons(store: &Store, n: usize, now: DateTime<Utc>) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..n {
        let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        receive(
            store,
            "Order",
            &format!("mid:single-{i}@contract"),
            None,
            now,
        )
        .await;
    }
}

/// A checked subscription spec from the create request's JSON fields.
/// A subscription `OWNER` creates at `t0`.
async fn create(store: &Store, spec: &Spec) -> Subscription {
    store
        .create_subscription(spec, OWNER, t0())
        .await
        .expect("create")
        .0
}

/// `member` joins `subscription` as `OWNER` at `t0` for `ttl`.
async fn join(store: &Store, subscription: i64, member: &str, ttl: Duration) {
    store
        .join(subscription, member, OWNER, ttl, t0())
        .await
        .expect("join");
}

fn spec(fields: serde_json::Value) -> Spec {
    let request: CreateRequest = serde_json::from_value(fields).expect("create request");
    request.check().expect("valid spec")
}

fn pull(name: &str) -> Spec {
    spec(serde_json::json!({ "name": name, "filter": "orders/#", "start": "oldest" }))
}

fn offsets(handed: &[Handed]) -> Vec<i64> {
    handed.iter().map(|h| h.message.offset).collect()
}

fn stale(e: DeliveryError) -> Stale {
    match e {
        DeliveryError::Stale(stale) => stale,
        other => panic!("not a stale refusal: {other}"),
    }
}

#[tokio::test]
async fn subscriptions_belong_to_their_owner_and_asking_again_finds_the_same() {
    for b in backends().await {
        let store = &b.store;
        let (sub, created) = store
            .create_subscription(&pull("billing"), OWNER, t0())
            .await
            .expect("create");
        assert!(created, "{}", b.name);
        assert_eq!(
            (sub.name.as_str(), sub.filter.as_str(), sub.owner.as_str()),
            ("billing", "orders/#", OWNER),
            "{}",
            b.name
        );
        let (again, created) = store
            .create_subscription(&pull("billing"), OWNER, t0())
            .await
            .expect("again");
        assert!(!created && again.id == sub.id, "{}", b.name);
        let theirs = store
            .create_subscription(&pull("billing"), "intruder", t0())
            .await;
        assert!(
            matches!(theirs, Err(DeliveryError::Conflict(_))),
            "{}: another owner gets no way in",
            b.name
        );
        let other_rules = spec(
            serde_json::json!({ "name": "billing", "filter": "orders/#", "max_deliveries": 9 }),
        );
        let changed = store.create_subscription(&other_rules, OWNER, t0()).await;
        assert!(
            matches!(changed, Err(DeliveryError::Conflict(_))),
            "{}",
            b.name
        );

        let hook = spec(serde_json::json!({
            "name": "hook", "filter": "orders/#", "mode": "push",
            "push_url": "http://127.0.0.1:9/hook"
        }));
        let pushed = create(store, &hook).await;
        assert!(matches!(pushed.rules.mode, Mode::Push { .. }), "{}", b.name);
        let all = store.subscriptions().await.expect("list");
        assert_eq!(all.len(), 2, "{}", b.name);
        let push: Vec<i64> = store
            .push_subscriptions()
            .await
            .expect("push list")
            .iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(push, vec![pushed.id], "{}", b.name);
        assert_eq!(
            store.subscription(sub.id).await.expect("get"),
            Some(sub.clone()),
            "{}",
            b.name
        );
        assert!(
            store.delete_subscription(sub.id).await.expect("delete"),
            "{}",
            b.name
        );
        assert!(
            !store.delete_subscription(sub.id).await.expect("again"),
            "{}",
            b.name
        );
        assert_eq!(
            store.subscription(sub.id).await.expect("get"),
            None,
            "{}",
            b.name
        );
        let join = store.join(sub.id, "s", OWNER, secs(60), t0()).await;
        assert!(
            matches!(join, Err(DeliveryError::NotFound(_))),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn grants_admit_and_a_revoke_ends_the_grantees_sessions_releasing_what_they_held() {
    for b in backends().await {
        let store = &b.store;
        let sub = create(store, &pull("shared")).await;
        assert!(sub.admits(OWNER) && !sub.admits("friend"), "{}", b.name);
        store.grant(sub.id, "zed").await.expect("grant");
        store.grant(sub.id, "friend").await.expect("grant");
        store.grant(sub.id, "friend").await.expect("grant twice");
        let sub = store
            .subscription(sub.id)
            .await
            .expect("get")
            .expect("exists");
        assert_eq!(
            sub.grants,
            ["friend", "zed"],
            "{}: once each, in order",
            b.name
        );
        assert!(sub.admits("friend"), "{}", b.name);

        singletons(store, 1, t0()).await;
        store
            .join(sub.id, "f", "friend", secs(600), t0())
            .await
            .expect("join");
        // What a member's request checks: its live session, with the subscription as stored.
        let (session, of) = store
            .member("f", t0())
            .await
            .expect("read")
            .expect("a live member");
        assert_eq!(
            (session.principal.as_str(), session.subscription_id),
            ("friend", sub.id),
            "{}",
            b.name
        );
        assert_eq!((of.id, &of.grants), (sub.id, &sub.grants), "{}", b.name);
        assert!(
            store.member("nobody", t0()).await.expect("read").is_none(),
            "{}",
            b.name
        );
        join(store, sub.id, "o", secs(600)).await;
        let held = store.fetch("f", take(10), t0()).await.expect("fetch");
        assert_eq!(held.len(), 1, "{}", b.name);
        assert!(
            store
                .fetch("o", take(10), t0())
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );
        assert!(
            store.revoke(sub.id, "friend", t0()).await.expect("revoke"),
            "{}",
            b.name
        );
        assert!(
            !store.revoke(sub.id, "friend", t0()).await.expect("again"),
            "{}",
            b.name
        );
        assert_eq!(
            store.session("f", t0()).await.expect("read"),
            None,
            "{}",
            b.name
        );
        assert!(
            store.member("f", t0()).await.expect("read").is_none(),
            "{}: the revoked grantee's session ended",
            b.name
        );
        let back = store.fetch("o", take(10), t0()).await.expect("fetch");
        assert_eq!(
            offsets(&back),
            offsets(&held),
            "{}: released at once",
            b.name
        );
        assert_eq!(back[0].receipt.attempt, 2, "{}", b.name);
    }
}

#[tokio::test]
async fn a_stale_receipt_is_refused_naming_the_current_attempt_and_extend_confirms_the_deadline() {
    for b in backends().await {
        let store = &b.store;
        let s = spec(
            serde_json::json!({ "name": "inv", "filter": "orders/#", "ack_wait_ms": 10_000, "start": "oldest" }),
        );
        let sub = create(store, &s).await;
        singletons(store, 1, t0()).await;
        join(store, sub.id, "a", secs(3600)).await;
        join(store, sub.id, "b", secs(3600)).await;
        let a = store
            .fetch("a", take(10), t0())
            .await
            .expect("fetch")
            .remove(0);
        assert_eq!(a.receipt.attempt, 1, "{}", b.name);
        assert_eq!(a.deadline, Some(t0() + secs(10)), "{}", b.name);
        let extended = store
            .extend(&a.receipt, t0() + secs(5))
            .await
            .expect("extend");
        assert_eq!(
            extended,
            t0() + secs(15),
            "{}: the confirmed new deadline",
            b.name
        );
        assert!(
            store
                .fetch("b", take(10), t0() + secs(12))
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );

        let late = t0() + secs(16);
        let b_got = store
            .fetch("b", take(10), late)
            .await
            .expect("fetch")
            .remove(0);
        assert_eq!(b_got.receipt.attempt, 2, "{}", b.name);
        let refused = stale(
            store
                .settle(&a.receipt, None, late)
                .await
                .expect_err("stale"),
        );
        assert_eq!(refused.current_attempt, 2, "{}", b.name);
        let refused = stale(store.extend(&a.receipt, late).await.expect_err("stale"));
        assert_eq!(refused.current_attempt, 2, "{}", b.name);
        store
            .settle(&b_got.receipt, Some(Outcome::Accepted), late)
            .await
            .expect("settle");
        let twice = stale(
            store
                .settle(&b_got.receipt, None, late)
                .await
                .expect_err("settled"),
        );
        assert_eq!(twice.current_attempt, 2, "{}", b.name);
        let mut forged = b_got.receipt.clone();
        forged.offset += 1_000;
        let unknown = store.settle(&forged, None, late).await;
        assert!(
            matches!(unknown, Err(DeliveryError::NotFound(_))),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_batch_of_settlements_answers_each_alone() {
    for b in backends().await {
        let store = &b.store;
        let sub = create(store, &pull("batch")).await;
        singletons(store, 2, t0()).await;
        join(store, sub.id, "a", secs(3600)).await;
        let got = store.fetch("a", take(10), t0()).await.expect("fetch");
        let mut stale_one = got[1].receipt.clone();
        stale_one.attempt = 7;
        let answers = store
            .settle_many(
                &[
                    (got[0].receipt.clone(), None, None),
                    (stale_one, None, None),
                    (got[0].receipt.clone(), None, None),
                    (got[1].receipt.clone(), Some(Outcome::Accepted), None),
                ],
                t0(),
            )
            .await
            .expect("batch");
        assert!(answers[0].is_ok(), "{}", b.name);
        assert!(
            matches!(answers[1], Err(DeliveryError::Stale(_))),
            "{}",
            b.name
        );
        assert!(
            matches!(answers[2], Err(DeliveryError::Stale(_))),
            "{}: counts once",
            b.name
        );
        assert!(answers[3].is_ok(), "{}", b.name);
        assert_eq!(
            store.backlog(sub.id).await.expect("backlog").in_flight,
            0,
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn ordering_group_hands_out_one_message_of_a_group_at_a_time_in_order_and_keeps_its_member() {
    for b in backends().await {
        let store = &b.store;
        let s = spec(
            serde_json::json!({ "name": "$share/ordered/orders/#", "ordering": "group", "start": "oldest" }),
        );
        let sub = create(store, &s).await;
        assert_eq!(sub.rules.ordering, Ordering::Group, "{}", b.name);
        for n in 1..=3 {
            receive(store, "Order", "mid:g@contract", Some(n), t0()).await;
        }
        receive(store, "Order", "mid:h@contract", Some(1), t0()).await;
        join(store, sub.id, "a", secs(3600)).await;
        join(store, sub.id, "b", secs(3600)).await;
        let first = store.fetch("a", take(10), t0()).await.expect("fetch");
        let groups: Vec<(&str, Option<u64>)> = first
            .iter()
            .map(|h| (h.message.group_id.as_str(), h.message.number))
            .collect();
        assert_eq!(
            groups,
            vec![("mid:g@contract", Some(1)), ("mid:h@contract", Some(1))],
            "{}: the head of each group only",
            b.name
        );
        assert!(
            store
                .fetch("a", take(10), t0())
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );
        assert!(
            store
                .fetch("b", take(10), t0())
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );
        store
            .settle(&first[0].receipt, Some(Outcome::Accepted), t0())
            .await
            .expect("settle");
        assert!(
            store
                .fetch("b", take(10), t0())
                .await
                .expect("fetch")
                .is_empty(),
            "{}: the group stays with its member",
            b.name
        );
        let second = store.fetch("a", take(10), t0()).await.expect("fetch");
        assert_eq!(second.len(), 1, "{}", b.name);
        assert_eq!(
            second[0].message.number,
            Some(2),
            "{}: next only after the settle",
            b.name
        );
        // The member leaves: its groups go on with another member, in order.
        assert!(store.leave("a", t0()).await.expect("leave"), "{}", b.name);
        let moved = store.fetch("b", take(10), t0()).await.expect("fetch");
        let numbers: Vec<(String, Option<u64>, u32)> = moved
            .iter()
            .map(|h| {
                (
                    h.message.group_id.clone(),
                    h.message.number,
                    h.receipt.attempt,
                )
            })
            .collect();
        assert_eq!(
            numbers,
            vec![
                ("mid:g@contract".to_string(), Some(2), 2),
                ("mid:h@contract".to_string(), Some(1), 2)
            ],
            "{}",
            b.name
        );
        for h in &moved {
            store.settle(&h.receipt, None, t0()).await.expect("settle");
        }
        let last = store.fetch("b", take(10), t0()).await.expect("fetch");
        assert_eq!(last.len(), 1, "{}", b.name);
        assert_eq!(last[0].message.number, Some(3), "{}", b.name);
    }
}

#[tokio::test]
async fn shared_members_each_get_their_own_and_a_lapsed_member_gives_back_at_once() {
    for b in backends().await {
        let store = &b.store;
        let s = spec(
            serde_json::json!({ "name": "$share/pool/orders/#", "ack_wait_ms": 3_600_000, "start": "oldest" }),
        );
        let sub = create(store, &s).await;
        singletons(store, 4, t0()).await;
        let a = store
            .join(sub.id, "a", OWNER, secs(3600), t0())
            .await
            .expect("join");
        assert_eq!(a.expires_at, t0() + secs(3600), "{}", b.name);
        join(store, sub.id, "gone", secs(2)).await;
        let held = store.fetch("gone", take(2), t0()).await.expect("fetch");
        let mine = store.fetch("a", take(10), t0()).await.expect("fetch");
        assert_eq!(
            (held.len(), mine.len()),
            (2, 2),
            "{}: each message to one member",
            b.name
        );
        // Nothing of "gone" before its TTL passes…
        let renewed = store
            .heartbeat("a", t0() + secs(1))
            .await
            .expect("heartbeat");
        assert_eq!(renewed, t0() + secs(3601), "{}", b.name);
        assert!(
            store
                .fetch("a", take(10), t0() + secs(2))
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );
        // …then all of it, long before the ack wait.
        let after = t0() + Duration::milliseconds(2_001);
        assert!(
            store.member("gone", after).await.expect("read").is_none(),
            "{}: past its TTL, before any maintenance ends it",
            b.name
        );
        let report = store
            .maintain_deliveries(after, secs(30), Duration::hours(1))
            .await
            .expect("maintain");
        assert_eq!(report.sessions_lapsed, 1, "{}", b.name);
        assert_eq!(
            store.session("gone", after).await.expect("read"),
            None,
            "{}",
            b.name
        );

        let lapsed = store.heartbeat("gone", after).await;
        assert!(
            matches!(lapsed, Err(DeliveryError::NotFound(_))),
            "{}",
            b.name
        );
        let taken = store.fetch("a", take(10), after).await.expect("fetch");
        assert_eq!(offsets(&taken), offsets(&held), "{}", b.name);
        assert!(taken.iter().all(|h| h.receipt.attempt == 2), "{}", b.name);
    }
}

#[tokio::test]
async fn outcomes_release_back_off_avoid_and_dead_letter_with_the_reason() {
    for b in backends().await {
        let store = &b.store;
        let s = spec(serde_json::json!({
            "name": "$share/nacks/orders/#", "backoff_ms": [5_000], "max_deliveries": 2,
            "start": "oldest"
        }));
        let sub = create(store, &s).await;
        singletons(store, 2, t0()).await;
        join(store, sub.id, "a", secs(3600)).await;
        join(store, sub.id, "b", secs(3600)).await;
        let first = store
            .fetch("a", take(1), t0())
            .await
            .expect("fetch")
            .remove(0);
        // Released: back now, uncounted, for anyone.
        store
            .settle(&first.receipt, Some(Outcome::Released), t0())
            .await
            .expect("release");
        let again = store
            .fetch("a", take(1), t0())
            .await
            .expect("fetch")
            .remove(0);
        assert_eq!(again.message.offset, first.message.offset, "{}", b.name);
        // A failed delivery: backoff, then preferably another member.
        let nack = Outcome::Modified {
            delivery_failed: true,
            undeliverable_here: false,
            delay: None,
        };
        store
            .settle(&again.receipt, Some(nack.clone()), t0())
            .await
            .expect("nack");
        let deadlines = store
            .delivery_deadlines(Some(sub.id), t0())
            .await
            .expect("deadlines");
        assert_eq!(deadlines.backoff_ends, Some(t0() + secs(5)), "{}", b.name);
        let other = store.fetch("b", take(1), t0()).await.expect("fetch");
        assert_ne!(
            offsets(&other),
            vec![first.message.offset],
            "{}: backoff first",
            b.name
        );
        let later = t0() + secs(5);
        assert!(
            !offsets(&store.fetch("a", take(10), later).await.expect("fetch"))
                .contains(&first.message.offset),
            "{}: not back to the nacker",
            b.name
        );
        let by_b = store.fetch("b", take(10), later).await.expect("fetch");
        assert_eq!(offsets(&by_b), vec![first.message.offset], "{}", b.name);
        let cause = "push to https://hooks.example/p: HTTP 503: busy";
        store
            .settle_by(&by_b[0].receipt, Some(nack), Some(cause.into()), later)
            .await
            .expect("nack");
        let dead = store
            .dead_letters(sub.id, 0, 100)
            .await
            .expect("dead letters");
        assert_eq!(dead.len(), 1, "{}", b.name);
        assert_eq!(dead[0].offset, first.message.offset, "{}", b.name);
        assert_eq!(
            dead[0].reason,
            format!("2 failed deliveries (max_deliveries); the last: {cause}"),
            "the cause of the last failure: {}",
            b.name
        );
        assert!(dead[0].message.is_some(), "{}", b.name);
        // Rejected: a dead letter at once, naming who rejected it.
        let second = store.fetch("a", take(10), later).await.expect("fetch");
        let second = second
            .into_iter()
            .find(|h| h.message.offset != first.message.offset)
            .or(other.into_iter().next())
            .expect("the other message");
        let rejected = store
            .settle_by(
                &second.receipt,
                Some(Outcome::Rejected),
                Some("billing: no such customer".into()),
                later,
            )
            .await;
        assert!(rejected.is_ok(), "{}: {rejected:?}", b.name);
        let dead = store
            .dead_letters(sub.id, 0, 100)
            .await
            .expect("dead letters");
        assert_eq!(dead.len(), 2, "{}", b.name);
        assert_eq!(
            dead[1].reason, "rejected by billing: no such customer",
            "who and why, not a session id: {}",
            b.name
        );
        let backlog = store.backlog(sub.id).await.expect("backlog");
        assert_eq!(backlog.dead_letters, 2, "{}", b.name);
        // Replay one (as new: counted from zero), purge the other.
        let one = [dead[0].offset];
        let replayed = store
            .change_dead_letters(sub.id, Some(&one), DeadLetterChange::Replay, later)
            .await
            .expect("replay");
        assert_eq!(replayed, 1, "{}", b.name);
        let purged = store
            .change_dead_letters(sub.id, None, DeadLetterChange::Purge, later)
            .await
            .expect("purge");
        assert_eq!(purged, 1, "{}", b.name);
        assert!(
            store
                .dead_letters(sub.id, 0, 100)
                .await
                .expect("read")
                .is_empty(),
            "{}",
            b.name
        );
        let back = store.fetch("a", take(10), later).await.expect("fetch");
        assert_eq!(offsets(&back), vec![dead[0].offset], "{}", b.name);
        assert_eq!(
            back[0].receipt.attempt, 4,
            "{}: attempts keep counting",
            b.name
        );
    }
}

/// Of the messages a fetch matches, those its bounds (count, bytes) do not admit wait for the
/// next fetch: none is lost, none handed out twice, all in offset order, and the backlog
/// counts them waiting meanwhile.
#[tokio::test]
async fn matched_messages_a_fetch_does_not_take_wait_for_the_next() {
    for b in backends().await {
        let store = &b.store;
        let sub = create(store, &pull("bounded")).await;
        join(store, sub.id, "m", secs(3600)).await;
        singletons(store, 5, t0()).await;
        let inbox: Vec<i64> = store
            .inbox(0, 100)
            .await
            .expect("inbox")
            .iter()
            .map(|e| e.offset)
            .collect();
        let expected = inbox[inbox.len() - 5..].to_vec();
        let mut handed = Vec::new();
        // A byte budget of 1: the first message only (a fetch always admits one).
        let first = store
            .fetch("m", Take::pull(10, 1), t0())
            .await
            .expect("fetch");
        assert_eq!(first.len(), 1, "{}", b.name);
        handed.extend(offsets(&first));
        let backlog = store.backlog(sub.id).await.expect("backlog");
        assert_eq!(
            (backlog.waiting, backlog.in_flight),
            (4, 1),
            "{}: the other four wait",
            b.name
        );
        let second = store.fetch("m", take(2), t0()).await.expect("fetch");
        assert_eq!(second.len(), 2, "{}", b.name);
        handed.extend(offsets(&second));
        let rest = store.fetch("m", take(10), t0()).await.expect("fetch");
        handed.extend(offsets(&rest));
        assert_eq!(handed, expected, "{}: each once, in order", b.name);
        assert!(
            store
                .fetch("m", take(10), t0())
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn settled_mode_is_never_left_acquired() {
    for b in backends().await {
        let store = &b.store;
        let accepted = spec(
            serde_json::json!({ "name": "once", "filter": "orders/#", "settle_mode": "settled", "start": "oldest" }),
        );
        let sub = create(store, &accepted).await;
        assert_eq!(sub.rules.settle_mode, SettleMode::Settled, "{}", b.name);
        singletons(store, 1, t0()).await;
        join(store, sub.id, "a", secs(3600)).await;
        let got = store.fetch("a", take(10), t0()).await.expect("fetch");
        assert_eq!(got.len(), 1, "{}", b.name);
        assert_eq!(got[0].deadline, None, "{}: nothing to settle", b.name);
        let backlog = store.backlog(sub.id).await.expect("backlog");
        assert_eq!((backlog.waiting, backlog.in_flight), (0, 0), "{}", b.name);
        assert!(
            store
                .fetch("a", take(10), t0() + secs(100))
                .await
                .expect("fetch")
                .is_empty(),
            "{}",
            b.name
        );

        let released = spec(serde_json::json!({
            "name": "$share/hot/orders/#", "settle_mode": "settled",
            "default_outcome": "released", "start": "oldest"
        }));
        let sub = create(store, &released).await;
        join(store, sub.id, "x", secs(3600)).await;
        let first = store.fetch("x", take(10), t0()).await.expect("fetch");
        assert_eq!(first.len(), 1, "{}", b.name);
        assert_eq!(
            store.backlog(sub.id).await.expect("backlog").in_flight,
            0,
            "{}",
            b.name
        );
        assert!(
            store
                .fetch("x", take(10), t0())
                .await
                .expect("fetch")
                .is_empty(),
            "{}: never back to the same member, even alone",
            b.name
        );
        join(store, sub.id, "y", secs(3600)).await;
        let second = store.fetch("y", take(10), t0()).await.expect("fetch");
        assert_eq!(
            offsets(&second),
            offsets(&first),
            "{}: another member gets it",
            b.name
        );
    }
}

#[tokio::test]
async fn backlog_counts_unmatched_waiting_in_flight_and_start_new_skips_the_past() {
    for b in backends().await {
        let store = &b.store;
        singletons(store, 2, t0()).await;
        let old = create(store, &pull("old")).await;
        let fresh =
            spec(serde_json::json!({ "name": "new", "filter": "orders/#", "start": "new" }));
        assert_eq!(fresh.start, Start::New);
        let new = create(store, &fresh).await;
        singletons(store, 1, t0()).await;
        let backlog = store.backlog(old.id).await.expect("backlog");
        assert_eq!(backlog.unmatched, 3, "{}", b.name);
        assert_eq!(
            store.backlog(new.id).await.expect("backlog").unmatched,
            1,
            "{}",
            b.name
        );
        join(store, old.id, "a", secs(3600)).await;
        store.fetch("a", take(1), t0()).await.expect("fetch");
        let backlog = store.backlog(old.id).await.expect("backlog");
        assert_eq!(
            (
                backlog.unmatched,
                backlog.waiting,
                backlog.in_flight,
                backlog.dead_letters
            ),
            (0, 2, 1, 0),
            "{}",
            b.name
        );
        join(store, new.id, "n", secs(3600)).await;
        assert_eq!(
            store.fetch("n", take(10), t0()).await.expect("fetch").len(),
            1,
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn appends_wake_the_fetchers_only_and_changes_wake_everyone() {
    for b in backends().await {
        let store = &b.store;
        let mut changes = store.delivery_changes();
        let mut appends = store.inbox_appends();
        changes.borrow_and_update();
        appends.borrow_and_update();
        singletons(store, 1, t0()).await;
        assert!(appends.has_changed().expect("open"), "{}", b.name);
        assert!(
            !changes.has_changed().expect("open"),
            "{}: a message received moves no delivery deadline",
            b.name
        );
        appends.borrow_and_update();
        let s = spec(serde_json::json!({ "name": "woken", "filter": "orders/#" }));
        create(store, &s).await;
        assert!(
            changes.has_changed().expect("open"),
            "{}: a new subscription is work for the push supervisor",
            b.name
        );
    }
}

#[tokio::test]
async fn deadlines_and_changes_tell_the_waiting_workers_when_to_look_again() {
    for b in backends().await {
        let store = &b.store;
        let s = spec(
            serde_json::json!({ "name": "w", "filter": "orders/#", "ack_wait_ms": 10_000, "start": "oldest" }),
        );
        let sub = create(store, &s).await;
        singletons(store, 1, t0()).await;
        join(store, sub.id, "a", secs(60)).await;
        let mut changes = store.delivery_changes();
        changes.borrow_and_update();
        let got = store.fetch("a", take(10), t0()).await.expect("fetch");
        let deadlines = store
            .delivery_deadlines(Some(sub.id), t0())
            .await
            .expect("deadlines");
        assert_eq!(deadlines.lease_deadline, got[0].deadline, "{}", b.name);
        assert_eq!(
            deadlines.session_expiry,
            Some(t0() + secs(60)),
            "{}",
            b.name
        );
        assert_eq!(deadlines.backoff_ends, None, "{}", b.name);
        let all = store
            .delivery_deadlines(None, t0())
            .await
            .expect("deadlines");
        assert_eq!(all.lease_deadline, got[0].deadline, "{}", b.name);
        assert_eq!(all.oldest_inbox, Some(t0()), "{}", b.name);
        assert!(store.leave("a", t0()).await.expect("leave"), "{}", b.name);
        assert!(
            changes.has_changed().expect("open"),
            "{}: what the member held is free again",
            b.name
        );
    }
}

#[tokio::test]
async fn an_ephemeral_subscription_goes_after_its_grace_and_the_receipt_key_stays() {
    for b in backends().await {
        let store = &b.store;
        let key = store.receipt_secret().await.expect("key");
        assert_eq!(key.len(), 32, "{}", b.name);
        assert_eq!(
            store.receipt_secret().await.expect("key"),
            key,
            "{}",
            b.name
        );
        let s =
            spec(serde_json::json!({ "name": "passing", "filter": "orders/#", "durable": false }));
        let sub = create(store, &s).await;
        join(store, sub.id, "a", secs(60)).await;
        let grace = secs(30);
        let report = store
            .maintain_deliveries(t0() + secs(40), grace, Duration::hours(1))
            .await
            .expect("maintain");
        assert_eq!(
            report.subscriptions_removed, 0,
            "{}: a member is there",
            b.name
        );
        store.leave("a", t0() + secs(40)).await.expect("leave");
        let all = store
            .delivery_deadlines(None, t0() + secs(40))
            .await
            .expect("deadlines");
        assert_eq!(all.idle_since, Some(t0() + secs(40)), "{}", b.name);
        let report = store
            .maintain_deliveries(t0() + secs(70), grace, Duration::hours(1))
            .await
            .expect("maintain");
        assert_eq!(
            report.subscriptions_removed, 0,
            "{}: within its grace",
            b.name
        );
        let report = store
            .maintain_deliveries(t0() + secs(71), grace, Duration::hours(1))
            .await
            .expect("maintain");
        assert_eq!(report.subscriptions_removed, 1, "{}", b.name);
        assert_eq!(
            store.subscription(sub.id).await.expect("get"),
            None,
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn the_inbox_keeps_what_a_subscription_still_needs_and_purges_the_rest_after_the_retention() {
    for b in backends().await {
        let store = &b.store;
        let s = spec(
            serde_json::json!({ "name": "keep", "filter": "orders/#", "ack_wait_ms": 7_200_000, "start": "oldest" }),
        );
        let sub = create(store, &s).await;
        singletons(store, 2, t0()).await;
        join(store, sub.id, "a", secs(7200)).await;
        let got = store.fetch("a", take(10), t0()).await.expect("fetch");
        let settled_at = t0() + secs(600);
        store
            .settle(&got[0].receipt, None, settled_at)
            .await
            .expect("settle");
        let hour = Duration::hours(1);
        let report = store
            .maintain_deliveries(t0() + secs(3601), secs(30), hour)
            .await
            .expect("maintain");
        assert_eq!(
            report.inbox_purged, 0,
            "{}: settled less than an hour ago",
            b.name
        );
        let later = settled_at + hour + secs(1);
        store.heartbeat("a", later - secs(1)).await.expect("alive");
        let report = store
            .maintain_deliveries(later, secs(30), hour)
            .await
            .expect("maintain");
        assert_eq!(
            report.inbox_purged, 1,
            "{}: the other one is still leased",
            b.name
        );
        let all = store
            .delivery_deadlines(None, later)
            .await
            .expect("deadlines");
        assert_eq!(
            all.oldest_inbox,
            Some(t0()),
            "{}: the leased one stays",
            b.name
        );
    }
}

#[tokio::test]
async fn stats_count_what_the_store_holds() {
    use super::receiver::{message, text};
    use wsr_gateway::wsr::ReplyTo;
    for b in backends().await {
        let store = &b.store;
        let empty = store.stats().await.expect("stats");
        assert_eq!(empty, Default::default(), "{}", b.name);

        // Number 1 of an ordered group, ahead of its gap: buffered.
        let ahead = message(
            "mid:stats-buffer@contract",
            Some(1),
            ReplyPattern::Response,
            text("<a/>"),
        );
        store.receive(ahead).await.expect("buffered");
        // A Callback-pattern singleton: its ack is owed.
        let to = ReplyPattern::Callback(ReplyTo {
            uri: "http://127.0.0.1:9/acks".into(),
            reference_scheme: None,
        });
        let called = message("mid:stats-callback@contract", None, to, text("<b/>"));
        store.receive(called).await.expect("delivered");
        singletons(store, 3, t0()).await;
        let sub = create(store, &pull("stats")).await;
        join(store, sub.id, "m", secs(600)).await;
        let held = store.fetch("m", take(1), t0()).await.expect("fetch");
        assert_eq!(held.len(), 1, "{}", b.name);

        let stats = store.stats().await.expect("stats");
        assert_eq!(stats.buffered_messages, 1, "{}", b.name);
        assert_eq!(stats.pending_callbacks, 1, "{}", b.name);
        let groups: u64 = stats.groups.iter().map(|(_, n)| n).sum();
        assert_eq!(groups, 5, "{}: {:?}", b.name, stats.groups);
        assert!(
            stats.groups.iter().any(|(s, _)| s == "open"),
            "{}: the ordered group is open: {:?}",
            b.name,
            stats.groups
        );
        assert!(stats.outbound.is_empty(), "{}", b.name);
        let backlog = store.backlog(sub.id).await.expect("backlog");
        let [one] = stats.subscriptions.as_slice() else {
            panic!("{}: one subscription: {:?}", b.name, stats.subscriptions);
        };
        assert_eq!(one.name, "stats", "{}", b.name);
        assert_eq!(one.in_flight, 1, "{}", b.name);
        assert_eq!(one.waiting, backlog.waiting, "{}", b.name);
        assert_eq!(one.dead_letters, 0, "{}", b.name);
    }
}

#[tokio::test]
async fn the_operators_reads_count_traffic_list_members_and_search_the_inbox() {
    use super::receiver::{message, text};
    use wsr_gateway::store::InboxFilter;
    for b in backends().await {
        let store = &b.store;
        // acme sends three singletons on `orders` (at 0 s, 10 s and 100 s) and one ordered
        // message ahead of its gap; an anonymous caller one singleton on `default` at 100 s.
        let at = |s: i64| t0() + secs(s);
        let sent = |group: &str, number: Option<u64>, partner: &str, channel: &str, s: i64| {
            let mut m = message(group, number, ReplyPattern::Response, text("<o/>"));
            m.partner = partner.into();
            m.channel = channel.into();
            m.topic = format!("{channel}/Order");
            m.now = at(s);
            m.request.expiry_time = at(s) + Duration::days(1);
            m
        };
        for (i, s) in [0, 10, 100].into_iter().enumerate() {
            let m = sent(&format!("mid:acme-{i}@contract"), None, "acme", "orders", s);
            store.receive(m).await.expect("delivered");
        }
        let ahead = sent("mid:acme-ordered@contract", Some(1), "acme", "orders", 100);
        store.receive(ahead).await.expect("buffered");
        let anonymous = sent("mid:anon@contract", None, "", "default", 100);
        store.receive(anonymous).await.expect("delivered");

        let traffic = store.traffic(at(50)).await.expect("traffic");
        let row = |channel: &str, partner: &str| {
            traffic
                .receiving
                .iter()
                .find(|r| r.channel == channel && r.partner == partner)
                .cloned()
                .unwrap_or_else(|| panic!("{}: no {channel}/{partner}: {traffic:?}", b.name))
        };
        let acme = row("orders", "acme");
        assert_eq!(acme.received, 1, "{}: since 50 s: {acme:?}", b.name);
        assert_eq!(acme.buffered, 1, "{}: {acme:?}", b.name);
        assert!(acme.open_groups >= 1, "{}: {acme:?}", b.name);
        assert_eq!(row("default", "").received, 1, "{}", b.name);
        assert!(!traffic.received_capped, "{}", b.name);
        assert!(traffic.sending.is_empty(), "{}", b.name);
        let all = store.traffic(at(0)).await.expect("traffic");
        let acme_all = all.receiving.iter().find(|r| r.partner == "acme");
        assert_eq!(acme_all.map(|r| r.received), Some(3), "{}", b.name);

        let search = |filter: InboxFilter, after: i64| async move {
            let page = store
                .search_inbox(&filter, after, 10)
                .await
                .expect("search");
            // Listed by size, not read whole.
            assert!(
                page.entries
                    .iter()
                    .all(|e| e.entry.payload.is_empty() && e.size > 0)
            );
            page.entries
                .iter()
                .map(|e| e.entry.group_id.clone())
                .collect::<Vec<_>>()
        };
        let acme_groups = search(
            InboxFilter {
                partner: Some("acme".into()),
                ..Default::default()
            },
            0,
        )
        .await;
        assert_eq!(
            acme_groups,
            [
                "mid:acme-0@contract",
                "mid:acme-1@contract",
                "mid:acme-2@contract"
            ],
            "{}",
            b.name
        );
        let anonymous = InboxFilter {
            partner: Some(String::new()),
            channel: Some("default".into()),
            ..Default::default()
        };
        assert_eq!(
            search(anonymous, 0).await,
            ["mid:anon@contract"],
            "{}",
            b.name
        );
        let by_group = InboxFilter {
            group_id: Some("mid:acme-1@contract".into()),
            ..Default::default()
        };
        assert_eq!(
            search(by_group, 0).await,
            ["mid:acme-1@contract"],
            "{}",
            b.name
        );
        let since = InboxFilter {
            since: Some(at(50)),
            ..Default::default()
        };
        assert_eq!(
            search(since.clone(), 0).await,
            ["mid:acme-2@contract", "mid:anon@contract"],
            "{}",
            b.name
        );
        let later = InboxFilter {
            since: Some(at(101)),
            ..Default::default()
        };
        let nothing = store.search_inbox(&later, 0, 10).await.expect("search");
        assert_eq!(nothing, Default::default(), "{}", b.name);
        // Pages continue after the last match.
        let first = store.search_inbox(&since, 0, 1).await.expect("search");
        assert_eq!(first.entries.len(), 1, "{}", b.name);
        let next = first.next_after.expect("a next page");
        assert_eq!(
            search(since, next).await,
            ["mid:anon@contract"],
            "{}",
            b.name
        );

        // A message held for a gap is received before messages that reach the inbox ahead of
        // it: a search from its receipt time still finds them.
        let held = sent("mid:held@contract", Some(1), "acme", "orders", 150);
        store.receive(held).await.expect("buffered");
        let between = sent("mid:between@contract", None, "acme", "orders", 160);
        store.receive(between).await.expect("delivered");
        let gap = sent("mid:held@contract", Some(0), "acme", "orders", 170);
        store
            .receive(gap)
            .await
            .expect("delivered with the held one");
        let since_held = InboxFilter {
            since: Some(at(150)),
            ..Default::default()
        };
        assert_eq!(
            search(since_held, 0).await,
            [
                "mid:between@contract",
                "mid:held@contract",
                "mid:held@contract"
            ],
            "{}",
            b.name
        );

        // Members: two live sessions, one holding a message; none once they lapse.
        let sub = create(store, &pull("members")).await;
        join(store, sub.id, "m1", secs(600)).await;
        join(store, sub.id, "m2", secs(60)).await;
        let held = store.fetch("m1", take(1), t0()).await.expect("fetch");
        assert_eq!(held.len(), 1, "{}", b.name);
        let members = store.members(sub.id, t0(), 10).await.expect("members");
        let seen: Vec<(&str, &str, u64)> = members
            .iter()
            .map(|m| (m.session.as_str(), m.principal.as_str(), m.in_flight))
            .collect();
        assert_eq!(seen, [("m1", OWNER, 1), ("m2", OWNER, 0)], "{}", b.name);
        let later = store.members(sub.id, t0() + secs(601), 10).await;
        assert!(later.expect("members").is_empty(), "{}", b.name);
    }
}
