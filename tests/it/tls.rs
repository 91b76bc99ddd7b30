//! TLS on the listener: HTTPS only on a TLS port, TLS 1.2 and 1.3, client certificates (CA
//! chained, pinned, refused) reaching requests, certificate reload without dropping open
//! connections, the handshake under the header timeout and capped per source, and a trusted
//! proxy's headers.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::client::TlsStream;
use wsr_gateway::config::TrustedProxy;
use wsr_gateway::http::serve::{Edge, PeerAddr};
use wsr_gateway::http::tls::{Tls, TlsReloader};
use wsr_gateway::partners::ClientCertificate;
use wsr_gateway::{App, Config};

use super::support::{TestCert, TestPki, init_tracing};

/// The longest any test here waits for the gateway to do what it must.
const BOUND: Duration = Duration::from_secs(10);

const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// A gateway serving HTTPS on the PKI's files.
struct TlsApp {
    addr: SocketAddr,
    reloader: TlsReloader,
    stop: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl TlsApp {
    async fn start(pki: &TestPki, adjust: impl FnOnce(&mut Config)) -> TlsApp {
        init_tracing();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::for_tests(dir.path().join("gw.db"));
        config.tls = Some(pki.tls_config(true));
        adjust(&mut config);
        let app = App::build(config).await.expect("gateway builds");
        let addr = app.local_addr();
        let reloader = app.tls_reloader().expect("TLS is on");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(app.run_until(async {
            let _ = stopped.await;
        }));
        TlsApp {
            addr,
            reloader,
            stop: Some(stop),
            _dir: dir,
        }
    }
}

impl Drop for TlsApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A client trusting the test CA, offering `versions`, with `identity` as its certificate.
fn client_config(
    pki: &TestPki,
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<&TestCert>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(pki.ca_der()))
        .expect("CA certificate");
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(cert) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(cert.der.clone())],
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("key"),
            )
            .expect("client certificate"),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

fn both_versions() -> &'static [&'static rustls::SupportedProtocolVersion] {
    rustls::ALL_VERSIONS
}

async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("name");
    tokio::time::timeout(
        BOUND,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .expect("the handshake ends in time")
}

/// The SHA-256 of the certificate the server presented on `stream`.
fn served_leaf(stream: &TlsStream<TcpStream>) -> String {
    let chain = stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("server chain");
    wsr_gateway::secrets::sha256_hex(chain[0].as_ref())
}

/// Sends `request` on a keep-alive connection and reads one whole answer (a
/// `Content-Length` body): its status line and body.
async fn exchange(
    stream: &mut TlsStream<TcpStream>,
    request: &[u8],
) -> std::io::Result<(String, String)> {
    stream.write_all(request).await?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        loop {
            if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if seen.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&seen[end + 4..end + 4 + length]);
                    let status = head.lines().next().unwrap_or_default().to_owned();
                    return Ok((status, body.into_owned()));
                }
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("answered in time")
}

async fn health(stream: &mut TlsStream<TcpStream>) -> std::io::Result<String> {
    let (status, body) = exchange(stream, HEALTH).await?;
    assert!(status.contains(" 200 "), "{status}");
    Ok(body)
}

/// Reads until the server closes the connection; fails after `BOUND`.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection in time");
    seen
}

#[tokio::test]
async fn https_serves_and_plain_http_does_not() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let app = TlsApp::start(&pki, |_| {}).await;
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).expect("CA")])
        .build()
        .expect("client");
    let answer = client
        .get(format!("https://localhost:{}/healthz", app.addr.port()))
        .send()
        .await
        .expect("HTTPS answers");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.expect("body"), "ok\n");
    // The certificate's expiry is a gauge (rcgen's default notAfter: 4096-01-01).
    let metrics = client
        .get(format!("https://localhost:{}/metrics", app.addr.port()))
        .send()
        .await
        .expect("HTTPS answers")
        .text()
        .await
        .expect("body");
    let expires = chrono::NaiveDate::from_ymd_opt(4096, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("date")
        .and_utc()
        .timestamp();
    assert!(
        metrics.contains(&format!(
            "wsr_tls_certificate_not_after_seconds{{certificate=\"server\"}} {expires}\n"
        )),
        "{metrics}"
    );
    // Plain HTTP on the TLS port gets no HTTP answer, only a closed connection.
    let mut plain = TcpStream::connect(app.addr).await.expect("connect");
    plain.write_all(HEALTH).await.expect("write");
    let seen = read_until_closed(&mut plain).await;
    assert!(
        !seen.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
}

#[tokio::test]
async fn tls_1_2_and_1_3_both_serve_http_1_1() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let app = TlsApp::start(&pki, |_| {}).await;
    for (version, expected) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let mut stream = connect(app.addr, client_config(&pki, &[version], None))
            .await
            .expect("handshake");
        let session = stream.get_ref().1;
        assert_eq!(session.protocol_version(), Some(expected));
        assert_eq!(session.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert_eq!(health(&mut stream).await.expect("answer"), "ok\n");
    }
}

#[tokio::test]
async fn a_bad_certificate_stops_the_start_naming_the_file() {
    let pki = TestPki::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let build = |tls| {
        let mut config = Config::for_tests(dir.path().join("gw.db"));
        config.tls = Some(tls);
        App::build(config)
    };
    let missing = build(pki.tls_config(false)).await.err().expect("refused");
    let why = format!("{missing:#}");
    assert!(why.contains("cert.pem"), "{why}");
    let one = pki.server_cert();
    let other = pki.server_cert();
    pki.write_server(&TestCert {
        key_pem: other.key_pem,
        ..one
    });
    let mismatch = build(pki.tls_config(false)).await.err().expect("refused");
    let why = format!("{mismatch:#}");
    assert!(why.contains("does not match"), "{why}");
    assert!(why.contains("key.pem"), "{why}");
}

/// Serves a route answering who the request says it is from: `PeerAddr`, and the
/// `ClientCertificate` (its fingerprint and `chain_verified`) or `none`.
async fn serve_who(edge: Edge) -> (SocketAddr, oneshot::Sender<()>) {
    init_tracing();
    let who = |request: Request| async move {
        let peer = request
            .extensions()
            .get::<PeerAddr>()
            .map(|p| p.0.to_string())
            .unwrap_or_default();
        let cert = match request.extensions().get::<ClientCertificate>() {
            Some(c) => format!(
                "{} {}",
                wsr_gateway::secrets::sha256_hex(&c.der),
                c.chain_verified
            ),
            None => "none".to_owned(),
        };
        format!("{peer} {cert}")
    };
    let router = Router::new().route("/who", get(who));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(wsr_gateway::http::serve::serve(
        listener,
        router,
        edge,
        async {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
    ));
    (addr, stop)
}

fn edge(tls: Option<Tls>, trusted_proxy: Option<TrustedProxy>) -> Edge {
    Edge {
        perimeter: Config::default().perimeter,
        tls,
        trusted_proxy,
    }
}

const WHO: &[u8] = b"GET /who HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[tokio::test]
async fn client_certificates_reach_requests_as_the_handshake_judged_them() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let chained = pki.client_cert("acme");
    let pinned = TestPki::self_signed_client("globex");
    let stranger = TestPki::self_signed_client("initech");
    let tls = Tls::new(&pki.tls_config(true), BTreeSet::from([pinned.sha256()])).expect("tls");
    let (addr, _stop) = serve_who(edge(Some(tls), None)).await;
    let who = |identity: Option<TestCert>| {
        let config = client_config(&pki, both_versions(), identity.as_ref());
        async move {
            let mut stream = connect(addr, config).await?;
            let (_, body) = exchange(&mut stream, WHO).await?;
            Ok::<_, std::io::Error>(body.split_once(' ').expect("two parts").1.to_owned())
        }
    };
    assert_eq!(
        who(Some(chained.clone())).await.expect("served"),
        format!("{} true", chained.sha256())
    );
    assert_eq!(
        who(Some(pinned.clone())).await.expect("served"),
        format!("{} false", pinned.sha256())
    );
    assert_eq!(who(None).await.expect("served"), "none");
    // In TLS 1.3 the client may finish its side before the server refuses it: the refusal
    // then comes as the answer to its request.
    assert!(who(Some(stranger)).await.is_err());
}

#[tokio::test]
async fn only_pinned_certificates_without_a_client_ca() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let pinned = TestPki::self_signed_client("globex");
    let tls = Tls::new(&pki.tls_config(false), BTreeSet::from([pinned.sha256()])).expect("tls");
    let (addr, _stop) = serve_who(edge(Some(tls), None)).await;
    let mut stream = connect(addr, client_config(&pki, both_versions(), Some(&pinned)))
        .await
        .expect("handshake");
    let (_, body) = exchange(&mut stream, WHO).await.expect("served");
    assert!(
        body.ends_with(&format!("{} false", pinned.sha256())),
        "{body}"
    );
    // A certificate of the (unconfigured) CA counts for nothing.
    let chained = pki.client_cert("acme");
    let refused = async {
        let mut stream =
            connect(addr, client_config(&pki, both_versions(), Some(&chained))).await?;
        exchange(&mut stream, WHO).await
    };
    assert!(refused.await.is_err());
}

#[tokio::test]
async fn reload_serves_new_connections_the_new_certificate_and_keeps_open_ones() {
    let pki = TestPki::new();
    let first = pki.server_cert();
    pki.write_server(&first);
    let app = TlsApp::start(&pki, |_| {}).await;
    let config = || client_config(&pki, both_versions(), None);
    let mut open = connect(app.addr, config()).await.expect("handshake");
    assert_eq!(served_leaf(&open), first.sha256());
    health(&mut open).await.expect("answer");

    let second = pki.server_cert();
    pki.write_server(&second);
    app.reloader.reload().expect("reloads");
    assert_eq!(app.reloader.fingerprint(), second.sha256());
    let mut fresh = connect(app.addr, config()).await.expect("handshake");
    assert_eq!(served_leaf(&fresh), second.sha256());
    health(&mut fresh).await.expect("answer");
    // The connection set up before the reload carries on.
    health(&mut open)
        .await
        .expect("the old connection still answers");

    // Broken files are refused and the last good certificate stays.
    std::fs::write(pki.path("cert.pem"), "not a certificate").expect("write");
    let why = app.reloader.reload().expect_err("refused").to_string();
    assert!(why.contains("cert.pem"), "{why}");
    let third = pki.server_cert();
    std::fs::write(pki.path("cert.pem"), &third.cert_pem).expect("write");
    let why = app.reloader.reload().expect_err("refused").to_string();
    assert!(why.contains("does not match"), "{why}");
    let mut after = connect(app.addr, config()).await.expect("handshake");
    assert_eq!(served_leaf(&after), second.sha256());
    health(&mut after).await.expect("answer");
}

#[tokio::test]
async fn changed_files_are_picked_up_by_the_periodic_check() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let app = TlsApp::start(&pki, |c| {
        if let Some(tls) = &mut c.tls {
            tls.reload_check_seconds = 1;
        }
    })
    .await;
    let renewed = pki.server_cert();
    pki.write_server(&renewed);
    let config = client_config(&pki, both_versions(), None);
    let started = std::time::Instant::now();
    loop {
        let stream = connect(app.addr, config.clone()).await.expect("handshake");
        if served_leaf(&stream) == renewed.sha256() {
            break;
        }
        assert!(
            started.elapsed() < BOUND,
            "the renewed certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_silent_client_is_cut_at_the_header_timeout_and_frees_its_slot() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let app = TlsApp::start(&pki, |c| {
        c.perimeter.header_timeout = Duration::from_millis(300);
        c.perimeter.max_connections = 1;
    })
    .await;
    let mut silent = TcpStream::connect(app.addr).await.expect("connect");
    let started = std::time::Instant::now();
    // The only connection slot is the silent client's until it is cut; this one waits.
    let waiting = tokio::spawn({
        let config = client_config(&pki, both_versions(), None);
        let addr = app.addr;
        async move {
            let mut stream = connect(addr, config).await?;
            health(&mut stream).await
        }
    });
    let seen = read_until_closed(&mut silent).await;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    let answered = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("served once the slot is free")
        .expect("task");
    assert_eq!(answered.expect("answer"), "ok\n");
}

#[tokio::test]
async fn a_trusted_proxy_names_the_client_and_an_untrusted_peer_does_not() {
    let pki = TestPki::new();
    let client = pki.client_cert("acme");
    let escaped: String = client
        .cert_pem
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let request = format!(
        "GET /who HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 198.51.100.1, 203.0.113.9\r\nX-Client-Cert: {escaped}\r\nConnection: close\r\n\r\n"
    );
    let proxy = |network: &str| TrustedProxy {
        networks: vec![(network.parse().expect("ip"), 8)],
        client_cert_header: Some("x-client-cert".parse().expect("name")),
        peer_address_header: Some("x-forwarded-for".parse().expect("name")),
        host_header: None,
    };
    let ask = |addr: SocketAddr| {
        let request = request.clone();
        async move {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            stream.write_all(request.as_bytes()).await.expect("write");
            let seen = read_until_closed(&mut stream).await;
            let text = String::from_utf8_lossy(&seen).into_owned();
            text.rsplit("\r\n").next().unwrap_or_default().to_owned()
        }
    };
    let (trusted, _stop) = serve_who(edge(None, Some(proxy("127.0.0.0")))).await;
    assert_eq!(
        ask(trusted).await,
        format!("203.0.113.9:0 {} true", client.sha256())
    );
    let (untrusted, _stop) = serve_who(edge(None, Some(proxy("10.0.0.0")))).await;
    let answer = ask(untrusted).await;
    assert!(answer.starts_with("127.0.0.1:"), "{answer}");
    assert!(answer.ends_with(" none"), "{answer}");
}

#[tokio::test]
async fn sighup_reloads_the_certificate_of_a_running_gateway() {
    let pki = TestPki::new();
    let first = pki.server_cert();
    pki.write_server(&first);
    let port = super::support::free_port();
    let config = pki.path("gw.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = {:?}\n[tls]\ncert_file = {:?}\nkey_file = {:?}\nreload_check_seconds = 0\n",
            pki.path("gw.db").display().to_string(),
            pki.path("cert.pem").display().to_string(),
            pki.path("key.pem").display().to_string(),
        ),
    )
    .expect("config");
    let mut child = super::support::start_gateway(&config);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let tls = client_config(&pki, both_versions(), None);
    let mut open = connect(addr, tls.clone()).await.expect("handshake");
    assert_eq!(served_leaf(&open), first.sha256());

    let second = pki.server_cert();
    pki.write_server(&second);
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(hup.success());
    let started = std::time::Instant::now();
    loop {
        let stream = connect(addr, tls.clone()).await.expect("handshake");
        if served_leaf(&stream) == second.sha256() {
            break;
        }
        assert!(started.elapsed() < BOUND, "SIGHUP did not reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    health(&mut open)
        .await
        .expect("the old connection still answers");
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "SIGHUP stopped it"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn an_idle_tls_connection_is_closed_like_a_plain_one() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let app = TlsApp::start(&pki, |c| {
        c.perimeter.idle_timeout = Duration::from_millis(300)
    })
    .await;
    let mut stream = connect(app.addr, client_config(&pki, both_versions(), None))
        .await
        .expect("handshake");
    health(&mut stream).await.expect("answer");
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(BOUND, stream.read(&mut buf))
        .await
        .expect("closed within the bound");
    // EOF, or a reset: either way no more bytes.
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
}

/// A connection from `local` (a loopback address of its own) to `addr`.
async fn connect_from(local: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{local}:0").parse().expect("address"))?;
    socket.connect(addr).await
}

/// One source may hold at most `max_tls_handshakes_per_source` (4 here) connections in their
/// handshake: beyond them its connections are closed at once, untouched by TLS, and the other
/// connection slots stay free for others: a client from 127.0.0.2 is served at once. The
/// slots of handshakes that end are given back.
#[tokio::test]
async fn a_source_s_unfinished_handshakes_are_capped_and_another_source_is_served() {
    let pki = TestPki::new();
    pki.write_server(&pki.server_cert());
    let app = TlsApp::start(&pki, |c| {
        c.perimeter.max_connections = 6;
        c.perimeter.max_tls_handshakes_per_source = 4;
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(connect_from("127.0.0.1", app.addr).await.expect("connect"));
    }
    // Let the listener take the four in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..4 {
        let mut extra = connect_from("127.0.0.1", app.addr).await.expect("connect");
        let started = std::time::Instant::now();
        let seen = read_until_closed(&mut extra).await;
        assert!(seen.is_empty(), "{seen:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "closed at once, not at the header timeout: {:?}",
            started.elapsed()
        );
    }
    // A client hello from the same source is not answered either.
    let tcp = connect_from("127.0.0.1", app.addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let config = client_config(&pki, both_versions(), None);
    let refused = tokio::time::timeout(
        BOUND,
        tokio_rustls::TlsConnector::from(config.clone()).connect(name.clone(), tcp),
    )
    .await
    .expect("refused in time");
    assert!(refused.is_err(), "no handshake beyond the cap");

    let started = std::time::Instant::now();
    let tcp = connect_from("127.0.0.2", app.addr).await.expect("connect");
    let mut other = tokio::time::timeout(
        BOUND,
        tokio_rustls::TlsConnector::from(config.clone()).connect(name.clone(), tcp),
    )
    .await
    .expect("in time")
    .expect("another source completes its handshake");
    assert_eq!(health(&mut other).await.expect("answer"), "ok\n");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "served at once: {:?}",
        started.elapsed()
    );

    // Handshakes that end give their slots back.
    drop(silent);
    let started = std::time::Instant::now();
    loop {
        let tcp = connect_from("127.0.0.1", app.addr).await.expect("connect");
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        if let Ok(Ok(mut stream)) =
            tokio::time::timeout(BOUND, connector.connect(name.clone(), tcp)).await
        {
            assert_eq!(health(&mut stream).await.expect("answer"), "ok\n");
            break;
        }
        assert!(
            started.elapsed() < BOUND,
            "the source's slots were not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
