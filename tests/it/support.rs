//! Helpers shared by the integration tests: envelope builders with non-default prefixes (to
//! prove prefix independence), xmllint validation, and paths to shared test data.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
#[allow(unused_imports)]
use wsr_gateway::store::{Backend as _, ReceiverStore as _};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use wsr_gateway::clock::ManualClock;
use wsr_gateway::store::{Endpoints, InboxEntry, Store};
use wsr_gateway::wsr::datetime::date_time_string;
use wsr_gateway::wsr::{Envelope, Limits, SoapVersion, read_message};
use wsr_gateway::{App, Config};

pub use crate::test_database::{FreshDatabase, fresh_database};

pub const WSRM: &str = "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd";

pub fn limits() -> Limits {
    Limits::default()
}

/// A SOAP 1.1 envelope with prefixes `S` (envelope) and `r` (WS-R).
pub fn soap11(headers: &str, body: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/" xmlns:r="{WSRM}"><S:Header>{headers}</S:Header><S:Body>{body}</S:Body></S:Envelope>"#
    )
}

/// A SOAP 1.2 envelope with prefixes `e` (envelope) and `r` (WS-R).
pub fn soap12(headers: &str, body: &str) -> String {
    format!(
        r#"<e:Envelope xmlns:e="http://www.w3.org/2003/05/soap-envelope" xmlns:r="{WSRM}"><e:Header>{headers}</e:Header><e:Body>{body}</e:Body></e:Envelope>"#
    )
}

/// `<r:Request mustUnderstand>` around the given children, for SOAP 1.1 (`S:` prefix).
pub fn request11(children: &str) -> String {
    format!(r#"<r:Request S:mustUnderstand="1">{children}</r:Request>"#)
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The recorded Holodeck exchanges, kept in the repository (`tests/fixtures/interop/`, copied
/// unchanged from the shared interop recordings) so that a fresh clone tests with nothing
/// beside it.
pub fn holodeck_dir() -> PathBuf {
    repo_root().join("tests/fixtures/interop/holodeck")
}

/// Validates each document against our schema for its SOAP version, in one xmllint run per
/// version. Returns the documents that failed, with xmllint's complaint.
pub fn schema_failures(docs: &[(SoapVersion, String)]) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for (version, schema) in [
        (SoapVersion::Soap11, "soap11-envelope.xsd"),
        (SoapVersion::Soap12, "soap12-envelope.xsd"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = Vec::new();
        for (i, (_, doc)) in docs.iter().enumerate().filter(|(_, (v, _))| *v == version) {
            let path = dir.path().join(format!("doc{i}.xml"));
            let mut f = std::fs::File::create(&path).expect("create temp file");
            f.write_all(doc.as_bytes()).expect("write temp file");
            files.push((path, doc.clone()));
        }
        if files.is_empty() {
            continue;
        }
        // Batches keep the command line short.
        for chunk in files.chunks(200) {
            let out = Command::new("xmllint")
                .arg("--noout")
                .arg("--nonet")
                .arg("--schema")
                .arg(repo_root().join("schemas").join(schema))
                .args(chunk.iter().map(|(p, _)| p))
                .output()
                .expect("xmllint must be installed (.ci/run installs libxml2-utils)");
            let stderr = String::from_utf8_lossy(&out.stderr);
            for (path, doc) in chunk {
                let name = path.to_string_lossy();
                if !stderr.contains(&format!("{name} validates")) {
                    let complaint: Vec<&str> = stderr
                        .lines()
                        .filter(|l| l.contains(name.as_ref()))
                        .collect();
                    failures.push((doc.clone(), complaint.join("\n")));
                }
            }
        }
    }
    failures
}

pub fn assert_schema_valid(docs: &[(SoapVersion, String)]) {
    let failures = schema_failures(docs);
    let shown: Vec<String> = failures
        .iter()
        .take(5)
        .map(|(doc, why)| format!("{doc}\n{why}"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} documents fail the schema; the first ones:\n{}",
        failures.len(),
        docs.len(),
        shown.join("\n\n")
    );
}

/// A gateway on port 0 with a fresh store and a manual clock set to the wall clock.
pub struct TestApp {
    pub addr: SocketAddr,
    pub store: Store,
    pub clock: ManualClock,
    pub client: reqwest::Client,
    pub config: Config,
    kept: Kept,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Gateway logs in test output when RUST_LOG is set (once per test binary).
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
    });
}

/// A gateway whose clock starts at `start` (a recording's time): its background work never
/// sees a later "now" than the requests it is sent, as on a real clock.
pub async fn spawn_app_at(start: chrono::DateTime<Utc>) -> TestApp {
    spawn_app_on(ManualClock::new(start), |_| {}).await
}

/// `spawn_app_at` with the configuration adjusted first.
pub async fn spawn_app_at_with(
    start: chrono::DateTime<Utc>,
    adjust: impl FnOnce(&mut Config),
) -> TestApp {
    spawn_app_on(ManualClock::new(start), adjust).await
}

pub async fn spawn_app_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
    spawn_app_on(ManualClock::new(Utc::now()), adjust).await
}

async fn spawn_app_on(clock: ManualClock, adjust: impl FnOnce(&mut Config)) -> TestApp {
    init_tracing();
    let dir = tempfile::tempdir().expect("temp dir");
    let database = fresh_database(dir.path(), "gw.db").await;
    let mut config = Config::for_tests(dir.path().join("gw.db"));
    config.database = database.database.clone();
    config.callback_retry_initial = std::time::Duration::from_millis(20);
    config.callback_retry_max = std::time::Duration::from_millis(200);
    adjust(&mut config);
    let mut app = start(config, clock).await;
    app.kept = Kept {
        _dir: Some(dir),
        _database: Some(database),
    };
    app
}

/// What keeps a stopped gateway's database alive, to start it again on the same one.
#[derive(Default)]
pub struct Kept {
    _dir: Option<tempfile::TempDir>,
    _database: Option<FreshDatabase>,
}

/// Starts a gateway on an existing configuration (e.g. the same database again).
/// Asks `probe` until it answers `Some` (at most 500 times, 10 ms apart): for what another
/// task, process or transaction finishes at a moment the test cannot name.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for attempt in 0..500 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if let Some(found) = probe().await {
            return found;
        }
    }
    panic!("{what}: not within 500 looks");
}

pub async fn start(config: Config, clock: ManualClock) -> TestApp {
    let app = App::build_with_clock(config.clone(), Arc::new(clock.clone()))
        .await
        .expect("gateway builds");
    let addr = app.local_addr();
    let store = app.store().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    TestApp {
        addr,
        store,
        clock,
        client: reqwest::Client::new(),
        config,
        kept: Kept::default(),
        stop: Some(stop),
        server: Some(server),
    }
}

/// An HTTP answer: status, content type and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

impl Answer {
    pub async fn read(r: reqwest::Response) -> Answer {
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = r.text().await.expect("answer body");
        Answer {
            status,
            content_type,
            body,
        }
    }

    /// The answer read as an envelope (it must be one).
    pub fn envelope(&self) -> Envelope<'_> {
        read_message(
            self.content_type.as_deref(),
            self.body.as_bytes(),
            &Limits::default(),
        )
        .unwrap_or_else(|d| panic!("answer is not a readable envelope: {d}\n{}", self.body))
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn post(&self, path: &str, content_type: &str, body: String) -> Answer {
        let r = self
            .client
            .post(self.url(path))
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .expect("request reaches the gateway");
        Answer::read(r).await
    }

    /// POSTs an envelope to `/wsr/default` with the media type of its SOAP version.
    pub async fn send(&self, version: SoapVersion, xml: String) -> Answer {
        self.post("/wsr/default", version.content_type(), xml).await
    }

    /// The groupIds of the inbox, in delivery order.
    pub async fn inbox_groups(&self) -> Vec<String> {
        self.inbox()
            .await
            .iter()
            .map(|e| e.group_id.clone())
            .collect()
    }

    pub async fn inbox(&self) -> Vec<InboxEntry> {
        self.store.inbox(0, 100_000).await.expect("inbox reads")
    }

    /// Applies the deadlines due at the test clock's time, as the sweeper would. On
    /// PostgreSQL a sweep leaves a group another transaction holds (the background sweeper
    /// may hold it with the clock read before an advance) to the next pass: sweep until
    /// nothing is due.
    pub async fn sweep(&self) {
        let now = self.clock.now_utc();
        eventually("every deadline due swept", || async {
            self.store.sweep(now).await.expect("sweep");
            let next = self.store.next_deadline().await.expect("next deadline");
            next.is_none_or(|d| d > now).then_some(())
        })
        .await;
    }

    /// Registers `url` as a push/notify webhook (DESIGN D15: only registered ones are used).
    pub async fn register_webhook(&self, url: &str) {
        self.store
            .add_endpoint(Endpoints::Push, None, url, Utc::now())
            .await
            .expect("register the webhook");
    }

    pub async fn register_callback(&self, url: &str) {
        self.store
            .add_endpoint(Endpoints::Callback, None, url, Utc::now())
            .await
            .expect("register endpoint");
    }

    /// Ends the gateway as kill -9 would, as far as its database can tell: every task stops
    /// where it is (no drain, nothing released), and its connections close.
    pub fn kill(mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }

    /// Stops the server (answering requests in flight) and hands back its configuration.
    pub async fn stop(mut self) -> (Config, ManualClock, Kept) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server
                .await
                .expect("server task")
                .expect("server stops cleanly");
        }
        (
            self.config.clone(),
            self.clock.clone(),
            std::mem::take(&mut self.kept),
        )
    }
}

pub trait ClockExt {
    fn now_utc(&self) -> DateTime<Utc>;
}

impl ClockExt for ManualClock {
    fn now_utc(&self) -> DateTime<Utc> {
        use wsr_gateway::clock::Clock;
        self.now()
    }
}

/// xs:dateTime text for `t`.
pub fn xs(t: DateTime<Utc>) -> String {
    date_time_string(&t)
}

/// A local endpoint that records every POST it receives (callbacks), answering each with the
/// next status from `statuses` (then 202).
pub struct MockPartner {
    pub url: String,
    pub received: mpsc::UnboundedReceiver<(HeaderMap, String)>,
}

pub async fn mock_partner(statuses: Vec<u16>) -> MockPartner {
    let (tx, rx) = mpsc::unbounded_channel();
    let statuses = Arc::new(Mutex::new(statuses.into_iter()));
    let handler = move |headers: HeaderMap, body: Bytes| {
        let tx = tx.clone();
        let statuses = statuses.clone();
        async move {
            // When it arrived, for tests that check timing against an ExpiryTime.
            let mut headers = headers;
            if let Ok(at) = axum::http::HeaderValue::from_str(&Utc::now().to_rfc3339()) {
                headers.insert("x-received-at", at);
            }
            let _ = tx.send((headers, String::from_utf8_lossy(&body).into_owned()));
            let next = statuses.lock().expect("lock").next().unwrap_or(202);
            axum::http::StatusCode::from_u16(next).expect("status")
        }
    };
    let router = axum::Router::new().route("/callback", axum::routing::post(handler));
    let url = format!("{}/callback", serve_local(router).await);
    MockPartner { url, received: rx }
}

impl MockPartner {
    /// The next POST of a retry: the retry waits on the gateway's clock, so the test clock is
    /// moved a second at a time until it comes (bounded: at most 10 minutes of clock).
    pub async fn next_retry(&mut self, clock: &ManualClock) -> (HeaderMap, String) {
        for _ in 0..600 {
            clock.advance(chrono::Duration::seconds(1));
            let wait = std::time::Duration::from_millis(50);
            if let Ok(Some(post)) = tokio::time::timeout(wait, self.received.recv()).await {
                return post;
            }
        }
        panic!("no retry within 10 minutes of test clock");
    }

    /// The next POST, waiting at most 10 s (an explicit event, not a sleep).
    pub async fn next_post(&mut self) -> (HeaderMap, String) {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.received.recv())
            .await
            .expect("a callback arrives within 10 s")
            .expect("mock partner alive")
    }
}

/// A port on 127.0.0.1 that was free a moment ago, for a gateway child process's config.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Serves `router` on 127.0.0.1, port 0, in the background; its base URL.
pub async fn serve_local(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local server");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    base
}

/// Starts `wsr-gateway serve --config FILE` as a child process and waits until it listens.
pub fn start_gateway(config: &std::path::Path) -> std::process::Child {
    start_gateway_logged(config).0
}

/// `start_gateway`, keeping every line it logs to stdout after "listening" (for the tests of
/// what its log lines say).
pub fn start_gateway_logged(
    config: &std::path::Path,
) -> (std::process::Child, Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut command = Command::new(env!("CARGO_BIN_EXE_wsr-gateway"));
    // The gateway refuses unknown WSR_* settings; the test run's own are not
    // for it, and the config file says everything.
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("WSR_")) {
        command.env_remove(key);
    }
    let mut child = command
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gateway starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next()
            .expect("the gateway says it is listening")
            .expect("stdout line");
        if line.contains("listening") {
            break;
        }
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    let logged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = logged.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    (child, logged)
}

/// The receivers in these tests are local test servers and gateways on 127.0.0.1, named by
/// URL: their senders allow URL destinations and list loopback (D15 refuses both by default).
pub fn allow_loopback_urls(c: &mut wsr_gateway::Config) {
    c.destinations =
        wsr_gateway::outbound::destination::DestinationRules::new(true, &["127.0.0.1".to_owned()])
            .expect("valid rules");
}

/// Load tests send everything from one address, 127.0.0.1: no storage quota per source (D13)
/// on any channel, or it would hold their burst back.
pub fn without_source_quota(c: &mut wsr_gateway::Config) {
    for agreement in c.channels.values_mut() {
        agreement.quota = wsr_gateway::rmp::quota::SourceQuota::UNLIMITED;
    }
}

/// A figure of a process's `/proc/{pid}/status` in KiB (`field` like `"VmHWM"`): the memory
/// tests' measure of a child gateway.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A SOAP 1.1 envelope with `request` in its header and `body` as its Body.
pub fn request_envelope(request: &wsr_gateway::wsr::Request, body: &str) -> String {
    wsr_gateway::wsr::write_envelope(
        SoapVersion::Soap11,
        wsr_gateway::wsr::Headers {
            request: Some(request),
            ..wsr_gateway::wsr::Headers::default()
        },
        body,
    )
}

/// A SOAP 1.1 envelope holding a `wsrm:Response` with `replies` (a callback's acks).
pub fn response_envelope(replies: Vec<wsr_gateway::wsr::Reply>) -> String {
    let response = wsr_gateway::wsr::Response { replies };
    wsr_gateway::wsr::write_envelope(
        SoapVersion::Soap11,
        wsr_gateway::wsr::Headers {
            response: Some(&response),
            ..wsr_gateway::wsr::Headers::default()
        },
        "",
    )
}

/// A SOAP 1.1 envelope holding a PollRequest for `refs`.
pub fn poll_envelope(refs: Vec<wsr_gateway::wsr::RefToMessageIds>) -> String {
    let poll = wsr_gateway::wsr::PollRequest {
        refs,
        reply_to: None,
    };
    wsr_gateway::wsr::write_envelope(
        SoapVersion::Soap11,
        wsr_gateway::wsr::Headers {
            poll_request: Some(&poll),
            ..wsr_gateway::wsr::Headers::default()
        },
        "",
    )
}

/// A bearer token of principal `app` with the `produce` scope.
pub fn producer_token(token: &str) -> wsr_gateway::config::ApiToken {
    wsr_gateway::config::ApiToken {
        secret: wsr_gateway::secrets::Stored::Plain(wsr_gateway::secrets::Secret::new(token)),
        principal: "app".into(),
        scopes: vec![wsr_gateway::config::Scope::Produce],
        topics: wsr_gateway::config::all_topics(),
    }
}

/// `POST /api/v1/messages` with `token`: the status and the JSON answer.
pub async fn submit_as(
    app: &TestApp,
    token: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = app
        .client
        .post(app.url("/api/v1/messages"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("API answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// A certificate and its key, PEM, with the leaf's DER.
#[derive(Clone)]
pub struct TestCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl TestCert {
    /// The lowercase hex SHA-256 of the DER, as partners pin it.
    pub fn sha256(&self) -> String {
        wsr_gateway::secrets::sha256_hex(&self.der)
    }
}

/// A test CA with its files in a temporary directory: `ca.pem`, and the listener's
/// `cert.pem`/`key.pem` (written by `write_server`).
pub struct TestPki {
    pub dir: tempfile::TempDir,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestPki {
    pub fn new() -> TestPki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "wsr-gateway test CA");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("CA key");
        let ca = rcgen::CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let pki = TestPki {
            dir: tempfile::tempdir().expect("temp dir"),
            ca,
        };
        std::fs::write(pki.path("ca.pem"), pki.ca_pem()).expect("write ca.pem");
        pki
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    pub fn ca_der(&self) -> Vec<u8> {
        self.ca.der().to_vec()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn leaf(&self, common_name: &str, sans: Vec<String>, server: bool) -> TestCert {
        let mut params = rcgen::CertificateParams::new(sans).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        TestCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost, signed by the CA.
    pub fn server_cert(&self) -> TestCert {
        self.leaf(
            "wsr-gateway test server",
            vec!["127.0.0.1".into(), "localhost".into()],
            true,
        )
    }

    /// A client certificate signed by the CA.
    pub fn client_cert(&self, common_name: &str) -> TestCert {
        self.leaf(common_name, vec![format!("{common_name}.example")], false)
    }

    /// A self-signed client certificate (a partner pins it, or nobody knows it).
    pub fn self_signed_client(common_name: &str) -> TestCert {
        let mut params =
            rcgen::CertificateParams::new(vec![format!("{common_name}.example")]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-sign");
        TestCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// Writes `cert` as the listener's `cert.pem` and `key.pem` (replacing, as a renewal does).
    pub fn write_server(&self, cert: &TestCert) {
        for (name, text) in [("cert.pem", &cert.cert_pem), ("key.pem", &cert.key_pem)] {
            let temporary = self.path(&format!("{name}.new"));
            std::fs::write(&temporary, text).expect("write");
            std::fs::rename(&temporary, self.path(name)).expect("rename");
        }
    }

    /// `[tls]` on the files of this PKI; with `client_ca`, `ca.pem` is the client CA.
    pub fn tls_config(&self, client_ca: bool) -> wsr_gateway::config::TlsFileConfig {
        wsr_gateway::config::TlsFileConfig {
            cert_file: self.path("cert.pem"),
            key_file: self.path("key.pem"),
            client_ca_file: client_ca.then(|| self.path("ca.pem")),
            reload_check_seconds: 0,
        }
    }
}

/// Runs one statement with one text parameter on a gateway's database, behind its back (to
/// corrupt or lose rows): `(sqlite, postgres)` spell it for each backend.
pub async fn execute_with(
    database: &wsr_gateway::store::Database,
    (sqlite, postgres): (&'static str, &'static str),
    value: &str,
) {
    use sqlx::Connection as _;
    use wsr_gateway::store::Database;
    match database {
        Database::Sqlite(path) => {
            let mut db = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .expect("open the store");
            sqlx::query(sqlite)
                .bind(value)
                .execute(&mut db)
                .await
                .unwrap_or_else(|e| panic!("{sqlite}: {e}"));
        }
        Database::Postgres(url) => {
            let mut db = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query(postgres)
                .bind(value)
                .execute(&mut db)
                .await
                .unwrap_or_else(|e| panic!("{postgres}: {e}"));
        }
    }
}

/// Runs the operator CLI against `app` with `token`; (exit code, stdout, stderr). Async, so
/// that the gateway in this test's runtime can answer it.
pub async fn operator(app: &TestApp, token: &str, args: &[&str]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_wsr-gateway"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WSR_") {
            command.env_remove(&name);
        }
    }
    let out = command
        .args(args)
        .env("WSR_API", app.url(""))
        .env("WSR_TOKEN", token)
        .output()
        .await
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
