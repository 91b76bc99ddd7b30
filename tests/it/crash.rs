//! Crash safety with a real child process (acceptance of the receiver issue): 1 000 messages
//! over 20 groups (ordered and not; Response, Callback and Poll), resends included, while the
//! gateway is SIGKILLed at random moments and restarted on the same file. Afterwards every
//! acked message is in the inbox exactly once, ordered groups in order, and no ack was ever
//! seen for a message missing from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, ReceiverStore as _};

use chrono::Utc;
use wsr_gateway::wsr::{
    GroupId, Headers, Limits, MessageId, MessageKey, RefToMessageIds, Reply, ReplyPattern, ReplyTo,
    Request, SeqRange, SequenceNum, SoapVersion, read_message, write_envelope,
};

use super::support::{mock_partner, start_gateway};

const GROUPS: u64 = 20;
const PER_GROUP: u64 = 50;
const KILLS: usize = 7;

type Acked = Arc<Mutex<BTreeSet<MessageKey>>>;

/// A tiny deterministic generator for kill moments and resend choices.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn message(group: u64, n: u64, reply: &ReplyPattern) -> (MessageKey, String) {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(&format!("mid:crash-{group}@test")).expect("group"),
            sequence: Some(SequenceNum {
                number: n,
                last: n == PER_GROUP - 1,
                group_limit: None,
            }),
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: reply.clone(),
        ack_requested: true,
        duplicate_elimination: true,
        message_order: group < GROUPS / 2,
    };
    let body = format!("<c:Item xmlns:c=\"urn:crash\">{group}/{n}</c:Item>");
    let xml = write_envelope(
        SoapVersion::Soap11,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        &body,
    );
    (request.key(), xml)
}

fn acks_in(body: &str, ct: Option<&str>) -> Vec<MessageKey> {
    let Ok(env) = read_message(ct, body.as_bytes(), &Limits::default()) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for reply in env.response.map(|r| r.replies).unwrap_or_default() {
        match reply {
            Reply::NonSequence {
                group_id,
                fault: None,
            } => keys.push(MessageKey {
                group_id,
                number: None,
            }),
            Reply::Sequence { group_id, ranges } => {
                for r in ranges.iter().filter(|r| r.fault.is_none()) {
                    for n in r.range.from()..=r.range.to().min(r.range.from() + PER_GROUP) {
                        keys.push(MessageKey {
                            group_id: group_id.clone(),
                            number: Some(n),
                        });
                    }
                }
            }
            Reply::NonSequence { .. } => {}
        }
    }
    keys
}

fn poll_xml(key: &MessageKey) -> String {
    let number = key.number.expect("sequenced");
    super::support::poll_envelope(vec![RefToMessageIds {
        group_id: key.group_id.clone(),
        ranges: vec![SeqRange::single(number)],
    }])
}

/// Sends one group's messages in order, each until an ack for it is seen.
async fn send_group(group: u64, url: String, callback: String, acked: Acked, seed: u64) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let reply = match group % 3 {
        0 => ReplyPattern::Response,
        1 => ReplyPattern::Callback(ReplyTo::bare(&callback)),
        _ => ReplyPattern::Poll,
    };
    let mut rng = XorShift(seed);
    for n in 0..PER_GROUP {
        let (key, xml) = message(group, n, &reply);
        let mut sends = 0;
        loop {
            sends += 1;
            let answer = client
                .post(&url)
                .header("Content-Type", "text/xml; charset=utf-8")
                .body(xml.clone())
                .send()
                .await;
            if let Ok(r) = answer {
                let ct = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                if let Ok(body) = r.text().await {
                    let seen = acks_in(&body, ct.as_deref());
                    acked.lock().expect("lock").extend(seen);
                }
            }
            if matches!(reply, ReplyPattern::Poll)
                && let Ok(r) = client
                    .post(&url)
                    .header("Content-Type", "text/xml")
                    .body(poll_xml(&key))
                    .send()
                    .await
                && let Ok(body) = r.text().await
            {
                acked
                    .lock()
                    .expect("lock")
                    .extend(acks_in(&body, Some("text/xml")));
            }
            let done = acked.lock().expect("lock").contains(&key);
            // Now and then resend an acked message anyway: it must not be delivered again.
            if done && (sends > 1 || !rng.next().is_multiple_of(10)) {
                break;
            }
            // Not acked yet (gateway down, callback pending): resend shortly.
            tokio::time::sleep(Duration::from_millis(if done { 0 } else { 40 })).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_and_doubles_nothing() {
    let started = Instant::now();
    let mut partner = mock_partner(vec![]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = super::support::free_port();
    let config = dir.path().join("gw.toml");
    let database = super::support::fresh_database(dir.path(), "gw.db").await;
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\nhold_ms = 0\ncallback_retry_initial_ms = 50\ncallback_retry_max_ms = 200\ncallback_endpoints = [{:?}]\n",
            database.setting(),
            partner.url
        ),
    )
    .expect("config");

    let acked: Acked = Arc::new(Mutex::new(BTreeSet::new()));
    let callback_url = partner.url.clone();
    // Callback acks arrive at the mock partner.
    let from_callbacks = acked.clone();
    let collector = tokio::spawn(async move {
        while let Some((headers, body)) = partner.received.recv().await {
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            from_callbacks
                .lock()
                .expect("lock")
                .extend(acks_in(&body, ct.as_deref()));
        }
    });

    let mut child = start_gateway(&config);
    let url = format!("http://127.0.0.1:{port}/wsr/default");
    let senders: Vec<_> = (0..GROUPS)
        .map(|g| {
            let seed = 0x9E37_79B9 ^ g;
            tokio::spawn(send_group(
                g,
                url.clone(),
                callback_url.clone(),
                acked.clone(),
                seed,
            ))
        })
        .collect();

    let mut rng = XorShift(0xC0FF_EE00 ^ u64::from(port));
    let mut acked_at_kills = Vec::new();
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(100 + rng.next() % 400)).await;
        child.kill().expect("SIGKILL the gateway");
        child.wait().expect("reaped");
        acked_at_kills.push(acked.lock().expect("lock").len());
        child = start_gateway(&config);
    }
    // At least five kills must have hit the stream, not an idle gateway.
    let mid_stream = acked_at_kills
        .iter()
        .filter(|&&n| n > 0 && (n as u64) < GROUPS * PER_GROUP)
        .count();
    assert!(
        mid_stream >= 5,
        "acked counts at the kills: {acked_at_kills:?}"
    );
    for s in senders {
        tokio::time::timeout(Duration::from_secs(180), s)
            .await
            .expect("every message acked within 3 minutes")
            .expect("sender task");
    }
    child.kill().expect("stop the gateway");
    child.wait().expect("reaped");
    collector.abort();

    // Read the store as a fresh gateway would.
    let store = wsr_gateway::store::Store::open(&wsr_gateway::store::StoreConfig {
        database: database.database.clone(),
        durability: wsr_gateway::store::Durability::Full,
        policy: Default::default(),
    })
    .await
    .expect("store opens after the crashes");
    let inbox = store.inbox(0, 1_000_000).await.expect("inbox");
    let mut seen: BTreeMap<MessageKey, usize> = BTreeMap::new();
    let mut per_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in &inbox {
        let key = MessageKey {
            group_id: GroupId::parse(&e.group_id).expect("group"),
            number: e.number,
        };
        *seen.entry(key).or_default() += 1;
        per_group
            .entry(e.group_id.clone())
            .or_default()
            .push(e.number.expect("sequenced"));
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(doubled.is_empty(), "delivered twice: {doubled:?}");
    let acked = acked.lock().expect("lock").clone();
    let missing: Vec<_> = acked.iter().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "acked but not in the store: {missing:?}"
    );
    assert_eq!(
        seen.len() as u64,
        GROUPS * PER_GROUP,
        "every message delivered"
    );
    for g in 0..GROUPS / 2 {
        let numbers = &per_group[&format!("mid:crash-{g}@test")];
        assert_eq!(
            *numbers,
            (0..PER_GROUP).collect::<Vec<_>>(),
            "ordered group {g} in order"
        );
    }
    eprintln!(
        "crash test: {} messages, {KILLS} SIGKILLs (acked so far at each: {acked_at_kills:?}), {:.1} s",
        inbox.len(),
        started.elapsed().as_secs_f64()
    );
}
