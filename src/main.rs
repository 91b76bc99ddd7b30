//! The `wsr-gateway` command line. Everything of substance lives in the library; the tools
//! that reach a running gateway only over HTTP — the load generator (`bench/`), the API client
//! (`client.rs`) and the operator commands over it (`ops.rs`) — are this binary's own modules,
//! not the library's (tests/it/bench.rs compiles `bench/` into itself, as this file does).

mod bench;
mod client;
mod ops;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use wsr_gateway::config::LogFormat;
use wsr_gateway::http::tls::TlsReloader;
use wsr_gateway::store::Prefill as _;
use wsr_gateway::{App, Config};

use self::bench::BenchArgs;
use self::ops::{EndpointsCommand, GroupsCommand, MessagesCommand, OpsArgs, SubsCommand};

/// The gateway's Rust allocations go through mimalloc. Under load one tokio worker serves many
/// requests at once, each allocating and then freeing dozens of blocks of the same few sizes:
/// glibc's per-thread cache (7 blocks a size) overflowed on every request into its locked,
/// consolidating slow paths — 18 % of the gateway's instructions per message
/// (`bench/instructions-per-message.sh`: 187.6 k with glibc, 165.4 k with this). `no_thp`:
/// without it mimalloc's arenas were backed by transparent huge pages, which took an idle
/// gateway from 25 to 45 MB resident.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The version with the commit it was built from (build.rs), so that an operator's report
/// names the exact code.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GATEWAY_BUILD_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(version = VERSION, about = "WS-Reliability 1.1 gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (SQLite under ./data/ and channel `default` unless configured).
    Serve {
        /// TOML configuration file; WSR_* environment variables override it.
        #[arg(long, env = "WSR_CONFIG")]
        config: Option<PathBuf>,
        /// The address to listen on (overrides `listen` and WSR_LISTEN), e.g. 127.0.0.1:9090.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Check a configuration file (with the WSR_* environment applied) without starting: says
    /// what it would serve, or what is wrong, and exits non-zero then.
    CheckConfig {
        /// The TOML configuration file.
        file: PathBuf,
    },
    /// Outbound messages: list, show, resend, fail (admin API).
    Messages {
        #[command(flatten)]
        ops: OpsArgs,
        #[command(subcommand)]
        command: MessagesCommand,
    },
    /// Received groups: list, show (admin API).
    Groups {
        #[command(flatten)]
        ops: OpsArgs,
        #[command(subcommand)]
        command: GroupsCommand,
    },
    /// Subscriptions: list, show, dead-letters, replay.
    Subs {
        #[command(flatten)]
        ops: OpsArgs,
        #[command(subcommand)]
        command: SubsCommand,
    },
    /// Partners: configuration without secrets, health, messages by state, refused sign-ins
    /// (admin API).
    Partners {
        #[command(flatten)]
        ops: OpsArgs,
    },
    /// Callback endpoints and push webhooks: list, add, rm (admin API).
    Endpoints {
        #[command(flatten)]
        ops: OpsArgs,
        #[command(subcommand)]
        command: EndpointsCommand,
    },
    /// Ask a running gateway whether it is ready (`/readyz`): exit 0 when it is, 1 with the
    /// reason when not — a container's HEALTHCHECK without curl.
    Health(client::HealthArgs),
    /// Print a shell completion script: `wsr-gateway completions bash > /etc/bash_completion.d/wsr-gateway`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Submit messages to a running gateway for reliable sending (one per FILE).
    Send(client::SendArgs),
    /// Show the state of a submitted message.
    Status {
        #[command(flatten)]
        api: client::ApiArgs,
        /// The message id `send` printed.
        id: String,
        #[arg(long, short = 'o', value_enum, default_value_t = ops::Output::Table)]
        output: ops::Output,
    },
    /// Load a running gateway (modes response, ordered, callback, poll, e2e) and report acked
    /// msgs/s and latency percentiles.
    Bench(BenchArgs),
    /// Print the hash of a secret for the configuration: a partner's `password_hash` or
    /// `token_hash`, an API token's `token_hash` (argon2id, PHC format), or with --sha256 the
    /// `token_sha256` of a long random token. The secret is read from standard input (one
    /// line), so that it stays out of the shell history and the process list.
    HashSecret {
        #[arg(long)]
        sha256: bool,
    },
    /// Copy a SQLite store (its gateway stopped) into a new, empty PostgreSQL database, every
    /// row in one transaction: then start the gateway with `database = "postgres://…"`.
    MigrateStore {
        /// The SQLite database file (the `database` setting it ran with).
        #[arg(long)]
        from: String,
        /// The PostgreSQL database, postgres://user@host/db; created empty beforehand.
        #[arg(long)]
        to: String,
    },
    /// Take a consistent copy of a running (or stopped) gateway's SQLite store into a new file,
    /// without stopping it, and say what it holds. PostgreSQL: use its own tools (README).
    Backup {
        #[command(flatten)]
        store: StoreArgs,
        /// The new file to write (never overwritten).
        #[arg(long)]
        to: PathBuf,
    },
    /// Put a backup in place of the store of a stopped gateway (refused while one runs on
    /// it); the backup is checked first, the store that was there is moved aside.
    Restore {
        #[command(flatten)]
        store: StoreArgs,
        /// The backup file (`backup --to`).
        #[arg(long)]
        from: PathBuf,
    },
    /// Check a store's invariants (SQLite's integrity check, then ours: duplicates still
    /// recognised, buffered messages in their groups, leases with their messages and
    /// subscriptions, cursors and offsets); exits non-zero naming each broken row. Safe beside
    /// a running gateway (one read snapshot).
    CheckStore {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Benchmark fixture: fill the configured store (gateway stopped) with delivered messages
    /// in ordered groups, for the growth benchmark and the restart time.
    Prefill {
        #[arg(long, env = "WSR_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, default_value_t = 100_000)]
        groups: u64,
        #[arg(long, default_value_t = 10)]
        per_group: u64,
        #[arg(long, default_value_t = 256)]
        body_bytes: usize,
    },
}

/// Which store a store command works on: `--database`, or the configuration's `database`.
#[derive(clap::Args)]
struct StoreArgs {
    /// TOML configuration file whose `database` is meant (WSR_* environment applied).
    #[arg(long, env = "WSR_CONFIG")]
    config: Option<PathBuf>,
    /// The database itself: a SQLite file or a postgres:// URL (wins over the configuration).
    #[arg(long)]
    database: Option<String>,
}

impl StoreArgs {
    fn database(&self) -> anyhow::Result<wsr_gateway::store::Database> {
        Ok(match &self.database {
            Some(database) => wsr_gateway::store::Database::parse(database),
            None => Config::load(self.config.as_deref(), std::env::vars())?.database,
        })
    }
}

/// The signals `serve` answers, installed before the gateway says it listens so that none
/// sent after that line takes the default action (which kills).
#[cfg(unix)]
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            terminate: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            hangup: signal(SignalKind::hangup()).context("cannot handle SIGHUP")?,
        })
    }

    /// Completes at SIGTERM (systemd, containers) or SIGINT (Ctrl-C): both drain the gateway.
    /// SIGHUP reloads the TLS certificate; the rest of the configuration is read only at start.
    async fn stopped(mut self, tls: Option<TlsReloader>) {
        loop {
            tokio::select! {
                _ = self.terminate.recv() => break tracing::info!("SIGTERM: draining"),
                _ = self.interrupt.recv() => break tracing::info!("SIGINT: draining"),
                _ = self.hangup.recv() => match &tls {
                    Some(tls) => tls.reload_logged(),
                    None => tracing::info!(
                        "SIGHUP: no TLS certificate to reload; restart to reload configuration"
                    ),
                },
            }
        }
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> anyhow::Result<Signals> {
        Ok(Signals)
    }

    async fn stopped(self, _tls: Option<TlsReloader>) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Log lines waiting for the log thread before a request that logs waits too (README).
const LOG_BACKLOG_LINES: usize = 128_000;

/// The log thread writes out up to this much at once: the lines of one linger under load.
const LOG_WRITE_BYTES: usize = 64 * 1024;

/// Starts logging to standard output in `format`, and exporting spans when `otlp` says where
/// (inside the runtime: the exporter runs on it). The guard writes out what is left when it is
/// dropped (at the end of `main`); the traces are shut down by `serve` when it stops.
fn init_logging(
    format: LogFormat,
    otlp: Option<&wsr_gateway::telemetry::OtlpConfig>,
) -> anyhow::Result<(
    tracing_appender::non_blocking::WorkerGuard,
    Option<wsr_gateway::telemetry::Traces>,
)> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // Never lossy: a full buffer (a stuck terminal or disk) slows requests down rather than
    // drop lines.
    let (log_writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_BACKLOG_LINES)
        .lossy(false)
        .thread_name("wsr-log")
        .finish(wsr_gateway::log_lines::Lingering::new(
            std::io::BufWriter::with_capacity(LOG_WRITE_BYTES, std::io::stdout()),
            wsr_gateway::log_lines::LINGER,
        ));
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // The PostgreSQL driver's notices ("relation … already exists, skipping") are for whoever
    // debugs the driver: shown only when RUST_LOG names sqlx.
    let asked_for_sqlx = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("sqlx"));
    if !asked_for_sqlx && let Ok(quiet) = "sqlx::postgres::notice=error".parse() {
        filter = filter.add_directive(quiet);
    }
    type Filtered = tracing_subscriber::layer::Layered<
        tracing_subscriber::EnvFilter,
        tracing_subscriber::Registry,
    >;
    let mut layers: Vec<Box<dyn tracing_subscriber::Layer<Filtered> + Send + Sync>> = Vec::new();
    let lines = tracing_subscriber::fmt::layer()
        .with_timer(wsr_gateway::log_lines::LineTime)
        .with_writer(log_writer);
    match format {
        // Plain text, on a terminal too: no colours (see Cargo.toml).
        // The default's fields, written more cheaply (`log_lines::LineFields`).
        LogFormat::Text => layers.push(
            lines
                .fmt_fields(wsr_gateway::log_lines::LineFields)
                .with_ansi(false)
                .boxed(),
        ),
        // One object per line; the fields of the spans a line happened in (`request_id`)
        // are in its `span` and `spans`.
        LogFormat::Json => layers.push(lines.json().with_ansi(false).boxed()),
    }
    let traces = match otlp {
        Some(otlp) => {
            let (spans, traces) = wsr_gateway::telemetry::layer(otlp)?;
            layers.push(spans.boxed());
            Some(traces)
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(layers)
        .init();
    if let Some(otlp) = otlp {
        tracing::info!(endpoint = %otlp.endpoint, "exporting traces by OTLP");
    }
    Ok((guard, traces))
}

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // An error is told as its chain of causes on one line, never as a backtrace (which anyhow
    // adds to `Debug` when RUST_BACKTRACE is set): it is for an operator, not a debugger.
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    // `serve` logs in the format its configuration asks for, so it reads that first (an
    // invalid configuration is reported by `main`'s error, not a log line); the other
    // commands log as text.
    let (command, config) = match command {
        Command::Serve { config, listen } => {
            // The flag wins over the file and the environment, and is checked as they are
            // (anonymous channels only on loopback).
            let flag = listen.map(|addr| ("WSR_LISTEN".to_owned(), addr.to_string()));
            let config = Config::load(config.as_deref(), std::env::vars().chain(flag))?;
            let placeholder = Command::Serve {
                config: None,
                listen: None,
            };
            (placeholder, Some(config))
        }
        other => (other, None),
    };
    let format = config.as_ref().map_or(LogFormat::Text, |c| c.log_format);
    let otlp = config.as_ref().and_then(|c| c.otlp.as_ref());
    let (_log_guard, traces) = init_logging(format, otlp)?;
    match command {
        Command::Serve { .. } => {
            let config = config.context("the configuration was read above")?;
            let signals = Signals::install()?;
            let app = App::build(config).await?;
            let stop = signals.stopped(app.tls_reloader());
            tracing::info!(addr = %app.local_addr(), "wsr-gateway listening");
            let stopped = app.run_until(stop).await;
            if let Some(traces) = traces {
                traces.shutdown().await;
            }
            stopped.context("gateway stopped with an error")?;
            tracing::info!("wsr-gateway stopped");
            Ok(())
        }
        Command::CheckConfig { file } => {
            let config = Config::load(Some(&file), std::env::vars())?;
            // The files it names, loaded as `serve` loads them.
            wsr_gateway::ConfiguredFiles::load(&config)?;
            println!("{}: valid", file.display());
            println!("{}", config.summary());
            Ok(())
        }
        Command::Messages { ops, command } => out(&ops::messages(&ops, &command).await?),
        Command::Groups { ops, command } => out(&ops::groups(&ops, &command).await?),
        Command::Subs { ops, command } => out(&ops::subs(&ops, &command).await?),
        Command::Partners { ops } => out(&ops::partners(&ops).await?),
        Command::Endpoints { ops, command } => out(&ops::endpoints(&ops, &command).await?),
        Command::Health(args) => out(&format!("{}\n", client::health(&args).await?)),
        Command::Completions { shell } => {
            // Written whole, then out: a reader that stops early (`| head`) closes the pipe,
            // which ends the command quietly instead of panicking inside the generator.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "wsr-gateway", &mut script);
            out_bytes(&script)
        }
        Command::Send(args) => {
            let lines = client::send(&args).await?;
            out(&lines.iter().map(|l| format!("{l}\n")).collect::<String>())
        }
        Command::Status { api, id, output } => {
            let message = client::status(&api, &id).await?;
            out(&ops::message_shown(output, message))
        }
        Command::Prefill {
            config,
            groups,
            per_group,
            body_bytes,
        } => {
            let config = Config::load(config.as_deref(), std::env::vars())?;
            let store = wsr_gateway::store::Store::open(&wsr_gateway::store::StoreConfig {
                database: config.database.clone(),
                durability: config.durability,
                policy: config.policy.clone(),
            })
            .await
            .context("cannot open the store")?;
            let started = std::time::Instant::now();
            let added = store
                .prefill_delivered("default", groups, per_group, body_bytes, chrono::Utc::now())
                .await?;
            println!(
                "added {added} delivered messages in {groups} groups in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Backup { store, to } => {
            let database = store.database()?;
            let started = std::time::Instant::now();
            let copied = wsr_gateway::store::backup_store(&database, &to)
                .await
                .with_context(|| format!("cannot back up {database}"))?;
            print!("{copied}");
            println!("in {:.1} s", started.elapsed().as_secs_f64());
            Ok(())
        }
        Command::Restore { store, from } => {
            let database = store.database()?;
            let restored = wsr_gateway::store::restore_store(&from, &database, chrono::Utc::now())
                .await
                .with_context(|| format!("cannot restore {} to {database}", from.display()))?;
            out(&restored.to_string())
        }
        Command::CheckStore { store } => {
            let database = store.database()?;
            let report = wsr_gateway::store::check_store(&database, chrono::Utc::now())
                .await
                .with_context(|| format!("cannot check {database}"))?;
            out(&report.to_string())?;
            if !report.is_sound() {
                anyhow::bail!("{database} breaks the invariants named above");
            }
            Ok(())
        }
        Command::MigrateStore { from, to } => {
            let store = |database| wsr_gateway::store::StoreConfig {
                database,
                durability: wsr_gateway::store::Durability::Full,
                policy: Default::default(),
            };
            let (from, to) = (
                store(wsr_gateway::store::Database::parse(&from)),
                store(wsr_gateway::store::Database::parse(&to)),
            );
            let started = std::time::Instant::now();
            let migrated = wsr_gateway::store::migrate_store(&from, &to)
                .await
                .with_context(|| format!("cannot migrate {} to {}", from.database, to.database))?;
            print!("{migrated}");
            println!("in {:.1} s", started.elapsed().as_secs_f64());
            Ok(())
        }
        Command::HashSecret { sha256 } => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the secret from standard input")?;
            let secret = line.trim_end_matches(['\r', '\n']);
            if secret.is_empty() {
                anyhow::bail!("no secret on standard input");
            }
            if sha256 {
                println!("{}", wsr_gateway::secrets::sha256_hex(secret.as_bytes()));
            } else {
                println!("{}", wsr_gateway::secrets::hash_secret(secret)?);
            }
            Ok(())
        }
        Command::Bench(args) => {
            // Ctrl-C stops the load and prints what it measured so far.
            let interrupt = async {
                if tokio::signal::ctrl_c().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let report = bench::run_until(&args, interrupt).await?;
            if args.json {
                println!("{}", report.to_json());
            } else {
                println!("{report}");
            }
            Ok(())
        }
    }
}

/// Writes a command's output: a reader that stops early (`| head`) closes the pipe, and the
/// command then ends quietly instead of failing on it.
fn out(text: &str) -> anyhow::Result<()> {
    out_bytes(text.as_bytes())
}

fn out_bytes(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.context("cannot write to standard output"),
    }
}
