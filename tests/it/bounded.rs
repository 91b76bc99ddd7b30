//! Bounded work (issue 12, item 4): a PollRequest or a callback costs time and memory linear
//! in its own size, within a cap on references (`max_poll_references`, default 10 000), and
//! a hostile one is refused while it is read.

use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};
use wsr_gateway::wsr::{
    FaultCode, GroupId, MessageId, RefToMessageIds, Reply, ReplyPattern, ReplyRange, Request,
    SeqRange, SequenceNum, SoapVersion,
};

use super::support::{free_port, mock_partner, spawn_app, spawn_app_with, start_gateway};

/// The default `max_poll_references`.
const CAP: usize = 10_000;

fn poll_xml(refs: Vec<RefToMessageIds>) -> String {
    super::support::poll_envelope(refs)
}

fn response_xml(replies: Vec<Reply>) -> String {
    super::support::response_envelope(replies)
}

fn group(s: &str) -> GroupId {
    GroupId::parse(s).expect("group id")
}

/// A PollRequest naming one reference more than the cap is refused as a whole with a
/// synchronous `InvalidPollRequest`; one at the cap is answered. Counted both ways: ranges
/// of one `RefToMessageIds`, and `RefToMessageIds` without ranges.
#[tokio::test]
async fn a_poll_beyond_the_reference_cap_is_an_invalid_poll_request() {
    let app = spawn_app().await;
    let whole = SeqRange::new(0, u64::MAX).expect("range");
    let ranges = |n: usize| {
        vec![RefToMessageIds {
            group_id: group("mid:poll-cap@test"),
            ranges: vec![whole; n],
        }]
    };
    let singletons = |n: usize| {
        (0..n)
            .map(|i| RefToMessageIds {
                group_id: group(&format!("mid:poll-cap-{i}@test")),
                ranges: Vec::new(),
            })
            .collect::<Vec<_>>()
    };
    for refs in [ranges(CAP + 1), singletons(CAP + 1)] {
        let answer = app.send(SoapVersion::Soap11, poll_xml(refs)).await;
        assert_eq!(
            answer.status,
            500,
            "{}",
            &answer.body[..answer.body.len().min(500)]
        );
        assert!(
            answer.body.contains("InvalidPollRequest") && answer.body.contains("10000"),
            "{}",
            answer.body
        );
    }
    for refs in [ranges(CAP), singletons(CAP)] {
        let answer = app.send(SoapVersion::Soap11, poll_xml(refs)).await;
        // Nothing is known of these groups: nothing to say (D11).
        assert_eq!(answer.status, 202, "{}", answer.body);
    }
    app.stop().await;
}

/// The key is configurable: a gateway with `max_poll_references = 3` refuses a fourth.
#[tokio::test]
async fn the_reference_cap_is_a_setting() {
    let app = spawn_app_with(|c| c.limits.max_references = 3).await;
    let refs = |n: u64| {
        vec![RefToMessageIds {
            group_id: group("mid:small-cap@test"),
            ranges: (0..n).map(SeqRange::single).collect(),
        }]
    };
    let answer = app.send(SoapVersion::Soap11, poll_xml(refs(4))).await;
    assert_eq!(answer.status, 500);
    assert!(
        answer.body.contains("InvalidPollRequest"),
        "{}",
        answer.body
    );
    let answer = app.send(SoapVersion::Soap11, poll_xml(refs(3))).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    app.stop().await;
}

/// A poll answer is never cut short (a sender may take what it leaves out as "not
/// delivered"): one that would make more statements than the cap is refused with
/// `InvalidPollRequest`, and one within it says everything.
#[tokio::test]
async fn a_poll_answer_beyond_the_cap_is_refused_not_cut_short() {
    let app = spawn_app_with(|c| c.limits.max_references = 3).await;
    let g = group("mid:answer-cap@test");
    for n in [0, 2, 4, 6] {
        let answer = app.send(SoapVersion::Soap11, message(&g, n)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    // One reference, four delivered ranges: four statements.
    let whole = vec![RefToMessageIds {
        group_id: g.clone(),
        ranges: Vec::new(),
    }];
    let answer = app.send(SoapVersion::Soap11, poll_xml(whole)).await;
    assert_eq!(answer.status, 500);
    assert!(
        answer.body.contains("InvalidPollRequest") && answer.body.contains("fewer"),
        "{}",
        answer.body
    );
    let three = vec![RefToMessageIds {
        group_id: g.clone(),
        ranges: vec![SeqRange::new(0, 4).expect("range")],
    }];
    let answer = app.send(SoapVersion::Soap11, poll_xml(three)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let replies = answer.envelope().response.expect("a wsrm:Response").replies;
    let expected: Vec<ReplyRange> = [0, 2, 4]
        .map(|n| ReplyRange {
            range: SeqRange::single(n),
            fault: None,
        })
        .to_vec();
    assert_eq!(
        replies,
        vec![Reply::Sequence {
            group_id: g,
            ranges: expected
        }]
    );
    app.stop().await;
}

fn status_mib(pid: u32, field: &str) -> u64 {
    super::support::proc_status_kib(pid, field) / 1024
}

fn message(g: &GroupId, n: u64) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: g.clone(),
            sequence: Some(SequenceNum {
                number: n,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    super::support::request_envelope(
        &request,
        &format!("<b:Item xmlns:b=\"urn:bounded\">{n}</b:Item>"),
    )
}

/// The amplification of issue 12 item 4, at the cap: a PollRequest of 10 000 ranges, each
/// the whole group, against a group with 2 000 delivered ranges (every even number below
/// 4 000). On commit 9982466 that walked 20 000 000 range pairs and grew the gateway by about
/// 700 MiB; now it is one merge pass. The answer is exactly the 2 000 delivered ranges, and
/// the child gateway's peak RSS grows by less than 64 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_allowed_poll_against_many_delivered_ranges_answers_in_bounded_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = dir.path().join("gateway.toml");
    let database = super::support::fresh_database(dir.path(), "gw.db").await;
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\ndurability = \"os\"\nhold_ms = 0\n",
            database.setting()
        ),
    )
    .expect("config");
    let mut child = start_gateway(&config);
    let pid = child.id();
    let url = format!("http://127.0.0.1:{port}/wsr/default");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let g = group("mid:poll-amplification@test");
    let delivered: Vec<u64> = (0..2_000).map(|i| 2 * i).collect();
    // Eight senders at a time; every message is acked (delivered) before the poll.
    for chunk in delivered.chunks(8) {
        let sends = chunk.iter().map(|&n| {
            let (client, url, xml) = (client.clone(), url.clone(), message(&g, n));
            async move {
                let r = client
                    .post(&url)
                    .header("Content-Type", "text/xml; charset=utf-8")
                    .body(xml)
                    .send()
                    .await
                    .expect("gateway answers");
                assert_eq!(r.status().as_u16(), 200, "message {n} acked");
            }
        });
        futures_util::future::join_all(sends).await;
    }
    let before = status_mib(pid, "VmHWM");
    let whole = SeqRange::new(0, u64::MAX).expect("range");
    let xml = poll_xml(vec![RefToMessageIds {
        group_id: g.clone(),
        ranges: vec![whole; CAP],
    }]);
    let r = client
        .post(&url)
        .header("Content-Type", "text/xml; charset=utf-8")
        .body(xml)
        .send()
        .await
        .expect("the poll is answered");
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.expect("answer body");
    let after = status_mib(pid, "VmHWM");
    child.kill().expect("stop the gateway");
    child.wait().expect("reaped");

    let env = wsr_gateway::wsr::read_message(
        Some("text/xml"),
        body.as_bytes(),
        &wsr_gateway::wsr::Limits::default(),
    )
    .expect("an envelope");
    let replies = env.response.expect("a wsrm:Response").replies;
    let [Reply::Sequence { group_id, ranges }] = &replies[..] else {
        panic!("one SequenceReplies expected: {replies:?}");
    };
    assert_eq!(group_id, &g);
    let expected: Vec<ReplyRange> = delivered
        .iter()
        .map(|&n| ReplyRange {
            range: SeqRange::single(n),
            fault: None,
        })
        .collect();
    assert_eq!(ranges, &expected);
    assert!(
        after.saturating_sub(before) < 64,
        "peak RSS grew from {before} MiB to {after} MiB for one poll"
    );
}

const TOKEN: &str = "producer-token-0123456789";

/// A callback (`/wsr/_callback`) with more statements than the cap is refused as a whole
/// with a SOAP Fault (`InvalidRequest`, HTTP 500), and nothing of it is applied; one just
/// under the cap — our 40 messages' acks among thousands of statements about other groups —
/// is applied, every message acked.
#[tokio::test]
async fn a_callback_beyond_the_cap_is_refused_and_one_within_is_applied() {
    let mut partner = mock_partner(Vec::new()).await;
    let app = spawn_app_with(|c| {
        c.tokens = vec![super::support::producer_token(TOKEN)];
        super::support::allow_loopback_urls(c);
    })
    .await;
    let agreement = json!({ "reply_pattern": "Callback", "waits_ms": [600000] });
    let submit = |group: Value| {
        let body = json!({ "destination": partner.url, "group": group, "agreement": agreement, "body": "<a/>" });
        app.client
            .post(app.url("/api/v1/messages"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    let first: Value = submit(json!({}))
        .await
        .expect("submit")
        .json()
        .await
        .expect("json");
    let gid = first["group_id"].as_str().expect("group id").to_owned();
    const MESSAGES: u64 = 40;
    for _ in 1..MESSAGES {
        let r = submit(json!({ "id": gid })).await.expect("submit");
        assert_eq!(r.status().as_u16(), 202);
    }
    // Every message went out once (it is `sent`, waiting for its callback ack).
    for _ in 0..MESSAGES {
        partner.next_post().await;
    }
    let ours = group(&gid);
    let acks = |statements: usize| {
        let mut replies: Vec<Reply> = (0..MESSAGES)
            .map(|n| Reply::Sequence {
                group_id: ours.clone(),
                ranges: vec![ReplyRange {
                    range: SeqRange::single(n),
                    fault: None,
                }],
            })
            .collect();
        replies.extend((MESSAGES as usize..statements).map(|i| Reply::NonSequence {
            group_id: group(&format!("mid:someone-else-{i}@test")),
            fault: Some(FaultCode::InvalidMessageId),
        }));
        response_xml(replies)
    };
    let states = || async {
        let mut states: Vec<String> = app
            .store
            .out_messages(None, None, None, 1000)
            .await
            .expect("list")
            .iter()
            .map(|m| m.outbound.state.name().to_owned())
            .collect();
        states.dedup();
        states
    };
    let answer = app.post("/wsr/_callback", "text/xml", acks(CAP + 1)).await;
    assert_eq!(
        answer.status,
        500,
        "{}",
        &answer.body[..answer.body.len().min(500)]
    );
    assert!(
        answer.body.contains("InvalidRequest") && answer.body.contains("10000"),
        "{}",
        answer.body
    );
    assert_eq!(
        states().await,
        vec!["sent"],
        "nothing of a refused callback is applied"
    );

    let answer = app.post("/wsr/_callback", "text/xml", acks(CAP - 1)).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(states().await, vec!["acked"]);
    app.stop().await;
}
