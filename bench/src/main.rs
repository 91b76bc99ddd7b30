//! `wsr-compare`: one run, one table. The same closed-loop load (C workers, one operation
//! outstanding each, D seconds, a fixed payload) against:
//!
//! - an HTTP ceiling: a trivial bare-hyper server in this process, loaded by the same lean
//!   client as the gateway rows;
//! - wsr-gateway itself, as a child process on a fresh store: Response pattern with
//!   `durability = "full"` and `"os"`, ordered groups, and end-to-end (ingest → fetch → accept),
//!   loaded by the lean client (`lean.rs`: bare hyper, template bodies, ack found by a byte
//!   search), as cheap per request as the broker clients; `--client codec` uses the gateway's
//!   full-codec generator (`wsr-gateway bench`) instead;
//! - NATS JetStream (file storage, deduplication): publish, and publish + consume;
//! - RabbitMQ: a quorum queue with publisher confirms, and publish + consume;
//! - request-response (`rr.rs`): a trivial SOAP service in this process called directly, and
//!   a durable gateway in front of it on a request-response channel (DESIGN D16);
//! - with `--postgres`: the durable response load on a gateway on a fresh PostgreSQL database,
//!   and on two gateways sharing one (`postgres.rs`);
//! - one large message (`--large-mib`, 100 MiB) to a fresh gateway: its peak RSS.
//!
//! `--runs N` repeats everything but the large message and prints the median run of each row.
//! Build the gateway first (`cargo build --release`); this tool only runs it.

mod lean;

mod ceiling;
mod cpu;
mod gateway;
mod jetstream;
mod load;
mod pin;
mod postgres;
mod rabbit;
mod rr;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};

use crate::gateway::{Gateway, Mode, Store};
use crate::jetstream::{AckStyle, JetStream};
use crate::load::Params;
use crate::postgres::FreshDatabase;
use crate::rabbit::Rabbit;
use crate::table::{Large, Outcome, Report, RowKey};

#[derive(Debug, Parser)]
#[command(
    name = "wsr-compare",
    about = "Compare wsr-gateway with an HTTP ceiling, NATS JetStream and RabbitMQ under the same closed-loop load"
)]
struct Cli {
    /// C: concurrent workers (connections, channels), one operation outstanding each.
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// D: seconds of load per phase.
    #[arg(long, short = 'd', default_value_t = 10)]
    duration: u64,
    /// Message payload in bytes.
    #[arg(long, default_value_t = 1024)]
    payload: usize,
    /// The gateway binary [default: target/release/wsr-gateway in the workspace].
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
    /// Skip JetStream and RabbitMQ.
    #[arg(long)]
    skip_brokers: bool,
    /// Run only these phases (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Phase>,
    /// K: consumers in the end-to-end phases (gateway and JetStream).
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Messages per fetch in the end-to-end phases.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// How JetStream consumers acknowledge.
    #[arg(long, value_enum, default_value_t = AckStyle::Double)]
    js_ack: AckStyle,
    /// NATS server (with JetStream).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// RabbitMQ server.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// Add the PostgreSQL rows: an admin connection to the server, which gets a fresh database
    /// per row (created and dropped by this tool).
    #[arg(
        long,
        value_name = "URL",
        num_args = 0..=1,
        default_missing_value = postgres::DEFAULT_ADMIN_URL
    )]
    postgres: Option<String>,
    /// Which client loads the HTTP ceiling and the gateway rows.
    #[arg(long, value_enum, default_value_t = Client::Lean)]
    client: Client,
    /// Run every phase (but the large message) this many times; each row shows its median run.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// The large-message phase: the payload in MiB.
    #[arg(long, default_value_t = 100)]
    large_mib: usize,
    /// Each system under test on one core (`--server-cpu`) and the load on another
    /// (`--client-cpu`): the gateway children, and for the run the machine's nats-server,
    /// RabbitMQ and PostgreSQL (their affinity restored afterwards). Each row is then a
    /// per-core figure.
    #[arg(long)]
    pin: bool,
    #[arg(long, default_value_t = 0, requires = "pin")]
    server_cpu: usize,
    #[arg(long, default_value_t = 1, requires = "pin")]
    client_cpu: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Client {
    /// Bare hyper, template bodies, the ack found by a byte search (as cheap as the broker
    /// clients).
    Lean,
    /// `wsr-gateway bench`: the gateway's full-codec load generator (writes and reads every
    /// envelope with the gateway's own codec).
    Codec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Phase {
    /// The HTTP ceiling.
    Ceiling,
    /// All wsr-gateway rows on SQLite.
    Gateway,
    /// Request-response: the SOAP backend called directly, and the gateway in front of it.
    Rr,
    /// Both PostgreSQL rows (without `--postgres`: on its default URL).
    Postgres,
    /// Both JetStream rows.
    Jetstream,
    /// Both RabbitMQ rows.
    Rabbit,
    /// One large message to a fresh gateway: peak RSS against the payload.
    Large,
}

impl Cli {
    fn wants(&self, phase: Phase) -> bool {
        if self.skip_brokers && matches!(phase, Phase::Jetstream | Phase::Rabbit) {
            return false;
        }
        // It needs a PostgreSQL server: only when asked for, by `--postgres` or by name.
        if phase == Phase::Postgres {
            return self.only.contains(&phase) || (self.only.is_empty() && self.postgres.is_some());
        }
        self.only.is_empty() || self.only.contains(&phase)
    }

    fn params(&self) -> anyhow::Result<Params> {
        if self.connections == 0
            || self.duration == 0
            || self.consumers == 0
            || self.batch == 0
            || self.runs == 0
        {
            bail!("--connections, --duration, --consumers, --batch and --runs must be at least 1");
        }
        Ok(Params {
            connections: self.connections,
            duration: Duration::from_secs(self.duration),
            payload: self.payload,
            consumers: self.consumers,
            batch: self.batch,
        })
    }

    fn postgres_url(&self) -> &str {
        self.postgres
            .as_deref()
            .unwrap_or(postgres::DEFAULT_ADMIN_URL)
    }

    fn gateway_bin(&self) -> PathBuf {
        self.gateway_bin.clone().unwrap_or_else(|| {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest
                .parent()
                .unwrap_or(manifest)
                .join("target/release/wsr-gateway")
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tokio::select! {
        result = run_all(&cli) => match result {
            Ok(report) => {
                print!("{}", report.render());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("wsr-compare: {e:#}");
                ExitCode::FAILURE
            }
        },
        // Dropping `run` kills any child process (kill_on_drop).
        _ = tokio::signal::ctrl_c() => {
            eprintln!("wsr-compare: interrupted");
            ExitCode::from(130)
        }
    }
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[compare] {}", msg.as_ref());
}

async fn run_all(cli: &Cli) -> anyhow::Result<Report> {
    // Dropped at the end, on an error and on Ctrl-C (this future is then dropped): the
    // machine's servers get their CPUs back.
    let _restore = match cli.pin {
        true => Some(pin::start(pin::Cores {
            server: cli.server_cpu,
            client: cli.client_cpu,
        })?),
        false => None,
    };
    let mut reports = Vec::with_capacity(cli.runs);
    for n in 0..cli.runs {
        if cli.runs > 1 {
            progress(format!("run {} of {}", n + 1, cli.runs));
        }
        reports.push(run(cli, n == 0).await?);
    }
    Ok(median(reports))
}

/// One report from several runs: each row is its median run (by msgs/s), RSS the highest seen.
fn median(mut reports: Vec<Report>) -> Report {
    if reports.len() <= 1 {
        return reports.pop().unwrap_or_default();
    }
    let runs = reports.len();
    let mut merged = reports.remove(0);
    let mut per_row = Vec::new();
    for key in RowKey::ALL {
        let mut measured: Vec<load::Figures> = std::iter::once(&merged)
            .chain(&reports)
            .filter_map(|r| r.outcome_of(key).figures().cloned())
            .collect();
        if measured.is_empty() {
            continue;
        }
        measured.sort_by(|a, b| a.msgs_per_s.total_cmp(&b.msgs_per_s));
        let rates: Vec<String> = measured
            .iter()
            .map(|f| format!("{:.0}", f.msgs_per_s))
            .collect();
        per_row.push(format!("{}: {}", key.label(), rates.join(" / ")));
        let mid = measured.swap_remove(measured.len() / 2);
        merged.set(key, Outcome::Measured(mid));
    }
    for r in &reports {
        merged.rss_full_kib = merged.rss_full_kib.max(r.rss_full_kib);
        merged.rss_os_kib = merged.rss_os_kib.max(r.rss_os_kib);
        merged.rss_response_kib = merged.rss_response_kib.max(r.rss_response_kib);
    }
    merged.heading.push_str(&format!("; median of {runs} runs"));
    merged.notes.push(format!(
        "Runs, msgs/s sorted (the median is shown): {}.",
        per_row.join("; ")
    ));
    merged
}

async fn run(cli: &Cli, first: bool) -> anyhow::Result<Report> {
    let params = cli.params()?;
    let bin = cli.gateway_bin();
    let pinned = match pin::cores() {
        Some(c) => format!(
            "; pinned: servers on CPU {}, the load on CPU {}",
            c.server, c.client
        ),
        None => String::new(),
    };
    let mut report = Report {
        heading: format!(
            "Closed loop: C={} workers, one operation outstanding each; D={} s per phase; {}-byte payload; {} cores{pinned}",
            params.connections,
            params.duration.as_secs(),
            params.payload,
            pin::machine_cpus(),
        ),
        ..Report::default()
    };
    if pin::cores().is_some() && cli.wants(Phase::Ceiling) {
        report.notes.push("Pinned: the HTTP ceiling's trivial server runs inside this tool, on the load's CPU (it shares it with the client).".into());
    }
    for key in RowKey::ALL {
        report.set(key, Outcome::Skipped);
    }
    let bin_ok = gateway::check_binary(&bin).map_err(|e| format!("{e:#}"));

    if cli.wants(Phase::Ceiling) {
        let outcome = match (&bin_ok, cli.client) {
            (Err(why), Client::Codec) => {
                Outcome::Unavailable(format!("needs the gateway's load generator: {why}"))
            }
            _ => measured(ceiling_phase(cli, &bin, &params).await),
        };
        report.set(RowKey::Ceiling, outcome);
    }
    if [Phase::Ceiling, Phase::Gateway, Phase::Rr, Phase::Postgres]
        .into_iter()
        .any(|phase| cli.wants(phase))
    {
        report.notes.push(match cli.client {
            Client::Lean => "HTTP ceiling and wsr-gateway rows are loaded by this tool's lean client (bare hyper, C keep-alive HTTP/1.1 connections, SOAP 1.1 envelopes spliced from a template, the ack checked by status 200 and a byte search for the message's groupId reply without fault=); the broker rows by this tool's own closed loop.".into(),
            Client::Codec => "HTTP ceiling and wsr-gateway rows are loaded by `wsr-gateway bench` (the gateway's full-codec client, C keep-alive HTTP/1.1 connections); the broker rows by this tool's own closed loop.".into(),
        });
    }

    if cli.wants(Phase::Gateway) {
        match &bin_ok {
            Ok(()) => gateway_phases(cli, &bin, &params, &mut report).await,
            Err(why) => {
                for key in [
                    RowKey::GatewayFull,
                    RowKey::GatewayOrdered,
                    RowKey::GatewayE2e,
                    RowKey::GatewayOs,
                ] {
                    report.set(key, Outcome::Unavailable(why.clone()));
                }
            }
        }
    }

    if cli.wants(Phase::Rr) {
        match cli.client {
            Client::Lean => {
                let bin = bin_ok.clone().map(|()| bin.as_path());
                rr::phases(bin, &params, &mut report).await;
            }
            Client::Codec => {
                for key in [RowKey::BackendDirect, RowKey::GatewayRr] {
                    report.set(key, Outcome::Unavailable("needs --client lean".into()));
                }
            }
        }
    }

    if cli.wants(Phase::Postgres) {
        match &bin_ok {
            Ok(()) => postgres_phases(cli, &bin, &params, &mut report).await,
            Err(why) => {
                for key in [RowKey::PostgresResponse, RowKey::PostgresPair] {
                    report.set(key, Outcome::Unavailable(why.clone()));
                }
            }
        }
    }

    if cli.wants(Phase::Jetstream) {
        jetstream_phases(cli, &params, &mut report).await;
    }

    if cli.wants(Phase::Rabbit) {
        rabbit_phase(cli, &params, &mut report).await;
    }

    if first && cli.wants(Phase::Large) {
        report.large = Some(match &bin_ok {
            Ok(()) => match large_phase(&bin, cli.large_mib).await {
                Ok(large) => large,
                Err(e) => {
                    progress(format!("  failed: {e:#}"));
                    Large::Failed(format!("{e:#}"))
                }
            },
            Err(why) => Large::Failed(why.clone()),
        });
    }

    Ok(report)
}

/// POSTs one message of `mib` MiB to a fresh gateway (durability full, `max_message_bytes`
/// raised to fit) with the lean client and reads the gateway's VmHWM afterwards.
async fn large_phase(bin: &Path, mib: usize) -> anyhow::Result<Large> {
    let payload = mib << 20;
    let extra = format!("max_message_bytes = {}\n", payload + (1 << 20));
    progress(format!(
        "wsr-gateway large message: {mib} MiB to a fresh gateway"
    ));
    let gw = Gateway::start_with(bin, "full", Store::Sqlite, &extra).await?;
    let target = lean::Target::parse(&gw.url())?;
    let template = lean::Template::new(lean::Shape::Response, payload);
    let group = template.group(0, Some(0));
    let body = template.body(&group, None, 0);
    let before_kib = gw.rss_kib()?;
    let started = Instant::now();
    let outcome = async {
        let mut conn = lean::Conn::open(&target).await?;
        let (status, answer) = tokio::time::timeout(
            Duration::from_secs(300),
            conn.post(None, "text/xml; charset=utf-8", None, body),
        )
        .await
        .context("no answer within 300 s")??;
        if status != 200 {
            bail!(
                "http-{}: {}",
                status.as_u16(),
                String::from_utf8_lossy(&answer[..answer.len().min(300)])
            );
        }
        lean::acked(&answer, &group, None).map_err(anyhow::Error::msg)
    }
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let peak_kib = gw.peak_rss_kib()?;
    let stopped = gw.stop().await;
    outcome?;
    stopped?;
    progress(format!(
        "  accepted in {seconds:.1} s; VmHWM {:.1} MB ({:.2}x payload)",
        peak_kib as f64 / 1024.0,
        peak_kib as f64 * 1024.0 / payload as f64
    ));
    Ok(Large::Measured {
        payload: payload as u64,
        before_kib,
        peak_kib,
        seconds,
    })
}

fn measured(result: anyhow::Result<load::Figures>) -> Outcome {
    match result {
        Ok(figures) if figures.count == 0 => {
            let why = match figures.top_error() {
                Some((kind, n)) => format!("nothing completed; {n}× {kind}"),
                None => "nothing completed".to_owned(),
            };
            progress(format!("  failed: {why}"));
            Outcome::Failed(why)
        }
        Ok(figures) => {
            progress(format!("  {}", figures.summary()));
            Outcome::Measured(figures)
        }
        Err(e) => {
            progress(format!("  failed: {e:#}"));
            Outcome::Failed(format!("{e:#}"))
        }
    }
}

async fn ceiling_phase(cli: &Cli, bin: &Path, params: &Params) -> anyhow::Result<load::Figures> {
    let server = ceiling::CeilingServer::start().await?;
    progress(format!(
        "HTTP ceiling: trivial server at {}, loaded for {} s",
        server.url(),
        params.duration.as_secs()
    ));
    let result = match cli.client {
        Client::Lean => {
            lean::phase(
                &lean::Target::parse(&server.url())?,
                lean::Shape::Response,
                params,
            )
            .await
        }
        Client::Codec => gateway::bench(bin, &server.url(), None, params)
            .await
            .map(|r| r.figures()),
    };
    server.stop().await?;
    result
}

/// One gateway phase with the chosen client.
async fn gateway_load(
    cli: &Cli,
    bin: &Path,
    url: &str,
    mode: Mode,
    params: &Params,
) -> anyhow::Result<load::Figures> {
    match cli.client {
        Client::Lean => {
            let target = lean::Target::parse(url)?;
            match mode {
                Mode::Response => lean::phase(&target, lean::Shape::Response, params).await,
                Mode::Ordered => lean::phase(&target, lean::Shape::Ordered, params).await,
                Mode::E2e => lean::e2e_phase(&target, params, gateway::CONSUMER_TOKEN).await,
            }
        }
        Client::Codec => {
            let result = gateway::bench(bin, url, Some(mode), params).await;
            match mode {
                Mode::E2e => result.and_then(|r| {
                    r.e2e_figures()
                        .context("the e2e report has no \"e2e\" figures")
                }),
                _ => result.map(|r| r.figures()),
            }
        }
    }
}

async fn gateway_phases(cli: &Cli, bin: &Path, params: &Params, report: &mut Report) {
    // durability = "full": response, ordered, e2e on one gateway (a fresh store).
    progress("wsr-gateway durability=full: starting");
    match Gateway::start(bin, "full").await {
        Ok(gw) => {
            for (key, mode) in [
                (RowKey::GatewayFull, Mode::Response),
                (RowKey::GatewayOrdered, Mode::Ordered),
                (RowKey::GatewayE2e, Mode::E2e),
            ] {
                progress(format!(
                    "wsr-gateway durability=full: --mode {} for {} s",
                    mode.arg(),
                    params.duration.as_secs()
                ));
                let result = gw
                    .server()
                    .measure(gateway_load(cli, bin, &gw.url(), mode, params))
                    .await;
                report.set(key, measured(result));
                if let Mode::Response = mode {
                    report.rss_response_kib = peak_rss(&gw);
                }
            }
            report.notes.push(format!(
                "wsr-gateway e2e: {} consumer sessions of one shared subscription fetching batches of {} and accepting each message (batched settles); figure = accepted msgs/s; latency = POST sent → accept answered.",
                params.consumers, params.batch
            ));
            report.rss_full_kib = peak_rss(&gw);
            if let Err(e) = gw.stop().await {
                report
                    .notes
                    .push(format!("gateway (durability=full): {e:#}"));
            }
        }
        Err(e) => {
            let why = format!("{e:#}");
            progress(format!("  failed to start: {why}"));
            for key in [
                RowKey::GatewayFull,
                RowKey::GatewayOrdered,
                RowKey::GatewayE2e,
            ] {
                report.set(
                    key,
                    Outcome::Failed(format!("gateway did not start: {why}")),
                );
            }
        }
    }

    // durability = "os": response only, on another fresh store.
    progress("wsr-gateway durability=os: starting");
    match Gateway::start(bin, "os").await {
        Ok(gw) => {
            progress(format!(
                "wsr-gateway durability=os: --mode response for {} s",
                params.duration.as_secs()
            ));
            let result = gw
                .server()
                .measure(gateway_load(cli, bin, &gw.url(), Mode::Response, params))
                .await;
            report.set(RowKey::GatewayOs, measured(result));
            report.rss_os_kib = peak_rss(&gw);
            if let Err(e) = gw.stop().await {
                report.notes.push(format!("gateway (durability=os): {e:#}"));
            }
        }
        Err(e) => {
            let why = format!("{e:#}");
            progress(format!("  failed to start: {why}"));
            report.set(
                RowKey::GatewayOs,
                Outcome::Failed(format!("gateway did not start: {why}")),
            );
        }
    }
}

/// The PostgreSQL rows, each on a fresh database: one gateway, then two sharing one.
async fn postgres_phases(cli: &Cli, bin: &Path, params: &Params, report: &mut Report) {
    let admin = cli.postgres_url();
    progress(format!(
        "PostgreSQL: fresh databases on {}",
        rabbit::redact(admin)
    ));
    let single = postgres_single(cli, bin, admin, params, report).await;
    report.set(RowKey::PostgresResponse, single);
    let pair = match (cli.client, params.connections) {
        // The row's percentiles are over both halves' latencies, which only the lean client,
        // in this process, has.
        (Client::Codec, _) => Outcome::Unavailable("needs --client lean".into()),
        (_, c) if c < 2 => Outcome::Unavailable("needs -c 2 or more".into()),
        _ => postgres_pair(bin, admin, params, report).await,
    };
    report.set(RowKey::PostgresPair, pair);
    report.notes.push(
        "wsr-gateway on PostgreSQL: durability=full (synchronous_commit on: the ack waits for the WAL flush), each row on a fresh database, dropped afterwards. ×2: two gateway processes on one database, worker i sending to gateway i mod 2; figure = both together, latency over all workers. Server CPU = the gateways plus the PostgreSQL backends serving the database (found by process title, so only when PostgreSQL runs on this machine), not PostgreSQL's shared WAL writer, checkpointer or background writer.".into(),
    );
}

/// A fresh database, or why not: the row is then unavailable.
async fn fresh_database(admin: &str) -> Result<FreshDatabase, Outcome> {
    match FreshDatabase::create(admin).await {
        Ok(db) => {
            progress(format!("  database {}", db.name()));
            Ok(db)
        }
        Err(e) => {
            let why = format!("{e:#}");
            progress(format!("  unavailable: {why}"));
            Err(Outcome::Unavailable(why))
        }
    }
}

async fn postgres_single(
    cli: &Cli,
    bin: &Path,
    admin: &str,
    params: &Params,
    report: &mut Report,
) -> Outcome {
    let db = match fresh_database(admin).await {
        Ok(db) => db,
        Err(outcome) => return outcome,
    };
    progress("wsr-gateway on PostgreSQL: starting");
    let gw = match Gateway::start_with(bin, "full", Store::Postgres(db.url()), "").await {
        Ok(gw) => gw,
        Err(e) => return start_failed(e),
    };
    progress(format!(
        "wsr-gateway on PostgreSQL: --mode response for {} s",
        params.duration.as_secs()
    ));
    let result = gw
        .server()
        .with_postgres_backends(db.name())
        .measure(gateway_load(cli, bin, &gw.url(), Mode::Response, params))
        .await;
    let outcome = measured(result);
    show_logs_on_errors(&outcome, &[&gw]);
    if let Err(e) = gw.stop().await {
        report.notes.push(format!("gateway (PostgreSQL): {e:#}"));
    }
    outcome
}

async fn postgres_pair(bin: &Path, admin: &str, params: &Params, report: &mut Report) -> Outcome {
    let db = match fresh_database(admin).await {
        Ok(db) => db,
        Err(outcome) => return outcome,
    };
    progress("wsr-gateway ×2 on PostgreSQL: starting");
    // One after the other: the first creates the schema, the second finds it there.
    let started = async {
        let a = Gateway::start_with(bin, "full", Store::Postgres(db.url()), "").await?;
        let b = Gateway::start_with(bin, "full", Store::Postgres(db.url()), "").await?;
        anyhow::Ok((a, b))
    };
    let (a, b) = match started.await {
        Ok(pair) => pair,
        Err(e) => return start_failed(e),
    };
    progress(format!(
        "wsr-gateway ×2 on PostgreSQL: --mode response, {} workers over both, for {} s",
        params.connections,
        params.duration.as_secs()
    ));
    let load = async {
        let targets = [
            lean::Target::parse(&a.url())?,
            lean::Target::parse(&b.url())?,
        ];
        lean::phase_on(&targets, lean::Shape::Response, params).await
    };
    let result = a
        .server()
        .and(b.server())
        .with_postgres_backends(db.name())
        .measure(load)
        .await;
    let outcome = measured(result);
    show_logs_on_errors(&outcome, &[&a, &b]);
    for gw in [a, b] {
        if let Err(e) = gw.stop().await {
            report.notes.push(format!("gateway (PostgreSQL ×2): {e:#}"));
        }
    }
    outcome
}

fn start_failed(e: anyhow::Error) -> Outcome {
    let why = format!("{e:#}");
    progress(format!("  failed to start: {why}"));
    Outcome::Failed(format!("gateway did not start: {why}"))
}

/// A phase with errors: the gateways' own account of them, before their logs go.
fn show_logs_on_errors(outcome: &Outcome, gateways: &[&Gateway]) {
    let errors = match outcome {
        Outcome::Measured(f) => f.error_count() > 0,
        _ => true,
    };
    if errors {
        for (i, gw) in gateways.iter().enumerate() {
            progress(format!(
                "  gateway {} log (tail):\n{}",
                i + 1,
                gw.log_tail()
            ));
        }
    }
}

fn peak_rss(gw: &Gateway) -> Option<u64> {
    match gw.peak_rss_kib() {
        Ok(kib) => {
            progress(format!(
                "  gateway peak RSS (VmHWM): {:.1} MB",
                kib as f64 / 1024.0
            ));
            Some(kib)
        }
        Err(e) => {
            progress(format!("  gateway peak RSS unknown: {e:#}"));
            None
        }
    }
}

async fn jetstream_phases(cli: &Cli, params: &Params, report: &mut Report) {
    progress(format!("JetStream: connecting to {}", cli.nats_url));
    let js = match JetStream::connect(&cli.nats_url).await {
        Ok(js) => js,
        Err(e) => {
            let why = format!("{e:#}");
            progress(format!("  unavailable: {why}"));
            report.set(RowKey::JetStreamPublish, Outcome::Unavailable(why.clone()));
            report.set(RowKey::JetStreamE2e, Outcome::Unavailable(why));
            return;
        }
    };
    progress(format!(
        "JetStream (nats-server {}): publish for {} s",
        js.server_version(),
        params.duration.as_secs()
    ));
    report.set(
        RowKey::JetStreamPublish,
        measured(nats_server().measure(js.publish_phase(params)).await),
    );
    progress(format!(
        "JetStream: publish + {} consumers for {} s",
        params.consumers,
        params.duration.as_secs()
    ));
    report.set(
        RowKey::JetStreamE2e,
        measured(
            nats_server()
                .measure(js.e2e_phase(params, cli.js_ack))
                .await,
        ),
    );
    js.cleanup().await;
    report.notes.push(format!(
        "JetStream (nats-server {}): stream {} on file storage, R1, duplicate window 2 min, a unique Nats-Msg-Id on every publish; it acks before fsync by default (sync every 2 min). Publishers share one NATS connection.",
        js.server_version(),
        "COMPARE"
    ));
    report.notes.push(format!(
        "JetStream e2e: {} consumers on one durable pull consumer (AckPolicy::Explicit), fetching batches of {}; {}. Figure = messages acked by consumers per second; latency = publish → ack.",
        params.consumers,
        params.batch,
        cli.js_ack.describe()
    ));
}

/// The local NATS server's processes, looked up at each phase (a restart changes the pid).
fn nats_server() -> cpu::Server {
    cpu::Server::named("nats-server")
}

/// The local RabbitMQ node's Erlang VM.
fn rabbit_server() -> cpu::Server {
    cpu::Server::named("beam.smp")
}

async fn rabbit_phase(cli: &Cli, params: &Params, report: &mut Report) {
    progress(format!(
        "RabbitMQ: connecting to {}",
        rabbit::redact(&cli.amqp_url)
    ));
    let rabbit = match Rabbit::connect(&cli.amqp_url).await {
        Ok(rabbit) => rabbit,
        Err(e) => {
            let why = format!("{e:#}");
            progress(format!("  unavailable: {why}"));
            report.set(RowKey::RabbitQuorum, Outcome::Unavailable(why.clone()));
            report.set(RowKey::RabbitE2e, Outcome::Unavailable(why));
            return;
        }
    };
    progress(format!(
        "RabbitMQ: quorum queue publish with confirms for {} s",
        params.duration.as_secs()
    ));
    report.set(
        RowKey::RabbitQuorum,
        measured(rabbit_server().measure(rabbit.publish_phase(params)).await),
    );
    progress(format!(
        "RabbitMQ: quorum queue publish + {} consumers for {} s",
        params.consumers,
        params.duration.as_secs()
    ));
    report.set(
        RowKey::RabbitE2e,
        measured(rabbit_server().measure(rabbit.e2e_phase(params)).await),
    );
    rabbit.cleanup().await;
    report.notes.push(
        "RabbitMQ: durable quorum queue, persistent messages (delivery_mode 2) to the default exchange, one channel per worker on one connection, each publish's confirm awaited; quorum queues fdatasync before confirming.".into(),
    );
    report.notes.push(format!(
        "RabbitMQ e2e: the same publishers and, concurrently, {} consumers, each on its own channel with basic.qos prefetch {} and manual acks (one basic.ack per delivery). Figure = messages acked by consumers per second; latency = publish → ack.",
        params.consumers, params.batch
    ));
}
