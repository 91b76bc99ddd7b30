//! `wsr-gateway bench`: a closed-loop load generator for a running gateway. C workers, one
//! operation outstanding each, for D seconds; only acknowledged messages count, everything
//! else is an error by kind. Modes:
//!
//! - `response`: singletons, Response pattern (the ack is in the HTTP answer);
//! - `ordered`: G sequenced groups with MessageOrder, each sent in order by one worker;
//! - `callback`: singletons, Callback pattern; the ack arrives at our own listener;
//! - `poll`: singletons, Poll pattern; the worker polls for its ack after each send;
//! - `e2e`: `response` plus K consumers of a fresh shared subscription fetching and accepting
//!   in batches: ingest → fetch → accept.
//!
//! Messages are AckRequested + DuplicateElimination with a `--body-bytes` body; the report
//! gives acked msgs/s and p50/p99/p999 latency (`--json` for machines).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::rmp::replies::items;
use crate::wsr::read::{Limits, read_envelope};
use crate::wsr::{
    GroupId, Headers, MessageId, MessageKey, PollRequest, RefToMessageIds, ReplyPattern, ReplyTo,
    Request, SeqRange, SequenceNum, SoapVersion, write_envelope,
};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The channel URL to load.
    #[arg(long, default_value = "http://127.0.0.1:8080/wsr/default")]
    pub url: String,
    /// Concurrent workers (keep-alive connections), one message outstanding each.
    #[arg(long, short = 'c', default_value_t = 64)]
    pub connections: usize,
    /// Seconds to run.
    #[arg(long, short = 'd', default_value_t = 10)]
    pub duration: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub body_bytes: usize,
    #[arg(long, value_enum, default_value_t = Mode::Response)]
    pub mode: Mode,
    /// SOAP version of the messages: 1.1 or 1.2.
    #[arg(long, default_value = "1.1", value_parser = ["1.1", "1.2"])]
    pub soap: String,
    /// ordered: how many sequenced groups (at most one per worker; default one per worker).
    #[arg(long)]
    pub groups: Option<usize>,
    /// e2e: a bearer token with the `consume` scope; callback: one with `admin`, to register
    /// our listener as a callback endpoint (omit if it is registered already).
    #[arg(long, env = "WSR_BENCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// e2e: consumer sessions (members of one shared subscription).
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// e2e: messages per fetch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// callback: where our listener for the gateway's callback acks binds.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub callback_listen: SocketAddr,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// HTTPS: a PEM CA bundle that verifies the gateway (instead of the system roots).
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
    /// HTTPS: our client certificate chain and key (PEM), for a partner known by certificate.
    #[arg(long, requires = "client_key")]
    pub client_cert: Option<std::path::PathBuf>,
    #[arg(long, requires = "client_cert")]
    pub client_key: Option<std::path::PathBuf>,
    /// The Authorization header of every message (a partner's `Basic …` or `Bearer …`).
    #[arg(long, env = "WSR_BENCH_AUTHORIZATION", hide_env_values = true)]
    pub authorization: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Response,
    Ordered,
    Callback,
    Poll,
    E2e,
}

#[derive(Debug)]
pub struct BenchReport {
    pub mode: Mode,
    pub connections: usize,
    pub acked: u64,
    pub errors: BTreeMap<String, u64>,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
    /// e2e: what the consumers accepted within the run.
    pub consumed: Option<Consumed>,
    /// Stopped early (Ctrl-C): the figures cover the time it ran.
    pub interrupted: bool,
}

#[derive(Debug)]
pub struct Consumed {
    pub accepted: u64,
    pub errors: u64,
    /// Ingest (POST sent) → accept answered.
    pub p50: Duration,
    pub p99: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl BenchReport {
    fn rate(&self, n: u64) -> f64 {
        n as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The machine-readable form (`--json`); the comparison tool reads it.
    pub fn to_json(&self) -> Value {
        json!({
            "mode": self.mode,
            "connections": self.connections,
            "acked": self.acked,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "msgs_per_s": self.rate(self.acked),
            "p50_ms": ms(self.p50),
            "p99_ms": ms(self.p99),
            "p999_ms": ms(self.p999),
            "max_ms": ms(self.max),
            "errors": self.errors,
            "interrupted": self.interrupted,
            "e2e": self.consumed.as_ref().map(|c| json!({
                "accepted": c.accepted,
                "errors": c.errors,
                "msgs_per_s": self.rate(c.accepted),
                "p50_ms": ms(c.p50),
                "p99_ms": ms(c.p99),
            })),
        })
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errors: u64 = self.errors.values().sum();
        if self.interrupted {
            writeln!(f, "interrupted: partial results")?;
        }
        write!(
            f,
            "{:?}: acked {} messages in {:.1} s: {:.0} msgs/s; latency p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms; {} errors",
            self.mode,
            self.acked,
            self.elapsed.as_secs_f64(),
            self.rate(self.acked),
            ms(self.p50),
            ms(self.p99),
            ms(self.p999),
            ms(self.max),
            errors
        )?;
        for (kind, n) in &self.errors {
            write!(f, "\n  {kind}: {n}")?;
        }
        if let Some(c) = &self.consumed {
            write!(
                f,
                "\nend to end: accepted {} messages: {:.0} msgs/s; ingest→accept p50 {:.2} ms, p99 {:.2} ms; {} errors",
                c.accepted,
                self.rate(c.accepted),
                ms(c.p50),
                ms(c.p99),
                c.errors
            )?;
        }
        Ok(())
    }
}

/// How one attempt ended.
enum Outcome {
    Acked(Duration),
    Failed(String),
}

/// What every worker shares.
struct Shared {
    client: reqwest::Client,
    args: BenchArgs,
    version: SoapVersion,
    run: i64,
    started: Instant,
    deadline: Instant,
    /// Set by an interrupt (Ctrl-C): the workers stop as at the deadline.
    interrupted: AtomicBool,
    /// Acks so far, for the progress line.
    acked: AtomicU64,
    payload: String,
    /// callback: our ReplyTo, and the workers waiting for their ack by group id.
    callback: Option<(String, Waiters)>,
}

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<Result<(), String>>>>>;

pub async fn run(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    run_until(args, std::future::pending()).await
}

/// `run`, stopped early when `interrupt` completes (`wsr-gateway bench` passes Ctrl-C): the
/// workers finish the request they have in flight, and the report covers what ran. While it
/// runs, a progress line goes to standard error when that is a terminal.
pub async fn run_until(
    args: &BenchArgs,
    interrupt: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<BenchReport> {
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(30));
    if let Some(path) = &args.ca_file {
        let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("{} is not a PEM CA bundle", path.display()))?;
        builder = builder.tls_certs_only(roots);
    }
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        let mut pem =
            std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
        pem.extend(std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?);
        builder = builder
            .identity(reqwest::Identity::from_pem(&pem).context("not a PEM certificate and key")?);
    }
    let client = builder.build().context("cannot build the HTTP client")?;
    let version = match args.soap.as_str() {
        "1.2" => SoapVersion::Soap12,
        _ => SoapVersion::Soap11,
    };
    let workers = match args.mode {
        Mode::Ordered => args
            .groups
            .unwrap_or(args.connections)
            .clamp(1, args.connections.max(1)),
        _ => args.connections.max(1),
    };
    let callback = match args.mode {
        Mode::Callback => Some(start_callback_listener(&client, args).await?),
        _ => None,
    };
    let started = Instant::now();
    let shared = Arc::new(Shared {
        client,
        args: args.clone(),
        version,
        run: Utc::now().timestamp_millis(),
        started,
        deadline: started + Duration::from_secs(args.duration),
        interrupted: AtomicBool::new(false),
        acked: AtomicU64::new(0),
        payload: "x".repeat(args.body_bytes.saturating_sub(80)),
        callback,
    });
    let consumers = match args.mode {
        Mode::E2e => Some(start_consumers(&shared).await?),
        _ => None,
    };
    let watcher = {
        let shared = shared.clone();
        tokio::spawn(async move {
            interrupt.await;
            shared.interrupted.store(true, Ordering::SeqCst);
        })
    };
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| tokio::spawn(show_progress(shared.clone())));
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
    let elapsed = started.elapsed();
    if let Some(progress) = progress {
        progress.abort();
        eprintln!();
    }
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
    watcher.abort();
    Ok(BenchReport {
        mode: args.mode,
        connections: workers,
        acked: latencies.len() as u64,
        errors,
        elapsed,
        p50: quantile(&latencies, 0.50),
        p99: quantile(&latencies, 0.99),
        p999: quantile(&latencies, 0.999),
        max: latencies.last().copied().unwrap_or_default(),
        consumed,
        interrupted: shared.interrupted.load(Ordering::SeqCst),
    })
}

/// Once a second until aborted: elapsed time, acks so far and the rate of the last second.
async fn show_progress(shared: Arc<Shared>) {
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let acked = shared.acked.load(Ordering::Relaxed);
        eprint!(
            "\r{:>4.0} s of {}: {acked} acked, {} msgs/s   ",
            shared.started.elapsed().as_secs_f64(),
            shared.args.duration,
            acked.saturating_sub(last)
        );
        last = acked;
    }
}

impl Shared {
    /// Whether the load goes on: before the deadline, and not interrupted.
    fn running(&self) -> bool {
        Instant::now() < self.deadline && !self.interrupted.load(Ordering::Relaxed)
    }
}

/// One worker's closed loop: its latencies and its errors by kind.
async fn load(shared: &Shared, worker: usize) -> (Vec<Duration>, HashMap<String, u64>) {
    let mut latencies = Vec::new();
    let mut errors: HashMap<String, u64> = HashMap::new();
    let mut i = 0u64;
    while shared.running() {
        let outcome = match shared.args.mode {
            Mode::Ordered => send_ordered(shared, worker, i).await,
            Mode::Callback => send_callback(shared, worker, i).await,
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

fn key(shared: &Shared, worker: usize, i: u64, sequenced: bool) -> MessageKey {
    let group = if sequenced {
        format!("mid:bench-{}-g{worker}@wsr-gateway", shared.run)
    } else {
        format!("mid:bench-{}-{worker}-{i}@wsr-gateway", shared.run)
    };
    MessageKey {
        group_id: GroupId::parse(&group).unwrap_or_else(|_| unreachable!("a valid anyURI")),
        number: sequenced.then_some(i),
    }
}

fn envelope(shared: &Shared, key: &MessageKey, reply: ReplyPattern, ordered: bool) -> String {
    let request = Request {
        message_id: MessageId {
            group_id: key.group_id.clone(),
            sequence: key.number.map(|number| SequenceNum {
                number,
                last: false,
                group_limit: None,
            }),
        },
        expiry_time: Utc::now() + chrono::Duration::hours(1),
        reply_pattern: reply,
        ack_requested: true,
        duplicate_elimination: true,
        message_order: ordered,
    };
    // The send time rides in the body, for the e2e latency.
    let body = format!(
        "<b:Load xmlns:b=\"urn:wsr-gateway:bench\" t=\"{}\">{}</b:Load>",
        shared.started.elapsed().as_micros(),
        shared.payload
    );
    write_envelope(
        shared.version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        &body,
    )
}

/// POSTs an envelope; the answer body, or the kind of failure.
async fn post(shared: &Shared, xml: String) -> Result<(u16, axum::body::Bytes), String> {
    let mut request = shared
        .client
        .post(&shared.args.url)
        .header("Content-Type", shared.version.content_type());
    if let Some(value) = &shared.args.authorization {
        request = request.header("Authorization", value);
    }
    let answer = request.body(xml).send().await.map_err(|e| {
        if e.is_timeout() {
            "timeout".to_owned()
        } else if e.is_connect() {
            "connect".to_owned()
        } else {
            "transport".to_owned()
        }
    })?;
    let status = answer.status().as_u16();
    let body = answer.bytes().await.map_err(|_| "transport".to_owned())?;
    Ok((status, body))
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

async fn send_callback(shared: &Shared, worker: usize, i: u64) -> Outcome {
    let Some((reply_to, waiters)) = &shared.callback else {
        return Outcome::Failed("no-listener".into());
    };
    let key = key(shared, worker, i, false);
    let (tx, rx) = oneshot::channel();
    lock(waiters).insert(key.group_id.to_string(), tx);
    let xml = envelope(
        shared,
        &key,
        ReplyPattern::Callback(ReplyTo::bare(reply_to.as_str())),
        false,
    );
    let sent = Instant::now();
    let outcome = match post(shared, xml).await {
        Ok((200 | 202, _)) => match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(Ok(()))) => Outcome::Acked(sent.elapsed()),
            Ok(Ok(Err(kind))) => Outcome::Failed(kind),
            _ => Outcome::Failed("callback-timeout".into()),
        },
        Ok((status, _)) => Outcome::Failed(format!("http-{status}")),
        Err(kind) => Outcome::Failed(kind),
    };
    lock(waiters).remove(key.group_id.as_str());
    outcome
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts our listener for callback acks and (with a token) registers it with the gateway.
async fn start_callback_listener(
    client: &reqwest::Client,
    args: &BenchArgs,
) -> anyhow::Result<(String, Waiters)> {
    let waiters: Waiters = Arc::default();
    let listener = tokio::net::TcpListener::bind(args.callback_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.callback_listen))?;
    let url = format!(
        "http://{}/acks",
        listener.local_addr().context("listener address")?
    );
    let for_handler = waiters.clone();
    let handler = move |body: axum::body::Bytes| {
        let waiters = for_handler.clone();
        async move {
            if let Ok(env) = read_envelope(&body, &Limits::default()) {
                for reply in env.response.iter().flat_map(|r| &r.replies) {
                    for item in items(reply) {
                        let answer = match item.fault {
                            None => Ok(()),
                            Some(code) => Err(format!("fault:{}", code.local_name())),
                        };
                        if let Some(tx) = lock(&waiters).remove(item.group_id.as_str()) {
                            let _ = tx.send(answer);
                        }
                    }
                }
            }
            axum::http::StatusCode::OK
        }
    };
    let router = axum::Router::new().route("/acks", axum::routing::post(handler));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    if let Some(token) = &args.token {
        let (origin, _) = args
            .url
            .rsplit_once("/wsr/")
            .context("--url must end in /wsr/{channel}")?;
        client
            .post(format!("{origin}/api/v1/callback-endpoints"))
            .bearer_auth(token)
            .json(&json!({ "url": url }))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .context("cannot register our callback listener (needs an admin token)")?;
    }
    Ok((url, waiters))
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
/// latencies of what it accepted before the deadline, and its error count.
async fn start_consumers(shared: &Arc<Shared>) -> anyhow::Result<Vec<Member>> {
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
