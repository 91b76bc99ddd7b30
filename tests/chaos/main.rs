//! `wsr-chaos`: the fault-injection proof (README "Chaos run"). Two gateways as real processes,
//! a lossy proxy between them both ways, consumers on a shared subscription, random kill -9s,
//! then a checker: nothing acked is lost, nothing is processed twice, ordered groups stay in
//! order, and every failure has a lawful reason.
//!
//! `wsr-chaos run [--short]` orchestrates; `proxy` and `consume` are the child processes it
//! starts (itself, with those subcommands).

mod check;
mod consumer;
mod proxy;
mod run;

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
    #[arg(long)]
    upstream: std::net::SocketAddr,
    #[arg(long)]
    seed: u64,
    /// The fault rates as JSON (`proxy::FaultRates`).
    #[arg(long)]
    rates: String,
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
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let stats = Arc::new(proxy::ProxyStats::default());
    println!("proxy listening on {} → {}", args.listen, args.upstream);
    let report = stats.clone();
    // The run reads the last of these lines from the log after it kills the proxy.
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("{}", report.summary());
        }
    });
    proxy::serve(listener, args.upstream, rates, args.seed, stats).await?;
    Ok(())
}
