//! A fault-injecting HTTP/1.1 proxy for the chaos harness.
//!
//! The proxy sits between a sender and the gateway (or between the gateway and its
//! downstream) and, for every request, rolls a seeded RNG to decide whether to forward it
//! untouched or to inject one fault: drop the request, drop the response ("ack lost"),
//! forward it twice, answer a 5xx itself, or reset the client connection. Independently of
//! that, a forwarded request may be delayed by a random amount, which reorders concurrent
//! requests.
//!
//! # Connection handling: one request per client connection
//!
//! Every client connection carries exactly one request. Each answer the proxy writes says
//! `Connection: close`, and the proxy closes the connection after writing it (write-side
//! shutdown, then a short bounded drain so that the kernel does not turn the close into a
//! reset while the client still has bytes in flight). This was chosen over keep-alive on
//! purpose: with pooled connections an HTTP client may silently retry a request that hit a
//! connection the proxy had just closed, which would blur the faults the harness means to
//! inject; with one request per connection each fault is seen by the client exactly once,
//! as injected. Pipelined bytes after the first request are ignored.
//!
//! Towards the upstream the proxy opens a fresh TCP connection per forwarded copy (no
//! pooling), sends `Host: <upstream>` and `Connection: close`, skips interim `1xx`
//! answers, and reads the final answer's body by `Content-Length`, by chunked decoding, or
//! until EOF. The whole upstream exchange is bounded by a 30 s timeout; an upstream that
//! cannot be reached, fails or times out is answered to the client as `502` and counted in
//! [`ProxyStats::upstream_failures`] — the normal situation while the harness kills and
//! restarts the upstream process.
//!
//! # Several upstreams: round-robin, next upstream on a failed connection
//!
//! The proxy may have several upstreams (gateways on one shared database, as behind a load
//! balancer). Each forwarded copy takes the next upstream in turn — per copy, so the two
//! copies of a duplicated request go to two different upstreams. When the connection to the
//! chosen upstream cannot be made (TCP connect refused or failed, or the TLS handshake
//! failed), the proxy tries the next one, and so on once round, before it fails the request
//! with `502`: what nginx's `proxy_next_upstream error` does. As nginx does for non-idempotent
//! requests, it never passes a request on once any of it has been sent: a failure after that
//! (a cut connection, a timeout, a malformed answer) fails the request as with one upstream,
//! because that upstream may have acted on it. Each connection passed on so is counted in
//! [`ProxyStats::next_upstream`]. With one upstream nothing changes.
//!
//! Only `Content-Length` framing is accepted from clients: a request with
//! `Transfer-Encoding` is answered `501`, a head over 64 KiB (or with more than 128 header
//! fields) `431`, a body over 64 MiB `413`, a malformed request `400`; each then closes.
//!
//! # Determinism
//!
//! Each accepted connection gets its own `fastrand::Rng`, seeded from the run's seed and
//! the connection's accept index, and every request draws the same number of values from
//! it. Runs with the same seed whose connections arrive in the same order therefore make
//! the same choices, however the handling of those connections interleaves afterwards.
//! (Which of several upstreams a copy goes to follows the order in which copies are
//! forwarded, and is not seeded.)
//!
//! # TLS
//!
//! With a [`ProxyTls`] the proxy terminates TLS on both sides, so that it can still see and
//! fault whole HTTP requests: it accepts TLS from clients with its own server certificate and
//! requires a client certificate chaining to the run's CA, and it connects to the upstream
//! over TLS, verifying the upstream's certificate against that CA and presenting the client
//! certificate of the *sender* of its direction. The upstream therefore authenticates the
//! real partner, not the proxy; `Authorization` headers pass through unchanged. Without it
//! (either side) that side is plain TCP.
//!
//! Nothing derived from the network is unwrapped; an error on one connection is logged
//! with `tracing::debug!` and ends only that connection.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Largest request or response head (request/status line plus header fields).
const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one head.
const MAX_HEADERS: usize = 128;
/// Largest request or response body.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// Longest line in a chunked body (chunk size line or trailer field).
const MAX_LINE: usize = 8 * 1024;
/// Bound on one whole upstream exchange: connect, send, read the answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on reading a request from a client and on writing an answer to it.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long, and how much, to drain from a client after answering, before closing.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
const DRAIN_MAX: usize = 1024 * 1024;

/// Hop-by-hop header fields, never passed on in either direction (the proxy writes its own
/// `Connection` and `Content-Length`).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
];

/// Probabilities (0.0..=1.0) of each fault, per request; at most one fault per request,
/// chosen by one roll.
///
/// The faults take consecutive slices of `[0, 1)` in field order (`drop_request`,
/// `drop_response`, `duplicate`, `error_5xx`, `reset`); if they add up to more than 1 the
/// later ones get what is left. `delay` is rolled separately and applies to every request
/// that is forwarded (plain, `drop_response` and `duplicate`). Missing fields deserialize
/// as 0; negative or NaN rates count as 0.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct FaultRates {
    /// Read the request, never forward it, close the client connection without an answer.
    pub drop_request: f64,
    /// Forward it, read upstream's answer, close the client connection without writing it
    /// (the "ack lost" case).
    pub drop_response: f64,
    /// Forward it twice (second copy concurrently or right after, at random), answer the
    /// client with one of the two answers.
    pub duplicate: f64,
    /// Sleep a random `0..=max_delay_ms` before forwarding (concurrent requests thereby get
    /// reordered).
    pub delay: f64,
    pub max_delay_ms: u64,
    /// Do not forward; answer 503 (or 500/502 at random) with a short text body.
    pub error_5xx: f64,
    /// Do not forward; reset the client connection (`SO_LINGER` 0 then drop → TCP RST).
    pub reset: f64,
}

/// Counters of what the proxy did; shared with the harness for its report.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Requests read completely from clients (malformed or oversized ones not included).
    pub requests: AtomicU64,
    /// Upstream exchanges that completed with an answer (a duplicated request counts twice).
    pub forwarded: AtomicU64,
    pub dropped_requests: AtomicU64,
    pub dropped_responses: AtomicU64,
    pub duplicated: AtomicU64,
    pub delayed: AtomicU64,
    pub errors_5xx: AtomicU64,
    pub resets: AtomicU64,
    /// Upstream exchanges that failed: refused, cut, malformed or timed out.
    pub upstream_failures: AtomicU64,
    /// Connections to an upstream that could not be made and were passed on to the next
    /// upstream (only with several).
    pub next_upstream: AtomicU64,
    /// Where upstream answers to marked requests are written down (see [`AnswerLog`]).
    pub answers: AnswerLog,
}

/// A record of the upstream's answers to the requests whose body holds a marker: one JSON
/// line per answer (`{"hid", "status", "content_type", "body"}`, the body in hex, byte for
/// byte), written before the client sees it — whatever the fault then does to the answer.
/// The chaos run marks its request-response messages so and checks that every copy of one
/// was answered with the same bytes. The harness id (`hid`) is the request body's first
/// ` id="…"` attribute. Off by default.
#[derive(Debug, Default)]
pub struct AnswerLog {
    target: std::sync::Mutex<Option<(std::fs::File, String)>>,
}

impl AnswerLog {
    /// Appends to `path` the answers to requests whose body contains `marker`.
    pub fn to_file(path: &std::path::Path, marker: &str) -> io::Result<AnswerLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(AnswerLog {
            target: std::sync::Mutex::new(Some((file, marker.to_owned()))),
        })
    }

    fn record(&self, request: &[u8], status: u16, headers: &Headers, body: &[u8]) {
        use std::io::Write as _;
        let Ok(mut target) = self.target.lock() else {
            return;
        };
        let Some((file, marker)) = target.as_mut() else {
            return;
        };
        let request = String::from_utf8_lossy(request);
        if !request.contains(marker.as_str()) {
            return;
        }
        let hid = request
            .find(" id=\"")
            .map(|start| &request[start + 5..])
            .and_then(|rest| rest.find('"').map(|end| &rest[..end]))
            .unwrap_or("?");
        let content_type = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
        let mut line = serde_json::json!({
            "hid": hid,
            "status": status,
            "content_type": content_type,
            "body": hex,
        })
        .to_string();
        line.push('\n');
        // One write per line: a kill -9 of the proxy leaves whole lines behind.
        if let Err(error) = file.write_all(line.as_bytes()) {
            tracing::warn!(%error, "chaos proxy: could not record an answer");
        }
    }
}

impl ProxyStats {
    /// One line, `requests=… forwarded=… dropped_requests=… …`.
    pub fn summary(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "requests={} forwarded={} dropped_requests={} dropped_responses={} duplicated={} \
             delayed={} errors_5xx={} resets={} upstream_failures={} next_upstream={}",
            get(&self.requests),
            get(&self.forwarded),
            get(&self.dropped_requests),
            get(&self.dropped_responses),
            get(&self.duplicated),
            get(&self.delayed),
            get(&self.errors_5xx),
            get(&self.resets),
            get(&self.upstream_failures),
            get(&self.next_upstream),
        )
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A connection the proxy reads and writes: plain TCP or TLS over TCP.
///
/// The faults are HTTP-level and do not care which; only the reset fault needs the TCP
/// socket underneath (`SO_LINGER` 0), hence [`Conn::tcp`].
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send {
    fn tcp(&self) -> &TcpStream;
}

impl Conn for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Conn for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

impl Conn for tokio_rustls::client::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// TLS on the proxy's two sides; a side left `None` is plain TCP.
#[derive(Clone, Default)]
pub struct ProxyTls {
    /// Towards clients: the proxy's server certificate; a client certificate chaining to the
    /// run's CA is required.
    pub accept: Option<TlsAcceptor>,
    /// Towards the upstream: its certificate is checked against the CA, and the sender's
    /// client certificate is presented.
    pub connect: Option<TlsConnector>,
}

/// The crypto provider, named explicitly: more than one is compiled into the tree, and then
/// rustls has no process default to pick.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read_certs(path: &std::path::Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("read {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parse {}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("no certificate in {}", path.display());
    }
    Ok(certs)
}

fn read_key(path: &std::path::Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("read a key from {}", path.display()))
}

fn roots(ca: &std::path::Path) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("a CA certificate in {}", ca.display()))?;
    }
    Ok(Arc::new(roots))
}

impl ProxyTls {
    /// The accepting side: our certificate and key, and the CA client certificates must
    /// chain to (one is required: the gateways behind the proxy always present theirs).
    pub fn server(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: &std::path::Path,
    ) -> anyhow::Result<TlsAcceptor> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots(client_ca)?,
            provider(),
        )
        .build()
        .context("client certificate verifier")?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(read_certs(cert)?, read_key(key)?)
            .context("the proxy's server certificate")?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// The connecting side: the CA the upstream's certificate must chain to and, if given,
    /// the client certificate to present (the sender's of this direction).
    pub fn client(
        ca: &std::path::Path,
        client_cert: Option<(&std::path::Path, &std::path::Path)>,
    ) -> anyhow::Result<TlsConnector> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots(ca)?);
        let config = match client_cert {
            Some((cert, key)) => builder
                .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
                .context("the client certificate towards the upstream")?,
            None => builder.with_no_client_auth(),
        };
        Ok(TlsConnector::from(Arc::new(config)))
    }
}

/// The upstreams, taken in turn (see "Several upstreams" above).
struct Upstreams {
    addrs: Vec<SocketAddr>,
    next: AtomicUsize,
}

impl Upstreams {
    /// The order to try them in for one forwarded copy: the next in turn, then the others
    /// after it, each once.
    fn turn(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        (0..self.addrs.len()).map(move |i| self.addrs[first.wrapping_add(i) % self.addrs.len()])
    }
}

/// Serves until the task is dropped/aborted. `upstreams` are host:port on 127.0.0.1, one or
/// more, used round-robin.
///
/// Connection tasks live in a `JoinSet` owned by this future, so aborting it also ends
/// every connection in flight. Only a failure to read the listener's own address (or no
/// upstream at all) returns an error; failed accepts are logged and retried.
pub async fn serve(
    listener: TcpListener,
    upstreams: Vec<SocketAddr>,
    rates: FaultRates,
    seed: u64,
    stats: Arc<ProxyStats>,
    tls: ProxyTls,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    if upstreams.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no upstream"));
    }
    tracing::debug!(
        %local,
        ?upstreams,
        ?rates,
        seed,
        tls_in = tls.accept.is_some(),
        tls_out = tls.connect.is_some(),
        "chaos proxy listening"
    );
    let upstreams = Arc::new(Upstreams {
        addrs: upstreams,
        next: AtomicUsize::new(0),
    });
    let mut tasks = JoinSet::new();
    let mut index: u64 = 0;
    loop {
        // Reap finished connection tasks so the set does not grow without bound.
        while tasks.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "chaos proxy: accept failed");
                // E.g. out of file descriptors: back off a little rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let rng = fastrand::Rng::with_seed(connection_seed(seed, index));
        let stats = Arc::clone(&stats);
        tasks.spawn(handle_connection(
            stream,
            peer,
            index,
            Arc::clone(&upstreams),
            rates,
            rng,
            stats,
            tls.clone(),
        ));
        index = index.wrapping_add(1);
    }
}

/// SplitMix64 of the run's seed and the connection's index: independent, reproducible
/// per-connection seeds.
fn connection_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The fault chosen for one request (delay is decided separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Forward,
    DropRequest,
    DropResponse,
    Duplicate,
    Error5xx,
    Reset,
}

fn rate(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

/// Maps one roll in `[0, 1)` to a fault: consecutive slices of the rates in field order.
fn choose(rates: &FaultRates, roll: f64) -> Fault {
    let slices = [
        (rates.drop_request, Fault::DropRequest),
        (rates.drop_response, Fault::DropResponse),
        (rates.duplicate, Fault::Duplicate),
        (rates.error_5xx, Fault::Error5xx),
        (rates.reset, Fault::Reset),
    ];
    let mut upper = 0.0;
    for (p, fault) in slices {
        upper += rate(p);
        if roll < upper {
            return fault;
        }
    }
    Fault::Forward
}

/// Everything random about one request, drawn up front (always the same number of draws,
/// so the RNG stream stays aligned whatever is chosen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Decision {
    fault: Fault,
    delay: Option<Duration>,
    /// Duplicate: send the second copy concurrently with the first (else right after it).
    duplicate_concurrently: bool,
    /// Duplicate: answer the client with the second copy's answer (else the first's).
    answer_with_second: bool,
    /// Error5xx: the status to answer.
    error_status: u16,
}

fn decide(rng: &mut fastrand::Rng, rates: &FaultRates) -> Decision {
    let roll = rng.f64();
    let delay_roll = rng.f64();
    let delay_ms = rng.u64(0..=rates.max_delay_ms);
    let duplicate_concurrently = rng.bool();
    let answer_with_second = rng.bool();
    let error_status = match rng.u8(0..4) {
        0 => 500,
        1 => 502,
        _ => 503,
    };
    Decision {
        fault: choose(rates, roll),
        delay: (delay_roll < rate(rates.delay)).then(|| Duration::from_millis(delay_ms)),
        duplicate_concurrently,
        answer_with_second,
        error_status,
    }
}

/// A byte stream with a read-ahead buffer.
struct BufConn<S> {
    io: S,
    buf: Vec<u8>,
}

impl<S: AsyncRead + Unpin> BufConn<S> {
    fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::new(),
        }
    }

    /// Reads more bytes into the buffer; `Ok(0)` at EOF.
    async fn fill(&mut self) -> io::Result<usize> {
        self.buf.reserve(16 * 1024);
        self.io.read_buf(&mut self.buf).await
    }

    /// Removes and returns the first `n` buffered bytes, reading more as needed.
    async fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if self.fill().await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Removes and returns one line without its CRLF (or LF).
    async fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line = self.take(i + 1).await?;
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(invalid("line too long"));
            }
            if self.fill().await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Everything up to EOF, at most `max` bytes.
    async fn read_until_eof(&mut self, max: usize) -> io::Result<Vec<u8>> {
        while self.fill().await? != 0 {
            if self.buf.len() > max {
                return Err(invalid("body too large"));
            }
        }
        Ok(std::mem::take(&mut self.buf))
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_owned())
}

type Headers = Vec<(String, Vec<u8>)>;

fn header<'a>(headers: &'a Headers, name: &str) -> impl Iterator<Item = &'a [u8]> {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn owned_headers(headers: &[httparse::Header<'_>]) -> Headers {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect()
}

/// The one `Content-Length` of a head: `Ok(None)` if absent, an error if malformed or if
/// several disagree.
fn content_length(headers: &Headers) -> Result<Option<u64>, &'static str> {
    let mut found = None;
    for value in header(headers, "content-length") {
        let n = std::str::from_utf8(value)
            .ok()
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("malformed Content-Length")?;
        if found.is_some_and(|f| f != n) {
            return Err("conflicting Content-Length");
        }
        found = Some(n);
    }
    Ok(found)
}

/// Lower-cased tokens of the `Connection` header fields (fields named there are hop-by-hop).
fn connection_tokens(headers: &Headers) -> Vec<String> {
    header(headers, "connection")
        .flat_map(|v| v.split(|&b| b == b','))
        .filter_map(|t| std::str::from_utf8(t).ok())
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

fn is_hop_by_hop(name: &str, tokens: &[String]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || tokens.iter().any(|t| name.eq_ignore_ascii_case(t))
}

/// A request read from a client.
#[derive(Debug)]
struct Request {
    method: String,
    /// The request target as sent (origin form, e.g. `/ws?x=1`).
    target: String,
    headers: Headers,
    /// Whether the client framed the request with a `Content-Length`.
    had_length: bool,
    body: Vec<u8>,
}

/// Why no request could be read from a client.
#[derive(Debug)]
enum ReadError {
    /// The connection failed, or ended in the middle of a request: just close.
    Io(io::Error),
    /// Answer this status with a short text, then close.
    Reject(u16, &'static str),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Reads one request; `Ok(None)` if the client closed before sending a byte.
async fn read_request<S: Conn>(conn: &mut BufConn<S>) -> Result<Option<Request>, ReadError> {
    let (method, target, headers, head_len) = loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut slots);
        match parsed.parse(&conn.buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let (Some(method), Some(target)) = (parsed.method, parsed.path) else {
                    return Err(ReadError::Reject(400, "malformed request line"));
                };
                break (
                    method.to_owned(),
                    target.to_owned(),
                    owned_headers(parsed.headers),
                    head_len,
                );
            }
            Ok(httparse::Status::Partial) => {
                if conn.buf.len() > MAX_HEAD {
                    return Err(ReadError::Reject(431, "request head too large"));
                }
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(ReadError::Reject(431, "too many header fields"));
            }
            Err(_) => return Err(ReadError::Reject(400, "malformed request")),
        }
        if conn.fill().await? == 0 {
            if conn.buf.is_empty() {
                return Ok(None);
            }
            return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    };
    if head_len > MAX_HEAD {
        return Err(ReadError::Reject(431, "request head too large"));
    }
    conn.take(head_len).await?;

    if header(&headers, "transfer-encoding").next().is_some() {
        return Err(ReadError::Reject(
            501,
            "Transfer-Encoding is not supported; send Content-Length",
        ));
    }
    let length = content_length(&headers).map_err(|m| ReadError::Reject(400, m))?;
    let len = match length {
        None => 0,
        Some(n) => match usize::try_from(n) {
            Ok(n) if n <= MAX_BODY => n,
            _ => return Err(ReadError::Reject(413, "request body too large")),
        },
    };
    let expects_continue =
        header(&headers, "expect").any(|v| v.eq_ignore_ascii_case(b"100-continue"));
    if expects_continue && len > conn.buf.len() {
        conn.io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        // TLS holds written bytes until a flush; the client waits for these.
        conn.io.flush().await?;
    }
    let body = conn.take(len).await?;
    Ok(Some(Request {
        method,
        target,
        headers,
        had_length: length.is_some(),
        body,
    }))
}

/// The request as sent upstream: `Host` replaced, hop-by-hop fields and `Expect` dropped,
/// `Content-Length` and `Connection: close` set by the proxy, other fields kept in order.
fn upstream_request(req: &Request, upstream: SocketAddr) -> Vec<u8> {
    let tokens = connection_tokens(&req.headers);
    let mut out = Vec::with_capacity(512 + req.body.len());
    out.extend_from_slice(
        format!(
            "{} {} HTTP/1.1\r\nHost: {upstream}\r\n",
            req.method, req.target
        )
        .as_bytes(),
    );
    for (name, value) in &req.headers {
        if is_hop_by_hop(name, &tokens)
            || name.eq_ignore_ascii_case("host")
            || name.eq_ignore_ascii_case("expect")
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if req.had_length || !req.body.is_empty() {
        out.extend_from_slice(format!("Content-Length: {}\r\n", req.body.len()).as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(&req.body);
    out
}

/// The final answer of the upstream.
#[derive(Debug, Clone)]
struct Response {
    status: u16,
    reason: String,
    headers: Headers,
    body: Vec<u8>,
}

/// A connection to an upstream, made before any of the request is sent.
enum UpstreamConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// A fresh connection to `upstream` (TLS if `connector`): TCP connect and TLS handshake.
async fn connect(
    upstream: SocketAddr,
    connector: Option<&TlsConnector>,
) -> io::Result<UpstreamConn> {
    let stream = TcpStream::connect(upstream).await?;
    let _ = stream.set_nodelay(true);
    match connector {
        Some(connector) => {
            // The gateways' server certificates name 127.0.0.1.
            let name = ServerName::IpAddress(upstream.ip().into());
            let stream = connector.connect(name, stream).await?;
            Ok(UpstreamConn::Tls(Box::new(stream)))
        }
        None => Ok(UpstreamConn::Plain(stream)),
    }
}

/// One whole upstream exchange on a fresh connection (TLS if `connector`), bounded by
/// [`UPSTREAM_TIMEOUT`], with the next upstream in turn. A connection that cannot be made
/// passes the request on to the next upstream (nginx's `proxy_next_upstream error`); once
/// the request is being sent it stays with that upstream, succeed or fail.
async fn exchange(
    upstreams: &Upstreams,
    connector: Option<&TlsConnector>,
    req: &Request,
    head_request: bool,
    stats: &ProxyStats,
    conn: u64,
) -> io::Result<Response> {
    let attempt = async {
        let mut candidates = upstreams.turn().peekable();
        while let Some(upstream) = candidates.next() {
            let stream = match connect(upstream, connector).await {
                Ok(stream) => stream,
                Err(error) if candidates.peek().is_some() => {
                    // Nothing was sent: safe to try the next upstream, even for a POST.
                    bump(&stats.next_upstream);
                    tracing::debug!(
                        conn,
                        %upstream,
                        %error,
                        "chaos proxy: upstream connection failed; trying the next"
                    );
                    continue;
                }
                Err(error) => return Err(error),
            };
            let request = upstream_request(req, upstream);
            return match stream {
                UpstreamConn::Plain(stream) => talk(stream, &request, head_request).await,
                UpstreamConn::Tls(stream) => talk(*stream, &request, head_request).await,
            };
        }
        Err(io::Error::new(io::ErrorKind::InvalidInput, "no upstream"))
    };
    match tokio::time::timeout(UPSTREAM_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "upstream exchange timed out",
        )),
    }
}

/// Sends the request, reads the final answer.
async fn talk<S: Conn>(mut stream: S, request: &[u8], head_request: bool) -> io::Result<Response> {
    stream.write_all(request).await?;
    // TLS holds written bytes until a flush. No write-side shutdown: some servers abort an
    // answer in progress on seeing EOF.
    stream.flush().await?;
    read_response(&mut BufConn::new(stream), head_request).await
}

async fn read_response<S: Conn>(conn: &mut BufConn<S>, head_request: bool) -> io::Result<Response> {
    let (status, reason, headers) = loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut slots);
        match parsed.parse(&conn.buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let status = parsed.code.ok_or_else(|| invalid("no status code"))?;
                let reason = parsed.reason.unwrap_or_default().to_owned();
                let headers = owned_headers(parsed.headers);
                conn.take(head_len).await?;
                if (100..200).contains(&status) && status != 101 {
                    // Interim answer (e.g. 100 Continue): skip it, the final one follows.
                    continue;
                }
                break (status, reason, headers);
            }
            Ok(httparse::Status::Partial) => {
                if conn.buf.len() > MAX_HEAD {
                    return Err(invalid("response head too large"));
                }
            }
            Err(e) => return Err(invalid(&format!("malformed response: {e}"))),
        }
        if conn.fill().await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "upstream closed before a complete response head",
            ));
        }
    };

    let chunked = header(&headers, "transfer-encoding").any(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
    });
    let body = if head_request || status == 204 || status == 304 {
        Vec::new()
    } else if chunked {
        read_chunked(conn).await?
    } else if let Some(n) = content_length(&headers).map_err(invalid)? {
        match usize::try_from(n) {
            Ok(n) if n <= MAX_BODY => conn.take(n).await?,
            _ => return Err(invalid("response body too large")),
        }
    } else {
        conn.read_until_eof(MAX_BODY).await?
    };
    Ok(Response {
        status,
        reason,
        headers,
        body,
    })
}

async fn read_chunked<S: Conn>(conn: &mut BufConn<S>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = conn.line().await?;
        let size = line.split(|&b| b == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size)
            .ok()
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or_else(|| invalid("malformed chunk size"))?;
        if size == 0 {
            // Trailer fields, if any, up to the empty line; they are not passed on.
            while !conn.line().await?.is_empty() {}
            return Ok(body);
        }
        if size > MAX_BODY - body.len() {
            return Err(invalid("response body too large"));
        }
        body.extend_from_slice(&conn.take(size).await?);
        if !conn.line().await?.is_empty() {
            return Err(invalid("chunk not followed by CRLF"));
        }
    }
}

/// The answer written to the client for an upstream response.
fn render_response(resp: &Response, head_request: bool) -> Vec<u8> {
    let tokens = connection_tokens(&resp.headers);
    let mut out = Vec::with_capacity(512 + resp.body.len());
    out.extend_from_slice(format!("HTTP/1.1 {} {}\r\n", resp.status, resp.reason).as_bytes());
    for (name, value) in &resp.headers {
        // A HEAD answer keeps upstream's Content-Length: it describes the body not sent.
        let keep_length = head_request && name.eq_ignore_ascii_case("content-length");
        if is_hop_by_hop(name, &tokens) && !keep_length {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !head_request {
        out.extend_from_slice(format!("Content-Length: {}\r\n", resp.body.len()).as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    if !head_request {
        out.extend_from_slice(&resp.body);
    }
    out
}

/// A short `text/plain` answer made by the proxy itself.
fn simple_response(status: u16, text: &str) -> Vec<u8> {
    let reason = match status {
        400 => "Bad Request",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "",
    };
    let body = format!("{text}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Writes the answer, then closes gracefully: write-side shutdown, then drain what the
/// client still sends (bounded) so the close does not become a reset that could destroy
/// the answer in flight.
async fn answer_and_close<S: Conn>(mut stream: S, answer: &[u8], conn: u64) {
    let written = tokio::time::timeout(CLIENT_TIMEOUT, async {
        stream.write_all(answer).await?;
        stream.shutdown().await
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::debug!(conn, %error, "chaos proxy: writing the answer failed");
            return;
        }
        Err(_) => {
            tracing::debug!(conn, "chaos proxy: writing the answer timed out");
            return;
        }
    }
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        let mut sink = [0u8; 4096];
        let mut total = 0;
        while let Ok(n @ 1..) = stream.read(&mut sink).await {
            total += n;
            if total > DRAIN_MAX {
                break;
            }
        }
    })
    .await;
}

/// One upstream copy (to the next upstream in turn), counted in the stats.
async fn forward_once(
    upstreams: &Upstreams,
    connector: Option<&TlsConnector>,
    req: &Request,
    head_request: bool,
    stats: &ProxyStats,
    conn: u64,
) -> Option<Response> {
    match exchange(upstreams, connector, req, head_request, stats, conn).await {
        Ok(resp) => {
            bump(&stats.forwarded);
            stats
                .answers
                .record(&req.body, resp.status, &resp.headers, &resp.body);
            Some(resp)
        }
        Err(error) => {
            bump(&stats.upstream_failures);
            tracing::debug!(conn, %error, "chaos proxy: upstream exchange failed");
            None
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle_connection(
    stream: TcpStream,
    peer: SocketAddr,
    conn: u64,
    upstreams: Arc<Upstreams>,
    rates: FaultRates,
    rng: fastrand::Rng,
    stats: Arc<ProxyStats>,
    tls: ProxyTls,
) {
    let _ = stream.set_nodelay(true);
    let connector = tls.connect.as_ref();
    match &tls.accept {
        None => handle_stream(stream, peer, conn, &upstreams, connector, rates, rng, stats).await,
        Some(acceptor) => {
            // A handshake that fails (no client certificate, one from another CA) or
            // stalls ends the connection before any request: nothing to fault.
            match tokio::time::timeout(CLIENT_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    handle_stream(stream, peer, conn, &upstreams, connector, rates, rng, stats)
                        .await
                }
                Ok(Err(error)) => {
                    tracing::debug!(conn, %peer, %error, "chaos proxy: TLS handshake failed");
                }
                Err(_) => tracing::debug!(conn, %peer, "chaos proxy: TLS handshake timed out"),
            }
        }
    }
}

/// One client connection after its TLS handshake, if any: one request, one fault.
#[allow(clippy::too_many_arguments)]
async fn handle_stream<S: Conn>(
    stream: S,
    peer: SocketAddr,
    conn: u64,
    upstreams: &Upstreams,
    connector: Option<&TlsConnector>,
    rates: FaultRates,
    mut rng: fastrand::Rng,
    stats: Arc<ProxyStats>,
) {
    let mut client = BufConn::new(stream);
    let req = match tokio::time::timeout(CLIENT_TIMEOUT, read_request(&mut client)).await {
        Ok(Ok(Some(req))) => req,
        Ok(Ok(None)) => return,
        Ok(Err(ReadError::Io(error))) => {
            tracing::debug!(conn, %peer, %error, "chaos proxy: reading the request failed");
            return;
        }
        Ok(Err(ReadError::Reject(status, text))) => {
            tracing::debug!(conn, %peer, status, text, "chaos proxy: request rejected");
            answer_and_close(client.io, &simple_response(status, text), conn).await;
            return;
        }
        Err(_) => {
            tracing::debug!(conn, %peer, "chaos proxy: timed out reading the request");
            return;
        }
    };
    bump(&stats.requests);
    let decision = decide(&mut rng, &rates);
    let method = req.method.as_str();
    let target = req.target.as_str();

    match decision.fault {
        Fault::DropRequest => {
            bump(&stats.dropped_requests);
            tracing::debug!(conn, method, target, "chaos proxy: dropping the request");
            return; // `client` dropped: closed without an answer
        }
        Fault::Reset => {
            bump(&stats.resets);
            tracing::debug!(
                conn,
                method,
                target,
                "chaos proxy: resetting the connection"
            );
            // Under TLS too: the RST comes from the TCP socket, without a close_notify.
            if let Err(error) = client.io.tcp().set_zero_linger() {
                tracing::debug!(conn, %error, "chaos proxy: SO_LINGER failed");
            }
            return; // dropped with SO_LINGER 0: RST
        }
        Fault::Error5xx => {
            bump(&stats.errors_5xx);
            let status = decision.error_status;
            tracing::debug!(
                conn,
                method,
                target,
                status,
                "chaos proxy: answering an error itself"
            );
            let answer =
                simple_response(status, "chaos proxy: injected error, request not forwarded");
            answer_and_close(client.io, &answer, conn).await;
            return;
        }
        Fault::Forward | Fault::DropResponse | Fault::Duplicate => {}
    }

    if let Some(delay) = decision.delay {
        bump(&stats.delayed);
        tracing::debug!(
            conn,
            method,
            target,
            delay_ms = delay.as_millis() as u64,
            "chaos proxy: delaying the request"
        );
        tokio::time::sleep(delay).await;
    }
    let head_request = method.eq_ignore_ascii_case("HEAD");
    let response = if decision.fault == Fault::Duplicate {
        bump(&stats.duplicated);
        tracing::debug!(
            conn,
            method,
            target,
            concurrently = decision.duplicate_concurrently,
            "chaos proxy: forwarding the request twice"
        );
        let once = || forward_once(upstreams, connector, &req, head_request, &stats, conn);
        let (first, second) = if decision.duplicate_concurrently {
            tokio::join!(once(), once())
        } else {
            let first = once().await;
            (first, once().await)
        };
        if decision.answer_with_second {
            second.or(first)
        } else {
            first.or(second)
        }
    } else {
        forward_once(upstreams, connector, &req, head_request, &stats, conn).await
    };

    if decision.fault == Fault::DropResponse {
        bump(&stats.dropped_responses);
        tracing::debug!(
            conn,
            method,
            target,
            status = response.as_ref().map(|r| r.status),
            "chaos proxy: dropping the response"
        );
        return; // `client` dropped: closed without an answer
    }
    let answer = match &response {
        Some(resp) => render_response(resp, head_request),
        None => simple_response(502, "chaos proxy: upstream unreachable or failed"),
    };
    answer_and_close(client.io, &answer, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// What the test upstream received.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        path: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    /// A tiny upstream: records each request, answers `200` with `echo:` + body. Path
    /// `/continue` first sends an interim `100 Continue`; path `/chunked` answers chunked.
    async fn start_upstream(listener: TcpListener) -> mpsc::UnboundedReceiver<Seen> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let (seen, head_len, length) = loop {
                        let n = stream.read(&mut chunk).await.expect("upstream read");
                        assert!(n > 0, "proxy closed before a full head");
                        buf.extend_from_slice(&chunk[..n]);
                        let mut slots = [httparse::EMPTY_HEADER; 64];
                        let mut req = httparse::Request::new(&mut slots);
                        if let httparse::Status::Complete(len) = req.parse(&buf).expect("parse") {
                            let headers: Vec<(String, String)> = req
                                .headers
                                .iter()
                                .map(|h| {
                                    (
                                        h.name.to_owned(),
                                        String::from_utf8_lossy(h.value).into_owned(),
                                    )
                                })
                                .collect();
                            let length = headers
                                .iter()
                                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                                .map_or(0, |(_, v)| v.parse::<usize>().expect("length"));
                            let seen = Seen {
                                method: req.method.expect("method").to_owned(),
                                path: req.path.expect("path").to_owned(),
                                headers,
                                body: Vec::new(),
                            };
                            break (seen, len, length);
                        }
                    };
                    let mut seen = seen;
                    while buf.len() < head_len + length {
                        let n = stream.read(&mut chunk).await.expect("upstream body");
                        assert!(n > 0, "proxy closed before the full body");
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    seen.body = buf[head_len..head_len + length].to_vec();
                    let mut body = b"echo:".to_vec();
                    body.extend_from_slice(&seen.body);
                    let path = seen.path.clone();
                    tx.send(seen).expect("test receiver alive");
                    let mut answer = Vec::new();
                    if path == "/continue" {
                        answer.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                    }
                    if path == "/chunked" {
                        answer.extend_from_slice(
                            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                              Transfer-Encoding: chunked\r\n\r\n",
                        );
                        for part in body.chunks(3) {
                            answer.extend_from_slice(
                                format!("{:x};ext=1\r\n", part.len()).as_bytes(),
                            );
                            answer.extend_from_slice(part);
                            answer.extend_from_slice(b"\r\n");
                        }
                        answer.extend_from_slice(b"0\r\nX-Trailer: t\r\n\r\n");
                    } else {
                        answer.extend_from_slice(
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Upstream: yes\r\n\
                                 Keep-Alive: timeout=5\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                body.len()
                            )
                            .as_bytes(),
                        );
                        answer.extend_from_slice(&body);
                    }
                    stream.write_all(&answer).await.expect("upstream write");
                    let _ = stream.shutdown().await;
                });
            }
        });
        rx
    }

    async fn upstream() -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        (addr, start_upstream(listener).await)
    }

    async fn proxy(upstream: SocketAddr, rates: FaultRates) -> (SocketAddr, Arc<ProxyStats>) {
        proxy_to(vec![upstream], rates).await
    }

    async fn proxy_to(
        upstreams: Vec<SocketAddr>,
        rates: FaultRates,
    ) -> (SocketAddr, Arc<ProxyStats>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let stats = Arc::new(ProxyStats::default());
        tokio::spawn(serve(
            listener,
            upstreams,
            rates,
            42,
            Arc::clone(&stats),
            ProxyTls::default(),
        ));
        (addr, stats)
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("reqwest client")
    }

    /// POSTs `body` to `/ws` through the proxy at `px`.
    async fn post_via(
        px: SocketAddr,
        body: impl Into<String>,
    ) -> reqwest::Result<reqwest::Response> {
        let url = format!("http://{px}/ws");
        client().post(url).body(body.into()).send().await
    }

    /// Sends raw bytes, reads until EOF (or error).
    async fn raw(proxy: SocketAddr, request: &[u8]) -> io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(proxy).await?;
        stream.write_all(request).await?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await?;
        Ok(out)
    }

    fn post(path: &str, body: &str) -> Vec<u8> {
        format!(
            "POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: text/xml\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn status_of(answer: &[u8]) -> Option<u16> {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut slots);
        match resp.parse(answer) {
            Ok(httparse::Status::Complete(_)) => resp.code,
            _ => None,
        }
    }

    fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn the_answer_log_writes_down_every_copys_answer_to_marked_requests() {
        let (up, _seen) = upstream().await;
        let dir = std::env::temp_dir().join(format!("chaos-answer-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("answers.jsonl");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let px = listener.local_addr().expect("proxy addr");
        let stats = ProxyStats {
            answers: AnswerLog::to_file(&log, "urn:mark").expect("log"),
            ..ProxyStats::default()
        };
        let rates = FaultRates {
            duplicate: 1.0,
            ..FaultRates::default()
        };
        let stats = Arc::new(stats);
        tokio::spawn(serve(
            listener,
            vec![up],
            rates,
            7,
            stats,
            ProxyTls::default(),
        ));
        let marked = "<m:Item xmlns:m=\"urn:mark\" id=\"h-1\">x</m:Item>";
        assert_eq!(post_via(px, marked).await.expect("answered").status(), 200);
        assert_eq!(
            post_via(px, "<other/>").await.expect("answered").status(),
            200
        );
        let text = std::fs::read_to_string(&log).expect("the log");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2, "both copies, and nothing unmarked: {text}");
        let hex: String = format!("echo:{marked}")
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        for line in &lines {
            assert_eq!(line["hid"], "h-1");
            assert_eq!(line["status"], 200);
            assert_eq!(line["body"], hex.as_str());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn no_faults_forwards_unchanged() {
        let (up, mut seen) = upstream().await;
        let (px, stats) = proxy(up, FaultRates::default()).await;
        let body = "<soap:Envelope>hello</soap:Envelope>";
        let resp = client()
            .post(format!("http://{px}/ws/rm?x=1"))
            .header("Content-Type", "application/soap+xml")
            .header("SOAPAction", "\"urn:test\"")
            .body(body)
            .send()
            .await
            .expect("request through the proxy");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers().get("x-upstream").map(|v| v.as_bytes()),
            Some(&b"yes"[..])
        );
        assert!(resp.headers().get("keep-alive").is_none());
        assert_eq!(resp.text().await.expect("body"), format!("echo:{body}"));

        let got = seen.recv().await.expect("upstream saw the request");
        assert_eq!(got.method, "POST");
        assert_eq!(got.path, "/ws/rm?x=1");
        assert_eq!(got.body, body.as_bytes());
        assert_eq!(got.header("host"), Some(up.to_string().as_str()));
        assert_eq!(got.header("connection"), Some("close"));
        assert_eq!(got.header("soapaction"), Some("\"urn:test\""));
        assert_eq!(got.header("content-type"), Some("application/soap+xml"));
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.requests), 1);
        assert_eq!(count(&stats.forwarded), 1);
        assert!(
            stats
                .summary()
                .starts_with("requests=1 forwarded=1 dropped_requests=0")
        );

        // A GET without a body goes through too.
        let resp = client()
            .get(format!("http://{px}/health"))
            .send()
            .await
            .expect("GET");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.expect("body"), "echo:");
        let got = seen.recv().await.expect("upstream saw the GET");
        assert_eq!((got.method.as_str(), got.path.as_str()), ("GET", "/health"));
    }

    #[tokio::test]
    async fn interim_and_chunked_upstream_answers() {
        let (up, mut seen) = upstream().await;
        let (px, _stats) = proxy(up, FaultRates::default()).await;
        for path in ["/continue", "/chunked"] {
            let answer = raw(px, &post(path, "abcdefgh")).await.expect("answer");
            assert_eq!(status_of(&answer), Some(200), "{path}");
            let text = String::from_utf8_lossy(&answer);
            assert!(text.ends_with("\r\n\r\necho:abcdefgh"), "{path}: {text}");
            assert!(text.contains("Content-Length: 13\r\n"), "{path}: {text}");
            assert!(!text.contains("100 Continue"), "{path}: {text}");
            assert!(
                !text.to_ascii_lowercase().contains("transfer-encoding"),
                "{path}: {text}"
            );
            assert_eq!(seen.recv().await.expect("seen").path, path);
        }
    }

    #[tokio::test]
    async fn drop_request_never_forwards_nor_answers() {
        let (up, mut seen) = upstream().await;
        let rates = FaultRates {
            drop_request: 1.0,
            ..FaultRates::default()
        };
        let (px, stats) = proxy(up, rates).await;
        let answer = raw(px, &post("/ws", "payload")).await;
        assert!(answer.as_ref().map_or(true, |a| a.is_empty()), "{answer:?}");
        // reqwest sees an error, not a status.
        let err = post_via(px, "x").await;
        assert!(err.is_err(), "{err:?}");
        // Had the proxy forwarded, the upstream would have recorded it before any close.
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.dropped_requests), 2);
        assert_eq!(count(&stats.forwarded), 0);
    }

    #[tokio::test]
    async fn drop_response_forwards_but_does_not_answer() {
        let (up, mut seen) = upstream().await;
        let rates = FaultRates {
            drop_response: 1.0,
            ..FaultRates::default()
        };
        let (px, stats) = proxy(up, rates).await;
        let answer = raw(px, &post("/ws", "payload")).await;
        assert!(answer.as_ref().map_or(true, |a| a.is_empty()), "{answer:?}");
        let got = seen.recv().await.expect("upstream saw the request");
        assert_eq!(got.body, b"payload");
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.dropped_responses), 1);
        assert_eq!(count(&stats.forwarded), 1);
    }

    #[tokio::test]
    async fn duplicate_forwards_twice_answers_once() {
        let (up, mut seen) = upstream().await;
        let rates = FaultRates {
            duplicate: 1.0,
            ..FaultRates::default()
        };
        let (px, stats) = proxy(up, rates).await;
        // Several requests, so both the concurrent and the sequential variant are likely hit.
        for i in 0..6 {
            let body = format!("message-{i}");
            let resp = post_via(px, body.clone()).await.expect("request");
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.expect("body"), format!("echo:{body}"));
            let a = seen.recv().await.expect("first copy");
            let b = seen.recv().await.expect("second copy");
            assert_eq!(a.body, body.as_bytes());
            assert_eq!(b.body, body.as_bytes());
            assert!(seen.try_recv().is_err());
        }
        assert_eq!(count(&stats.duplicated), 6);
        assert_eq!(count(&stats.forwarded), 12);
    }

    #[tokio::test]
    async fn error_5xx_answers_without_forwarding() {
        let (up, mut seen) = upstream().await;
        let rates = FaultRates {
            error_5xx: 1.0,
            ..FaultRates::default()
        };
        let (px, stats) = proxy(up, rates).await;
        for _ in 0..4 {
            let resp = post_via(px, "payload").await.expect("request");
            assert!(
                [500, 502, 503].contains(&resp.status().as_u16()),
                "{}",
                resp.status()
            );
            assert!(!resp.text().await.expect("body").is_empty());
        }
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.errors_5xx), 4);
        assert_eq!(count(&stats.forwarded), 0);
    }

    #[tokio::test]
    async fn reset_sends_rst_without_forwarding() {
        let (up, mut seen) = upstream().await;
        let rates = FaultRates {
            reset: 1.0,
            ..FaultRates::default()
        };
        let (px, stats) = proxy(up, rates).await;
        let answer = raw(px, &post("/ws", "payload")).await;
        match answer {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
            Ok(bytes) => assert!(bytes.is_empty(), "got an answer: {bytes:?}"),
        }
        let err = post_via(px, "x").await;
        assert!(err.is_err(), "{err:?}");
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.resets), 2);
        assert_eq!(count(&stats.forwarded), 0);
    }

    #[tokio::test]
    async fn upstream_down_gives_502_and_proxy_keeps_serving() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let up = listener.local_addr().expect("addr");
        drop(listener);
        let (px, stats) = proxy(up, FaultRates::default()).await;
        for _ in 0..2 {
            let resp = post_via(px, "payload").await.expect("request");
            assert_eq!(resp.status(), 502);
        }
        assert_eq!(count(&stats.upstream_failures), 2);
        // The upstream comes back on the same port (as after a restart): served again.
        if let Ok(listener) = TcpListener::bind(up).await {
            let mut seen = start_upstream(listener).await;
            let resp = post_via(px, "again").await.expect("request");
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.expect("body"), "echo:again");
            assert_eq!(seen.recv().await.expect("seen").body, b"again");
        }
    }

    /// A port nothing listens on (bound, then let go).
    async fn dead_port() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    }

    #[tokio::test]
    async fn several_upstreams_take_turns() {
        let (up1, mut seen1) = upstream().await;
        let (up2, mut seen2) = upstream().await;
        let (px, stats) = proxy_to(vec![up1, up2], FaultRates::default()).await;
        for i in 0..4 {
            let resp = post_via(px, format!("m{i}")).await.expect("request");
            assert_eq!(resp.status(), 200);
            let (seen, up) = if i % 2 == 0 {
                (&mut seen1, up1)
            } else {
                (&mut seen2, up2)
            };
            let got = seen.recv().await.expect("seen");
            assert_eq!(got.body, format!("m{i}").as_bytes());
            assert_eq!(got.header("host"), Some(up.to_string().as_str()));
        }
        assert!(seen1.try_recv().is_err() && seen2.try_recv().is_err());
        assert_eq!(count(&stats.next_upstream), 0);

        // The two copies of a duplicated request go to the two upstreams.
        let (px, stats) = proxy_to(
            vec![up1, up2],
            FaultRates {
                duplicate: 1.0,
                ..FaultRates::default()
            },
        )
        .await;
        for i in 0..3 {
            let resp = post_via(px, format!("d{i}")).await.expect("request");
            assert_eq!(resp.status(), 200);
            assert_eq!(
                seen1.recv().await.expect("copy 1").body,
                format!("d{i}").as_bytes()
            );
            assert_eq!(
                seen2.recv().await.expect("copy 2").body,
                format!("d{i}").as_bytes()
            );
        }
        assert_eq!(count(&stats.forwarded), 6);
    }

    #[tokio::test]
    async fn a_refused_connection_passes_the_request_to_the_next_upstream() {
        let down = dead_port().await;
        let (up, mut seen) = upstream().await;
        let (px, stats) = proxy_to(vec![down, up], FaultRates::default()).await;
        for i in 0..4 {
            let resp = post_via(px, format!("m{i}")).await.expect("request");
            assert_eq!(resp.status(), 200, "request {i}");
            assert_eq!(
                seen.recv().await.expect("seen").body,
                format!("m{i}").as_bytes()
            );
        }
        // Every other request was the dead one's turn: passed on, never failed.
        assert_eq!(count(&stats.next_upstream), 2);
        assert_eq!(count(&stats.upstream_failures), 0);
        assert_eq!(count(&stats.forwarded), 4);

        // All of them down: 502 once each has been tried.
        let (px, stats) = proxy_to(vec![down, dead_port().await], FaultRates::default()).await;
        for _ in 0..2 {
            let resp = post_via(px, "payload").await.expect("request");
            assert_eq!(resp.status(), 502);
        }
        assert_eq!(count(&stats.next_upstream), 2);
        assert_eq!(count(&stats.upstream_failures), 2);
    }

    #[tokio::test]
    async fn delay_still_forwards() {
        let (up, mut seen) = upstream().await;
        let rates = FaultRates {
            delay: 1.0,
            max_delay_ms: 3,
            ..FaultRates::default()
        };
        let (px, stats) = proxy(up, rates).await;
        let answer = raw(px, &post("/ws", "late")).await.expect("answer");
        assert_eq!(status_of(&answer), Some(200));
        assert_eq!(seen.recv().await.expect("seen").body, b"late");
        assert_eq!(count(&stats.delayed), 1);
    }

    #[tokio::test]
    async fn rejects_chunked_and_oversized_requests() {
        let (up, mut seen) = upstream().await;
        let (px, stats) = proxy(up, FaultRates::default()).await;
        let chunked = b"POST /ws HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(
            status_of(&raw(px, chunked).await.expect("answer")),
            Some(501)
        );

        let mut huge_head = b"GET / HTTP/1.1\r\nHost: p\r\nX-Big: ".to_vec();
        huge_head.resize(huge_head.len() + 70 * 1024, b'a');
        huge_head.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            status_of(&raw(px, &huge_head).await.expect("answer")),
            Some(431)
        );

        let too_long = format!(
            "POST /ws HTTP/1.1\r\nHost: p\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(
            status_of(&raw(px, too_long.as_bytes()).await.expect("answer")),
            Some(413)
        );

        let garbage = b"\x00\x01 nonsense\r\n\r\n";
        assert_eq!(
            status_of(&raw(px, garbage).await.expect("answer")),
            Some(400)
        );

        // A client that connects and leaves sends nothing upstream.
        drop(TcpStream::connect(px).await.expect("connect"));
        assert_eq!(
            status_of(&raw(px, &post("/ok", "fine")).await.expect("answer")),
            Some(200)
        );
        assert_eq!(seen.recv().await.expect("seen").path, "/ok");
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.requests), 1);
    }

    #[test]
    fn choose_maps_rolls_to_consecutive_slices() {
        let rates = FaultRates {
            drop_request: 0.1,
            drop_response: 0.2,
            duplicate: 0.1,
            error_5xx: 0.1,
            reset: 0.1,
            delay: 0.5,
            max_delay_ms: 10,
        };
        assert_eq!(choose(&rates, 0.0), Fault::DropRequest);
        assert_eq!(choose(&rates, 0.099), Fault::DropRequest);
        assert_eq!(choose(&rates, 0.1), Fault::DropResponse);
        assert_eq!(choose(&rates, 0.29), Fault::DropResponse);
        assert_eq!(choose(&rates, 0.35), Fault::Duplicate);
        assert_eq!(choose(&rates, 0.45), Fault::Error5xx);
        assert_eq!(choose(&rates, 0.55), Fault::Reset);
        assert_eq!(choose(&rates, 0.61), Fault::Forward);
        assert_eq!(choose(&rates, 0.999), Fault::Forward);

        let none = FaultRates::default();
        assert_eq!(choose(&none, 0.0), Fault::Forward);
        let all_reset = FaultRates {
            reset: 1.0,
            ..FaultRates::default()
        };
        assert_eq!(choose(&all_reset, 0.0), Fault::Reset);
        assert_eq!(choose(&all_reset, 0.999_999), Fault::Reset);
        let odd = FaultRates {
            drop_request: f64::NAN,
            drop_response: -1.0,
            duplicate: 2.0,
            ..FaultRates::default()
        };
        assert_eq!(choose(&odd, 0.0), Fault::Duplicate);
        assert_eq!(choose(&odd, 0.999), Fault::Duplicate);
    }

    #[test]
    fn same_seed_same_choices() {
        let rates = FaultRates {
            drop_request: 0.1,
            drop_response: 0.1,
            duplicate: 0.1,
            error_5xx: 0.1,
            reset: 0.1,
            delay: 0.3,
            max_delay_ms: 50,
        };
        let run = |seed: u64| -> Vec<Decision> {
            (0..50)
                .flat_map(|conn| {
                    let mut rng = fastrand::Rng::with_seed(connection_seed(seed, conn));
                    (0..4)
                        .map(move |_| decide(&mut rng, &rates))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        // With these rates every fault and both delay outcomes show up in 200 draws.
        for fault in [
            Fault::Forward,
            Fault::DropRequest,
            Fault::DropResponse,
            Fault::Duplicate,
            Fault::Error5xx,
            Fault::Reset,
        ] {
            assert!(a.iter().any(|d| d.fault == fault), "{fault:?} never chosen");
        }
        assert!(a.iter().any(|d| d.delay.is_some()) && a.iter().any(|d| d.delay.is_none()));
        assert!(
            a.iter()
                .all(|d| d.delay.is_none_or(|t| t <= Duration::from_millis(50)))
        );
        assert!(a.iter().all(|d| [500, 502, 503].contains(&d.error_status)));
    }

    /// A test PKI: a CA and certificates it signs, written as PEM files.
    struct Pki {
        dir: tempfile::TempDir,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Pki {
        fn new() -> Pki {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().expect("CA key");
            let cert = params.self_signed(&key).expect("CA cert");
            let dir = tempfile::tempdir().expect("temp dir");
            std::fs::write(dir.path().join("ca.pem"), cert.pem()).expect("write CA");
            Pki {
                dir,
                issuer: rcgen::Issuer::new(params, key),
            }
        }

        fn path(&self, file: &str) -> std::path::PathBuf {
            self.dir.path().join(file)
        }

        /// `{name}.pem` and `{name}.key` for these subjectAltNames; returns the cert's DER.
        fn issue(&self, name: &str, sans: &[&str]) -> Vec<u8> {
            let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
            let params = rcgen::CertificateParams::new(sans).expect("params");
            let key = rcgen::KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &self.issuer).expect("sign");
            std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).expect("write cert");
            std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem())
                .expect("write key");
            cert.der().to_vec()
        }
    }

    /// What the TLS upstream saw: the client certificate, the Authorization header, the body.
    type TlsSeen = (Option<Vec<u8>>, Option<String>, Vec<u8>);

    /// A TLS upstream that requires a client certificate under the CA, records what each
    /// request presented and answers `200` with `echo:` + body.
    async fn tls_upstream(pki: &Pki) -> (SocketAddr, mpsc::UnboundedReceiver<TlsSeen>) {
        let acceptor = ProxyTls::server(
            &pki.path("up.pem"),
            &pki.path("up.key"),
            &pki.path("ca.pem"),
        )
        .expect("upstream TLS");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let cert = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.to_vec());
                    let mut conn = BufConn::new(stream);
                    let Ok(Some(req)) = read_request(&mut conn).await else {
                        return;
                    };
                    let auth = header(&req.headers, "authorization")
                        .next()
                        .map(|v| String::from_utf8_lossy(v).into_owned());
                    let mut body = b"echo:".to_vec();
                    body.extend_from_slice(&req.body);
                    tx.send((cert, auth, req.body))
                        .expect("test receiver alive");
                    let answer = Response {
                        status: 200,
                        reason: "OK".into(),
                        headers: Vec::new(),
                        body,
                    };
                    answer_and_close(conn.io, &render_response(&answer, false), 0).await;
                });
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn tls_both_ways_presents_the_senders_certificate() {
        let pki = Pki::new();
        pki.issue("up", &["127.0.0.1", "localhost"]);
        pki.issue("px", &["127.0.0.1", "localhost"]);
        pki.issue("client", &["client.example"]);
        let sender = pki.issue("sender", &["sender.example"]);
        let (up, mut seen) = tls_upstream(&pki).await;
        let tls = ProxyTls {
            accept: Some(
                ProxyTls::server(
                    &pki.path("px.pem"),
                    &pki.path("px.key"),
                    &pki.path("ca.pem"),
                )
                .expect("proxy server TLS"),
            ),
            connect: Some(
                ProxyTls::client(
                    &pki.path("ca.pem"),
                    Some((&pki.path("sender.pem"), &pki.path("sender.key"))),
                )
                .expect("proxy client TLS"),
            ),
        };
        let start = |rates: FaultRates| {
            let tls = tls.clone();
            async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
                let addr = listener.local_addr().expect("proxy addr");
                let stats = Arc::new(ProxyStats::default());
                tokio::spawn(serve(listener, vec![up], rates, 7, Arc::clone(&stats), tls));
                (addr, stats)
            }
        };
        let ca =
            reqwest::Certificate::from_pem(&std::fs::read(pki.path("ca.pem")).expect("read CA"))
                .expect("CA");
        let mut identity = std::fs::read(pki.path("client.pem")).expect("client cert");
        identity.extend(std::fs::read(pki.path("client.key")).expect("client key"));
        let identity = reqwest::Identity::from_pem(&identity).expect("identity");
        let with_cert = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([ca.clone()])
            .identity(identity)
            .build()
            .expect("client");

        let (px, stats) = start(FaultRates::default()).await;
        let resp = with_cert
            .post(format!("https://127.0.0.1:{}/wsr/default", px.port()))
            .basic_auth("gateway-a", Some("secret"))
            .body("hello")
            .send()
            .await
            .expect("request through the TLS proxy");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.expect("body"), "echo:hello");
        let (cert, auth, body) = seen.recv().await.expect("upstream saw it");
        // The upstream sees the sender's certificate, not the client's or the proxy's, and
        // the credentials unchanged.
        assert_eq!(cert.as_deref(), Some(sender.as_slice()));
        assert_eq!(auth.as_deref(), Some("Basic Z2F0ZXdheS1hOnNlY3JldA=="));
        assert_eq!(body, b"hello");
        assert_eq!(count(&stats.forwarded), 1);

        // Without a client certificate the proxy refuses the handshake: nothing forwarded.
        let without_cert = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([ca.clone()])
            .build()
            .expect("client");
        let refused = without_cert
            .post(format!("https://127.0.0.1:{}/wsr/default", px.port()))
            .body("nobody")
            .send()
            .await;
        assert!(refused.is_err(), "{refused:?}");
        assert!(seen.try_recv().is_err());
        assert_eq!(count(&stats.requests), 1);

        // The reset fault still reaches the TCP socket under TLS.
        let (px, stats) = start(FaultRates {
            reset: 1.0,
            ..FaultRates::default()
        })
        .await;
        let reset = with_cert
            .post(format!("https://127.0.0.1:{}/wsr/default", px.port()))
            .body("x")
            .send()
            .await;
        assert!(reset.is_err(), "{reset:?}");
        assert_eq!(count(&stats.resets), 1);
        assert!(seen.try_recv().is_err());
    }

    #[test]
    fn fault_rates_deserialize_with_defaults() {
        let rates: FaultRates =
            serde::Deserialize::deserialize(serde::de::value::MapDeserializer::<
                _,
                serde::de::value::Error,
            >::new([("duplicate", 0.25)].into_iter()))
            .expect("deserialize");
        assert_eq!(rates.duplicate, 0.25);
        assert_eq!(rates.drop_request, 0.0);
        assert_eq!(rates.max_delay_ms, 0);
    }
}
