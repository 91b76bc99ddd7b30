//! The `wsr-gateway` command line. Everything of substance lives in the library.

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use wsr_gateway::{App, Config};

#[derive(Parser)]
#[command(version, about = "WS-Reliability 1.1 gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Address to listen on.
        #[arg(long, env = "WSR_LISTEN", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().command {
        Command::Serve { listen } => {
            let app = App::build(Config { listen }).await?;
            tracing::info!(addr = %app.local_addr(), "wsr-gateway listening");
            app.run_until(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("gateway stopped with an error")
        }
    }
}
