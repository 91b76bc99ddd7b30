//! `wsr-chaos`: the fault-injection proof (README "Chaos run"). Two gateways as real processes,
//! a lossy proxy between them both ways, consumers on a shared subscription, random kill -9s,
//! then a checker: nothing acked is lost, nothing is processed twice, ordered groups stay in
//! order, and every failure has a lawful reason.
//!
//! `wsr-chaos run [--short]` orchestrates; `proxy` and `consume` are the child processes it
//! starts (itself, with those subcommands). `run --postgres` runs two gateways a side on
//! PostgreSQL, each pair behind a round-robin proxy.

mod backend;
mod certs;
mod check;
mod consumer;
mod proxy;
mod run;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "wsr-chaos", about = "Fault-injection run for wsr-gateway")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The whole run: processes, faults, kills, quiet period, check. Exits 1 on a violation.
    Run(run::RunArgs),
    /// A fault-injecting HTTP proxy (started by `run`).
    Proxy(ProxyArgs),
    /// A consumer process (started by `run`).
    Consume(consumer::ConsumeArgs),
}

#[derive(clap::Args)]
struct ProxyArgs {
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Where to forward: one address, or several (repeated, or comma-separated) taken
    /// round-robin, a refused connection passed on to the next (see `proxy`).
    #[arg(long, required = true, value_delimiter = ',')]
    upstream: Vec<std::net::SocketAddr>,
    #[arg(long)]
    seed: u64,
    /// The fault rates as JSON (`proxy::FaultRates`).
    #[arg(long)]
    rates: String,
    /// TLS towards clients: the proxy's certificate and key, and the CA that clients'
    /// (required) certificates must chain to. All three or none.
    #[arg(long, requires_all = ["tls_key", "tls_client_ca"])]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// TLS towards the upstream: the CA its certificate must chain to, and the client
    /// certificate to present there (the sender's of this direction).
    #[arg(long)]
    upstream_ca: Option<PathBuf>,
    #[arg(long, requires_all = ["upstream_ca", "upstream_client_key"])]
    upstream_client_cert: Option<PathBuf>,
    #[arg(long, requires = "upstream_client_cert")]
    upstream_client_key: Option<PathBuf>,
    /// Append upstream answers to requests whose body contains `--record-marker` to this
    /// file, one JSON line each (`proxy::AnswerLog`).
    #[arg(long, requires = "record_marker")]
    record_answers: Option<PathBuf>,
    #[arg(long, requires = "record_answers")]
    record_marker: Option<String>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wsr-chaos: no runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Cmd::Run(args) => run::run(args).await,
            Cmd::Proxy(args) => proxy_main(args).await.map(|()| true),
            Cmd::Consume(args) => consumer::consume(args).await.map(|()| true),
        }
    });
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("wsr-chaos: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn proxy_main(args: ProxyArgs) -> anyhow::Result<()> {
    let rates: proxy::FaultRates = serde_json::from_str(&args.rates)?;
    let mut tls = proxy::ProxyTls::default();
    if let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_client_ca)
    {
        tls.accept = Some(proxy::ProxyTls::server(cert, key, ca)?);
    }
    if let Some(ca) = &args.upstream_ca {
        let client = match (&args.upstream_client_cert, &args.upstream_client_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        tls.connect = Some(proxy::ProxyTls::client(ca, client)?);
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let mut stats = proxy::ProxyStats::default();
    if let (Some(path), Some(marker)) = (&args.record_answers, &args.record_marker) {
        stats.answers = proxy::AnswerLog::to_file(path, marker)?;
    }
    let stats = Arc::new(stats);
    let upstreams: Vec<String> = args.upstream.iter().map(|u| u.to_string()).collect();
    println!(
        "proxy listening on {} → {}",
        args.listen,
        upstreams.join(",")
    );
    let report = stats.clone();
    // The run reads the last of these lines from the log after it kills the proxy.
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("{}", report.summary());
        }
    });
    proxy::serve(listener, args.upstream, rates, args.seed, stats, tls).await?;
    Ok(())
}
