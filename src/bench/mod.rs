//! `wsr-gateway bench`: a closed-loop load generator for a running gateway, which it reaches
//! only over HTTP (never its store or config). C workers, one operation outstanding each, for D
//! seconds; only acknowledged messages count, everything
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
//!
//! Here the arguments and the run; `load.rs` the workers' loop, `callback.rs` and `e2e.rs` the
//! listener and the consumers those modes add, `report.rs` what the run prints.

mod callback;
mod e2e;
mod load;
mod report;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;

use callback::Waiters;
pub use report::BenchReport;
use report::quantile;
use wsr_gateway::wsr::SoapVersion;

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

impl Shared {
    /// Whether the load goes on: before the deadline, and not interrupted.
    fn running(&self) -> bool {
        Instant::now() < self.deadline && !self.interrupted.load(Ordering::Relaxed)
    }
}

/// The run, stopped early when `interrupt` completes (`wsr-gateway bench` passes Ctrl-C): the
/// workers finish the request they have in flight, and the report covers what ran. While it
/// runs, a progress line goes to standard error when that is a terminal.
pub async fn run_until(
    args: &BenchArgs,
    interrupt: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<BenchReport> {
    let client = http_client(args)?;
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
        Mode::Callback => Some(callback::start_listener(&client, args).await?),
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
        Mode::E2e => Some(e2e::start_consumers(&shared).await?),
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
        .then(|| tokio::spawn(report::show_progress(shared.clone())));
    let (latencies, errors) = load::run_workers(&shared, workers).await?;
    let elapsed = started.elapsed();
    if let Some(progress) = progress {
        progress.abort();
        eprintln!();
    }
    let consumed = match consumers {
        None => None,
        Some(members) => Some(e2e::finish(members).await?),
    };
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

/// `builder` checking an https gateway against the CA certificates (PEM) in `path` alone: a
/// gateway with a private CA (the load client's and the operator CLI's `--ca-file`).
pub fn trusting_ca_file(
    builder: reqwest::ClientBuilder,
    path: &std::path::Path,
) -> anyhow::Result<reqwest::ClientBuilder> {
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("{} is not a PEM CA bundle", path.display()))?;
    Ok(builder.tls_certs_only(roots))
}

/// The client every worker shares: one keep-alive connection per worker, and the TLS settings
/// of the arguments.
fn http_client(args: &BenchArgs) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(30));
    if let Some(path) = &args.ca_file {
        builder = trusting_ca_file(builder, path)?;
    }
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        let mut pem =
            std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
        pem.extend(std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?);
        builder = builder
            .identity(reqwest::Identity::from_pem(&pem).context("not a PEM certificate and key")?);
    }
    builder.build().context("cannot build the HTTP client")
}
