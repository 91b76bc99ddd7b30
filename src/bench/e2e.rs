//! The e2e mode of `wsr-gateway bench`: a fresh shared subscription and its consumers, fetching
//! and accepting in batches, timing ingest → accept. It never sends messages to the channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};

use super::Shared;
use super::report::{Consumed, quantile};

pub(super) type Member = tokio::task::JoinHandle<(Vec<Duration>, u64)>;

/// Creates the run's subscription and starts its members; each returns the ingest→accept
/// latencies of what it accepted before the deadline, and its error count.
pub(super) async fn start_consumers(shared: &Arc<Shared>) -> anyhow::Result<Vec<Member>> {
    let args = &shared.args;
    let token = args
        .token
        .clone()
        .context("e2e needs --token (or WSR_BENCH_TOKEN) with the consume scope")?;
    let (origin, channel) = args
        .url
        .rsplit_once("/wsr/")
        .context("--url must end in /wsr/{channel}")?;
    let api = format!("{origin}/api/v1");
    let created: Value = shared
        .client
        .post(format!("{api}/subscriptions"))
        .bearer_auth(&token)
        .json(&json!({
            "name": format!("$share/bench-{}/{channel}/Load", shared.run),
            "durable": false,
            "ack_wait_ms": 60_000,
        }))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .context("cannot create the bench subscription")?
        .json()
        .await
        .context("unreadable subscription answer")?;
    let sub = created["id"].as_i64().context("no subscription id")?;
    let mut members = Vec::new();
    for _ in 0..args.consumers.max(1) {
        let joined: Value = shared
            .client
            .post(format!("{api}/subscriptions/{sub}/sessions"))
            .bearer_auth(&token)
            .json(&json!({ "ttl_ms": 30_000 }))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .context("cannot join the bench subscription")?
            .json()
            .await
            .context("unreadable join answer")?;
        let session = joined["session"]
            .as_str()
            .context("no session id")?
            .to_owned();
        let (shared, api, token) = (shared.clone(), api.clone(), token.clone());
        members.push(tokio::spawn(async move {
            consume(&shared, &api, &token, &session).await
        }));
    }
    Ok(members)
}

/// Waits for every member and sums up what they accepted.
pub(super) async fn finish(members: Vec<Member>) -> anyhow::Result<Consumed> {
    let mut e2e = Vec::new();
    let mut errors = 0;
    for m in members {
        let (l, e) = m.await.context("a consumer failed")?;
        e2e.extend(l);
        errors += e;
    }
    e2e.sort_unstable();
    Ok(Consumed {
        accepted: e2e.len() as u64,
        errors,
        p50: quantile(&e2e, 0.50),
        p99: quantile(&e2e, 0.99),
    })
}

/// One member's loop until the deadline: fetch a batch, accept it all, time what was settled.
async fn consume(shared: &Shared, api: &str, token: &str, session: &str) -> (Vec<Duration>, u64) {
    let mut latencies = Vec::new();
    let mut errors = 0u64;
    while shared.running() {
        let fetched = shared
            .client
            .post(format!("{api}/sessions/{session}/fetch"))
            .bearer_auth(token)
            .json(&json!({ "max": shared.args.batch, "wait_ms": 200 }))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        let answer: Value = match fetched {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => {
                errors += 1;
                continue;
            }
        };
        let Some(messages) = answer["messages"].as_array().filter(|m| !m.is_empty()) else {
            continue;
        };
        let settlements: Vec<Value> = messages
            .iter()
            .map(|m| json!({ "receipt": m["receipt"], "outcome": "accepted" }))
            .collect();
        let settled = shared
            .client
            .post(format!("{api}/settle"))
            .bearer_auth(token)
            .json(&json!({ "settlements": settlements }))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        let now = Instant::now();
        let Ok(settled) = settled else {
            errors += messages.len() as u64;
            continue;
        };
        let results: Value = settled.json().await.unwrap_or_default();
        let results = results["results"].as_array().cloned().unwrap_or_default();
        for (m, result) in messages.iter().zip(&results) {
            if result["settled"] != true {
                errors += 1;
                continue;
            }
            let sent = m["payload"]
                .as_str()
                .and_then(|p| p.split("t=\"").nth(1))
                .and_then(|t| t.split('"').next())
                .and_then(|t| t.parse::<u64>().ok())
                .map(|us| shared.started + Duration::from_micros(us));
            if let Some(sent) = sent
                && now <= shared.deadline
            {
                latencies.push(now.saturating_duration_since(sent));
            }
        }
    }
    (latencies, errors)
}
