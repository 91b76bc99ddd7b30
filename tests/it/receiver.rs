//! The receiving RMP end to end over real HTTP: the receiver scenarios of digest §9.1, each
//! asserting the wire answer and the inbox (exactly once, in order).

use chrono::{DateTime, Duration, Utc};
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, ReceiverStore as _, TestHooks as _};
use wsr_gateway::wsr::datetime::XsDuration;
use wsr_gateway::wsr::{
    FaultCode, GroupId, GroupLimit, Headers, MessageId, PollRequest, RefToMessageIds, Reply,
    ReplyPattern, ReplyTo, Request, SeqRange, SequenceNum, SoapVersion, write_envelope,
};

use super::support::{Answer, ClockExt, TestApp, mock_partner, spawn_app, spawn_app_with, start};

const BOTH: [SoapVersion; 2] = [SoapVersion::Soap11, SoapVersion::Soap12];

/// A reliable message to build; defaults: singleton, Response pattern, AckRequested and
/// DuplicateElimination, one hour to live.
#[derive(Clone)]
struct Msg {
    group: String,
    number: Option<u64>,
    last: bool,
    limit: Option<GroupLimit>,
    expiry: DateTime<Utc>,
    pattern: ReplyPattern,
    ack: bool,
    dup: bool,
    order: bool,
    body: String,
}

fn msg(app: &TestApp, group: &str) -> Msg {
    Msg {
        group: group.to_owned(),
        number: None,
        last: false,
        limit: None,
        expiry: app.clock.now_utc() + Duration::hours(1),
        pattern: ReplyPattern::Response,
        ack: true,
        dup: true,
        order: false,
        body: format!("<p:Order xmlns:p=\"urn:p\">{group}</p:Order>"),
    }
}

impl Msg {
    fn n(mut self, n: u64) -> Msg {
        self.number = Some(n);
        self.body = format!("<p:Order xmlns:p=\"urn:p\">{}#{n}</p:Order>", self.group);
        self
    }
    fn ordered(mut self) -> Msg {
        self.order = true;
        self
    }
    fn last(mut self) -> Msg {
        self.last = true;
        self
    }
    fn pattern(mut self, p: ReplyPattern) -> Msg {
        self.pattern = p;
        self
    }
    fn request(&self) -> Request {
        Request {
            message_id: MessageId {
                group_id: GroupId::parse(&self.group).expect("group id"),
                sequence: self.number.map(|number| SequenceNum {
                    number,
                    last: self.last,
                    group_limit: self.limit.clone(),
                }),
            },
            expiry_time: self.expiry,
            reply_pattern: self.pattern.clone(),
            ack_requested: self.ack,
            duplicate_elimination: self.dup,
            message_order: self.order,
        }
    }
    fn xml(&self, version: SoapVersion) -> String {
        let request = self.request();
        write_envelope(
            version,
            Headers {
                request: Some(&request),
                ..Headers::default()
            },
            &self.body,
        )
    }
}

fn poll_xml(version: SoapVersion, refs: Vec<(&str, Vec<(u64, u64)>)>) -> String {
    let poll = PollRequest {
        refs: refs
            .into_iter()
            .map(|(g, ranges)| RefToMessageIds {
                group_id: GroupId::parse(g).expect("group"),
                ranges: ranges
                    .into_iter()
                    .map(|(a, b)| SeqRange::new(a, b).expect("range"))
                    .collect(),
            })
            .collect(),
        reply_to: None,
    };
    write_envelope(
        version,
        Headers {
            poll_request: Some(&poll),
            ..Headers::default()
        },
        "",
    )
}

/// One reply: group, number range (`None` for a singleton), fault.
type ReplyRow = (String, Option<(u64, u64)>, Option<FaultCode>);

/// The replies of a `wsrm:Response` answer as (group, from, to, fault); singletons as from=to=None.
fn replies_of(answer: &Answer) -> Vec<ReplyRow> {
    let env = answer.envelope();
    let Some(response) = env.response else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for reply in response.replies {
        match reply {
            Reply::NonSequence { group_id, fault } => out.push((group_id.to_string(), None, fault)),
            Reply::Sequence { group_id, ranges } => {
                for r in ranges {
                    out.push((
                        group_id.to_string(),
                        Some((r.range.from(), r.range.to())),
                        r.fault,
                    ));
                }
            }
        }
    }
    out
}

fn ack(group: &str) -> Vec<ReplyRow> {
    vec![(group.to_owned(), None, None)]
}

fn range_ack(group: &str, from: u64, to: u64) -> Vec<ReplyRow> {
    vec![(group.to_owned(), Some((from, to)), None)]
}

/// Inbox contents as (group, number).
async fn delivered(app: &TestApp) -> Vec<(String, Option<u64>)> {
    app.inbox()
        .await
        .into_iter()
        .map(|e| (e.group_id, e.number))
        .collect()
}

/// The fault code a SOAP Fault answer carries, from its wsrm:Response header.
fn fault_of(answer: &Answer) -> Option<FaultCode> {
    replies_of(answer).into_iter().find_map(|(_, _, f)| f)
}

// 1. Singleton, Response, GD+DE, one-way: 200 + NonSequenceReply; a resend is acked again
//    and not delivered again.
#[tokio::test]
async fn s01_singleton_response_pattern_acks_and_resend_is_acked_once_delivered() {
    for version in BOTH {
        let app = spawn_app().await;
        let m = msg(&app, "mid:s1@test");
        let first = app.send(version, m.xml(version)).await;
        assert_eq!(first.status, 200, "{}", first.body);
        assert_eq!(replies_of(&first), ack("mid:s1@test"));
        assert_eq!(
            first.envelope().version,
            version,
            "answered in the request's SOAP version"
        );
        assert_eq!(
            first.envelope().body.content,
            "",
            "empty Body on a one-way ack (D5)"
        );
        let again = app.send(version, m.xml(version)).await;
        assert_eq!(again.status, 200);
        assert_eq!(replies_of(&again), ack("mid:s1@test"));
        assert_eq!(
            delivered(&app).await,
            vec![("mid:s1@test".to_owned(), None)]
        );
        let inbox = app.inbox().await;
        assert_eq!(inbox[0].topic, "default/Order");
        assert_eq!(inbox[0].payload, m.body);
        app.stop().await;
    }
}

// 2. Singleton, Callback: 202; the ack is POSTed; a lost callback is retried; a resend gets
//    the ack again without a second delivery.
#[tokio::test]
async fn s02_singleton_callback_pattern() {
    let mut partner = mock_partner(vec![500]).await;
    let app = spawn_app().await;
    app.register_callback(&partner.url).await;
    let m = msg(&app, "mid:s2@test").pattern(ReplyPattern::Callback(ReplyTo::bare(&partner.url)));
    let answer = app
        .send(SoapVersion::Soap11, m.xml(SoapVersion::Soap11))
        .await;
    assert_eq!((answer.status, answer.body.as_str()), (202, ""));
    // First POST refused with 500, so it comes again once its backoff has passed.
    let (_, first) = partner.next_post().await;
    let (_, retry) = partner.next_retry(&app.clock).await;
    for body in [first, retry] {
        let posted = Answer {
            status: 200,
            content_type: Some("text/xml".into()),
            body,
        };
        assert_eq!(replies_of(&posted), ack("mid:s2@test"));
    }
    let resent = app
        .send(SoapVersion::Soap11, m.xml(SoapVersion::Soap11))
        .await;
    assert_eq!(resent.status, 202);
    let (_, body) = partner.next_post().await;
    let posted = Answer {
        status: 200,
        content_type: Some("text/xml".into()),
        body,
    };
    assert_eq!(
        replies_of(&posted),
        ack("mid:s2@test"),
        "duplicate re-acked by callback"
    );
    assert_eq!(delivered(&app).await.len(), 1);
    app.stop().await;
}

// 2b. A Callback ReplyTo that is not registered is refused synchronously (D10).
#[tokio::test]
async fn s02b_unregistered_callback_endpoint_is_refused() {
    let app = spawn_app().await;
    let m = msg(&app, "mid:s2b@test").pattern(ReplyPattern::Callback(ReplyTo::bare(
        "http://127.0.0.1:9/x",
    )));
    let answer = app
        .send(SoapVersion::Soap12, m.xml(SoapVersion::Soap12))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.body.contains("wsrm:InvalidReplyPattern"),
        "{}",
        answer.body
    );
    assert!(delivered(&app).await.is_empty());
    app.stop().await;
}

// 3. Singleton, Poll: 202; a poll before delivery says nothing; after delivery it acks.
#[tokio::test]
async fn s03_singleton_poll_pattern() {
    for version in BOTH {
        let app = spawn_app().await;
        let early = app
            .send(version, poll_xml(version, vec![("mid:s3@test", vec![])]))
            .await;
        assert_eq!(
            (early.status, early.body.as_str()),
            (202, ""),
            "nothing to say: no Response"
        );
        let m = msg(&app, "mid:s3@test").pattern(ReplyPattern::Poll);
        let answer = app.send(version, m.xml(version)).await;
        assert_eq!((answer.status, answer.body.as_str()), (202, ""));
        let polled = app
            .send(version, poll_xml(version, vec![("mid:s3@test", vec![])]))
            .await;
        assert_eq!(polled.status, 200);
        assert_eq!(replies_of(&polled), ack("mid:s3@test"));
        assert_eq!(delivered(&app).await.len(), 1);
        app.stop().await;
    }
}

/// Chaos-harness finding: a sender whose acks were all lost can only learn what became of its
/// message by polling after the message's ExpiryTime — when the receiver used to have forgotten
/// the ID already, so "nothing" wrongly read as "not delivered". Delivered IDs are now kept
/// `delivered_id_retention_seconds` past expiry (and a late resend is acked, not faulted).
#[tokio::test]
async fn delivered_ids_are_still_answered_for_after_expiry() {
    let app = spawn_app().await;
    let v = SoapVersion::Soap11;
    let mut single = msg(&app, "mid:late-single@test").pattern(ReplyPattern::Poll);
    single.expiry = app.clock.now_utc() + Duration::seconds(10);
    let mut grouped = msg(&app, "mid:late-group@test").n(0).last();
    grouped.expiry = single.expiry;
    assert_eq!(app.send(v, single.xml(v)).await.status, 202);
    assert_eq!(app.send(v, grouped.xml(v)).await.status, 200);
    app.clock.advance(Duration::minutes(30));
    app.sweep().await;
    let polled = app
        .send(
            v,
            poll_xml(
                v,
                vec![
                    ("mid:late-single@test", vec![]),
                    ("mid:late-group@test", vec![(0, 0)]),
                ],
            ),
        )
        .await;
    assert_eq!(polled.status, 200, "{}", polled.body);
    let replies = replies_of(&polled);
    assert_eq!(replies.len(), 2, "{replies:?}");
    let resend = app.send(v, grouped.xml(v)).await;
    assert_eq!(
        fault_of(&resend),
        None,
        "a late resend of a delivered message is acked"
    );
    assert_eq!(resend.status, 200);
    // After the retention the IDs go.
    app.clock.advance(Duration::minutes(31));
    app.sweep().await;
    let polled = app
        .send(v, poll_xml(v, vec![("mid:late-single@test", vec![])]))
        .await;
    assert_eq!((polled.status, polled.body.as_str()), (202, ""));
    assert_eq!(delivered(&app).await.len(), 2);
    app.stop().await;
}

// 4. Group of 5, unordered, Callback: acks batched per endpoint; last on 4 completes it.
#[tokio::test]
async fn s04_unordered_group_with_callback_acks_and_last() {
    let mut partner = mock_partner(vec![]).await;
    let app = spawn_app().await;
    app.register_callback(&partner.url).await;
    let base =
        msg(&app, "mid:s4@test").pattern(ReplyPattern::Callback(ReplyTo::bare(&partner.url)));
    let sends = (0..5).map(|n| {
        let m = if n == 4 {
            base.clone().n(n).last()
        } else {
            base.clone().n(n)
        };
        let app = &app;
        async move {
            app.send(SoapVersion::Soap11, m.xml(SoapVersion::Soap11))
                .await
        }
    });
    for answer in futures_join(sends).await {
        assert_eq!(answer.status, 202);
    }
    let mut acked = std::collections::BTreeSet::new();
    while acked.len() < 5 {
        let (_, body) = partner.next_post().await;
        let posted = Answer {
            status: 200,
            content_type: Some("text/xml".into()),
            body,
        };
        for (group, range, fault) in replies_of(&posted) {
            assert_eq!((group.as_str(), fault), ("mid:s4@test", None));
            let (from, to) = range.expect("sequence replies");
            acked.extend(from..=to);
        }
    }
    assert_eq!(acked.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    let group = app
        .store
        .group("", "mid:s4@test")
        .await
        .expect("read")
        .expect("group");
    assert_eq!(group.status.as_str(), "complete");
    let mut numbers: Vec<u64> = delivered(&app)
        .await
        .into_iter()
        .filter_map(|(_, n)| n)
        .collect();
    numbers.sort();
    assert_eq!(numbers, vec![0, 1, 2, 3, 4]);
    // Beyond `last`: InvalidMessageId.
    let beyond = app
        .send(
            SoapVersion::Soap11,
            base.clone()
                .n(5)
                .pattern(ReplyPattern::Response)
                .xml(SoapVersion::Soap11),
        )
        .await;
    assert_eq!(
        fault_of(&beyond),
        Some(FaultCode::InvalidMessageId),
        "{}",
        beyond.body
    );
    app.stop().await;
}

async fn futures_join<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futures.collect();
    let mut out = Vec::new();
    for f in handles {
        out.push(f.await);
    }
    out
}

// 5. Ordered group sent 0, 2, 1: delivered 0, 1, 2; 2 is not acked before 1 arrives, and its
//    held answer carries the ack once 1 fills the gap.
#[tokio::test]
async fn s05_ordered_group_out_of_order() {
    for version in BOTH {
        let app = spawn_app_with(|c| c.hold = std::time::Duration::from_secs(5)).await;
        let base = msg(&app, "mid:s5@test").ordered();
        let zero = app.send(version, base.clone().n(0).xml(version)).await;
        assert_eq!(replies_of(&zero), range_ack("mid:s5@test", 0, 0));
        let two = {
            let xml = base.clone().n(2).xml(version);
            let client = app.client.clone();
            let url = app.url("/wsr/default");
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .header("Content-Type", version.content_type())
                    .body(xml)
                    .send()
                    .await
                    .expect("send");
                Answer::read(r).await
            })
        };
        // Number 2 is buffered, not delivered and not acked, until 1 arrives.
        wait_until_buffered(&app, "mid:s5@test", 2).await;
        assert_eq!(delivered(&app).await.len(), 1);
        let one = app.send(version, base.clone().n(1).xml(version)).await;
        assert_eq!(replies_of(&one), range_ack("mid:s5@test", 1, 1));
        let two = two.await.expect("held request");
        assert_eq!(two.status, 200, "{}", two.body);
        assert_eq!(replies_of(&two), range_ack("mid:s5@test", 2, 2));
        let order: Vec<Option<u64>> = delivered(&app).await.into_iter().map(|(_, n)| n).collect();
        assert_eq!(order, vec![Some(0), Some(1), Some(2)]);
        app.stop().await;
    }
}

async fn wait_until_buffered(app: &TestApp, group: &str, n: u64) {
    for _ in 0..500 {
        if let Some(g) = app.store.group("", group).await.expect("read")
            && g.buffered.contains_key(&n)
        {
            return;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("{group}#{n} never got buffered");
}

// 5b. Without waiting (hold 0) a buffered message is answered 202 with no ack; a resend of it
//     while buffered is not stored twice and not acked; once delivered, a resend is acked.
#[tokio::test]
async fn s05b_buffered_message_is_not_acked_until_delivered() {
    let app = spawn_app_with(|c| c.hold = std::time::Duration::ZERO).await;
    let base = msg(&app, "mid:s5b@test").ordered();
    let v = SoapVersion::Soap11;
    assert_eq!(app.send(v, base.clone().n(0).xml(v)).await.status, 200);
    let two = app.send(v, base.clone().n(2).xml(v)).await;
    assert_eq!((two.status, two.body.as_str()), (202, ""));
    let again = app.send(v, base.clone().n(2).xml(v)).await;
    assert_eq!((again.status, again.body.as_str()), (202, ""));
    let poll = app
        .send(v, poll_xml(v, vec![("mid:s5b@test", vec![(0, 5)])]))
        .await;
    assert_eq!(
        replies_of(&poll),
        range_ack("mid:s5b@test", 0, 0),
        "buffered: nothing said"
    );
    assert_eq!(app.send(v, base.clone().n(1).xml(v)).await.status, 200);
    let resend = app.send(v, base.clone().n(2).xml(v)).await;
    assert_eq!(replies_of(&resend), range_ack("mid:s5b@test", 2, 2));
    assert_eq!(delivered(&app).await.len(), 3);
    app.stop().await;
}

// 6. Ordered group with a permanent gap: after the idle limit the buffered 2 is discarded,
//    only 0 was delivered, and 3 gets GroupAborted.
#[tokio::test]
async fn s06_permanent_gap_aborts_the_group() {
    let app = spawn_app_with(|c| c.hold = std::time::Duration::ZERO).await;
    let mut base = msg(&app, "mid:s6@test").ordered();
    base.limit = Some(GroupLimit::MaxIdleDuration(
        XsDuration::parse("PT5S").expect("duration"),
    ));
    let v = SoapVersion::Soap11;
    assert_eq!(app.send(v, base.clone().n(0).xml(v)).await.status, 200);
    assert_eq!(app.send(v, base.clone().n(2).xml(v)).await.status, 202);
    app.clock.advance(Duration::seconds(6));
    app.sweep().await;
    let group = app
        .store
        .group("", "mid:s6@test")
        .await
        .expect("read")
        .expect("group");
    assert_eq!(group.status.as_str(), "aborted");
    let three = app.send(v, base.clone().n(3).xml(v)).await;
    assert_eq!(three.status, 500);
    assert_eq!(fault_of(&three), Some(FaultCode::GroupAborted));
    let polled = app
        .send(v, poll_xml(v, vec![("mid:s6@test", vec![(0, 3)])]))
        .await;
    let replies = replies_of(&polled);
    assert!(
        replies.contains(&("mid:s6@test".into(), Some((0, 0)), None)),
        "{replies:?}"
    );
    assert!(
        replies.contains(&(
            "mid:s6@test".into(),
            Some((2, 3)),
            Some(FaultCode::GroupAborted)
        )),
        "{replies:?}"
    );
    assert_eq!(
        delivered(&app).await,
        vec![("mid:s6@test".to_owned(), Some(0))]
    );
    app.stop().await;
}

// 7. Expired on arrival: not delivered; InvalidExpiryTime by the reply pattern.
#[tokio::test]
async fn s07_expired_on_arrival() {
    for version in BOTH {
        let app = spawn_app().await;
        let mut m = msg(&app, "mid:s7@test");
        m.expiry = app.clock.now_utc() - Duration::seconds(1);
        let answer = app.send(version, m.xml(version)).await;
        assert_eq!(
            answer.status,
            if version == SoapVersion::Soap12 {
                400
            } else {
                500
            }
        );
        assert_eq!(fault_of(&answer), Some(FaultCode::InvalidExpiryTime));
        assert!(delivered(&app).await.is_empty());
        app.stop().await;
    }
}

// 8. Group expiry: after groupExpiryTime a later message of the group is refused.
#[tokio::test]
async fn s08_group_expiry() {
    let app = spawn_app().await;
    let mut base = msg(&app, "mid:s8@test");
    base.limit = Some(GroupLimit::ExpiryTime(
        app.clock.now_utc() + Duration::minutes(10),
    ));
    base.expiry = app.clock.now_utc() + Duration::minutes(10);
    let v = SoapVersion::Soap11;
    assert_eq!(app.send(v, base.clone().n(0).xml(v)).await.status, 200);
    app.clock.advance(Duration::minutes(11));
    let mut late = base.clone().n(1);
    late.expiry = app.clock.now_utc() + Duration::minutes(10);
    let answer = app.send(v, late.xml(v)).await;
    assert_eq!(
        fault_of(&answer),
        Some(FaultCode::GroupAborted),
        "{}",
        answer.body
    );
    assert_eq!(delivered(&app).await.len(), 1);
    app.stop().await;
}

// 9. Malformed requests: the exact fault code and where it travels.
#[tokio::test]
async fn s09_malformed_requests() {
    for version in BOTH {
        let app = spawn_app().await;
        let (env_ns, mu) = match version {
            SoapVersion::Soap11 => ("http://schemas.xmlsoap.org/soap/envelope/", "1"),
            SoapVersion::Soap12 => ("http://www.w3.org/2003/05/soap-envelope", "true"),
        };
        let wrap = |request: &str| {
            format!(
                r#"<s:Envelope xmlns:s="{env_ns}" xmlns:r="http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd"><s:Header><r:Request s:mustUnderstand="{mu}">{request}</r:Request></s:Header><s:Body/></s:Envelope>"#
            )
        };
        let exp = format!(
            "<r:ExpiryTime>{}</r:ExpiryTime>",
            super::support::xs(app.clock.now_utc() + Duration::hours(1))
        );
        let cases = [
            // Missing ExpiryTime: identified, Response pattern → SOAP Fault + wsrm:Response.
            (
                r#"<r:MessageId groupId="mid:m1"/><r:ReplyPattern><r:Value>Response</r:Value></r:ReplyPattern>"#.to_owned(),
                FaultCode::InvalidRequest,
                true,
            ),
            // Children reordered.
            (
                format!(
                    r#"{exp}<r:MessageId groupId="mid:m2"/><r:ReplyPattern><r:Value>Response</r:Value></r:ReplyPattern>"#
                ),
                FaultCode::InvalidRequest,
                true,
            ),
            // Lower-case Value: reply pattern unusable → SOAP Fault only.
            (
                format!(
                    r#"<r:MessageId groupId="mid:m3"/>{exp}<r:ReplyPattern><r:Value>callback</r:Value></r:ReplyPattern>"#
                ),
                FaultCode::InvalidReplyPattern,
                false,
            ),
            // Unparseable groupId → SOAP Fault only.
            (
                format!(
                    r#"<r:MessageId groupId="mid:%zz"/>{exp}<r:ReplyPattern><r:Value>Response</r:Value></r:ReplyPattern>"#
                ),
                FaultCode::InvalidMessageId,
                false,
            ),
        ];
        for (request, code, with_header) in cases {
            let answer = app.send(version, wrap(&request)).await;
            let expected_status = if version == SoapVersion::Soap12 {
                400
            } else {
                500
            };
            assert_eq!(answer.status, expected_status, "{request}\n{}", answer.body);
            assert!(
                answer.body.contains(&format!("wsrm:{code}")),
                "{code}: {}",
                answer.body
            );
            assert_eq!(
                fault_of(&answer).is_some(),
                with_header,
                "{request}\n{}",
                answer.body
            );
            let env = answer.envelope();
            assert_eq!(
                env.body.root.map(|r| r.local_name),
                Some("Fault".to_owned())
            );
        }
        assert!(delivered(&app).await.is_empty());
        app.stop().await;
    }
}

// 10. Parameter conflicts → InvalidMessageParameters.
#[tokio::test]
async fn s10_parameter_conflicts() {
    let app = spawn_app().await;
    let v = SoapVersion::Soap11;
    // MessageOrder without SequenceNum (the codec refuses it).
    let unordered_singleton = msg(&app, "mid:s10a@test").ordered();
    let answer = app.send(v, unordered_singleton.xml(v)).await;
    assert_eq!(
        fault_of(&answer),
        Some(FaultCode::InvalidMessageParameters),
        "{}",
        answer.body
    );
    // Both group limits.
    let both = msg(&app, "mid:s10b@test").n(0).xml(v).replace(
        r#"number="0""#,
        r#"number="0" groupExpiryTime="2099-01-01T00:00:00Z" groupMaxIdleDuration="PT1M""#,
    );
    let answer = app.send(v, both).await;
    assert_eq!(
        fault_of(&answer),
        Some(FaultCode::InvalidMessageParameters),
        "{}",
        answer.body
    );
    // Parameters differing within a group.
    let base = msg(&app, "mid:s10c@test");
    assert_eq!(app.send(v, base.clone().n(0).xml(v)).await.status, 200);
    let mut differs = base.clone().n(1);
    differs.dup = false;
    let answer = app.send(v, differs.xml(v)).await;
    assert_eq!(
        fault_of(&answer),
        Some(FaultCode::InvalidMessageParameters),
        "{}",
        answer.body
    );
    assert_eq!(delivered(&app).await.len(), 1);
    app.stop().await;
}

// 11. A channel that does not offer ordering: MessageOrder → FeatureNotSupported.
#[tokio::test]
async fn s11_unsupported_feature() {
    use wsr_gateway::rmp::agreement::{Agreement, Feature};
    let app = spawn_app_with(|c| {
        let mut strict = Agreement::everything();
        strict.offers.retain(|f| *f != Feature::MessageOrder);
        c.channels.insert("default".into(), strict);
    })
    .await;
    let v = SoapVersion::Soap12;
    let answer = app
        .send(v, msg(&app, "mid:s11@test").ordered().n(0).xml(v))
        .await;
    assert_eq!(answer.status, 500, "processing fault: Receiver → 500");
    assert_eq!(fault_of(&answer), Some(FaultCode::FeatureNotSupported));
    assert!(delivered(&app).await.is_empty());
    app.stop().await;
}

// 14. Restart on the same store: a resend after the restart is acked, not delivered again.
#[tokio::test]
async fn s14_restart_keeps_delivered_ids() {
    let app = spawn_app().await;
    let v = SoapVersion::Soap11;
    let m = msg(&app, "mid:s14@test").n(0);
    assert_eq!(app.send(v, m.xml(v)).await.status, 200);
    let (config, clock, dir) = app.stop().await;
    let app = start(config, clock).await;
    let again = app.send(v, m.xml(v)).await;
    assert_eq!(replies_of(&again), range_ack("mid:s14@test", 0, 0));
    assert_eq!(delivered(&app).await.len(), 1);
    app.stop().await;
    drop(dir);
}

// 15. Holodeck quirks on input: zone-less dateTime, an empty Response header beside the
//     Request, a PollRequest with ReplyTo first (answered by callback).
#[tokio::test]
async fn s15_peer_quirks_tolerated() {
    let mut partner = mock_partner(vec![]).await;
    let app = spawn_app().await;
    app.register_callback(&partner.url).await;
    let v = SoapVersion::Soap11;
    let expiry = super::support::xs(app.clock.now_utc() + Duration::hours(1));
    let zoneless = expiry.trim_end_matches('Z');
    let xml = format!(
        r#"<S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/" xmlns:wsrm="http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd"><S:Header><wsrm:Request S:mustUnderstand="1"><wsrm:MessageId groupId="mid://1234@vm"/><wsrm:ExpiryTime>{zoneless}</wsrm:ExpiryTime><wsrm:ReplyPattern><wsrm:Value>Poll</wsrm:Value></wsrm:ReplyPattern><wsrm:AckRequested/><wsrm:DuplicateElimination/></wsrm:Request><wsrm:Response S:mustUnderstand="1"/></S:Header><S:Body><e:echo xmlns:e="http://example.org/echo">hi</e:echo></S:Body></S:Envelope>"#
    );
    let answer = app.send(v, xml).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    let poll = format!(
        r#"<S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/" xmlns:wsrm="http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd"><S:Header><wsrm:PollRequest S:mustUnderstand="1"><wsrm:ReplyTo><wsrm:BareURI>{}</wsrm:BareURI></wsrm:ReplyTo><wsrm:RefToMessageIds groupId="mid://1234@vm"/></wsrm:PollRequest></S:Header><S:Body/></S:Envelope>"#,
        partner.url
    );
    let polled = app.send(v, poll).await;
    assert_eq!(
        (polled.status, polled.body.as_str()),
        (202, ""),
        "answer goes by callback"
    );
    let (_, body) = partner.next_post().await;
    let posted = Answer {
        status: 200,
        content_type: Some("text/xml".into()),
        body,
    };
    assert_eq!(replies_of(&posted), ack("mid://1234@vm"));
    assert_eq!(app.inbox().await[0].topic, "default/echo");
    app.stop().await;
}

// 16. mustUnderstand "true" and "1" both accepted; a foreign header we must understand but
//     do not is refused with a MustUnderstand fault, nothing delivered.
#[tokio::test]
async fn s16_must_understand() {
    let app = spawn_app().await;
    let v = SoapVersion::Soap12;
    for (i, mu) in ["true", "1"].iter().enumerate() {
        let xml = msg(&app, &format!("mid:s16-{i}@test")).xml(v).replace(
            "mustUnderstand=\"true\"",
            &format!("mustUnderstand=\"{mu}\""),
        );
        assert_eq!(app.send(v, xml).await.status, 200);
    }
    let xml = msg(&app, "mid:s16-x@test").xml(v).replace(
        "<env:Header>",
        r#"<env:Header><sec:Security xmlns:sec="urn:sec" env:mustUnderstand="true"/>"#,
    );
    let answer = app.send(v, xml).await;
    assert_eq!(answer.status, 500);
    assert!(
        answer.body.contains("env:MustUnderstand"),
        "{}",
        answer.body
    );
    assert_eq!(delivered(&app).await.len(), 2);
    app.stop().await;
}

// A failing commit: no ack, MessageProcessingFailure; the resend after recovery is delivered
// once (acceptance 3).
#[tokio::test]
async fn failing_commit_gives_no_ack_and_the_resend_is_delivered_once() {
    for version in BOTH {
        let app = spawn_app().await;
        let m = msg(&app, "mid:commit@test").n(0);
        app.store.fail_next_commits(1);
        let failed = app.send(version, m.xml(version)).await;
        assert_eq!(failed.status, 500, "{}", failed.body);
        assert!(
            failed.body.contains("wsrm:MessageProcessingFailure"),
            "{}",
            failed.body
        );
        assert!(
            !replies_of(&failed).iter().any(|(_, _, f)| f.is_none()),
            "no ack"
        );
        assert!(delivered(&app).await.is_empty());
        let resent = app.send(version, m.xml(version)).await;
        assert_eq!(replies_of(&resent), range_ack("mid:commit@test", 0, 0));
        let again = app.send(version, m.xml(version)).await;
        assert_eq!(replies_of(&again), range_ack("mid:commit@test", 0, 0));
        assert_eq!(delivered(&app).await.len(), 1);
        app.stop().await;
    }
}

// An unknown channel is not a SOAP endpoint at all.
#[tokio::test]
async fn unknown_channel_is_404() {
    let app = spawn_app().await;
    let answer = app
        .post(
            "/wsr/nope",
            "text/xml",
            msg(&app, "mid:x").xml(SoapVersion::Soap11),
        )
        .await;
    assert_eq!(answer.status, 404);
    app.stop().await;
}

// The README's example: the envelope in examples/ is acked by a gateway configured by the
// example config (its port and database aside), as the README's first run does.
#[tokio::test]
async fn readme_example_envelope_is_acked_and_example_config_loads() {
    let path = super::support::repo_root().join("examples/gateway.toml");
    let example = wsr_gateway::Config::load(Some(&path), []).expect("example config is valid");
    assert!(example.channels.contains_key("orders"));
    assert!(example.partners.get("acme").is_some() && example.agreements.contains_key("orders"));
    let app = spawn_app_with(|c| {
        *c = wsr_gateway::Config {
            listen: c.listen,
            database: c.database.clone(),
            ..example
        }
    })
    .await;
    // As the README does: the example's ExpiryTime becomes one hour from now (every channel
    // refuses one more than 30 days ahead).
    let in_an_hour = super::support::xs(app.clock.now_utc() + Duration::hours(1));
    let xml =
        std::fs::read_to_string(super::support::repo_root().join("examples/purchase-order.xml"))
            .expect("example envelope")
            .replace("2099-12-31T23:59:59Z", &in_an_hour);
    assert!(
        xml.contains(&in_an_hour),
        "the README's substitution applies"
    );
    for _ in 0..2 {
        let answer = app
            .post("/wsr/default", "text/xml; charset=utf-8", xml.clone())
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            replies_of(&answer),
            ack("mid:example-po-0001@partner.example.org")
        );
    }
    assert_eq!(app.inbox().await.len(), 1, "the second POST is a duplicate");
    assert_eq!(app.inbox().await[0].topic, "default/PurchaseOrder");
    app.stop().await;
}

// The admin API: bearer tokens with scopes, callback endpoint registration, groups, inbox.
#[tokio::test]
async fn admin_api_requires_a_token_and_serves_groups_and_inbox() {
    use wsr_gateway::config::{ApiToken, Scope};
    let app = spawn_app_with(|c| {
        c.tokens = vec![
            ApiToken {
                secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(
                    "admin-token-0123456789",
                )),
                principal: "ops".into(),
                scopes: vec![Scope::Admin],
                topics: wsr_gateway::config::all_topics(),
            },
            ApiToken {
                secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(
                    "reader-token-0123456789",
                )),
                principal: "app".into(),
                scopes: vec![Scope::Consume],
                topics: wsr_gateway::config::all_topics(),
            },
        ]
    })
    .await;
    let get = |path: &str, token: Option<&str>| {
        let mut r = app.client.get(app.url(path));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    assert_eq!(
        get("/api/v1/groups", None).await.expect("answer").status(),
        401
    );
    assert_eq!(
        get("/api/v1/groups", Some("wrong-token-0123456789"))
            .await
            .expect("answer")
            .status(),
        401
    );
    assert_eq!(
        get("/api/v1/groups", Some("reader-token-0123456789"))
            .await
            .expect("answer")
            .status(),
        403
    );

    let v = SoapVersion::Soap11;
    assert_eq!(
        app.send(v, msg(&app, "mid:admin@test").n(0).xml(v))
            .await
            .status,
        200
    );
    let groups: serde_json::Value = get("/api/v1/groups", Some("admin-token-0123456789"))
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(groups["groups"][0]["group_id"], "mid:admin@test");
    assert_eq!(
        groups["groups"][0]["delivered"],
        serde_json::json!([[0, 0]])
    );
    let one = get(
        "/api/v1/groups/mid:admin@test",
        Some("admin-token-0123456789"),
    )
    .await
    .expect("answer");
    assert_eq!(one.status(), 200);
    assert_eq!(
        get("/api/v1/groups/mid:nope", Some("admin-token-0123456789"))
            .await
            .expect("answer")
            .status(),
        404
    );
    // The raw inbox is for operators: applications read through subscriptions.
    assert_eq!(
        get("/api/v1/inbox?after=0", Some("reader-token-0123456789"))
            .await
            .expect("answer")
            .status(),
        403
    );
    let inbox: serde_json::Value = get("/api/v1/inbox?after=0", Some("admin-token-0123456789"))
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(inbox["messages"][0]["topic"], "default/Order");

    let post = |body: serde_json::Value| {
        app.client
            .post(app.url("/api/v1/callback-endpoints"))
            .bearer_auth("admin-token-0123456789")
            .json(&body)
            .send()
    };
    assert_eq!(
        post(serde_json::json!({"url": "ftp://x"}))
            .await
            .expect("answer")
            .status(),
        400
    );
    assert_eq!(
        post(serde_json::json!({"url": "http://127.0.0.1:9/cb"}))
            .await
            .expect("answer")
            .status(),
        201
    );
    assert_eq!(
        post(serde_json::json!({"url": "http://127.0.0.1:9/cb"}))
            .await
            .expect("answer")
            .status(),
        200
    );
    let listed: serde_json::Value =
        get("/api/v1/callback-endpoints", Some("admin-token-0123456789"))
            .await
            .expect("answer")
            .json()
            .await
            .expect("json");
    assert_eq!(
        listed["endpoints"],
        serde_json::json!(["http://127.0.0.1:9/cb"])
    );
    let removed = app
        .client
        .delete(app.url("/api/v1/callback-endpoints?url=http://127.0.0.1:9/cb"))
        .bearer_auth("admin-token-0123456789")
        .send()
        .await
        .expect("answer");
    assert_eq!(removed.status(), 204);
    app.stop().await;
}

/// The body limit over HTTP: a message of exactly the limit is read and answered by the codec's
/// own rules; one announcing more than the limit is refused with 413 before it is read.
#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_and_one_at_the_limit_is_read() {
    let app = spawn_app_with(|c| c.limits.max_bytes = 4096).await;
    let big = "x".repeat(5000);
    let answer = app
        .post("/wsr/default", "text/xml; charset=utf-8", big)
        .await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    let m = msg(&app, "mid:limit@test");
    let xml = m.xml(SoapVersion::Soap11);
    assert!(xml.len() < 4096);
    let answer = app.send(SoapVersion::Soap11, xml).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(app.inbox().await.len(), 1);
}
