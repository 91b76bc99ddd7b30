//! The receiver store trait's contract (see `contract/mod.rs`): written against the facade and
//! the traits only.

use chrono::{DateTime, Duration, Utc};
use wsr_gateway::rmp::receiver::Verdict;
use wsr_gateway::store::{InboxEntry, Payload, ReceivedMessage, Store, TestHooks as _};
use wsr_gateway::wsr::{
    FaultCode, GroupId, GroupLimit, MessageId, ReplyPattern, ReplyTo, Request, SequenceNum,
};

use super::backends;

pub fn now() -> DateTime<Utc> {
    Utc::now()
}

pub fn message(
    group: &str,
    number: Option<u64>,
    reply: ReplyPattern,
    payload: Payload,
) -> ReceivedMessage {
    ReceivedMessage {
        partner: String::new(),
        channel: "default".into(),
        request: Request {
            message_id: MessageId {
                group_id: GroupId::parse(group).expect("group id"),
                sequence: number.map(|number| SequenceNum {
                    number,
                    last: false,
                    group_limit: None,
                }),
            },
            expiry_time: now() + Duration::hours(1),
            reply_pattern: reply,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: number.is_some(),
        },
        payload,
        namespaces: "[]".into(),
        topic: "default/Order".into(),
        source: "127.0.0.1".into(),
        quota: wsr_gateway::rmp::quota::SourceQuota::UNLIMITED,
        soap12: false,
        now: now(),
        inbox: true,
        answer: None,
    }
}

/// The first ten inbox messages.
async fn inbox(store: &Store) -> Vec<InboxEntry> {
    store.inbox(0, 10).await.expect("inbox")
}

pub fn text(s: &str) -> Payload {
    Payload::from(s.to_owned())
}

#[tokio::test]
async fn a_message_is_accepted_once_and_its_duplicate_acked_without_a_second_delivery() {
    for b in backends().await {
        let m = message(
            "mid:one@contract",
            None,
            ReplyPattern::Response,
            text("<a/>"),
        );
        let first = b.store.receive(m.clone()).await.expect("stored");
        assert_eq!(first.verdict, Verdict::Ack, "{}", b.name);
        let again = b.store.receive(m).await.expect("stored");
        assert_eq!(again.verdict, Verdict::Ack, "{}", b.name);
        let inbox = inbox(&b.store).await;
        assert_eq!(inbox.len(), 1, "{}", b.name);
        assert_eq!(inbox[0].payload, "<a/>", "{}", b.name);
        assert!(
            b.store
                .group("", "mid:one@contract")
                .await
                .expect("read")
                .is_some(),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn an_ordered_message_ahead_of_a_gap_waits_and_is_delivered_in_order_with_its_watcher_told() {
    for b in backends().await {
        let g = "mid:ordered@contract";
        let second = message(g, Some(1), ReplyPattern::Response, text("<n>1</n>"));
        let watcher = b.store.watch_delivery("", &second.request.key());
        b.store.receive(second).await.expect("stored");
        assert!(inbox(&b.store).await.is_empty(), "{}", b.name);
        b.store
            .receive(message(
                g,
                Some(0),
                ReplyPattern::Response,
                text("<n>0</n>"),
            ))
            .await
            .expect("stored");
        watcher.await.expect("told after the commit");
        let payloads: Vec<String> = b
            .store
            .inbox(0, 10)
            .await
            .expect("inbox")
            .into_iter()
            .map(|e| e.payload)
            .collect();
        assert_eq!(payloads, vec!["<n>0</n>", "<n>1</n>"], "{}", b.name);
    }
}

#[tokio::test]
async fn a_callback_ack_is_owed_then_forgotten_once_sent_or_rescheduled_when_it_failed() {
    for b in backends().await {
        let to = ReplyPattern::Callback(ReplyTo {
            uri: "http://127.0.0.1:9/acks".into(),
            reference_scheme: None,
        });
        b.store
            .receive(message("mid:cb@contract", None, to, text("<a/>")))
            .await
            .expect("stored");
        let due = b
            .store
            .due_callbacks(now() + Duration::seconds(1), 10)
            .await
            .expect("due");
        assert_eq!(due.len(), 1, "{}", b.name);
        let later = now() + Duration::minutes(5);
        b.store
            .callbacks_failed(&[due[0].id], later)
            .await
            .expect("rescheduled");
        assert!(
            b.store
                .due_callbacks(now() + Duration::seconds(1), 10)
                .await
                .expect("due")
                .is_empty(),
            "{}",
            b.name
        );
        let again = b.store.due_callbacks(later, 10).await.expect("due");
        assert_eq!(again[0].attempts, 1, "{}", b.name);
        b.store.callbacks_sent(&[again[0].id]).await.expect("sent");
        assert_eq!(
            b.store.next_callback_due().await.expect("next"),
            None,
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_failed_commit_acks_nobody_and_stores_nothing() {
    for b in backends().await {
        b.store.fail_next_commits(1);
        let m = message(
            "mid:lost@contract",
            None,
            ReplyPattern::Response,
            text("<a/>"),
        );
        assert!(b.store.receive(m.clone()).await.is_err(), "{}", b.name);
        assert!(inbox(&b.store).await.is_empty(), "{}", b.name);
        assert!(
            b.store.readiness().await.is_err(),
            "{}: not ready after a failed commit",
            b.name
        );
        b.store.receive(m).await.expect("stored on retry");
        assert_eq!(inbox(&b.store).await.len(), 1, "{}", b.name);
    }
}

/// Message `i` of the sequenced group `g`, its payload `<n>i</n>`.
fn numbered(g: &str, i: u64) -> ReceivedMessage {
    let payload = text(&format!("<n>{i}</n>"));
    message(g, Some(i), ReplyPattern::Response, payload)
}

/// The payloads in the inbox, in order.
async fn payloads(store: &Store) -> Vec<String> {
    inbox(store).await.into_iter().map(|e| e.payload).collect()
}

#[tokio::test]
async fn a_sequenced_message_whose_commit_failed_is_decided_again_on_what_was_stored() {
    for b in backends().await {
        let g = "mid:retried@contract";
        let n = |i| numbered(g, i);
        b.store.receive(n(0)).await.expect("stored");
        b.store.fail_next_commits(1);
        assert!(b.store.receive(n(1)).await.is_err(), "{}", b.name);
        // Not a duplicate of the failed attempt: delivered now, and the next one after it.
        let again = b.store.receive(n(1)).await.expect("stored on retry");
        assert_eq!(again.verdict, Verdict::Ack, "{}", b.name);
        b.store.receive(n(2)).await.expect("stored");
        assert_eq!(
            payloads(&b.store).await,
            ["<n>0</n>", "<n>1</n>", "<n>2</n>"],
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_message_after_an_operators_abort_meets_the_aborted_group() {
    for b in backends().await {
        let g = "mid:aborted@contract";
        let n = |i| numbered(g, i);
        b.store.receive(n(0)).await.expect("stored");
        b.store.receive(n(1)).await.expect("stored");
        assert!(
            b.store.abort_group("", g, now()).await.expect("aborted"),
            "{}",
            b.name
        );
        let after = b.store.receive(n(2)).await.expect("decided");
        assert!(
            matches!(after.verdict, Verdict::Fault(FaultCode::GroupAborted, _)),
            "{}: {:?}",
            b.name,
            after.verdict
        );
        assert_eq!(payloads(&b.store).await.len(), 2, "{}", b.name);
    }
}

#[tokio::test]
async fn a_sequenced_group_expired_and_purged_by_sweeps_is_forgotten_and_its_id_opens_anew() {
    for b in backends().await {
        let g = "mid:expired@contract";
        let expiry = now() + Duration::seconds(30);
        let n = |i: u64| {
            let mut m = numbered(g, i);
            m.request.message_id.sequence = Some(SequenceNum {
                number: i,
                last: false,
                group_limit: Some(GroupLimit::ExpiryTime(expiry)),
            });
            m
        };
        b.store.receive(n(0)).await.expect("stored");
        b.store.receive(n(1)).await.expect("stored");
        let report = b.store.sweep(expiry + Duration::seconds(1)).await;
        assert_eq!(report.expect("swept").changed, 1, "{}: expired", b.name);
        let later = now() + Duration::days(60);
        let report = b.store.sweep(later).await.expect("swept");
        assert_eq!(report.purged, 1, "{}", b.name);
        let mut anew = message(g, Some(0), ReplyPattern::Response, text("<new/>"));
        anew.now = later;
        anew.request.expiry_time = later + Duration::hours(1);
        let received = b.store.receive(anew).await.expect("decided");
        assert_eq!(received.verdict, Verdict::Ack, "{}", b.name);
        assert_eq!(
            payloads(&b.store).await,
            ["<n>0</n>", "<n>1</n>", "<new/>"],
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_sweep_long_after_expiry_purges_the_group() {
    for b in backends().await {
        b.store
            .receive(message(
                "mid:old@contract",
                None,
                ReplyPattern::Response,
                text("<a/>"),
            ))
            .await
            .expect("stored");
        assert!(
            b.store.next_deadline().await.expect("deadline").is_some(),
            "{}",
            b.name
        );
        let report = b
            .store
            .sweep(now() + Duration::days(60))
            .await
            .expect("swept");
        assert_eq!(report.purged, 1, "{}", b.name);
        assert!(
            b.store
                .group("", "mid:old@contract")
                .await
                .expect("read")
                .is_none(),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_purged_group_is_forgotten_and_its_id_opens_a_new_group() {
    for b in backends().await {
        let m = message(
            "mid:again@contract",
            None,
            ReplyPattern::Response,
            text("<a/>"),
        );
        b.store.receive(m.clone()).await.expect("stored");
        let report = b
            .store
            .sweep(now() + Duration::days(60))
            .await
            .expect("swept");
        assert_eq!(report.purged, 1, "{}", b.name);
        // The same id, sent again after its group was purged: a new message.
        let again = b.store.receive(m.clone()).await.expect("stored");
        assert_eq!(again.verdict, Verdict::Ack, "{}", b.name);
        assert_eq!(inbox(&b.store).await.len(), 2, "{}", b.name);
        assert!(
            b.store
                .group("", "mid:again@contract")
                .await
                .expect("read")
                .is_some(),
            "{}",
            b.name
        );
        // And its resend is a duplicate of the new group.
        b.store.receive(m).await.expect("stored");
        assert_eq!(
            inbox(&b.store).await.len(),
            2,
            "{}: a duplicate of the new group",
            b.name
        );
    }
}

#[tokio::test]
async fn two_partners_groups_of_one_id_are_two_groups() {
    for b in backends().await {
        let ours = message(
            "mid:shared@contract",
            None,
            ReplyPattern::Response,
            text("<a/>"),
        );
        let theirs = ReceivedMessage {
            partner: "acme".into(),
            ..ours.clone()
        };
        b.store.receive(ours.clone()).await.expect("stored");
        b.store.receive(theirs.clone()).await.expect("stored");
        b.store.receive(theirs).await.expect("stored");
        b.store.receive(ours).await.expect("stored");
        let inbox = inbox(&b.store).await;
        let mut partners: Vec<&str> = inbox.iter().map(|e| e.partner.as_str()).collect();
        partners.sort_unstable();
        assert_eq!(
            partners,
            ["", "acme"],
            "{}: one each, resends dropped",
            b.name
        );
        for partner in ["", "acme"] {
            assert!(
                b.store
                    .group(partner, "mid:shared@contract")
                    .await
                    .expect("read")
                    .is_some(),
                "{}: {partner:?}",
                b.name
            );
        }
        assert!(
            b.store
                .group("other", "mid:shared@contract")
                .await
                .expect("read")
                .is_none(),
            "{}",
            b.name
        );
    }
}

/// A message far above the blob threshold goes in through incremental blob I/O and comes back
/// byte for byte.
#[tokio::test]
async fn a_large_payload_round_trips_byte_for_byte() {
    for b in backends().await {
        let body: String = (0..3 * 1024 * 1024 + 17)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let m = message(
            "mid:big@contract",
            None,
            ReplyPattern::Response,
            Payload::from(body.clone()),
        );
        b.store.receive(m).await.expect("stored");
        // And one held ahead of a gap, then released into the inbox.
        let g = "mid:big-ordered@contract";
        let held = message(
            g,
            Some(1),
            ReplyPattern::Response,
            Payload::from(body.clone()),
        );
        b.store.receive(held).await.expect("stored");
        let filler = message(g, Some(0), ReplyPattern::Response, text("<n/>"));
        b.store.receive(filler).await.expect("stored");
        let inbox = inbox(&b.store).await;
        assert_eq!(inbox.len(), 3, "{}", b.name);
        assert!(inbox[0].payload == body, "{}: the payload changed", b.name);
        assert!(
            inbox[2].payload == body,
            "{}: the released payload changed",
            b.name
        );
    }
}

/// The console's view of a message: its payload's head and size, without the whole payload —
/// for a large one (a BLOB on SQLite) and a small one (TEXT there), multi-byte characters
/// counted in bytes.
#[tokio::test]
async fn an_inbox_excerpt_is_the_payloads_head_and_size() {
    for b in backends().await {
        let big: String = "é".repeat(300_000);
        let cases = [
            ("mid:head-big@contract", big),
            ("mid:head-small@contract", "<n>ü</n>".to_owned()),
        ];
        for (group, body) in &cases {
            let m = message(
                group,
                None,
                ReplyPattern::Response,
                Payload::from(body.clone()),
            );
            b.store.receive(m).await.expect("stored");
        }
        let inbox = inbox(&b.store).await;
        for ((_, body), stored) in cases.iter().zip(&inbox) {
            let excerpt = b
                .store
                .inbox_excerpt(stored.offset, 5)
                .await
                .expect("read")
                .expect("there");
            assert_eq!(excerpt.size, body.len() as u64, "{}", b.name);
            assert_eq!(excerpt.head, body.as_bytes()[..5], "{}", b.name);
            assert_eq!(excerpt.entry.offset, stored.offset);
            assert_eq!(excerpt.entry.group_id, stored.group_id);
            assert!(excerpt.entry.payload.is_empty(), "not read whole");
        }
        let missing = b.store.inbox_excerpt(9_999, 5).await.expect("read");
        assert!(missing.is_none(), "{}", b.name);
    }
}

#[tokio::test]
async fn a_poll_is_answered_from_what_was_committed_and_unknown_groups_get_nothing() {
    use wsr_gateway::wsr::{RefToMessageIds, Reply};
    for b in backends().await {
        let g = GroupId::parse("mid:polled@contract").expect("id");
        b.store
            .receive(message(g.as_str(), None, ReplyPattern::Poll, text("<a/>")))
            .await
            .expect("stored");
        let refs = [RefToMessageIds {
            group_id: g.clone(),
            ranges: Vec::new(),
        }];
        let answer = b.store.poll_answer("", &refs).await.expect("answer");
        let replies = answer.expect("something to say").replies;
        assert_eq!(
            replies,
            vec![Reply::NonSequence {
                group_id: g.clone(),
                fault: None
            }],
            "{}",
            b.name
        );
        // Another partner's poll for the same id is about its own (unknown) group.
        let other = b.store.poll_answer("acme", &refs).await.expect("answer");
        assert!(
            other.is_none_or(|r| !r.replies.contains(&Reply::NonSequence {
                group_id: g.clone(),
                fault: None
            })),
            "{}",
            b.name
        );
    }
}

/// A job that fails inside the writer (here a simulated bug) fails alone: the messages that
/// share its batch are stored and acked.
#[tokio::test]
async fn a_failing_job_fails_alone_in_its_batch() {
    for b in backends().await {
        b.store.panic_on_group(Some("mid:doomed@contract"));
        let doomed = message(
            "mid:doomed@contract",
            None,
            ReplyPattern::Response,
            text("<x/>"),
        );
        let mut sends = vec![tokio::spawn({
            let store = b.store.clone();
            async move { store.receive(doomed).await.is_ok() }
        })];
        for i in 0..20 {
            let store = b.store.clone();
            let m = message(
                &format!("mid:fine-{i}@contract"),
                None,
                ReplyPattern::Response,
                text("<a/>"),
            );
            sends.push(tokio::spawn(async move { store.receive(m).await.is_ok() }));
        }
        let mut stored = Vec::new();
        for s in sends {
            stored.push(s.await.expect("send"));
        }
        assert!(!stored[0], "{}: the doomed message is not acked", b.name);
        assert!(
            stored[1..].iter().all(|ok| *ok),
            "{}: the others are",
            b.name
        );
        assert_eq!(
            b.store.inbox(0, 100).await.expect("inbox").len(),
            20,
            "{}",
            b.name
        );
        b.store.panic_on_group(None);
    }
}

/// A backend's answer rides with its request's delivery (D16): both are stored in one
/// transaction, or neither — an answer from a call whose exchange was taken over meanwhile is
/// refused, and the request is not delivered by it.
#[tokio::test]
async fn a_delivery_carrying_an_answer_is_stored_only_with_it() {
    use wsr_gateway::store::{
        Began, BeginCall, CachedAnswer, ExchangeState, KeptAnswer, NewCall, StoreError,
    };
    for b in backends().await {
        let mut ours = message(
            "mid:answered@contract",
            None,
            ReplyPattern::Response,
            text("<a/>"),
        );
        ours.inbox = false;
        let key = ours.request.key();
        let new_call = || NewCall {
            partner: "",
            key: &key,
            channel: "default",
            source: "127.0.0.1",
            now: now(),
            keep_until: now() + Duration::hours(2),
        };
        let fresh = BeginCall::Fresh { quota: u64::MAX };
        let (Began::Call(slow), committed) =
            b.store.begin_call(new_call(), fresh).await.expect("begins")
        else {
            panic!("{}: not begun", b.name);
        };
        committed.durable().await.expect("durable");
        let take_over = BeginCall::TakeOver {
            started_before: now() + Duration::seconds(1),
        };
        let (Began::Call(current), committed) = b
            .store
            .begin_call(new_call(), take_over)
            .await
            .expect("takes over")
        else {
            panic!("{}: not taken over", b.name);
        };
        committed.durable().await.expect("durable");
        let answer = |text: &str| CachedAnswer {
            status: 200,
            content_type: "text/xml".into(),
            body: text.as_bytes().to_vec().into(),
        };
        let mut late = ours.clone();
        late.answer = Some(KeptAnswer {
            attempt: slow,
            answer: answer("<slow/>"),
        });
        match b.store.receive(late).await {
            Err(StoreError::Superseded) => {}
            other => panic!("{}: {other:?}", b.name),
        }
        let group = b
            .store
            .group("", key.group_id.as_str())
            .await
            .expect("reads");
        assert!(
            group.is_none(),
            "{}: not delivered by the superseded call",
            b.name
        );
        let mut kept = ours.clone();
        kept.answer = Some(KeptAnswer {
            attempt: current,
            answer: answer("<current/>"),
        });
        let received = b.store.receive(kept).await.expect("stored");
        assert_eq!(received.verdict, Verdict::Ack, "{}", b.name);
        let exchange = b.store.exchange("", &key, now()).await.expect("reads");
        let exchange = exchange.expect("kept");
        assert_eq!(exchange.state, ExchangeState::Answered, "{}", b.name);
        assert_eq!(
            exchange.answer.map(|a| a.body),
            Some(answer("<current/>").body)
        );
        let group = b
            .store
            .group("", key.group_id.as_str())
            .await
            .expect("reads");
        assert!(group.is_some(), "{}: delivered with the answer", b.name);
    }
}
