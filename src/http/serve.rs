//! The listener and its connections (D13): accepting under a connection cap, the header, body
//! and idle timeouts, the caps on requests in flight and on body bytes being received, and the
//! graceful drain. It hands whole requests to the router and never looks inside them.
//!
//! Over `max_connections` the loop holds back accepting (the mini-redis way): excess clients
//! wait in the kernel's listen backlog and are served as soon as a connection closes, which the
//! header and idle timeouts guarantee happens. Accepting and closing at once would cost the
//! same per connection and tell the client less.
//!
//! hyper's own `header_read_timeout` is not used: it runs from the moment a connection waits
//! for its next request, so it also cuts keep-alive connections that are merely idle and cannot
//! give a short header timeout with a longer idle timeout. The per-connection `Watch` below
//! tells the two apart.
//!
//! With TLS the handshake runs inside the connection's task, under the same watch: it counts
//! against the first request's header timeout, so a client that never finishes it is cut
//! like one that never finishes its head, and holds its connection slot no longer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse as _;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

use crate::config::{Perimeter, TrustedProxy};
use crate::http::tls::Tls;
use crate::partners::ClientCertificate;

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

/// Why the perimeter refused a request body; `read_body` turns it into its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefused {
    /// It paused longer than `body_timeout` or fell below `body_min_bytes_per_second`.
    TooSlow,
    /// Bodies being received already hold `max_body_bytes_in_flight`.
    OverBudget,
}

impl std::fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BodyRefused::TooSlow => "the request body arrived too slowly",
            BodyRefused::OverBudget => "too many request bodies are being received now",
        })
    }
}

impl std::error::Error for BodyRefused {}

/// 503 with `Retry-After`, for a request refused because the gateway is busy.
pub fn busy(why: &str) -> axum::response::Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        )],
        format!("{why}; try again later\n"),
    )
        .into_response()
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, lets every
/// connection finish the request it is handling (at most `grace`) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    edge: impl Into<Edge>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) {
    let Edge {
        perimeter,
        tls,
        trusted_proxy,
    } = edge.into();
    let limits = Arc::new(Limits {
        connections: Arc::new(Semaphore::new(perimeter.max_connections)),
        in_flight: Arc::new(Semaphore::new(perimeter.max_requests_in_flight)),
        body_bytes: Arc::new(Semaphore::new(perimeter.max_body_bytes_in_flight)),
        perimeter,
        tls,
        trusted_proxy,
    });
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

struct Limits {
    connections: Arc<Semaphore>,
    in_flight: Arc<Semaphore>,
    body_bytes: Arc<Semaphore>,
    perimeter: Perimeter,
    tls: Option<Tls>,
    trusted_proxy: Option<TrustedProxy>,
}

/// One connection: the TLS handshake if any, then hyper's HTTP/1.1, with the watchdog beside
/// both.
async fn connection(
    stream: TcpStream,
    peer: PeerAddr,
    _permit: OwnedSemaphorePermit,
    router: Router,
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
    http(io, peer, certificate, router, limits, watch, stop).await
}

/// HTTP/1.1 on one connection until it ends, a timeout cuts it or the drain has closed it.
async fn http<IO>(
    io: IO,
    peer: PeerAddr,
    certificate: Option<ClientCertificate>,
    router: Router,
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
            let (addr, certificate) = crate::http::forwarded::client_of(
                request.headers(),
                peer.0,
                certificate.as_ref(),
                limits.trusted_proxy.as_ref(),
            );
            if let Some(name) = limits
                .trusted_proxy
                .as_ref()
                .and_then(|p| p.client_cert_header.as_ref())
            {
                // Read above when it counts; gone so that nothing after us can mistake it.
                request.headers_mut().remove(name);
            }
            let forwarded_host = crate::http::forwarded::host_of(
                request.headers(),
                peer.0,
                limits.trusted_proxy.as_ref(),
            );
            request.extensions_mut().insert(PeerAddr(addr));
            if let Some(host) = forwarded_host {
                request.extensions_mut().insert(ForwardedHost(host));
            }
            if let Some(certificate) = certificate {
                request.extensions_mut().insert(certificate);
            }
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

/// One request: the in-flight cap, the watched body in, the watched body out.
async fn handle(
    request: Request<Incoming>,
    router: Router,
    limits: Arc<Limits>,
    watch: Arc<Watch>,
) -> Result<Response<Body>, Infallible> {
    let open = OpenRequest::new(watch);
    // Health checks are answered even when the gateway is saturated: they say so themselves.
    let exempt = matches!(request.uri().path(), "/healthz" | "/readyz");
    let permit = if exempt {
        None
    } else {
        match limits.in_flight.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                return Ok(busy("too many requests in flight").map(|b| {
                    Body::new(Tracked {
                        body: b,
                        _open: open,
                    })
                }));
            }
        }
    };
    let perimeter = &limits.perimeter;
    let request = request.map(|incoming| {
        Body::new(TimedBody {
            inner: incoming,
            pause: perimeter.body_timeout,
            min_rate: perimeter.body_min_bytes_per_second,
            budget: limits.body_bytes.clone(),
            held: None,
            window_start: None,
            window_bytes: 0,
            waiting: false,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        })
    });
    let response = match router.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    drop(permit);
    Ok(response.map(|b| {
        Body::new(Tracked {
            body: b,
            _open: open,
        })
    }))
}

/// The state of one connection, as far as its timeouts care.
struct Watch {
    state: Mutex<Phase>,
    changed: Notify,
}

#[derive(Clone, Copy)]
enum Phase {
    /// Waiting for a request head whose first byte (or the accept) came at this instant.
    Head(Instant),
    /// No request open, nothing of the next one received, since this instant.
    Idle(Instant),
    /// This many requests are being handled or answered (their own timeouts apply).
    Busy(usize),
}

impl Watch {
    fn new() -> Watch {
        Watch {
            // A fresh connection must send its first head within the header timeout.
            state: Mutex::new(Phase::Head(Instant::now())),
            changed: Notify::new(),
        }
    }

    fn update(&self, change: impl FnOnce(Phase) -> Phase) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = change(*state);
        drop(state);
        self.changed.notify_one();
    }

    fn phase(&self) -> Phase {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_bytes(&self) {
        if matches!(self.phase(), Phase::Idle(_)) {
            self.update(|p| match p {
                Phase::Idle(_) => Phase::Head(Instant::now()),
                other => other,
            });
        }
    }

    /// Completes when the connection has waited longer than its phase allows.
    async fn expired(&self, header: Duration, idle: Duration) -> &'static str {
        let deadline = |phase| match phase {
            Phase::Head(since) => Some((since + header, "header timeout")),
            Phase::Idle(since) => Some((since + idle, "idle timeout")),
            Phase::Busy(_) => None,
        };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let Some((at, _)) = deadline(self.phase()) else {
                changed.await;
                continue;
            };
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(at) => {
                    // The phase may have moved on just as the timer fired.
                    if let Some((at, why)) = deadline(self.phase())
                        && at <= Instant::now() {
                            return why;
                        }
                }
            }
        }
    }
}

/// Marks a request open on its connection until its answer has been written (or dropped).
struct OpenRequest(Arc<Watch>);

impl OpenRequest {
    fn new(watch: Arc<Watch>) -> OpenRequest {
        watch.update(|p| match p {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
        OpenRequest(watch)
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.update(|p| match p {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        });
    }
}

/// The socket, telling the watch when bytes arrive.
struct Watched<IO> {
    io: IO,
    watch: Arc<Watch>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.watch.read_bytes();
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request open on the connection until it has been sent.
struct Tracked {
    body: Body,
    _open: OpenRequest,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body under the body timeout, the minimum rate and the shared byte budget.
///
/// The body is cut when the next piece takes longer than `pause` to come, or when fewer than
/// `min_rate` × `pause` bytes come within one window of `pause`: the rate is kept in every
/// window, not as an average since the start, which a fast start would bank for hours of
/// trickling while holding its share of the budget. Every byte received takes its share of
/// `budget` until the body is dropped, so bodies that stall hold at most the budget between
/// them, whatever they announced.
struct TimedBody {
    inner: Incoming,
    pause: Duration,
    min_rate: u64,
    budget: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    /// When the current window began (the first read, or when the last one met its quota).
    window_start: Option<Instant>,
    /// Bytes received in the current window.
    window_bytes: u64,
    waiting: bool,
    timer: Pin<Box<Sleep>>,
}

impl TimedBody {
    /// Bytes one window must bring.
    fn window_quota(&self) -> u64 {
        let millis = u64::try_from(self.pause.as_millis()).unwrap_or(u64::MAX);
        self.min_rate.saturating_mul(millis) / 1000
    }

    fn deadline(&self, now: Instant, window_start: Instant) -> Instant {
        if self.min_rate == 0 {
            return now + self.pause;
        }
        // The window's end comes no later than `now + pause`: it also bounds the gap.
        window_start + self.pause
    }

    /// Counts a piece into the window; a window whose quota is met starts the next one.
    fn count(&mut self, bytes: usize, now: Instant) {
        self.window_bytes = self.window_bytes.saturating_add(bytes as u64);
        if self.window_bytes >= self.window_quota() {
            self.window_start = Some(now);
            self.window_bytes = 0;
        }
    }
}

impl HttpBody for TimedBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if !this.waiting {
            let now = Instant::now();
            let window_start = *this.window_start.get_or_insert(now);
            let deadline = this.deadline(now, window_start);
            this.timer.as_mut().reset(deadline);
            this.waiting = true;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.waiting = false;
                if let Some(data) = frame.data_ref() {
                    this.count(data.len(), Instant::now());
                    let share = u32::try_from(data.len()).unwrap_or(u32::MAX);
                    match this.budget.clone().try_acquire_many_owned(share) {
                        Ok(permit) => match &mut this.held {
                            Some(held) => held.merge(permit),
                            None => this.held = Some(permit),
                        },
                        Err(_) => return Poll::Ready(Some(Err(BodyRefused::OverBudget.into()))),
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.waiting = false;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(BodyRefused::TooSlow.into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
