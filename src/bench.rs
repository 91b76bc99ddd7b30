//! `wsr-gateway bench`: N keep-alive connections post singleton reliable messages (Response
//! pattern, AckRequested + DuplicateElimination, a 1 KiB body) to a running gateway for D
//! seconds, and report acked messages per second with latency percentiles. Only acked
//! messages count; anything else is reported as an error.
//!
//! Mode `e2e` adds consumers: a fresh ephemeral subscription on the channel's `Load` topic,
//! K members fetching batches and accepting each message (batched settles), and reports the
//! accepted messages per second with ingest→accept latency percentiles.

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;

use crate::wsr::{GroupId, Headers, MessageId, ReplyPattern, Request, SoapVersion, write_envelope};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The channel URL to load.
    #[arg(long, default_value = "http://127.0.0.1:8080/wsr/default")]
    pub url: String,
    /// Concurrent keep-alive connections.
    #[arg(long, short = 'c', default_value_t = 64)]
    pub connections: usize,
    /// Seconds to run.
    #[arg(long, short = 'd', default_value_t = 10)]
    pub duration: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub body_bytes: usize,
    /// `response`: ingest only; `e2e`: ingest → fetch → accept.
    #[arg(long, value_enum, default_value_t = Mode::Response)]
    pub mode: Mode,
    /// e2e: a bearer token with the `consume` scope.
    #[arg(long, env = "WSR_BENCH_TOKEN")]
    pub token: Option<String>,
    /// e2e: consumer sessions (members of one shared subscription).
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// e2e: messages per fetch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Response,
    E2e,
}

#[derive(Debug)]
pub struct BenchReport {
    pub acked: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// e2e: what the consumers accepted within the run.
    pub consumed: Option<Consumed>,
}

#[derive(Debug)]
pub struct Consumed {
    pub accepted: u64,
    pub errors: u64,
    /// Ingest (POST sent) → accept answered.
    pub p50: Duration,
    pub p99: Duration,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        write!(
            f,
            "acked {} messages in {:.1} s: {:.0} msgs/s; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} errors",
            self.acked,
            secs,
            self.acked as f64 / secs,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3,
            self.errors
        )?;
        if let Some(c) = &self.consumed {
            write!(
                f,
                "\nend to end: accepted {} messages in {:.1} s: {:.0} msgs/s; ingest→accept p50 {:.2} ms, p99 {:.2} ms; {} errors",
                c.accepted,
                secs,
                c.accepted as f64 / secs,
                c.p50.as_secs_f64() * 1e3,
                c.p99.as_secs_f64() * 1e3,
                c.errors
            )?;
        }
        Ok(())
    }
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the HTTP client")?;
    let run_id = Utc::now().timestamp_millis();
    let payload = "x".repeat(args.body_bytes.saturating_sub(80));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let consumers = match args.mode {
        Mode::Response => None,
        Mode::E2e => Some(start_consumers(&client, args, run_id, started, deadline).await?),
    };
    let mut workers = Vec::new();
    for worker in 0..args.connections.max(1) {
        let client = client.clone();
        let url = args.url.clone();
        let payload = payload.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let sent = Instant::now();
                let body = format!(
                    "<b:Load xmlns:b=\"urn:wsr-gateway:bench\" t=\"{}\">{payload}</b:Load>",
                    sent.duration_since(started).as_micros()
                );
                let envelope = message(run_id, worker, i, &body);
                let answer = client
                    .post(&url)
                    .header("Content-Type", SoapVersion::Soap11.content_type())
                    .body(envelope)
                    .send()
                    .await;
                let acked = match answer {
                    Ok(r) if r.status().is_success() => r.text().await.is_ok_and(|body| {
                        body.contains("NonSequenceReply") && !body.contains("fault=")
                    }),
                    _ => false,
                };
                if acked {
                    latencies.push(sent.elapsed());
                } else {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (l, e) = w.await.context("a load worker failed")?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed();
    let consumed = match consumers {
        None => None,
        Some(members) => {
            let mut e2e = Vec::new();
            let mut errors = 0;
            for m in members {
                let (l, e) = m.await.context("a consumer failed")?;
                e2e.extend(l);
                errors += e;
            }
            e2e.sort_unstable();
            Some(Consumed {
                accepted: e2e.len() as u64,
                errors,
                p50: quantile(&e2e, 0.50),
                p99: quantile(&e2e, 0.99),
            })
        }
    };
    latencies.sort_unstable();
    Ok(BenchReport {
        acked: latencies.len() as u64,
        errors,
        elapsed,
        p50: quantile(&latencies, 0.50),
        p99: quantile(&latencies, 0.99),
        max: latencies.last().copied().unwrap_or_default(),
        consumed,
    })
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

type Member = tokio::task::JoinHandle<(Vec<Duration>, u64)>;

/// Creates the run's subscription and starts its members; each returns the ingest→accept
/// latencies of what it accepted before `deadline`, and its error count.
async fn start_consumers(
    client: &reqwest::Client,
    args: &BenchArgs,
    run_id: i64,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<Vec<Member>> {
    let token = args
        .token
        .clone()
        .context("e2e needs --token (or WSR_BENCH_TOKEN) with the consume scope")?;
    let (origin, channel) = args
        .url
        .rsplit_once("/wsr/")
        .context("--url must end in /wsr/{channel}")?;
    let api = format!("{origin}/api/v1");
    let created: serde_json::Value = client
        .post(format!("{api}/subscriptions"))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "name": format!("$share/bench-{run_id}/{channel}/Load"),
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
        let joined: serde_json::Value = client
            .post(format!("{api}/subscriptions/{sub}/sessions"))
            .bearer_auth(&token)
            .json(&serde_json::json!({ "ttl_ms": 30_000 }))
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
        let (client, api, token, batch) = (client.clone(), api.clone(), token.clone(), args.batch);
        members.push(tokio::spawn(async move {
            consume(&client, &api, &token, &session, batch, started, deadline).await
        }));
    }
    Ok(members)
}

async fn consume(
    client: &reqwest::Client,
    api: &str,
    token: &str,
    session: &str,
    batch: usize,
    started: Instant,
    deadline: Instant,
) -> (Vec<Duration>, u64) {
    let mut latencies = Vec::new();
    let mut errors = 0u64;
    while Instant::now() < deadline {
        let fetched = client
            .post(format!("{api}/sessions/{session}/fetch"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "max": batch, "wait_ms": 200 }))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        let answer: serde_json::Value = match fetched {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => {
                errors += 1;
                continue;
            }
        };
        let Some(messages) = answer["messages"].as_array().filter(|m| !m.is_empty()) else {
            continue;
        };
        let settlements: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!({ "receipt": m["receipt"], "outcome": "accepted" }))
            .collect();
        let settled = client
            .post(format!("{api}/settle"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "settlements": settlements }))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        let now = Instant::now();
        let Ok(settled) = settled else {
            errors += messages.len() as u64;
            continue;
        };
        let results: serde_json::Value = settled.json().await.unwrap_or_default();
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
                .map(|us| started + Duration::from_micros(us));
            if let Some(sent) = sent {
                if now <= deadline {
                    latencies.push(now.saturating_duration_since(sent));
                }
            }
        }
    }
    (latencies, errors)
}

fn message(run: i64, worker: usize, i: u64, payload: &str) -> String {
    let group = format!("mid:bench-{run}-{worker}-{i}@wsr-gateway");
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(&group).unwrap_or_else(|_| unreachable!("a valid anyURI")),
            sequence: None,
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: ReplyPattern::Response,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    write_envelope(
        SoapVersion::Soap11,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        payload,
    )
}
