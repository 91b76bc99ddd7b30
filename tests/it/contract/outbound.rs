//! The outbound store trait's contract (see `contract/mod.rs`): submits numbered per group,
//! idempotency keys, the send window, claims and the retry state, what replies do (ack, fault,
//! `MessageProcessingFailure` retried, in doubt, an ordered group's failure), closing a group,
//! and the event log. Written against the facade and `OutboundStore` only.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use wsr_gateway::rmp::sender::{
    ATTEMPTS_KEPT_FIRST, ATTEMPTS_KEPT_LAST, AttemptKind, AttemptNote, AttemptVerdict, Event,
    OutState, RetrySchedule,
};
use wsr_gateway::store::Store;
use wsr_gateway::store::outbound::{
    IdempotencyKey, OutMessage, ReplySource, Submission, SubmitError, Submitted,
};
use wsr_gateway::wsr::{
    FaultCode, GroupId, Reply, ReplyPattern, ReplyRange, ReplyTo, SeqRange, SoapVersion,
};

use super::backends;

const PEER: &str = "http://127.0.0.1:9/wsr/default";
const OTHER: &str = "http://127.0.0.1:9/wsr/other";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .expect("date")
}

fn secs(s: i64) -> chrono::Duration {
    chrono::Duration::seconds(s)
}

/// A submission of `id` to PEER by "alice": a singleton unless `group` says otherwise.
fn submission(id: &str) -> Submission {
    Submission {
        id: id.into(),
        destination: PEER.into(),
        partner: String::new(),
        group_id: None,
        sequenced: false,
        last: false,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
        reply: ReplyPattern::Response,
        version: SoapVersion::Soap11,
        body: format!("<b xmlns=\"urn:contract\">{id}</b>"),
        expiry: t0() + secs(3600),
        schedule: RetrySchedule::Waits(vec![Duration::from_secs(10); 3]),
        notify_url: None,
        idempotency: None,
        principal: "alice".into(),
        any_group: false,
        sent_again: None,
    }
}

/// The first message of a new sequenced group.
fn first_of_group(id: &str, ordered: bool) -> Submission {
    Submission {
        sequenced: true,
        message_order: ordered,
        ..submission(id)
    }
}

/// The next message of `group`.
fn next_in(id: &str, group: &GroupId, ordered: bool) -> Submission {
    Submission {
        group_id: Some(group.clone()),
        ..first_of_group(id, ordered)
    }
}

async fn submit(store: &Store, s: Submission) -> Submitted {
    store.submit(s, t0()).await.expect("submitted")
}

async fn message(store: &Store, id: &str) -> OutMessage {
    store.out_message(id).await.expect("read").expect("stored")
}

/// Claims the next attempt of `id` at `now`, as the sender does; answers the envelope.
async fn claim(store: &Store, id: &str, now: DateTime<Utc>) -> String {
    let m = message(store, id).await;
    let mut after = m.outbound.clone();
    after.apply(Event::Sent, now);
    store
        .claim_attempt(id, &m.outbound, &after, now)
        .await
        .expect("claim")
        .expect("claimed")
}

fn ack(group: &GroupId, number: Option<u64>, fault: Option<FaultCode>) -> Reply {
    match number {
        None => Reply::NonSequence {
            group_id: group.clone(),
            fault,
        },
        Some(n) => Reply::Sequence {
            group_id: group.clone(),
            ranges: vec![ReplyRange {
                range: SeqRange::single(n),
                fault,
            }],
        },
    }
}

/// A send of message `id` that failed with `cause` at `at` (no answer came).
fn failed_send(id: &str, cause: &str, at: DateTime<Utc>) -> (String, AttemptNote) {
    let note = AttemptNote {
        kind: AttemptKind::Send,
        at,
        status: None,
        verdict: AttemptVerdict::Nothing,
        failure: Some(cause.to_owned()),
    };
    (id.to_owned(), note)
}

async fn group_of(store: &Store, id: &str) -> GroupId {
    message(store, id).await.group_id
}

fn numbers(messages: &[OutMessage]) -> Vec<Option<u64>> {
    messages.iter().map(|m| m.number).collect()
}

fn conflict(e: SubmitError) -> String {
    match e {
        SubmitError::Conflict(why) => why,
        other => panic!("not a conflict: {other}"),
    }
}

#[tokio::test]
async fn numbers_are_assigned_in_submit_order_per_group() {
    for b in backends().await {
        let store = &b.store;
        let first = submit(store, first_of_group("a0", false)).await;
        assert_eq!(first.number, Some(0), "{}", b.name);
        assert!(!first.replayed, "{}", b.name);
        let group = first.group_id.clone();
        for (i, id) in ["a1", "a2", "a3"].into_iter().enumerate() {
            let next = submit(store, next_in(id, &group, false)).await;
            assert_eq!(next.group_id, group, "{}", b.name);
            assert_eq!(next.number, Some(i as u64 + 1), "{}", b.name);
        }
        let other = submit(store, first_of_group("b0", false)).await;
        assert_ne!(other.group_id, group, "{}", b.name);
        assert_eq!(other.number, Some(0), "a group numbers its own: {}", b.name);
        let single = submit(store, submission("s")).await;
        assert_eq!(single.number, None, "{}", b.name);
        let m = message(store, "a2").await;
        assert_eq!(m.outbound.state, OutState::Queued, "{}", b.name);
        assert_eq!(m.key().number, Some(2), "{}", b.name);
        assert!(m.envelope.contains("urn:contract"), "{}", b.name);
        let listed = store
            .out_messages(None, Some(group.as_str()), None, 100)
            .await
            .expect("list");
        assert_eq!(
            numbers(&listed),
            vec![Some(0), Some(1), Some(2), Some(3)],
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_group_refuses_what_does_not_fit_it_and_stores_nothing() {
    for b in backends().await {
        let store = &b.store;
        let group = submit(store, first_of_group("g0", true)).await.group_id;
        let elsewhere = Submission {
            destination: OTHER.into(),
            ..next_in("x1", &group, true)
        };
        let refused = [
            elsewhere,
            next_in("x2", &group, false),
            Submission {
                principal: "bob".into(),
                ..next_in("x3", &group, true)
            },
            next_in(
                "x4",
                &GroupId::parse("mid:nobody@example").expect("id"),
                true,
            ),
        ];
        for s in refused {
            let id = s.id.clone();
            let e = store.submit(s, t0()).await.expect_err("refused");
            assert!(
                matches!(e, SubmitError::Conflict(_)),
                "{id}: {e} ({})",
                b.name
            );
            assert!(
                store.out_message(&id).await.expect("read").is_none(),
                "{id} not stored: {}",
                b.name
            );
        }
        // An operator may continue anyone's group.
        let operator = Submission {
            principal: "operator".into(),
            any_group: true,
            ..next_in("op", &group, true)
        };
        assert_eq!(submit(store, operator).await.number, Some(1), "{}", b.name);
        // A last message closes the group: nothing after it.
        let last = Submission {
            last: true,
            ..next_in("g2", &group, true)
        };
        assert_eq!(submit(store, last).await.number, Some(2), "{}", b.name);
        let after = store
            .submit(next_in("g3", &group, true), t0())
            .await
            .expect_err("closed");
        assert!(conflict(after).contains("closed"), "{}", b.name);
    }
}

#[tokio::test]
async fn an_idempotency_key_returns_the_stored_message() {
    for b in backends().await {
        let store = &b.store;
        let key = |fingerprint: &str| IdempotencyKey {
            principal: "alice".into(),
            key: "k-1".into(),
            fingerprint: fingerprint.into(),
        };
        assert!(
            store
                .earlier_submission(&key("f"))
                .await
                .expect("look up")
                .is_none(),
            "{}",
            b.name
        );
        let keyed = |id: &str, fingerprint: &str| Submission {
            idempotency: Some(key(fingerprint)),
            ..first_of_group(id, false)
        };
        let stored = submit(store, keyed("m1", "f")).await;
        let again = submit(store, keyed("m2", "f")).await;
        assert!(again.replayed, "{}", b.name);
        assert_eq!(
            (&again.id, &again.group_id, again.number),
            (&stored.id, &stored.group_id, stored.number),
            "{}",
            b.name
        );
        assert!(
            store.out_message("m2").await.expect("read").is_none(),
            "a replay stores nothing: {}",
            b.name
        );
        let earlier = store
            .earlier_submission(&key("f"))
            .await
            .expect("look up")
            .expect("found");
        assert_eq!(earlier.id, "m1", "{}", b.name);
        let reused = store.submit(keyed("m3", "other"), t0()).await;
        assert!(
            matches!(reused, Err(SubmitError::KeyReused(_))),
            "{:?} ({})",
            reused,
            b.name
        );
        assert!(matches!(
            store.earlier_submission(&key("other")).await,
            Err(SubmitError::KeyReused(_))
        ));
        // The same key of another principal is another message.
        let bobs = Submission {
            principal: "bob".into(),
            idempotency: Some(IdempotencyKey {
                principal: "bob".into(),
                ..key("f")
            }),
            ..first_of_group("m4", false)
        };
        let bobs = submit(store, bobs).await;
        assert!(!bobs.replayed, "{}", b.name);
        assert_eq!(
            message(store, "m1").await.idempotency_key.as_deref(),
            Some("k-1")
        );
    }
}

#[tokio::test]
async fn the_send_window_holds_an_ordered_group_beyond_its_lowest_open_message() {
    for b in backends().await {
        let store = &b.store;
        let group = submit(store, first_of_group("o0", true)).await.group_id;
        for i in 1..5 {
            submit(store, next_in(&format!("o{i}"), &group, true)).await;
        }
        let free = submit(store, first_of_group("u0", false)).await.group_id;
        for i in 1..5 {
            submit(store, next_in(&format!("u{i}"), &free, false)).await;
        }
        let none = BTreeMap::new();
        let due = store.due_outbound(t0(), 2, &none, 100).await.expect("due");
        let of = |group: &GroupId| -> Vec<Option<u64>> {
            due.messages
                .iter()
                .filter(|m| m.group_id == *group)
                .map(|m| m.number)
                .collect()
        };
        assert_eq!(of(&group), vec![Some(0), Some(1)], "{}", b.name);
        assert_eq!(of(&free).len(), 5, "unordered: all due: {}", b.name);
        assert_eq!(due.held_until, Some(t0() + secs(3600)), "{}", b.name);
        // The destination's own window.
        let windows = BTreeMap::from([(PEER.to_owned(), 3)]);
        let due = store
            .due_outbound(t0(), 2, &windows, 100)
            .await
            .expect("due");
        let ordered: Vec<_> = due.messages.iter().filter(|m| m.ordered).collect();
        assert_eq!(ordered.len(), 3, "{}", b.name);
        // An ack of the lowest moves the window on.
        let now = t0() + secs(1);
        claim(store, "o0", now).await;
        let finished = store
            .apply_replies(
                &[ack(&group, Some(0), None)],
                ReplySource::Destination(PEER),
                now,
            )
            .await
            .expect("applied");
        assert_eq!(finished, vec!["o0".to_owned()], "{}", b.name);
        let due = store.due_outbound(now, 2, &none, 100).await.expect("due");
        let ordered: Vec<_> = due
            .messages
            .iter()
            .filter(|m| m.ordered)
            .map(|m| m.number)
            .collect();
        assert_eq!(ordered, vec![Some(1), Some(2)], "{}", b.name);
        // A limit takes the longest due first.
        let one = store.due_outbound(now, 2, &none, 1).await.expect("due");
        assert_eq!(one.messages.len(), 1, "{}", b.name);
        // Past ExpiryTime a held message is due: the stop rules settle it.
        let late = t0() + secs(3600);
        let due = store.due_outbound(late, 2, &none, 100).await.expect("due");
        assert_eq!(
            due.messages.iter().filter(|m| m.ordered).count(),
            4,
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn claims_count_attempts_once_and_failures_keep_the_retry_state() {
    for b in backends().await {
        let store = &b.store;
        submit(store, submission("m")).await;
        let m = message(store, "m").await;
        assert_eq!(
            m.outbound.next_attempt,
            Some(t0()),
            "due at once: {}",
            b.name
        );
        let mut after = m.outbound.clone();
        after.apply(Event::Sent, t0());
        let envelope = store
            .claim_attempt("m", &m.outbound, &after, t0())
            .await
            .expect("claim")
            .expect("claimed");
        assert_eq!(envelope, m.envelope, "sent unchanged: {}", b.name);
        assert_eq!(
            store
                .claim_attempt("m", &m.outbound, &after, t0())
                .await
                .expect("claim"),
            None,
            "an attempt is claimed once: {}",
            b.name
        );
        let sent = message(store, "m").await;
        assert_eq!(sent.outbound.state, OutState::Sent, "{}", b.name);
        assert_eq!(sent.outbound.attempts, 1, "{}", b.name);
        let retry = t0() + secs(10);
        assert_eq!(sent.outbound.next_attempt, Some(retry), "{}", b.name);
        // Not due before its retry; the next due is its retry.
        let none = BTreeMap::new();
        assert!(
            store
                .due_outbound(t0(), 8, &none, 10)
                .await
                .expect("due")
                .messages
                .is_empty(),
            "{}",
            b.name
        );
        assert_eq!(
            store.next_outbound_due(t0()).await.expect("next"),
            Some(retry),
            "{}",
            b.name
        );
        assert_eq!(
            store
                .due_outbound(retry, 8, &none, 10)
                .await
                .expect("due")
                .messages
                .len(),
            1,
            "{}",
            b.name
        );
        // A failed attempt is recorded; one that never arrived is counted.
        store
            .record_attempts("acme", &[failed_send("m", "unreachable: refused", t0())])
            .await
            .expect("recorded");
        let mut unreached = sent.outbound.clone();
        unreached.apply(Event::Unreached, t0());
        store.save_unreached("m", &unreached).await.expect("saved");
        let failed = message(store, "m").await;
        let last = failed.last_error.expect("last error");
        assert_eq!(last.cause, "unreachable: refused", "{}", b.name);
        assert_eq!(last.at, t0(), "{}", b.name);
        assert_eq!(failed.outbound.unreached, 1, "{}", b.name);
        assert_eq!(
            failed.outbound.state,
            OutState::Sent,
            "still retried: {}",
            b.name
        );
        // The schedule's end: saved, final, and no longer due.
        let mut given_up = failed.outbound.clone();
        given_up.fail("no acknowledgment after 1 attempts");
        let finished = store
            .save_outbound("m", &failed.outbound.state, &given_up, t0())
            .await
            .expect("saved");
        assert_eq!(finished, vec!["m".to_owned()], "{}", b.name);
        assert_eq!(
            store.next_outbound_due(t0()).await.expect("next"),
            None,
            "{}",
            b.name
        );
        // Final states stay final.
        let mut revived = given_up.clone();
        revived.state = OutState::Sent;
        assert!(
            store
                .save_outbound("m", &given_up.state, &revived, t0())
                .await
                .expect("saved")
                .is_empty(),
            "{}",
            b.name
        );
        assert!(
            matches!(
                message(store, "m").await.outbound.state,
                OutState::Failed(_)
            ),
            "{}",
            b.name
        );
        store
            .record_attempts("acme", &[failed_send("m", "later", t0() + secs(5))])
            .await
            .expect("recorded");
        assert_eq!(
            message(store, "m").await.last_error.expect("kept").cause,
            "unreachable: refused",
            "a final message keeps its last error: {}",
            b.name
        );
    }
}

#[tokio::test]
async fn replies_ack_fault_or_retry_only_what_their_source_may_settle() {
    for b in backends().await {
        let store = &b.store;
        for id in ["acked", "faulted", "retried", "unsent"] {
            submit(store, submission(id)).await;
        }
        for id in ["acked", "faulted", "retried"] {
            claim(store, id, t0()).await;
        }
        let now = t0() + secs(1);
        // The wrong destination, or a callback for a Response-pattern message: nothing.
        let replies = [ack(&group_of(store, "acked").await, None, None)];
        for source in [
            ReplySource::Destination(OTHER),
            ReplySource::Callback {
                partners: &[String::new()],
            },
        ] {
            let finished = store
                .apply_replies(&replies, source, now)
                .await
                .expect("applied");
            assert!(finished.is_empty(), "{source:?}: {}", b.name);
        }
        assert_eq!(message(store, "acked").await.outbound.state, OutState::Sent);
        let replies = [
            ack(&group_of(store, "acked").await, None, None),
            ack(
                &group_of(store, "faulted").await,
                None,
                Some(FaultCode::InvalidMessageId),
            ),
            ack(
                &group_of(store, "retried").await,
                None,
                Some(FaultCode::MessageProcessingFailure),
            ),
            ack(&group_of(store, "unsent").await, None, None),
        ];
        let mut finished = store
            .apply_replies(&replies, ReplySource::Destination(PEER), now)
            .await
            .expect("applied");
        finished.sort();
        assert_eq!(
            finished,
            vec!["acked".to_owned(), "faulted".to_owned()],
            "{}",
            b.name
        );
        let acked = message(store, "acked").await;
        assert_eq!(acked.outbound.state, OutState::Acked, "{}", b.name);
        assert_eq!(acked.outbound.next_attempt, None, "{}", b.name);
        assert_eq!(
            message(store, "faulted").await.outbound.state,
            OutState::Faulted(FaultCode::InvalidMessageId),
            "{}",
            b.name
        );
        let retried = message(store, "retried").await;
        assert_eq!(retried.outbound.state, OutState::Sent, "{}", b.name);
        assert_eq!(
            retried.outbound.next_attempt,
            Some(t0() + secs(10)),
            "retried on its schedule: {}",
            b.name
        );
        assert_eq!(
            message(store, "unsent").await.outbound.state,
            OutState::Queued,
            "a reply for a message not sent settles nothing: {}",
            b.name
        );
        // A late reply does not change a final state.
        let late = [ack(&group_of(store, "faulted").await, None, None)];
        assert!(
            store
                .apply_replies(&late, ReplySource::Destination(PEER), now)
                .await
                .expect("applied")
                .is_empty(),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_callback_settles_the_callback_messages_of_its_partners() {
    for b in backends().await {
        let store = &b.store;
        let callback = |id: &str, partner: &str| Submission {
            partner: partner.into(),
            reply: ReplyPattern::Callback(ReplyTo {
                uri: "http://127.0.0.1:9/wsr/_callback".into(),
                reference_scheme: None,
            }),
            ..submission(id)
        };
        submit(store, callback("theirs", "p")).await;
        submit(store, callback("others", "q")).await;
        claim(store, "theirs", t0()).await;
        claim(store, "others", t0()).await;
        let replies = [
            ack(&message(store, "theirs").await.group_id, None, None),
            ack(&message(store, "others").await.group_id, None, None),
        ];
        let partners = ["p".to_owned()];
        let finished = store
            .apply_replies(
                &replies,
                ReplySource::Callback {
                    partners: &partners,
                },
                t0(),
            )
            .await
            .expect("applied");
        assert_eq!(finished, vec!["theirs".to_owned()], "{}", b.name);
        assert_eq!(
            message(store, "others").await.outbound.state,
            OutState::Sent
        );
    }
}

#[tokio::test]
async fn a_message_without_a_verdict_is_in_doubt_until_a_poll_settles_it() {
    for b in backends().await {
        let store = &b.store;
        let once = |id: &str| Submission {
            schedule: RetrySchedule::Waits(Vec::new()),
            expiry: t0() + secs(60),
            ..submission(id)
        };
        submit(store, once("doubt")).await;
        submit(store, once("acked")).await;
        submit(
            store,
            Submission {
                reply: ReplyPattern::Poll,
                ..submission("poll")
            },
        )
        .await;
        submit(store, submission("waiting")).await;
        for id in ["doubt", "acked", "poll", "waiting"] {
            claim(store, id, t0()).await;
        }
        let waiting: Vec<String> = store
            .awaiting_poll("", 100)
            .await
            .expect("read")
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(
            waiting,
            vec!["acked".to_owned(), "doubt".to_owned(), "poll".to_owned()],
            "its attempts used up, or the Poll pattern; not one with a resend to come: {}",
            b.name
        );
        let page = store.awaiting_poll("acked", 1).await.expect("read");
        assert_eq!(page.len(), 1, "{}", b.name);
        assert_eq!(page[0].id, "doubt", "paged by id: {}", b.name);
        assert!(
            page[0].envelope.is_empty(),
            "a poll never sends it, so it is not read: {}",
            b.name
        );
        assert!(
            !message(store, "doubt").await.envelope.is_empty(),
            "still stored: {}",
            b.name
        );
        // A poll's ack settles one; its silence proves nothing before ExpiryTime…
        let acked = message(store, "acked").await;
        let finished = store
            .apply_replies(
                &[ack(&acked.group_id, None, None)],
                ReplySource::Destination(PEER),
                t0() + secs(30),
            )
            .await
            .expect("applied");
        assert_eq!(finished, vec!["acked".to_owned()], "{}", b.name);
        let ids = ["doubt".to_owned()];
        let hour = Duration::from_secs(3600);
        let early = t0() + secs(30);
        assert!(
            store
                .not_held(&ids, early, hour, early)
                .await
                .expect("applied")
                .is_empty(),
            "{}",
            b.name
        );
        assert_eq!(message(store, "doubt").await.outbound.state, OutState::Sent);
        // …and is conclusive once the destination could no longer accept it.
        let later = t0() + secs(120);
        let finished = store
            .not_held(&ids, later, hour, later)
            .await
            .expect("applied");
        assert_eq!(finished, ids.to_vec(), "{}", b.name);
        let failed = message(store, "doubt").await;
        assert!(
            matches!(&failed.outbound.state, OutState::Failed(r) if r.contains("not delivered")),
            "{:?} ({})",
            failed.outbound.state,
            b.name
        );
    }
}

#[tokio::test]
async fn a_failure_in_an_ordered_group_fails_the_rest_of_it() {
    for b in backends().await {
        let store = &b.store;
        let group = submit(store, first_of_group("f0", true)).await.group_id;
        for i in 1..4 {
            submit(store, next_in(&format!("f{i}"), &group, true)).await;
        }
        claim(store, "f0", t0()).await;
        claim(store, "f1", t0()).await;
        store
            .apply_replies(
                &[ack(&group, Some(0), None)],
                ReplySource::Destination(PEER),
                t0(),
            )
            .await
            .expect("applied");
        let mut finished = store
            .apply_replies(
                &[ack(&group, Some(1), Some(FaultCode::InvalidMessageId))],
                ReplySource::Destination(PEER),
                t0(),
            )
            .await
            .expect("applied");
        finished.sort();
        assert_eq!(finished, vec!["f1", "f2", "f3"], "{}", b.name);
        assert_eq!(message(store, "f0").await.outbound.state, OutState::Acked);
        for id in ["f2", "f3"] {
            let m = message(store, id).await;
            assert!(
                matches!(&m.outbound.state, OutState::Failed(r) if r.contains("(f1)")),
                "{id}: {:?} ({})",
                m.outbound.state,
                b.name
            );
            assert_eq!(m.outbound.next_attempt, None, "{}", b.name);
        }
        let refused = store
            .submit(next_in("f4", &group, true), t0())
            .await
            .expect_err("refused");
        assert!(conflict(refused).contains("failed"), "{}", b.name);
        // An unordered group carries on.
        let free = submit(store, first_of_group("u0", false)).await.group_id;
        submit(store, next_in("u1", &free, false)).await;
        claim(store, "u0", t0()).await;
        let finished = store
            .apply_replies(
                &[ack(&free, Some(0), Some(FaultCode::InvalidMessageId))],
                ReplySource::Destination(PEER),
                t0(),
            )
            .await
            .expect("applied");
        assert_eq!(finished, vec!["u0".to_owned()], "{}", b.name);
        assert_eq!(message(store, "u1").await.outbound.state, OutState::Queued);
        assert_eq!(
            submit(store, next_in("u2", &free, false)).await.number,
            Some(2)
        );
    }
}

#[tokio::test]
async fn a_group_closes_with_last_only_before_its_newest_message_went_out() {
    for b in backends().await {
        let store = &b.store;
        let group = submit(store, first_of_group("c0", false)).await.group_id;
        submit(store, next_in("c1", &group, false)).await;
        assert_eq!(
            store
                .close_group(&group, Some("bob"))
                .await
                .map_err(conflict)
                .expect_err("another's group"),
            format!("no outbound group {group}"),
            "{}",
            b.name
        );
        assert_eq!(
            store
                .close_group(&group, Some("alice"))
                .await
                .expect("closed"),
            Some(1),
            "{}",
            b.name
        );
        assert!(
            message(store, "c1")
                .await
                .envelope
                .contains("last=\"true\""),
            "{}",
            b.name
        );
        assert_eq!(
            store.close_group(&group, None).await.expect("closed"),
            Some(1),
            "closed before: {}",
            b.name
        );
        let sent = submit(store, first_of_group("d0", false)).await.group_id;
        claim(store, "d0", t0()).await;
        let refused = store.close_group(&sent, None).await.expect_err("sent");
        assert!(conflict(refused).contains("already sent"), "{}", b.name);
        let envelope = message(store, "d0").await.envelope;
        assert!(!envelope.contains("last=\"true\""), "{}", b.name);
    }
}

#[tokio::test]
async fn every_state_change_is_an_event_in_order() {
    for b in backends().await {
        let store = &b.store;
        submit(store, submission("e1")).await;
        submit(
            store,
            Submission {
                principal: "bob".into(),
                ..submission("e2")
            },
        )
        .await;
        claim(store, "e1", t0()).await;
        let m = message(store, "e1").await;
        store
            .apply_replies(
                &[ack(&m.group_id, None, None)],
                ReplySource::Destination(PEER),
                t0() + secs(1),
            )
            .await
            .expect("applied");
        let events = store.out_events(0, 100).await.expect("events");
        let seen: Vec<(&str, &str)> = events
            .iter()
            .map(|e| (e.message_id.as_str(), e.state.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("e1", "queued"),
                ("e2", "queued"),
                ("e1", "sent"),
                ("e1", "acked")
            ],
            "{}",
            b.name
        );
        assert!(events.windows(2).all(|w| w[0].seq < w[1].seq), "{}", b.name);
        assert_eq!(events[3].at, t0() + secs(1), "{}", b.name);
        let after = store.out_events(events[1].seq, 100).await.expect("events");
        assert_eq!(after.len(), 2, "{}", b.name);
        let bobs = store
            .out_events_of(Some("bob"), 0, 100)
            .await
            .expect("events");
        assert_eq!(bobs.len(), 1, "{}", b.name);
        assert_eq!(bobs[0].message_id, "e2", "{}", b.name);
        submit(store, submission("e3")).await;
        claim(store, "e3", t0()).await;
        let g = message(store, "e3").await.group_id;
        store
            .apply_replies(
                &[ack(&g, None, Some(FaultCode::InvalidMessageId))],
                ReplySource::Destination(PEER),
                t0(),
            )
            .await
            .expect("applied");
        let last = store.out_events(0, 100).await.expect("events");
        let last = last.last().expect("an event");
        assert_eq!(
            (last.state.as_str(), last.detail.as_deref()),
            ("faulted", Some(FaultCode::InvalidMessageId.local_name())),
            "{}",
            b.name
        );
    }
}

/// One message's history alone, oldest first and capped (the console's message page).
#[tokio::test]
async fn one_messages_events_are_read_alone() {
    for b in backends().await {
        let store = &b.store;
        submit(store, submission("h1")).await;
        submit(store, submission("h2")).await;
        claim(store, "h1", t0()).await;
        let events = store.out_message_events("h1", 100).await.expect("events");
        let seen: Vec<(&str, &str)> = events
            .iter()
            .map(|e| (e.message_id.as_str(), e.state.as_str()))
            .collect();
        assert_eq!(seen, vec![("h1", "queued"), ("h1", "sent")], "{}", b.name);
        assert!(events[0].seq < events[1].seq, "{}", b.name);
        let first = store.out_message_events("h1", 1).await.expect("events");
        assert_eq!(first.len(), 1, "{}", b.name);
        assert_eq!(first[0].state, "queued", "{}", b.name);
        let none = store.out_message_events("nope", 100).await.expect("events");
        assert!(none.is_empty(), "{}", b.name);
    }
}

/// A submit wakes whoever waits for outbound work (the sender), after its commit.
#[tokio::test]
async fn a_submit_wakes_the_sender() {
    for b in backends().await {
        let store = &b.store;
        let woken = store.outbound_due().notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        submit(store, submission("w")).await;
        woken.await;
    }
}

/// A stop-rule decision made on a message read before another gateway claimed an attempt of
/// it ("expired before it was sent", "no attempt reached the destination") is not saved: the
/// message was sent meanwhile, and may be delivered.
#[tokio::test]
async fn a_decision_made_on_a_view_an_attempt_has_overtaken_is_not_saved() {
    for b in backends().await {
        let store = &b.store;
        submit(store, submission("stale")).await;
        let read = message(store, "stale").await;
        // Another gateway claims an attempt of it …
        claim(store, "stale", t0()).await;
        // … while this one, on what it read, fails it as expired before any attempt.
        let expired = t0() + secs(3601);
        let failed = {
            let mut o = read.outbound.clone();
            assert!(!o.due(expired, Duration::from_secs(60)), "{}", b.name);
            o
        };
        assert!(
            failed.state.is_final(),
            "the stop rules failed it: {}",
            b.name
        );
        let finished = store
            .save_outbound("stale", &read.outbound.state, &failed, expired)
            .await
            .expect("save");
        assert!(finished.is_empty(), "nothing finished: {}", b.name);
        let stored = message(store, "stale").await;
        assert_eq!(stored.outbound.state, OutState::Sent, "{}", b.name);
        assert_eq!(stored.outbound.attempts, 1, "{}", b.name);
        // A decision on what is stored now is saved (a sent message past its expiry waits
        // for a poll to settle its doubt).
        let mut decided = stored.outbound.clone();
        assert!(!decided.due(expired, Duration::from_secs(60)), "{}", b.name);
        assert_ne!(decided, stored.outbound, "the rules changed it: {}", b.name);
        store
            .save_outbound("stale", &stored.outbound.state, &decided, expired)
            .await
            .expect("save");
        let after = message(store, "stale").await;
        assert_eq!(after.outbound, decided, "{}", b.name);
    }
}

/// Every send and poll is a line of the message's story, with its status and verdict, oldest
/// first; a long story keeps its first and latest lines and the count of all; a poll answer's
/// time is kept as `last_poll_at`; a failure is also `last_error`, a success is not.
#[tokio::test]
async fn a_messages_attempts_are_its_story_kept_bounded() {
    for b in backends().await {
        let store = &b.store;
        submit(store, submission("story")).await;
        submit(store, submission("other")).await;
        store
            .record_attempts(
                "acme",
                &[failed_send("story", "HTTP 503 without a WS-R answer", t0())],
            )
            .await
            .expect("recorded");
        let answered = AttemptNote {
            kind: AttemptKind::Send,
            at: t0() + secs(1),
            status: Some(200),
            verdict: AttemptVerdict::Fault(FaultCode::InvalidMessageId),
            failure: None,
        };
        store
            .record_attempts("acme", &[("story".to_owned(), answered.clone())])
            .await
            .expect("recorded");
        let history = store.out_attempts("story").await.expect("history");
        assert_eq!(history.total, 2, "{}", b.name);
        assert_eq!(history.kept[0].0, 1, "{}", b.name);
        assert_eq!(
            history.kept[0].1,
            failed_send("story", "HTTP 503 without a WS-R answer", t0()).1,
            "{}",
            b.name
        );
        assert_eq!(history.kept[1], (2, answered), "{}", b.name);
        let m = message(store, "story").await;
        assert_eq!(
            m.last_error.expect("kept").cause,
            "HTTP 503 without a WS-R answer",
            "a success does not clear the cause: {}",
            b.name
        );
        assert_eq!(m.last_poll_at, None, "{}", b.name);
        // A poll asks about both: each gets its own line with what the answer said of it.
        let polled_at = t0() + secs(10);
        let poll = |verdict| AttemptNote {
            kind: AttemptKind::Poll,
            at: polled_at,
            status: Some(200),
            verdict,
            failure: None,
        };
        store
            .record_attempts(
                "acme",
                &[
                    ("story".to_owned(), poll(AttemptVerdict::Ack)),
                    ("other".to_owned(), poll(AttemptVerdict::Nothing)),
                ],
            )
            .await
            .expect("recorded");
        assert_eq!(
            message(store, "story").await.last_poll_at,
            Some(polled_at),
            "{}",
            b.name
        );
        let other = store.out_attempts("other").await.expect("history");
        assert_eq!(other.total, 1, "{}", b.name);
        assert_eq!(
            other.kept[0].1.verdict,
            AttemptVerdict::Nothing,
            "{}",
            b.name
        );
        // Polled for a long time: bounded, with the beginning and the end.
        for i in 0..40 {
            store
                .record_attempts(
                    "acme",
                    &[failed_send(
                        "story",
                        &format!("poll: timeout {i}"),
                        t0() + secs(20 + i),
                    )],
                )
                .await
                .expect("recorded");
        }
        let long = store.out_attempts("story").await.expect("history");
        assert_eq!(long.total, 43, "{}", b.name);
        assert_eq!(
            long.kept.len() as u64,
            ATTEMPTS_KEPT_FIRST + ATTEMPTS_KEPT_LAST,
            "{}",
            b.name
        );
        let numbers: Vec<u64> = long.kept.iter().map(|(n, _)| *n).collect();
        assert_eq!(numbers[..5], [1, 2, 3, 4, 5], "{}", b.name);
        assert_eq!(
            numbers[5..],
            (24..=43).collect::<Vec<u64>>()[..],
            "{}",
            b.name
        );
        assert_eq!(
            long.kept.last().expect("latest").1.failure.as_deref(),
            Some("poll: timeout 39"),
            "{}",
            b.name
        );
        assert!(
            store
                .out_attempts("nobody")
                .await
                .expect("history")
                .kept
                .is_empty(),
            "{}",
            b.name
        );
    }
}

/// A partner's health follows its exchanges: an answer resets the failures in a row and is
/// its last success; a failure counts one more and is its last error, kept after a success.
#[tokio::test]
async fn a_partners_health_follows_its_exchanges() {
    for b in backends().await {
        let store = &b.store;
        submit(store, submission("h1")).await;
        submit(store, submission("h2")).await;
        assert!(
            store.partner_health().await.expect("read").is_empty(),
            "{}",
            b.name
        );
        for i in 0..3 {
            store
                .record_attempts(
                    "acme",
                    &[failed_send(
                        "h1",
                        "HTTP 503 without a WS-R answer",
                        t0() + secs(i),
                    )],
                )
                .await
                .expect("recorded");
        }
        store
            .record_attempts("", &[failed_send("h2", "unreachable: refused", t0())])
            .await
            .expect("recorded");
        let health = store.partner_health().await.expect("read");
        assert_eq!(health.len(), 2, "{}", b.name);
        assert_eq!(health[0].partner, "", "{}", b.name);
        let acme = &health[1];
        assert_eq!(acme.partner, "acme", "{}", b.name);
        assert_eq!(acme.failures_in_row, 3, "{}", b.name);
        assert_eq!(acme.last_success_at, None, "{}", b.name);
        let error = acme.last_error.as_ref().expect("an error");
        assert_eq!(
            (error.cause.as_str(), error.at),
            ("HTTP 503 without a WS-R answer", t0() + secs(2)),
            "{}",
            b.name
        );
        let answered = AttemptNote {
            kind: AttemptKind::Poll,
            at: t0() + secs(10),
            status: Some(200),
            verdict: AttemptVerdict::Ack,
            failure: None,
        };
        store
            .record_attempts("acme", &[("h1".to_owned(), answered)])
            .await
            .expect("recorded");
        let health = store.partner_health().await.expect("read");
        let acme = &health[1];
        assert_eq!(acme.failures_in_row, 0, "{}", b.name);
        assert_eq!(acme.last_success_at, Some(t0() + secs(10)), "{}", b.name);
        assert_eq!(
            acme.last_error.as_ref().map(|e| e.cause.as_str()),
            Some("HTTP 503 without a WS-R answer"),
            "the last error stays after a success: {}",
            b.name
        );
    }
}
