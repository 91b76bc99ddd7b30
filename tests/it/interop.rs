//! Replay of the recorded Holodeck exchanges (`tests/fixtures/interop/holodeck/*.json`): every body
//! that crossed the wire — sent by the independent peer, or sent to it — is read by our codec,
//! and the fields match what each file says it shows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use wsr_gateway::wsr::datetime::format_date_time;
use wsr_gateway::wsr::{
    Defect, Envelope, FaultCode, FaultRoute, GroupLimit, Quirk, Reply, ReplyPattern, Request,
    SoapVersion, read_message,
};

use super::support::{holodeck_dir, limits};

struct Exchange {
    file: String,
    seq: u64,
    from: String,
    request_ct: Option<String>,
    request_body: String,
    request_time: DateTime<Utc>,
    response_ct: Option<String>,
    response_body: String,
}

pub(crate) fn header(v: &Value, name: &str) -> Option<String> {
    v.as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.as_str())
        .map(str::to_owned)
}

fn load() -> Vec<Exchange> {
    let dir = holodeck_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("interop transcripts at {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 40,
        "expected the full set of transcripts in {}",
        dir.display()
    );
    let mut out = Vec::new();
    for path in files {
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("read transcript"))
            .expect("transcript is JSON");
        let file = path
            .file_stem()
            .expect("stem")
            .to_string_lossy()
            .into_owned();
        for ex in doc["exchanges"].as_array().expect("exchanges") {
            let req = &ex["request"];
            let resp = &ex["response"];
            out.push(Exchange {
                file: file.clone(),
                seq: ex["seq"].as_u64().expect("seq"),
                from: ex["from"].as_str().expect("from").to_owned(),
                request_ct: header(&req["headers"], "content-type"),
                request_body: req["body"].as_str().unwrap_or("").to_owned(),
                request_time: req["time"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .expect("request time"),
                response_ct: header(&resp["headers"], "content-type"),
                response_body: resp["body"].as_str().unwrap_or("").to_owned(),
            });
        }
    }
    out
}

fn read(ct: &Option<String>, body: &str) -> Result<Envelope<'static>, Defect> {
    // Leaked on purpose: a test process is short-lived and Envelope borrows its input.
    let body: &'static str = Box::leak(body.to_owned().into_boxed_str());
    read_message(ct.as_deref(), body.as_bytes(), &limits())
}

/// The defects our profile (D4, D4a) gives the malformed recordings: code and whether only a
/// synchronous SOAP Fault can carry it. Holodeck itself accepted most of these.
fn expected_defect(file: &str, seq: u64) -> Option<(FaultCode, bool)> {
    let base = file.trim_end_matches("-soap12");
    Some(match (base, seq) {
        ("recv-malformed-both-group-limits", 1) => (FaultCode::InvalidMessageParameters, false),
        ("recv-malformed-callback-without-replyto", 1) => (FaultCode::InvalidReplyPattern, true),
        ("recv-malformed-missing-expirytime", 1) => (FaultCode::InvalidRequest, false),
        ("recv-malformed-missing-groupid", 1) => (FaultCode::InvalidMessageId, true),
        ("recv-malformed-nonnumeric-seq", 1) => (FaultCode::InvalidMessageId, true),
        ("recv-malformed-order-without-seq", 1) => (FaultCode::InvalidMessageParameters, false),
        ("recv-malformed-poll-from-gt-to", 2) => (FaultCode::InvalidPollRequest, true),
        ("recv-malformed-value-lowercase", 1) => (FaultCode::InvalidReplyPattern, true),
        _ => return None,
    })
}

#[test]
fn every_recorded_body_is_read_with_the_expected_outcome() {
    let exchanges = load();
    let mut checked = 0;
    for ex in &exchanges {
        let what = format!("{} #{} ({} request)", ex.file, ex.seq, ex.from);
        if ex.request_body.is_empty() {
            continue;
        }
        let result = read(&ex.request_ct, &ex.request_body);
        match expected_defect(&ex.file, ex.seq) {
            Some((code, synchronous)) => {
                let defect = result.expect_err(&what);
                assert_eq!(defect.code, code, "{what}: {}", defect.reason);
                assert_eq!(
                    defect.is_synchronous(),
                    synchronous,
                    "{what}: route {:?}",
                    defect.route
                );
            }
            None => {
                let env = result.unwrap_or_else(|d| panic!("{what}: {d}"));
                let expected_version = if ex.file.ends_with("-soap12") {
                    SoapVersion::Soap12
                } else {
                    SoapVersion::Soap11
                };
                // Holodeck's own sends and callbacks are SOAP 1.1 except the one 1.2 sender run.
                if ex.from == "client" || ex.file == "send-singleton-response-soap12" {
                    assert_eq!(env.version, expected_version, "{what}");
                }
                assert!(
                    env.request.is_some() || env.response.is_some() || env.poll_request.is_some(),
                    "{what}: no WS-R header read"
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 90, "only {checked} request bodies replayed");
}

#[test]
fn every_recorded_reply_body_is_read() {
    let mut checked = 0;
    for ex in load() {
        if ex.response_body.trim().is_empty() {
            continue;
        }
        let what = format!("{} #{} response", ex.file, ex.seq);
        let env =
            read(&ex.response_ct, &ex.response_body).unwrap_or_else(|d| panic!("{what}: {d}"));
        if ex.response_body.contains(":Fault") {
            let root = env.body.root.as_ref().expect("fault body");
            assert_eq!(root.local_name, "Fault", "{what}");
        }
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} reply bodies replayed");
}

/// Requests of one file, by exchange number, read successfully.
fn requests_of(file: &str) -> BTreeMap<u64, (Exchange, Envelope<'static>)> {
    load()
        .into_iter()
        .filter(|ex| ex.file == file && !ex.request_body.is_empty())
        .map(|ex| {
            let env = read(&ex.request_ct, &ex.request_body)
                .unwrap_or_else(|d| panic!("{file} #{}: {d}", ex.seq));
            (ex.seq, (ex, env))
        })
        .collect()
}

fn request<'e>(env: &'e Envelope<'_>) -> &'e Request {
    env.request.as_ref().expect("wsrm:Request")
}

fn reply_of(file: &str, seq: u64) -> Envelope<'static> {
    let ex = load()
        .into_iter()
        .find(|ex| ex.file == file && ex.seq == seq)
        .expect("exchange");
    read(&ex.response_ct, &ex.response_body).unwrap_or_else(|d| panic!("{file} #{seq}: {d}"))
}

/// The ExpiryTime we read is the instant written in the body (zone-less = UTC).
fn assert_expiry_matches_body(ex: &Exchange, r: &Request) {
    let mut written = String::new();
    format_date_time(&r.expiry_time, &mut written);
    let wire = written.trim_end_matches('Z');
    assert!(
        ex.request_body.contains(wire),
        "{} #{}: {wire}",
        ex.file,
        ex.seq
    );
}

#[test]
fn singleton_response_pattern_both_versions() {
    for file in ["recv-singleton-response", "recv-singleton-response-soap12"] {
        let reqs = requests_of(file);
        let (ex, env) = &reqs[&1];
        let r = request(env);
        assert!(r.message_id.group_id.as_str().starts_with("mid:single-"));
        assert_eq!(r.message_id.sequence, None);
        assert_eq!(r.reply_pattern, ReplyPattern::Response);
        assert!(r.ack_requested && r.duplicate_elimination && !r.message_order);
        assert_expiry_matches_body(ex, r);
        assert_eq!(
            env.body.root.as_ref().map(|b| b.local_name.as_str()),
            Some("echo")
        );
        assert!(env.body.content.contains("hello singleton"));
        // Holodeck's multipart reply acknowledges that very group.
        let reply = reply_of(file, 1);
        let response = reply.response.expect("ack header");
        assert_eq!(
            response.replies,
            vec![Reply::NonSequence {
                group_id: r.message_id.group_id.clone(),
                fault: None
            }]
        );
        assert_eq!(
            reply.body.root.as_ref().map(|b| b.local_name.as_str()),
            Some("echoResponse")
        );
    }
}

#[test]
fn duplicates_carry_the_same_identity() {
    for file in ["recv-duplicate-response", "recv-duplicate-response-soap12"] {
        let reqs = requests_of(file);
        let key = |seq: u64| request(&reqs[&seq].1).key();
        assert_eq!(key(1), key(2));
        assert_eq!(key(2), key(3));
        assert_eq!(key(1).number, None);
        assert_eq!(key(4).number, Some(0));
        assert_eq!(key(4), key(5));
        assert_ne!(key(1).group_id, key(4).group_id);
    }
}

#[test]
fn ordered_groups_and_their_acks() {
    for file in ["recv-ordered-group", "recv-ordered-group-soap12"] {
        let reqs = requests_of(file);
        for (seq, number) in [(1, 0), (2, 1), (3, 2)] {
            let r = request(&reqs[&seq].1);
            let s = r.message_id.sequence.as_ref().expect("SequenceNum");
            assert_eq!(s.number, number);
            assert!(r.message_order && r.ack_requested && r.duplicate_elimination);
            assert!(
                matches!(s.group_limit, Some(GroupLimit::MaxIdleDuration(_))),
                "{file}"
            );
            let reply = reply_of(file, seq);
            match &reply.response.expect("ack").replies[..] {
                [Reply::Sequence { group_id, ranges }] => {
                    assert_eq!(group_id, &r.message_id.group_id);
                    assert_eq!(ranges.len(), 1);
                    assert_eq!(
                        (ranges[0].range.from(), ranges[0].range.to()),
                        (number, number)
                    );
                    assert_eq!(ranges[0].fault, None);
                }
                other => panic!("{file} #{seq}: {other:?}"),
            }
        }
    }
}

#[test]
fn ordered_gap_and_the_patched_range_poll() {
    let reqs = requests_of("recv-ordered-gap-patched");
    let numbers: Vec<u64> = (1..=4)
        .map(|seq| request(&reqs[&seq].1).key().number.expect("number"))
        .collect();
    assert_eq!(numbers, vec![0, 2, 1, 2]);
    let poll = reqs[&5].1.poll_request.as_ref().expect("PollRequest");
    assert_eq!(poll.refs.len(), 1);
    assert_eq!(
        poll.refs[0].group_id,
        request(&reqs[&1].1).message_id.group_id
    );
    assert_eq!(
        poll.refs[0]
            .ranges
            .iter()
            .map(|r| (r.from(), r.to()))
            .collect::<Vec<_>>(),
        vec![(0, 2)]
    );
    match &reply_of("recv-ordered-gap-patched", 5)
        .response
        .expect("answer")
        .replies[..]
    {
        [Reply::Sequence { ranges, .. }] => {
            assert_eq!((ranges[0].range.from(), ranges[0].range.to()), (0, 1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn group_with_last_and_beyond() {
    let reqs = requests_of("recv-group-last");
    for seq in 1..=5 {
        let r = request(&reqs[&seq].1);
        let s = r.message_id.sequence.as_ref().expect("SequenceNum");
        assert_eq!(s.number, seq - 1);
        assert_eq!(s.last, seq == 3, "only number 2 is last");
        assert!(matches!(s.group_limit, Some(GroupLimit::ExpiryTime(_))));
    }
}

#[test]
fn callback_requests_and_holodecks_callback_posts() {
    let reqs = requests_of("recv-callback");
    let r = request(&reqs[&1].1);
    match &r.reply_pattern {
        ReplyPattern::Callback(to) => assert_eq!(to.uri, "http://127.0.0.1:9090/wsr/callback"),
        other => panic!("{other:?}"),
    }
    for seq in [2, 6, 7] {
        let (ex, env) = &reqs[&seq];
        assert_eq!(ex.from, "peer");
        assert!(
            ex.request_ct
                .as_deref()
                .is_some_and(|ct| ct.starts_with("multipart/related"))
        );
        assert_eq!(
            env.version,
            SoapVersion::Soap11,
            "Holodeck calls back in SOAP 1.1"
        );
        let replies = &env.response.as_ref().expect("ack").replies;
        assert_eq!(replies.len(), 1, "one ack per callback POST");
        assert_eq!(env.body.content, "");
    }
}

#[test]
fn poll_pattern_requests_and_answers() {
    for file in ["recv-poll", "recv-poll-soap12"] {
        let reqs = requests_of(file);
        for seq in 1..=3 {
            assert_eq!(request(&reqs[&seq].1).reply_pattern, ReplyPattern::Poll);
        }
        let singleton = request(&reqs[&1].1).message_id.group_id.clone();
        let poll = |seq: u64| reqs[&seq].1.poll_request.clone().expect("PollRequest");
        assert_eq!(poll(4).refs.len(), 1);
        assert_eq!(poll(4).refs[0].group_id, singleton);
        assert!(poll(4).refs[0].ranges.is_empty());
        let ranges = |seq: u64| {
            poll(seq).refs[0]
                .ranges
                .iter()
                .map(|r| (r.from(), r.to()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ranges(6), vec![(0, 1)]);
        assert_eq!(ranges(7), vec![(5, 9)]);
        assert_eq!(poll(8).refs.len(), 2);
        // A PollRequest piggy-backed on a business request keeps the business body.
        let piggy = &reqs[&9].1;
        assert!(piggy.request.is_none());
        assert_eq!(
            piggy.body.root.as_ref().map(|b| b.local_name.as_str()),
            Some("echo")
        );
        // Holodeck's answer for an unknown singleton is an empty wsrm:Response: no information.
        let unknown = reply_of(file, 5);
        assert_eq!(unknown.response.expect("header").replies, vec![]);
        assert!(unknown.quirks.contains(&Quirk::EmptyResponse));
    }
}

#[test]
fn expired_recordings_read_with_their_real_times() {
    let reqs = requests_of("recv-expired");
    for seq in [1, 2] {
        let (ex, env) = &reqs[&seq];
        let r = request(env);
        assert!(r.expiry_time < ex.request_time, "already expired when sent");
        assert_expiry_matches_body(ex, r);
    }
}

#[test]
fn a_number_above_32_bits_is_a_valid_unsigned_long() {
    for file in ["recv-malformed-huge-seq", "recv-malformed-huge-seq-soap12"] {
        let reqs = requests_of(file);
        assert_eq!(request(&reqs[&1].1).key().number, Some(4_294_967_296));
    }
}

#[test]
fn malformed_recordings_route_by_what_can_be_recovered() {
    let ex = load()
        .into_iter()
        .find(|ex| ex.file == "recv-malformed-order-without-seq" && ex.seq == 1)
        .expect("exchange");
    let defect = read(&ex.request_ct, &ex.request_body).expect_err("defect");
    match defect.route {
        FaultRoute::ReplyPattern { key, reply } => {
            assert_eq!(key.number, None);
            assert!(key.group_id.as_str().starts_with("mid:"));
            assert_eq!(reply, ReplyPattern::Response);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn holodeck_as_sender_mid_slash_slash_zoneless_multipart() {
    for file in [
        "send-singleton-response",
        "send-ordered-group-patched",
        "send-callback",
        "send-poll",
    ] {
        let reqs = requests_of(file);
        let (ex, env) = &reqs[&1];
        assert_eq!(ex.from, "peer");
        let r = request(env);
        assert!(
            r.message_id.group_id.as_str().starts_with("mid://"),
            "{file}"
        );
        assert!(env.quirks.contains(&Quirk::ZonelessDateTime), "{file}");
        assert_expiry_matches_body(ex, r);
    }
    let ordered = requests_of("send-ordered-group-patched");
    for seq in 1..=3 {
        let r = request(&ordered[&seq].1);
        assert_eq!(r.key().number, Some(seq - 1));
        assert!(r.message_order);
        assert!(matches!(
            r.message_id
                .sequence
                .as_ref()
                .and_then(|s| s.group_limit.as_ref()),
            Some(GroupLimit::ExpiryTime(_))
        ));
    }
    let callback = requests_of("send-callback");
    assert!(matches!(
        request(&callback[&1].1).reply_pattern,
        ReplyPattern::Callback(_)
    ));
    let ack = callback[&2].1.response.as_ref().expect("our callback ack");
    assert_eq!(ack.replies.len(), 1);
    let polls = requests_of("send-poll");
    for seq in [2, 3] {
        let poll = polls[&seq]
            .1
            .poll_request
            .as_ref()
            .expect("Holodeck's PollRequest");
        assert_eq!(
            poll.refs[0].group_id,
            request(&polls[&1].1).message_id.group_id
        );
    }
}

/// Every request Holodeck sent as a sending RMP (`send-*.json`), replayed against our
/// receiver on a clock set to the recording's time: accepted, answered as a conforming
/// receiver answers (README of the transcripts), each message delivered exactly once.
#[tokio::test]
async fn holodeck_as_sender_is_answered_by_our_receiver() {
    use super::support::spawn_app_at;
    use wsr_gateway::wsr::Reply as R;

    let exchanges = load();
    let files: std::collections::BTreeSet<String> = exchanges
        .iter()
        .filter(|e| e.file.starts_with("send-"))
        .map(|e| e.file.clone())
        .collect();
    assert!(
        files.len() >= 11,
        "all send-* transcripts present: {files:?}"
    );
    for file in files {
        // The clock starts at the recording's time: the housekeeping pass must not see a
        // "now" years after the messages it is sent (a purge by age would then be right).
        let first = exchanges
            .iter()
            .filter(|e| e.file == file)
            .map(|e| e.request_time)
            .min()
            .expect("a transcript has exchanges");
        let app = spawn_app_at(first).await;
        app.register_callback("http://127.0.0.1:8081/axis2/services/wsrm")
            .await;
        let mut keys = std::collections::BTreeSet::new();
        for ex in exchanges
            .iter()
            .filter(|e| e.file == file && e.from == "peer")
        {
            app.clock.set(ex.request_time);
            let ct = ex.request_ct.clone().expect("content type");
            let answer = app.post("/wsr/default", &ct, ex.request_body.clone()).await;
            let what = format!("{file} #{}", ex.seq);
            let sent =
                read(&ex.request_ct, &ex.request_body).unwrap_or_else(|d| panic!("{what}: {d}"));
            if let Some(request) = &sent.request {
                keys.insert(request.key());
                match request.reply_pattern {
                    ReplyPattern::Response => {
                        assert_eq!(answer.status, 200, "{what}: {}", answer.body);
                        let acks = answer.envelope().response.expect("ack").replies;
                        let acked = acks.iter().any(|r| match (r, request.key().number) {
                            (
                                R::NonSequence {
                                    group_id,
                                    fault: None,
                                },
                                None,
                            ) => *group_id == request.message_id.group_id,
                            (R::Sequence { group_id, ranges }, Some(n)) => {
                                *group_id == request.message_id.group_id
                                    && ranges
                                        .iter()
                                        .any(|x| x.fault.is_none() && x.range.contains(n))
                            }
                            _ => false,
                        });
                        assert!(acked, "{what}: {acks:?}");
                    }
                    _ => assert_eq!((answer.status, answer.body.as_str()), (202, ""), "{what}"),
                }
            }
            if let Some(poll) = &sent.poll_request {
                assert_eq!(answer.status, 200, "{what}: {}", answer.body);
                let acks = answer.envelope().response.expect("poll answer").replies;
                for r in &poll.refs {
                    let found = acks.iter().any(|a| matches!(a, R::NonSequence { group_id, fault: None } if *group_id == r.group_id));
                    assert!(found, "{what}: {acks:?}");
                }
            }
        }
        let inbox = app.inbox().await;
        assert_eq!(
            inbox.len(),
            keys.len(),
            "{file}: each message delivered exactly once"
        );
        app.stop().await;
    }
}

/// Every reply the independent peer sent (`recv-*.json`: its HTTP answers and its callback
/// POSTs) is read by our sending side's reply reader into the right outcome: acks for the
/// messages it names, nothing from an empty `wsrm:Response` or a generic SOAP Fault (which
/// means "resend").
#[test]
fn holodeck_replies_are_read_into_ack_and_fault_outcomes() {
    use wsr_gateway::outbound::sender::read_answer;

    let mut replies_read = 0;
    for ex in load().into_iter().filter(|e| e.file.starts_with("recv-")) {
        let what = format!("{} #{}", ex.file, ex.seq);
        // Holodeck's callback POSTs are replies too.
        let (ct, body) = if ex.from == "peer" {
            (ex.request_ct.clone(), ex.request_body.clone())
        } else {
            (ex.response_ct.clone(), ex.response_body.clone())
        };
        if body.trim().is_empty() {
            continue;
        }
        let answer = read_answer(ct.as_deref(), body.as_bytes());
        assert_eq!(
            answer.fault, None,
            "{what}: Holodeck's faults carry no WS-R code"
        );
        let replies = answer.replies;
        let items: Vec<_> = replies
            .iter()
            .flat_map(wsr_gateway::rmp::replies::items)
            .collect();
        let stated = body.matches("NonSequenceReply").count() + body.matches("ReplyRange").count();
        assert_eq!(items.len(), stated, "{what}: every reply element read");
        assert!(
            items.iter().all(|i| i.fault.is_none()),
            "{what}: Holodeck never sent a fault attribute"
        );
        if body.contains(":Fault") {
            assert!(
                items.is_empty(),
                "{what}: a generic SOAP Fault acks nothing"
            );
        }
        // A Response-pattern request answered with a header: that very message is acked.
        if ex.from == "client"
            && !items.is_empty()
            && let Ok(env) = read(&ex.request_ct, &ex.request_body)
            && let Some(request) = env.request
        {
            let key = request.key();
            let acked = items.iter().any(|i| {
                i.group_id == key.group_id
                    && match (i.range, key.number) {
                        (None, None) => true,
                        (Some(r), Some(n)) => r.contains(n),
                        _ => false,
                    }
            });
            assert!(acked, "{what}: the answer acks the request it answers");
        }
        replies_read += 1;
    }
    assert!(replies_read >= 30, "only {replies_read} replies read");
}

/// A fresh clone tests with nothing beside it: the transcripts are part of the checkout.
#[test]
fn transcripts_live_inside_the_checkout() {
    let dir = holodeck_dir();
    assert!(dir.starts_with(super::support::repo_root()));
    assert!(
        !dir.components()
            .any(|c| c == std::path::Component::ParentDir),
        "{} reaches outside the checkout",
        dir.display()
    );
    assert!(dir.join("README.md").is_file(), "{}", dir.display());
}
