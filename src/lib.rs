//! wsr-gateway: a WS-Reliability 1.1 gateway (receiving and sending RMP) over SOAP on HTTP.
//!
//! Rooms (DESIGN.md §3): `wsr` the wire codec; `rmp` the pure protocol decisions; `store` the
//! durable state with its group-commit writer and sweeper; `outbound` what we send to partners
//! (our messages, callback acks); `delivery` subscriptions for applications (pull, push,
//! leases and receipts); `http` the thin axum surface; `config` and `clock` the settings and time;
//! `metrics` the names and labels every room records with.
//! `App::build` opens the store and binds, for `main` and tests alike.

pub mod clock;
pub mod config;
pub mod consume;
pub mod delivery;
pub mod endpoint;
pub mod hex;
pub mod http;
pub mod inbound;
pub mod json_text;
pub mod log_lines;
pub mod metrics;
pub mod outbound;
pub mod partners;
pub mod rmp;
pub mod secrets;
pub mod store;
pub mod telemetry;
pub mod wsr;
pub mod wss;
pub mod x509;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::clock::{Clock, SystemClock};
use crate::delivery::receipt::ReceiptKey;
use crate::http::AppState;
use crate::outbound::backend::Backends;
use crate::outbound::callbacks::RetryPolicy;
use crate::outbound::partner_clients::PartnerClients;
use crate::outbound::sender::SenderConfig;
use crate::store::{Endpoints, Store, StoreConfig};

pub use config::Config;

/// How long a shutdown waits for requests in flight (SIGTERM/SIGINT in `main`).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Longest exchange with a partner or a callback endpoint, answer included.
const OUTBOUND_TIMEOUT: Duration = Duration::from_secs(30);

/// A gateway with its store open and its port bound, not yet serving. Binding happens in
/// `build` so that a test can ask for port 0 and learn the real port first.
pub struct App {
    listener: TcpListener,
    addr: SocketAddr,
    state: AppState,
    tls: Option<http::tls::Tls>,
    /// The sender's and the callback worker's HTTP clients, built once.
    clients: PartnerClients,
}

/// Every file the configuration names, loaded as `serve` uses it: each partner's CA bundle
/// and client certificate and key, each SOAP service's, the listener's certificate, key and
/// client CA. `check-config` loads them through this too, so a file `serve` would refuse is
/// refused there, naming it.
pub struct ConfiguredFiles {
    clients: PartnerClients,
    backends: Backends,
    tls: Option<http::tls::Tls>,
}

impl ConfiguredFiles {
    pub fn load(config: &Config) -> anyhow::Result<ConfiguredFiles> {
        let clients = PartnerClients::new(
            &config.partners,
            OUTBOUND_TIMEOUT,
            Arc::new(config.destinations.clone()),
        )?;
        let backends = Backends::new(&config.operations)?;
        let tls = config
            .tls
            .as_ref()
            .map(|files| {
                let pinned = config
                    .partners
                    .iter()
                    .flat_map(|p| p.inbound.cert_sha256.iter().cloned())
                    .collect();
                http::tls::Tls::new(files, pinned).context("cannot set up TLS on the listener")
            })
            .transpose()?;
        Ok(ConfiguredFiles {
            clients,
            backends,
            tls,
        })
    }
}

impl App {
    pub async fn build(config: Config) -> anyhow::Result<App> {
        App::build_with_clock(config, Arc::new(SystemClock)).await
    }

    /// Like `build`, with the clock every decision reads (tests set it instead of sleeping).
    pub async fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<App> {
        // Before anything records: what is recorded before the recorder exists is lost.
        crate::metrics::handle();
        // First: an unusable certificate, key or CA file fails the start before anything is
        // opened or bound.
        let ConfiguredFiles {
            clients,
            backends,
            tls,
        } = ConfiguredFiles::load(&config)?;
        let store = Store::open(&StoreConfig {
            database: config.database.clone(),
            durability: config.durability,
            policy: config.policy.clone(),
        })
        .await
        .with_context(|| format!("cannot open the store at {}", config.database))?;
        // The global callback list is for anonymous callers; each partner's own list is for
        // that partner alone (a partner may name only its own endpoints, D14).
        let registered = [
            (Endpoints::Callback, None, &config.callback_endpoints),
            (Endpoints::Push, None, &config.delivery.push_endpoints),
        ]
        .into_iter()
        .chain(config.partners.iter().map(|p| {
            (
                Endpoints::Callback,
                Some(p.name.as_str()),
                &p.inbound.callback_endpoints,
            )
        }));
        for (kind, partner, urls) in registered {
            for url in urls {
                store
                    .add_endpoint(kind, partner, url, clock.now())
                    .await
                    .with_context(|| match partner {
                        None => format!("cannot register the configured {kind:?} endpoints"),
                        Some(p) => format!("cannot register partner {p}'s callback endpoints"),
                    })?;
            }
        }
        let secret = store
            .receipt_secret()
            .await
            .context("cannot read the receipt key")?;
        let receipts = Arc::new(ReceiptKey::new(&secret).context("cannot make the receipt key")?);
        let console_key = Arc::new(http::ConsoleKey::derive(&secret));
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let addr = listener
            .local_addr()
            .context("listener has no local address")?;
        let base = config.public_url.clone().unwrap_or_else(|| {
            let scheme = if tls.is_some() { "https" } else { "http" };
            format!("{scheme}://{addr}")
        });
        let callback_url = format!("{}/wsr/_callback", base.trim_end_matches('/'));
        let admissions = consume::admit::Admissions::new(
            store.clone(),
            consume::admit::Caps {
                subscriptions_per_principal: config.delivery.max_subscriptions_per_principal,
                sessions_per_subscription: config.delivery.max_sessions_per_subscription,
            },
        );
        let server_certificate = tls.as_ref().map(http::tls::Tls::reloader);
        if let Some(not_after) = server_certificate.as_ref().and_then(|c| c.not_after()) {
            tracing::info!(%not_after, "TLS certificate valid until");
        }
        Ok(App {
            listener,
            addr,
            tls,
            clients,
            state: AppState::new(http::AppContext {
                store,
                config: Arc::new(config),
                clock,
                callback_url,
                backends,
                receipts,
                console_key,
                event_streams: Arc::new(http::slots::KeyedSlots::new(
                    http::slots::MAX_EVENT_STREAMS,
                )),
                waiting_fetches: Arc::new(http::slots::KeyedSlots::new(
                    http::slots::MAX_WAITING_FETCHES,
                )),
                admissions,
                push_health: consume::push::PushHealthBook::default(),
                audit_refusals: http::audit::RefusalLimiter::default(),
                server_certificate,
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Reloads the listener's certificate (SIGHUP in `main`, tests); `None` without TLS.
    /// It stays usable while `run_until` serves.
    pub fn tls_reloader(&self) -> Option<http::tls::TlsReloader> {
        self.tls.as_ref().map(http::tls::Tls::reloader)
    }

    /// The store, for inspection and test hooks.
    pub fn store(&self) -> &Store {
        &self.state.store
    }

    /// Serves until `shutdown` completes; requests in flight are answered before it returns.
    /// The background workers (sweeper, callbacks, sender, delivery housekeeping, push) run
    /// alongside and stop with it.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let state = self.state;
        // Background workers: they stop with the server.
        let mut background = tokio::task::JoinSet::new();
        background.spawn(store::sweeper::run(
            state.store.clone(),
            state.clock.clone(),
            state.config.audit_retention,
        ));
        background.spawn(outbound::callbacks::run(
            state.store.clone(),
            state.clock.clone(),
            RetryPolicy {
                initial: state.config.callback_retry_initial,
                max: state.config.callback_retry_max,
                answer_cap: state.config.limits.max_bytes,
            },
            self.clients.clone(),
        ));
        background.spawn(outbound::sender::run(
            state.store.clone(),
            state.clock.clone(),
            SenderConfig {
                window: state.config.send_window,
                windows: outbound::sender::send_windows(&state.config.partners),
                poll_interval: state.config.poll_interval,
                concurrency: 32,
                resolve_in_doubt: state.config.resolve_in_doubt,
                partner_id_retention: state.config.partner_id_retention,
                answer_cap: state.config.limits.max_bytes,
            },
            self.clients,
        ));
        background.spawn(consume::maintain::run(
            state.store.clone(),
            state.clock.clone(),
            state.config.delivery.clone(),
        ));
        background.spawn(consume::push::run(
            state.store.clone(),
            state.clock.clone(),
            consume::push::PushLimits {
                answer_cap: state.config.limits.max_bytes,
                bytes_in_flight: state.config.delivery.max_push_bytes_in_flight,
            },
            state.push_health.clone(),
        ));
        if let (Some(tls), Some(files)) = (&self.tls, &state.config.tls)
            && files.reload_check_seconds > 0
        {
            let every = Duration::from_secs(files.reload_check_seconds);
            background.spawn(tls.reloader().watch_files(every));
        }
        let edge = http::serve::Edge {
            perimeter: state.config.perimeter.clone(),
            tls: self.tls,
            trusted_proxy: state.config.trusted_proxy.clone(),
        };
        let store = state.store.clone();
        http::serve::serve(
            self.listener,
            http::Gateway::new(state),
            edge,
            shutdown,
            SHUTDOWN_GRACE,
        )
        .await;
        // The workers stop; what they had handed to the group-commit writer is committed or
        // rolled back whole. Then the writer is flushed: whatever is still in its queue is
        // committed before we return.
        background.shutdown().await;
        match tokio::time::timeout(SHUTDOWN_GRACE, store.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the store could not be flushed at shutdown"),
            // A writer stuck reconnecting: what it had not committed was never acknowledged.
            Err(_) => tracing::warn!("the store writer did not finish within the shutdown grace"),
        }
        Ok(())
    }
}
