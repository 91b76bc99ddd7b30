//! The listener and its connections (D13): accepting under a connection cap, the header, body
//! and idle timeouts, the caps on requests in flight (per class and per source,
//! `classes.rs`) and on body bytes being received, and the graceful drain. It hands whole requests to the router and never looks inside them.
//!
//! Over `max_connections` the loop holds back accepting (the mini-redis way): excess clients
//! wait in the kernel's listen backlog and are served as soon as a connection closes, which the
//! header and idle timeouts guarantee happens. Accepting and closing at once would cost the
//! same per connection and tell the client less.
//!
//! hyper's own `header_read_timeout` is not used: it runs from the moment a connection waits
//! for its next request, so it also cuts keep-alive connections that are merely idle and cannot
//! give a short header timeout with a longer idle timeout. The per-connection `Watch`
//! (`watchdog.rs`) tells the two apart.
//!
//! With TLS the handshake runs inside the connection's task, under the same watch: it counts
//! against the first request's header timeout, so a client that never finishes it is cut
//! like one that never finishes its head, and holds its connection slot no longer. Each
//! source address (its /64 for IPv6; a trusted proxy is not counted) may have at most
//! `max_tls_handshakes_per_source` handshakes in progress: a connection beyond them is closed
//! before a byte of TLS is read, so one client re-opening slow or costly handshakes holds a
//! few connection slots and a few handshakes' CPU, never all of them.

//!
//! The request and response bodies under those limits are in `body.rs`.

mod body;
mod classes;
mod watchdog;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt as _;

use crate::config::{Perimeter, TrustedProxy};
use crate::http::slots::{KeyedSlot, KeyedSlots};
use crate::http::tls::Tls;
use crate::partners::ClientCertificate;
pub use body::BodyRefused;
use body::{SourceShares, TimedBody, Tracked};
use classes::{Class, Classes, Refused};
use watchdog::{OpenRequest, Watch, Watched};

/// The most a connection's read buffer may grow to (hyper's default is about 400 KiB): it is
/// memory per connection outside the body budget, so with `max_connections` it must stay
/// small; 64 KiB reads still carry large bodies at full speed.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What a client is told to wait before retrying a request refused for load.
const RETRY_AFTER_SECONDS: &str = "1";

/// The address a request came from, in every request's extensions: the TCP peer, or the
/// client a trusted proxy names (port 0 when it gives none). Per-source quotas count against
/// it. A request with a client certificate (from the TLS handshake, or a trusted proxy's
/// header) also carries a `partners::ClientCertificate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// The host the client asked for, where a trusted proxy rewrote `Host` and said so in its
/// `host_header` (`forwarded::host_of`); absent otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedHost(pub String);

/// What the listener does besides HTTP: the perimeter's limits, TLS, and which peers are
/// proxies whose headers say who the client is.
#[derive(Debug, Clone)]
pub struct Edge {
    pub perimeter: Perimeter,
    /// `None`: plain HTTP.
    pub tls: Option<Tls>,
    pub trusted_proxy: Option<TrustedProxy>,
}

impl From<Perimeter> for Edge {
    fn from(perimeter: Perimeter) -> Edge {
        Edge {
            perimeter,
            tls: None,
            trusted_proxy: None,
        }
    }
}

/// 503 with `Retry-After`, for a request refused because the gateway is busy.
pub fn busy(why: &str) -> axum::response::Response {
    try_later(StatusCode::SERVICE_UNAVAILABLE, why)
}

/// `status` with `Retry-After`, saying `why`. Such a refusal comes before the request's body
/// is read, so it also says `Connection: close`: the unread body must not be taken for the
/// connection's next request.
fn try_later(status: StatusCode, why: &str) -> axum::response::Response {
    (
        status,
        [
            (
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            ),
            (header::CONNECTION, HeaderValue::from_static("close")),
        ],
        format!("{why}; try again later\n"),
    )
        .into_response()
}

/// The answer to a request its class did not admit: 503 when the class is full (the gateway
/// is busy), 429 when the client holds its whole share of it; both say when to try again.
fn refusal(refused: Refused) -> axum::response::Response {
    crate::metrics::refused(refused.class().name(), refused.reason());
    match refused {
        Refused::ClassFull(class) => busy(&format!("too many {} requests in flight", class.name())),
        Refused::ShareUsed(class) => try_later(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "this client has its whole share of {} requests in flight",
                class.name()
            ),
        ),
    }
}

/// What `serve` hands each request to: the gateway's `http::Gateway`, or any `Router`.
pub trait Handler:
    tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Handler for S where
    S: tower::Service<
            Request<Body>,
            Response = Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, lets every
/// connection finish the request it is handling (at most `grace`) and returns.
pub async fn serve(
    listener: TcpListener,
    router: impl Handler,
    edge: impl Into<Edge>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) {
    let limits = Arc::new(Limits::new(edge.into()));
    let (stopping, stop) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = limits.connections.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, PeerAddr(peer)),
                Err(e) => {
                    // Out of file descriptors or a connection reset before accept: wait a
                    // little instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        connections.spawn(connection(
            stream,
            peer,
            permit,
            router.clone(),
            limits.clone(),
            stop.clone(),
        ));
    }
    drop(listener);
    let _ = stopping.send(true);
    drain(connections, grace).await;
}

/// Waits up to `grace` for every connection to finish, then closes the rest.
async fn drain(mut connections: JoinSet<()>, grace: Duration) {
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "graceful shutdown timed out; closing the remaining connections"
        );
    }
    connections.shutdown().await;
}

/// What every connection of one listener shares: the caps as semaphores, the perimeter's
/// timeouts, TLS and the trusted proxy.
struct Limits {
    connections: Arc<Semaphore>,
    classes: Classes,
    body_bytes: Arc<Semaphore>,
    /// Each source's share of `body_bytes`.
    body_shares: Arc<KeyedSlots>,
    /// TLS handshakes in progress per source (`inbound::source_of`).
    handshakes: Arc<KeyedSlots>,
    perimeter: Perimeter,
    tls: Option<Tls>,
    trusted_proxy: Option<TrustedProxy>,
}

impl Limits {
    fn new(edge: Edge) -> Limits {
        let Edge {
            perimeter,
            tls,
            trusted_proxy,
        } = edge;
        Limits {
            connections: Arc::new(Semaphore::new(perimeter.max_connections)),
            classes: Classes::new(&perimeter),
            body_bytes: Arc::new(Semaphore::new(perimeter.max_body_bytes_in_flight)),
            body_shares: Arc::new(KeyedSlots::new(
                perimeter.max_body_bytes_in_flight_per_source,
            )),
            handshakes: Arc::new(KeyedSlots::new(perimeter.max_tls_handshakes_per_source)),
            perimeter,
            tls,
            trusted_proxy,
        }
    }

    /// A handshake slot for a connection from `peer`: `Ok(None)` for a trusted proxy, which
    /// speaks for many clients and is not counted; `Err(())` when the source has its whole
    /// share of handshakes in progress.
    fn handshake_slot(&self, peer: PeerAddr) -> Result<Option<KeyedSlot>, ()> {
        if self
            .trusted_proxy
            .as_ref()
            .is_some_and(|p| p.trusts(peer.0.ip()))
        {
            return Ok(None);
        }
        let source = crate::inbound::source_of(Some(peer.0));
        self.handshakes.take(&source).map(Some).ok_or(())
    }
}

/// One connection: the TLS handshake if any, then hyper's HTTP/1.1, with the watchdog beside
/// both.
async fn connection(
    stream: TcpStream,
    peer: PeerAddr,
    _permit: OwnedSemaphorePermit,
    router: impl Handler,
    limits: Arc<Limits>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let watch = Arc::new(Watch::new());
    let io = Watched {
        io: stream,
        watch: watch.clone(),
    };
    let Some(tls) = limits.tls.clone() else {
        return http(io, peer, None, router, limits, watch, stop).await;
    };
    let Ok(handshake) = limits.handshake_slot(peer) else {
        crate::metrics::refused("tls", "handshakes_per_source");
        tracing::debug!(
            peer = %peer.0,
            "closing a connection before its TLS handshake: this source has {} in progress",
            limits.perimeter.max_tls_handshakes_per_source
        );
        return;
    };
    let perimeter = &limits.perimeter;
    let (io, certificate) = tokio::select! {
        accepted = tls.accept(io) => match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(peer = %peer.0, error = %e, "TLS handshake failed");
                return;
            }
        },
        why = watch.expired(perimeter.header_timeout, perimeter.idle_timeout) => {
            tracing::debug!(peer = %peer.0, "closing a connection in its TLS handshake: {why}");
            return;
        }
        // No request is open yet: nothing to finish.
        _ = stop.wait_for(|s| *s) => return,
    };
    drop(handshake);
    http(io, peer, certificate, router, limits, watch, stop).await
}

/// HTTP/1.1 on one connection until it ends, a timeout cuts it or the drain has closed it.
async fn http<IO>(
    io: IO,
    peer: PeerAddr,
    certificate: Option<ClientCertificate>,
    router: impl Handler,
    limits: Arc<Limits>,
    watch: Arc<Watch>,
    mut stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let watch = watch.clone();
        let limits = limits.clone();
        hyper::service::service_fn(move |mut request: Request<Incoming>| {
            note_client(
                &mut request,
                peer,
                certificate.as_ref(),
                limits.trusted_proxy.as_ref(),
            );
            handle(request, router.clone(), limits.clone(), watch.clone())
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .max_buf_size(READ_BUFFER_BYTES)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            why = watch.expired(limits.perimeter.header_timeout, limits.perimeter.idle_timeout) => {
                tracing::debug!("closing a connection: {why}");
                return;
            }
            _ = stop.wait_for(|s| *s), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Puts who the client is into the request's extensions: its address (`PeerAddr`), the host
/// it asked for (`ForwardedHost`) and its certificate, from the connection or, for a trusted
/// proxy, from the headers the proxy sets.
fn note_client(
    request: &mut Request<Incoming>,
    peer: PeerAddr,
    certificate: Option<&ClientCertificate>,
    trusted_proxy: Option<&TrustedProxy>,
) {
    let (addr, certificate) =
        crate::http::forwarded::client_of(request.headers(), peer.0, certificate, trusted_proxy);
    if let Some(name) = trusted_proxy.and_then(|p| p.client_cert_header.as_ref()) {
        // Read above when it counts; gone so that nothing after us can mistake it.
        request.headers_mut().remove(name);
    }
    let forwarded_host = crate::http::forwarded::host_of(request.headers(), peer.0, trusted_proxy);
    request.extensions_mut().insert(PeerAddr(addr));
    if let Some(host) = forwarded_host {
        request.extensions_mut().insert(ForwardedHost(host));
    }
    if let Some(certificate) = certificate {
        request.extensions_mut().insert(certificate);
    }
}

/// One request: the in-flight cap, the watched body in, the watched body out.
async fn handle(
    request: Request<Incoming>,
    router: impl Handler,
    limits: Arc<Limits>,
    watch: Arc<Watch>,
) -> Result<Response<Body>, Infallible> {
    let open = OpenRequest::new(watch);
    // Who the shares are counted for: the client's address (an IPv6 client's /64, which one
    // host can fill with addresses), as the per-source quotas count it.
    let source = crate::inbound::source_of(request.extensions().get::<PeerAddr>().map(|p| p.0));
    // Health checks are answered even when the gateway is saturated: they say so themselves.
    let permit = match Class::of(request.uri().path()) {
        None => None,
        Some(class) => match limits.classes.admit(class, &source) {
            Ok(admitted) => Some(admitted),
            Err(refused) => {
                return Ok(refusal(refused).map(|b| Body::new(Tracked::new(b, open, None))));
            }
        },
    };
    let perimeter = &limits.perimeter;
    let request = request.map(|incoming| {
        Body::new(TimedBody::new(
            incoming,
            perimeter.body_timeout,
            perimeter.body_min_bytes_per_second,
            limits.body_bytes.clone(),
            SourceShares {
                slots: limits.body_shares.clone(),
                source,
            },
        ))
    });
    let response = match router.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    Ok(response.map(|b| Body::new(Tracked::new(b, open, permit))))
}
