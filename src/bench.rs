//! `wsr-gateway bench`: N keep-alive connections post singleton reliable messages (Response
//! pattern, AckRequested + DuplicateElimination, a 1 KiB body) to a running gateway for D
//! seconds, and report acked messages per second with latency percentiles. Only acked
//! messages count; anything else is reported as an error.

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
}

#[derive(Debug)]
pub struct BenchReport {
    pub acked: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
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
        )
    }
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the HTTP client")?;
    let run_id = Utc::now().timestamp_millis();
    let payload = format!(
        "<b:Load xmlns:b=\"urn:wsr-gateway:bench\">{}</b:Load>",
        "x".repeat(args.body_bytes.saturating_sub(50))
    );
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    let started = Instant::now();
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
                let envelope = message(run_id, worker, i, &payload);
                let sent = Instant::now();
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
    latencies.sort_unstable();
    let pick = |q: f64| -> Duration {
        if latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies[i.min(latencies.len() - 1)]
    };
    Ok(BenchReport {
        acked: latencies.len() as u64,
        errors,
        elapsed,
        p50: pick(0.50),
        p99: pick(0.99),
        max: latencies.last().copied().unwrap_or_default(),
    })
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
