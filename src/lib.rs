//! wsr-gateway: a WS-Reliability 1.1 gateway (receiving and sending RMP) over SOAP on HTTP.
//!
//! Rooms (see DESIGN.md §3): `wsr` is the wire codec; `http` the thin axum surface; `config`
//! the settings. `App::build` binds and returns the running application, for `main` and tests.

pub mod config;
pub mod http;
pub mod wsr;

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::net::TcpListener;

pub use config::Config;

/// A bound, not yet serving gateway. Binding happens in `build` so that a test can ask for
/// port 0 and learn the real port before the first request.
pub struct App {
    listener: TcpListener,
    addr: SocketAddr,
}

impl App {
    pub async fn build(config: Config) -> anyhow::Result<App> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let addr = listener
            .local_addr()
            .context("listener has no local address")?;
        Ok(App { listener, addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes; requests in flight are answered before it returns.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        axum::serve(self.listener, http::router())
            .with_graceful_shutdown(shutdown)
            .await
            .context("HTTP server failed")
    }
}
