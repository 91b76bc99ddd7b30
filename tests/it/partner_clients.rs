//! How we reach partners (DESIGN §6, D15): our credentials go with every message, poll and
//! callback to a partner; polls go to its poll address; SOAP 1.1 polls and callbacks carry
//! `SOAPAction`; a partner's send window holds its ordered groups; its CA bundle verifies it
//! (and nothing else does); our client certificate is presented; an unusable TLS file fails
//! the start naming the partner and the file.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use wsr_gateway::Config;
use wsr_gateway::outbound::destination::DestinationRules;
use wsr_gateway::outbound::partner_clients::PartnerClients;
use wsr_gateway::partners::{Partner, PartnerConfig, Partners, base64_encode};
use wsr_gateway::secrets::Verifier;
use wsr_gateway::wsr::{
    GroupId, Headers, Limits, MessageId, Reply, ReplyPattern, ReplyRange, ReplyTo, Request,
    Response, SoapVersion, read_message, write_envelope,
};

use super::support::{ClockExt, TestApp, serve_local, spawn_app_with};

const TOKEN: &str = "partner-clients-token-0123456789";

fn partner(name: &str, config: PartnerConfig) -> Partner {
    config
        .check(name, None, &BTreeSet::new())
        .expect("a valid partner")
}

// ---- a fake partner over plain HTTP ----

/// What kind of WS-R request the fake partner got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Message,
    Poll,
    Callback,
}

#[derive(Debug, Clone)]
struct Seen {
    path: String,
    kind: Kind,
    version: SoapVersion,
    headers: HeaderMap,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct FakeState {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    arrivals: Notify,
}

/// A partner on 127.0.0.1 that answers any path like a WS-R peer: a Response-pattern message
/// gets its ack, a PollRequest acks everything it names, anything else gets 202. It records
/// every request and counts the messages in flight at once.
struct FakePartner {
    base: String,
    seen: mpsc::UnboundedReceiver<Seen>,
    state: Arc<FakeState>,
}

/// How long the fake partner holds a message open waiting for another one to arrive beside
/// it (the window test): an upper bound on a wait for an event, not a pause. With a window
/// of one nothing else can arrive, so each message waits this long; a wider window sends the
/// next ones at once and they meet here.
const HOLD: Duration = Duration::from_millis(150);

async fn fake_partner(hold: bool) -> FakePartner {
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Arc::new(FakeState::default());
    let shared = state.clone();
    let handler = move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let (tx, state) = (tx.clone(), shared.clone());
        async move {
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let Ok(env) = read_message(ct.as_deref(), &body, &Limits::default()) else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            let (kind, replies) = if let Some(request) = &env.request {
                let ack = match request.reply_pattern {
                    ReplyPattern::Response => Some(ack_of(request)),
                    _ => None,
                };
                (Kind::Message, ack.into_iter().collect())
            } else if let Some(poll) = &env.poll_request {
                let acks = poll
                    .refs
                    .iter()
                    .map(|r| {
                        if r.ranges.is_empty() {
                            Reply::NonSequence {
                                group_id: r.group_id.clone(),
                                fault: None,
                            }
                        } else {
                            Reply::Sequence {
                                group_id: r.group_id.clone(),
                                ranges: r
                                    .ranges
                                    .iter()
                                    .map(|range| ReplyRange {
                                        range: *range,
                                        fault: None,
                                    })
                                    .collect(),
                            }
                        }
                    })
                    .collect();
                (Kind::Poll, acks)
            } else {
                (Kind::Callback, Vec::new())
            };
            let _ = tx.send(Seen {
                path: uri.path().to_owned(),
                kind,
                version: env.version,
                headers: headers.clone(),
            });
            if kind == Kind::Message && hold {
                let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                state.most_in_flight.fetch_max(now, Ordering::SeqCst);
                // Wake the ones held before this one, then wait for the next: a `Notified`
                // made before `notify_waiters` would be woken by this very call.
                state.arrivals.notify_waiters();
                let next = state.arrivals.notified();
                let _ = tokio::time::timeout(HOLD, next).await;
                state.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            if replies.is_empty() {
                return StatusCode::ACCEPTED.into_response();
            }
            let response = Response { replies };
            let xml = write_envelope(
                env.version,
                Headers {
                    response: Some(&response),
                    ..Headers::default()
                },
                "",
            );
            (
                StatusCode::OK,
                [("content-type", env.version.content_type())],
                xml,
            )
                .into_response()
        }
    };
    let base = serve_local(axum::Router::new().fallback(handler)).await;
    FakePartner {
        base,
        seen: rx,
        state,
    }
}

fn ack_of(request: &Request) -> Reply {
    let group_id = request.message_id.group_id.clone();
    match &request.message_id.sequence {
        Some(s) => Reply::Sequence {
            group_id,
            ranges: vec![ReplyRange {
                range: wsr_gateway::wsr::SeqRange::single(s.number),
                fault: None,
            }],
        },
        None => Reply::NonSequence {
            group_id,
            fault: None,
        },
    }
}

impl FakePartner {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Everything received until `done` says it is enough, moving the gateway's clock a
    /// second at a time so that polls come due. Bounded: 20 s.
    async fn until(&mut self, app: &TestApp, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let mut all = Vec::new();
        for _ in 0..400 {
            while let Ok(s) = self.seen.try_recv() {
                all.push(s);
            }
            if done(&all) {
                return all;
            }
            app.clock.advance(chrono::Duration::seconds(1));
            if let Ok(Some(s)) =
                tokio::time::timeout(Duration::from_millis(50), self.seen.recv()).await
            {
                all.push(s);
            }
        }
        panic!("the fake partner did not get what was expected within 20 s: {all:#?}");
    }
}

fn has(seen: &[Seen], path: &str, kind: Kind) -> bool {
    seen.iter().any(|s| s.path == path && s.kind == kind)
}

async fn submit(app: &TestApp, body: Value) {
    let (status, answer) = super::support::submit_as(app, TOKEN, body).await;
    assert_eq!(status, 202, "{answer}");
}

/// A message from the partner asking for its ack by callback to `endpoint`.
async fn callback_pattern_message(app: &TestApp, version: SoapVersion, endpoint: &str, n: u32) {
    let request = Request {
        message_id: MessageId {
            group_id: GroupId::parse(&format!("mid:cb-{n}@partner")).expect("group"),
            sequence: None,
        },
        expiry_time: app.clock.now_utc() + chrono::Duration::hours(1),
        reply_pattern: ReplyPattern::Callback(ReplyTo::bare(endpoint)),
        ack_requested: true,
        duplicate_elimination: true,
        message_order: false,
    };
    let xml = write_envelope(
        version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        "<p:Order xmlns:p=\"urn:p\">by callback</p:Order>",
    );
    let answer = app.send(version, xml).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
}

/// A gateway that knows `partners`, registers their callback endpoints, and polls every
/// 200 ms of its clock.
async fn gateway(partners: Vec<Partner>) -> TestApp {
    spawn_app_with(move |c| {
        c.tokens = vec![super::support::producer_token(TOKEN)];
        c.poll_interval = Duration::from_millis(200);
        super::support::allow_loopback_urls(c);
        for p in partners {
            c.callback_endpoints
                .extend(p.inbound.callback_endpoints.iter().cloned());
            c.partners.insert(p);
        }
    })
    .await
}

#[tokio::test]
async fn our_credentials_go_with_every_message_poll_and_callback_to_the_partner() {
    let mut fake = fake_partner(false).await;
    let basic = partner(
        "basic-peer",
        PartnerConfig {
            address: Some(fake.url("/basic/wsr")),
            poll_address: Some(fake.url("/basic/poll")),
            callback_endpoints: vec![fake.url("/basic/callback")],
            our_username: Some("our-gw".into()),
            our_password: Some("pw-of-ours-1".into()),
            ..PartnerConfig::default()
        },
    );
    let bearer = partner(
        "bearer-peer",
        PartnerConfig {
            address: Some(fake.url("/bearer/wsr")),
            callback_endpoints: vec![fake.url("/bearer/callback")],
            our_token: Some("our-token-0123456789".into()),
            ..PartnerConfig::default()
        },
    );
    let app = gateway(vec![basic, bearer]).await;
    for name in ["basic-peer", "bearer-peer"] {
        for pattern in ["Response", "Poll"] {
            submit(
                &app,
                json!({ "destination": name, "agreement": { "reply_pattern": pattern },
                        "body": "<o:Order xmlns:o=\"urn:o\"/>" }),
            )
            .await;
        }
    }
    // A URL destination that is no partner's address gets no partner's credentials.
    submit(
        &app,
        json!({ "destination": fake.url("/stranger/wsr"), "body": "<o:Order xmlns:o=\"urn:o\"/>" }),
    )
    .await;
    callback_pattern_message(&app, SoapVersion::Soap11, &fake.url("/basic/callback"), 1).await;
    callback_pattern_message(&app, SoapVersion::Soap11, &fake.url("/bearer/callback"), 2).await;

    let seen = fake
        .until(&app, |s| {
            has(s, "/basic/wsr", Kind::Message)
                && has(s, "/basic/poll", Kind::Poll)
                && has(s, "/basic/callback", Kind::Callback)
                && has(s, "/bearer/wsr", Kind::Message)
                && has(s, "/bearer/wsr", Kind::Poll)
                && has(s, "/bearer/callback", Kind::Callback)
                && has(s, "/stranger/wsr", Kind::Message)
        })
        .await;
    let basic_auth = format!("Basic {}", base64_encode(b"our-gw:pw-of-ours-1"));
    for s in &seen {
        let expected = if s.path.starts_with("/basic/") {
            Some(basic_auth.as_str())
        } else if s.path.starts_with("/bearer/") {
            Some("Bearer our-token-0123456789")
        } else {
            None
        };
        assert_eq!(
            s.header("authorization"),
            expected,
            "{:?} to {}",
            s.kind,
            s.path
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn polls_go_to_the_poll_address_and_soap11_polls_and_callbacks_carry_soapaction() {
    let mut fake = fake_partner(false).await;
    let holodeck = partner(
        "holodeck",
        PartnerConfig {
            address: Some(fake.url("/axis2/services/echo")),
            poll_address: Some(fake.url("/axis2/services/wsrm")),
            callback_endpoints: vec![fake.url("/cb11"), fake.url("/cb12")],
            ..PartnerConfig::default()
        },
    );
    let plain = partner(
        "plain",
        PartnerConfig {
            address: Some(fake.url("/plain/wsr")),
            ..PartnerConfig::default()
        },
    );
    let app = gateway(vec![holodeck, plain]).await;
    for (name, version) in [("holodeck", "1.1"), ("holodeck", "1.2"), ("plain", "1.1")] {
        submit(
            &app,
            json!({ "destination": name, "agreement": { "reply_pattern": "Poll" },
                    "soap_version": version, "body": "<o:Order xmlns:o=\"urn:o\"/>" }),
        )
        .await;
    }
    callback_pattern_message(&app, SoapVersion::Soap11, &fake.url("/cb11"), 3).await;
    callback_pattern_message(&app, SoapVersion::Soap12, &fake.url("/cb12"), 4).await;
    let polled = |s: &[Seen], version| {
        s.iter()
            .any(|s| s.kind == Kind::Poll && s.version == version && s.path.starts_with("/axis2"))
    };
    let seen = fake
        .until(&app, |s| {
            polled(s, SoapVersion::Soap11)
                && polled(s, SoapVersion::Soap12)
                && has(s, "/plain/wsr", Kind::Poll)
                && has(s, "/cb11", Kind::Callback)
                && has(s, "/cb12", Kind::Callback)
        })
        .await;
    for s in &seen {
        match (s.kind, s.path.as_str()) {
            (Kind::Poll, path) if path.starts_with("/axis2") => {
                assert_eq!(path, "/axis2/services/wsrm", "polls go to the poll address")
            }
            (Kind::Message, path) if path.starts_with("/axis2") => {
                assert_eq!(path, "/axis2/services/echo", "messages go to the address")
            }
            _ => {}
        }
        // SOAP 1.1 requires the header (WS-R defines no action: ""); SOAP 1.2 has none.
        let expected = match s.version {
            SoapVersion::Soap11 => Some("\"\""),
            SoapVersion::Soap12 => None,
        };
        assert_eq!(
            s.header("soapaction"),
            expected,
            "{:?} {:?} to {}",
            s.version,
            s.kind,
            s.path
        );
        assert_eq!(
            s.header("content-type"),
            Some(s.version.content_type()),
            "{:?} to {}",
            s.kind,
            s.path
        );
    }
    app.stop().await;
}

/// Submits an ordered group of `n` to `destination` (Response pattern) and waits until all
/// are acked. Bounded: 20 s.
async fn ordered_group_acked(app: &TestApp, destination: &str, n: u64) {
    let mut group: Option<String> = None;
    for i in 0..n {
        let mut g = json!({ "last": i + 1 == n });
        if let Some(id) = &group {
            g["id"] = json!(id);
        }
        let (status, answer) = super::support::submit_as(
            app,
            TOKEN,
            json!({ "destination": destination,
                    "agreement": { "reply_pattern": "Response", "message_order": true },
                    "group": g, "body": format!("<o:Line xmlns:o=\"urn:o\">{i}</o:Line>") }),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
        group.get_or_insert_with(|| answer["group_id"].as_str().expect("group id").to_owned());
    }
    let group = group.expect("a group");
    for _ in 0..400 {
        let messages = app
            .store
            .out_messages(None, Some(&group), None, 1000)
            .await
            .expect("list");
        if messages.len() as u64 == n && messages.iter().all(|m| m.outbound.state.name() == "acked")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the group to {destination} was not acked within 20 s");
}

#[tokio::test]
async fn a_partner_send_window_of_one_keeps_one_message_of_an_ordered_group_in_flight() {
    let one = fake_partner(true).await;
    let eight = fake_partner(true).await;
    let partners = vec![
        partner(
            "holds-out-of-order",
            PartnerConfig {
                address: Some(one.url("/wsr")),
                send_window: Some(1),
                ..PartnerConfig::default()
            },
        ),
        // The global window (8): shows the fake partner does see messages side by side.
        partner(
            "any-order",
            PartnerConfig {
                address: Some(eight.url("/wsr")),
                ..PartnerConfig::default()
            },
        ),
    ];
    let app = gateway(partners).await;
    assert_eq!(app.config.send_window, 8);
    ordered_group_acked(&app, "holds-out-of-order", 5).await;
    ordered_group_acked(&app, "any-order", 5).await;
    assert_eq!(one.state.most_in_flight.load(Ordering::SeqCst), 1);
    assert!(
        eight.state.most_in_flight.load(Ordering::SeqCst) > 1,
        "with the global window the group goes out side by side"
    );
    app.stop().await;
}

// ---- TLS ----

/// A CA, and the certificates it signs.
struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    der: rustls::pki_types::CertificateDer<'static>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("CA certificate");
    Ca {
        der: cert.der().clone(),
        pem: cert.pem(),
        issuer: rcgen::Issuer::new(params, key),
    }
}

/// A leaf certificate for 127.0.0.1 and its key.
struct Leaf {
    der: rustls::pki_types::CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
    key_der: Vec<u8>,
}

fn leaf(ca: &Ca, purpose: rcgen::ExtendedKeyUsagePurpose) -> Leaf {
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
    params.extended_key_usages = vec![purpose];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params
        .signed_by(&key, &ca.issuer)
        .expect("leaf certificate");
    Leaf {
        der: cert.der().clone(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        key_der: key.serialize_der(),
    }
}

/// A TLS server on 127.0.0.1 answering every request 202; with `client_ca`, it requires a
/// client certificate chaining to it and records the ones presented.
struct TlsServer {
    addr: SocketAddr,
    clients: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn tls_server(leaf: &Leaf, client_ca: Option<&Ca>) -> TlsServer {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.der.clone()).expect("client CA");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf.key_der.clone().into());
    let config = builder
        .with_single_cert(vec![leaf.der.clone()], key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let clients = Arc::new(Mutex::new(Vec::new()));
    let seen = clients.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Some(chain) = tls.get_ref().1.peer_certificates() {
                    let end_entity = chain.first().map(|c| c.to_vec()).unwrap_or_default();
                    seen.lock().expect("lock").push(end_entity);
                }
                let service = hyper::service::service_fn(|_request| async {
                    let mut answer = hyper::Response::new(String::new());
                    *answer.status_mut() = hyper::StatusCode::ACCEPTED;
                    Ok::<_, std::convert::Infallible>(answer)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    TlsServer { addr, clients }
}

impl TlsServer {
    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/wsr", self.addr.port())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a PEM file");
    path
}

fn clients_for(partners: Vec<Partner>) -> anyhow::Result<PartnerClients> {
    PartnerClients::new(
        &Partners::new(partners, Verifier::default()),
        Duration::from_secs(10),
        Arc::new(DestinationRules::default()),
    )
}

/// A SOAP 1.1 POST through the partner's route; its status, or the error's text.
async fn post(clients: &PartnerClients, url: &str) -> Result<u16, String> {
    clients
        .for_message("", url)
        .post_soap(url, SoapVersion::Soap11, "<x/>")
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{:?}", e.without_url()))
}

#[tokio::test]
async fn a_partner_ca_file_verifies_the_partner_and_no_other_server() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ours, other) = (ca("partner CA"), ca("someone else's CA"));
    let ca_file = write(dir.path(), "partner-ca.pem", &ours.pem);
    let good = tls_server(
        &leaf(&ours, rcgen::ExtendedKeyUsagePurpose::ServerAuth),
        None,
    )
    .await;
    let bad = tls_server(
        &leaf(&other, rcgen::ExtendedKeyUsagePurpose::ServerAuth),
        None,
    )
    .await;
    let with_ca = |name: &str, url: String| {
        partner(
            name,
            PartnerConfig {
                address: Some(url),
                ca_file: Some(ca_file.clone()),
                ..PartnerConfig::default()
            },
        )
    };
    let clients = clients_for(vec![
        with_ca("trusted", good.url()),
        with_ca("impostor", bad.url()),
    ])
    .expect("clients build");
    assert_eq!(post(&clients, &good.url()).await, Ok(202));
    let refused = post(&clients, &bad.url()).await;
    assert!(
        refused.is_err(),
        "a server the partner CA did not sign: {refused:?}"
    );
    // Without the partner's CA file (the system roots) the partner's server is not trusted:
    // the CA file is what made the first call pass.
    let system_roots = clients_for(vec![partner(
        "trusted",
        PartnerConfig {
            address: Some(good.url()),
            ..PartnerConfig::default()
        },
    )])
    .expect("clients build");
    let refused = post(&system_roots, &good.url()).await;
    assert!(
        refused.is_err(),
        "system roots trusted a private CA: {refused:?}"
    );
}

#[tokio::test]
async fn our_client_certificate_is_presented_to_a_partner_that_requires_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server_ca, client_ca) = (ca("partner CA"), ca("partner's CA for its clients"));
    let ca_file = write(dir.path(), "partner-ca.pem", &server_ca.pem);
    let ours = leaf(&client_ca, rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let cert_file = write(dir.path(), "our-cert.pem", &ours.cert_pem);
    let key_file = write(dir.path(), "our-key.pem", &ours.key_pem);
    let server = tls_server(
        &leaf(&server_ca, rcgen::ExtendedKeyUsagePurpose::ServerAuth),
        Some(&client_ca),
    )
    .await;
    let clients = clients_for(vec![partner(
        "strict",
        PartnerConfig {
            address: Some(server.url()),
            ca_file: Some(ca_file.clone()),
            client_cert_file: Some(cert_file),
            client_key_file: Some(key_file),
            ..PartnerConfig::default()
        },
    )])
    .expect("clients build");
    assert_eq!(post(&clients, &server.url()).await, Ok(202));
    assert_eq!(
        server.clients.lock().expect("lock").as_slice(),
        [ours.der.to_vec()],
        "our certificate was presented"
    );
    // The same partner without our certificate is turned away: the server does check.
    let anonymous = clients_for(vec![partner(
        "strict",
        PartnerConfig {
            address: Some(server.url()),
            ca_file: Some(ca_file),
            ..PartnerConfig::default()
        },
    )])
    .expect("clients build");
    let refused = post(&anonymous, &server.url()).await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
}

#[tokio::test]
async fn an_unusable_partner_tls_file_fails_the_start_naming_partner_and_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let authority = ca("partner CA");
    let good_ca = write(dir.path(), "ca.pem", &authority.pem);
    let not_pem = write(dir.path(), "not-pem.pem", "this is no certificate\n");
    let key_only = write(
        dir.path(),
        "key-only.pem",
        &leaf(&authority, rcgen::ExtendedKeyUsagePurpose::ClientAuth).key_pem,
    );
    let missing = dir.path().join("missing.pem");
    let one = leaf(&authority, rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let another = leaf(&authority, rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let cert_file = write(dir.path(), "cert.pem", &one.cert_pem);
    let wrong_key = write(dir.path(), "wrong-key.pem", &another.key_pem);
    let right_key = write(dir.path(), "right-key.pem", &one.key_pem);
    let ca_only = |f: &Path| PartnerConfig {
        ca_file: Some(f.to_owned()),
        ..PartnerConfig::default()
    };
    let with_cert = |cert: &Path, key: &Path| PartnerConfig {
        ca_file: Some(good_ca.clone()),
        client_cert_file: Some(cert.to_owned()),
        client_key_file: Some(key.to_owned()),
        ..PartnerConfig::default()
    };
    let cases = [
        (ca_only(&missing), &missing),
        (ca_only(&not_pem), &not_pem),
        (ca_only(&key_only), &key_only),
        (with_cert(&cert_file, &wrong_key), &wrong_key),
        (with_cert(&missing, &right_key), &missing),
        (with_cert(&cert_file, &not_pem), &not_pem),
    ];
    for (i, (config, file)) in cases.into_iter().enumerate() {
        let mut c = Config::for_tests(dir.path().join(format!("gw{i}.db")));
        c.partners.insert(partner("acme-bad", config));
        let error = match wsr_gateway::App::build(c).await {
            Ok(_) => panic!("case {i}: the gateway started with {}", file.display()),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            error.contains("acme-bad") && error.contains(&file.display().to_string()),
            "case {i}: {error}"
        );
    }
    // The same files used rightly start it.
    let mut c = Config::for_tests(dir.path().join("gw-ok.db"));
    c.partners
        .insert(partner("acme-good", with_cert(&cert_file, &right_key)));
    assert!(wsr_gateway::App::build(c).await.is_ok());
}
