//! The load loop of `wsr-gateway bench`: each worker's closed loop of one message at a time,
//! and the Response-, ordered- and Poll-pattern sends with the reading of their acks. It never
//! touches the report's formatting or the consumers of the e2e mode.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::wire::{Outcome, envelope, key, post};
use super::{Mode, Shared, callback};
use anyhow::Context as _;
use wsr_gateway::rmp::replies::items;
use wsr_gateway::wsr::read::{Limits, read_envelope};
use wsr_gateway::wsr::{
    Headers, MessageKey, PollRequest, RefToMessageIds, ReplyPattern, SeqRange, write_envelope,
};

/// Runs `workers` load loops to the end: every ack's latency (sorted), and the errors by kind.
pub(super) async fn run_workers(
    shared: &Arc<Shared>,
    workers: usize,
) -> anyhow::Result<(Vec<Duration>, BTreeMap<String, u64>)> {
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move { load(&shared, worker).await }));
    }
    let mut latencies = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        let (l, e) = t.await.context("a load worker failed")?;
        latencies.extend(l);
        for (kind, n) in e {
            *errors.entry(kind).or_default() += n;
        }
    }
    latencies.sort_unstable();
    Ok((latencies, errors))
}

/// One worker's closed loop: its latencies and its errors by kind.
async fn load(shared: &Shared, worker: usize) -> (Vec<Duration>, HashMap<String, u64>) {
    let mut latencies = Vec::new();
    let mut errors: HashMap<String, u64> = HashMap::new();
    let mut i = 0u64;
    while shared.running() {
        let outcome = match shared.args.mode {
            Mode::Ordered => send_ordered(shared, worker, i).await,
            Mode::Callback => callback::send_callback(shared, worker, i).await,
            Mode::Poll => send_poll(shared, worker, i).await,
            Mode::Response | Mode::E2e => send_response(shared, worker, i).await,
        };
        match outcome {
            Outcome::Acked(l) => {
                latencies.push(l);
                shared.acked.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            Outcome::Failed(kind) => {
                *errors.entry(kind).or_default() += 1;
                // An ordered group must not skip a number: resend the same one.
                if shared.args.mode != Mode::Ordered {
                    i += 1;
                }
            }
        }
    }
    (latencies, errors)
}

/// Whether a `wsrm:Response` in `body` acknowledges `key`: `Ok` if acked, else the error kind.
fn ack_in(body: &[u8], key: &MessageKey) -> Result<(), String> {
    let env = read_envelope(body, &Limits::default()).map_err(|_| "unreadable-answer")?;
    let Some(response) = env.response else {
        return Err(if env.body.fault.is_some() {
            "soap-fault".into()
        } else {
            "no-ack".into()
        });
    };
    for reply in &response.replies {
        for item in items(reply) {
            if item.covers(key) {
                return match item.fault {
                    None => Ok(()),
                    Some(code) => Err(format!("fault:{}", code.local_name())),
                };
            }
        }
    }
    Err("no-ack".into())
}

async fn send_and_read_ack(shared: &Shared, key: &MessageKey, xml: String) -> Outcome {
    let sent = Instant::now();
    match post(shared, xml).await {
        Ok((200, body)) => match ack_in(&body, key) {
            Ok(()) => Outcome::Acked(sent.elapsed()),
            Err(kind) => Outcome::Failed(kind),
        },
        Ok((status, _)) => Outcome::Failed(format!("http-{status}")),
        Err(kind) => Outcome::Failed(kind),
    }
}

async fn send_response(shared: &Shared, worker: usize, i: u64) -> Outcome {
    let key = key(shared, worker, i, false);
    let xml = envelope(shared, &key, ReplyPattern::Response, false);
    send_and_read_ack(shared, &key, xml).await
}

async fn send_ordered(shared: &Shared, worker: usize, i: u64) -> Outcome {
    let key = key(shared, worker, i, true);
    let xml = envelope(shared, &key, ReplyPattern::Response, true);
    send_and_read_ack(shared, &key, xml).await
}

async fn send_poll(shared: &Shared, worker: usize, i: u64) -> Outcome {
    let key = key(shared, worker, i, false);
    let sent = Instant::now();
    match post(shared, envelope(shared, &key, ReplyPattern::Poll, false)).await {
        Ok((200 | 202, _)) => {}
        Ok((status, _)) => return Outcome::Failed(format!("http-{status}")),
        Err(kind) => return Outcome::Failed(kind),
    }
    let poll = PollRequest {
        refs: vec![RefToMessageIds {
            group_id: key.group_id.clone(),
            ranges: key
                .number
                .and_then(|n| SeqRange::new(n, n))
                .into_iter()
                .collect(),
        }],
        reply_to: None,
    };
    let xml = write_envelope(
        shared.version,
        Headers {
            poll_request: Some(&poll),
            ..Headers::default()
        },
        "",
    );
    match post(shared, xml).await {
        Ok((200, body)) => match ack_in(&body, &key) {
            Ok(()) => Outcome::Acked(sent.elapsed()),
            Err(kind) => Outcome::Failed(format!("poll-{kind}")),
        },
        Ok((status, _)) => Outcome::Failed(format!("poll-http-{status}")),
        Err(kind) => Outcome::Failed(format!("poll-{kind}")),
    }
}
