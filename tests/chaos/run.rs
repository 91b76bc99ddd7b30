//! The run: starts gateway A (sending), gateway B (receiving), a fault proxy each way between
//! them (A→B for messages and polls, B→A for callbacks) and consumer processes pulling from B
//! through one shared subscription with group ordering. The driver submits the planned
//! messages to A while random processes are SIGKILLed and restarted; a quiet period lets
//! retries drain; then the checker reads A's final states, B's inbox and the processing log.
//!
//! The gateways are each other's partners over mutual TLS (certificates made per run, see
//! `certs`): B knows A by Basic and by A's client certificate, A knows B by B's client
//! certificate; the proxies terminate TLS and present the sender's certificate upstream.
//!
//! With `--postgres` each side is two gateways on one PostgreSQL database of the run's own:
//! A1 and A2 on one, B1 and B2 on the other, each pair behind its proxy (round-robin, a
//! refused connection passed on to the other). The driver submits to A1 and A2 in turn,
//! consumers are spread over B1 and B2, kills hit all four, and at least once B1 and B2 are
//! down together.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sqlx::{Connection, Row};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::backend::{Backend, RR_NAMESPACE};
use crate::certs;
use crate::check::{self, Exchange, Facts, Fate, Handed, Planned, Processed, RrAnswer, Settled};
use crate::consumer::{harness_id, open_app_db};
use crate::proxy::FaultRates;

const PRODUCER_TOKEN: &str = "chaos-producer-token-0001";
const CONSUMER_TOKEN: &str = "chaos-consumer-token-0001";
/// The admin connection `--postgres` makes the run's databases through, if it names none.
const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The CI preset: 2 000 messages, 100 groups, 6 kills, about two minutes.
    #[arg(long)]
    short: bool,
    #[arg(long)]
    messages: Option<usize>,
    #[arg(long)]
    groups: Option<usize>,
    #[arg(long)]
    kills: Option<usize>,
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// How long submissions and kills are spread over.
    #[arg(long)]
    active_secs: Option<u64>,
    /// The longest wait, after the last kill, for every message to settle.
    #[arg(long)]
    quiet_secs: Option<u64>,
    /// Seeds the plan, the kills and the proxies; printed so a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Where the stores and logs go (default: a new directory under the temp dir, removed
    /// after a passing run).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The gateway binary (default: `wsr-gateway` beside this one).
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
    /// Run on PostgreSQL: two receiving gateways B1, B2 on one database and two sending
    /// gateways A1, A2 on another, each pair behind its proxy. URL: an admin connection
    /// (default postgres://postgres@127.0.0.1:5432/test) through which the run creates its
    /// two databases, and drops them after a passing run.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = DEFAULT_POSTGRES)]
    postgres: Option<String>,
    #[arg(long, default_value_t = 0.03)]
    drop_request: f64,
    #[arg(long, default_value_t = 0.03)]
    drop_response: f64,
    #[arg(long, default_value_t = 0.03)]
    duplicate: f64,
    #[arg(long, default_value_t = 0.10)]
    delay: f64,
    #[arg(long, default_value_t = 300)]
    max_delay_ms: u64,
    #[arg(long, default_value_t = 0.02)]
    error_5xx: f64,
    #[arg(long, default_value_t = 0.02)]
    reset: f64,
}

struct Settings {
    messages: usize,
    groups: usize,
    kills: usize,
    active: Duration,
    quiet: Duration,
    seed: u64,
}

impl RunArgs {
    fn settings(&self) -> Settings {
        let (messages, groups, kills, active, quiet) = if self.short {
            (2_000, 100, 6, 50, 90)
        } else {
            // The quiet period is only the longest wait: a run ends as soon as every message
            // has settled. 240 s was too short for two debug gateways per side on a slow
            // 2-core host, which needed 208 s and 291 s to drain ordered groups one message at
            // a time (issue 35's notes).
            (20_000, 120, 24, 480, 480)
        };
        Settings {
            messages: self.messages.unwrap_or(messages),
            groups: self.groups.unwrap_or(groups),
            kills: self.kills.unwrap_or(kills),
            active: Duration::from_secs(self.active_secs.unwrap_or(active)),
            quiet: Duration::from_secs(self.quiet_secs.unwrap_or(quiet)),
            seed: self.seed.unwrap_or_else(|| fastrand::u64(..)),
        }
    }

    fn rates(&self) -> FaultRates {
        FaultRates {
            drop_request: self.drop_request,
            drop_response: self.drop_response,
            duplicate: self.duplicate,
            delay: self.delay,
            max_delay_ms: self.max_delay_ms,
            error_5xx: self.error_5xx,
            reset: self.reset,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ordered,
    Unordered,
    /// Messages without a group: each a WS-R singleton.
    Singles,
}

/// Where a group's messages go on B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// The one-way channel: B's inbox, the consumers.
    Default,
    /// A request-response channel (D16) answered by the recording backend, under
    /// `on_unknown = "retry"` (`rr`) or `"fail"` (`rr-fail`).
    Rr { fail: bool },
}

impl Channel {
    /// A's partner for the channel: the same B, at the channel's address.
    fn partner(self) -> &'static str {
        match self {
            Channel::Default => "b",
            Channel::Rr { fail: false } => "b-rr",
            Channel::Rr { fail: true } => "b-rr-fail",
        }
    }
}

#[derive(Debug, Clone)]
struct GroupPlan {
    name: String,
    kind: Kind,
    channel: Channel,
    reply: &'static str,
    soap: &'static str,
    expiry_secs: u64,
    waits_ms: Vec<u64>,
    count: usize,
    /// Without DuplicateElimination B delivers every resend again (D2): the consumers'
    /// idempotent processing absorbs those copies.
    duplicate_elimination: bool,
}

/// The plan: every group's kind, reply pattern, SOAP version, expiry and retry schedule.
fn make_plan(rng: &mut fastrand::Rng, messages: usize, groups: usize) -> Vec<GroupPlan> {
    let mut counts = vec![1usize; groups];
    for _ in 0..messages.saturating_sub(groups) {
        counts[rng.usize(0..groups)] += 1;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, count)| {
            let kind = match i % 20 {
                0..=8 => Kind::Ordered,
                9..=16 => Kind::Unordered,
                _ => Kind::Singles,
            };
            // Some groups live only seconds: they expire under the faults and must fail
            // cleanly. A few get just two attempts ("retries exhausted"); they live seconds
            // too, since an unacknowledged message is settled only after its ExpiryTime.
            let few_attempts = rng.f64() < 0.08;
            let expiry_secs = if few_attempts || rng.f64() < 0.12 {
                rng.u64(2..=8)
            } else {
                3600
            };
            let waits_ms = if few_attempts {
                vec![300]
            } else {
                let mut w = vec![200, 400, 800];
                w.extend(std::iter::repeat_n(1500, 60));
                w
            };
            // Ordered groups need DuplicateElimination; some others go without it.
            let mut duplicate_elimination = kind == Kind::Ordered || rng.f64() >= 0.15;
            let mut reply = ["Response", "Callback", "Poll"][rng.usize(0..3)];
            // One group in five is request-response, of every kind: the business response is
            // the delivery, so each is sent with DuplicateElimination (without it every copy
            // would be a new call), and under the Response pattern (the ack rides on the
            // business response).
            let channel = match i % 10 {
                3 => Channel::Rr { fail: false },
                6 => Channel::Rr { fail: true },
                _ => Channel::Default,
            };
            if channel != Channel::Default {
                duplicate_elimination = true;
                reply = "Response";
            }
            GroupPlan {
                duplicate_elimination,
                name: format!("g{i:03}"),
                kind,
                channel,
                reply,
                soap: if rng.bool() { "1.1" } else { "1.2" },
                expiry_secs,
                waits_ms,
                count,
            }
        })
        .collect()
}

fn planned(groups: &[GroupPlan]) -> Vec<Planned> {
    let mut out = Vec::new();
    for g in groups {
        for seq in 0..g.count {
            out.push(Planned {
                hid: hid(g, seq),
                group: if g.kind == Kind::Singles {
                    hid(g, seq)
                } else {
                    g.name.clone()
                },
                seq: if g.kind == Kind::Singles { 0 } else { seq },
                ordered: g.kind == Kind::Ordered,
                copies_allowed: !g.duplicate_elimination,
                rr: match g.channel {
                    Channel::Default => None,
                    Channel::Rr { fail } => Some(check::RrPolicy { fail }),
                },
            });
        }
    }
    out
}

fn hid(g: &GroupPlan, seq: usize) -> String {
    format!("{}-{seq:05}", g.name)
}

/// A child process the run can kill and start again with the same command.
struct Proc {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    ready: &'static str,
    log: PathBuf,
    child: Option<Child>,
    /// When it was killed, each time.
    killed_at: Vec<Instant>,
    /// When it was started, each time.
    started_at: Vec<Instant>,
}

impl Proc {
    fn new(name: &str, program: &Path, args: Vec<String>, ready: &'static str, dir: &Path) -> Proc {
        Proc {
            name: name.to_owned(),
            program: program.to_owned(),
            args,
            ready,
            log: dir.join(format!("{name}.log")),
            child: None,
            killed_at: Vec::new(),
            started_at: Vec::new(),
        }
    }

    /// Starts it and waits until it says it is ready; its output goes on to its log file.
    async fn start(&mut self) -> Result<()> {
        let mut command = Command::new(&self.program);
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("WSR_")) {
            command.env_remove(key);
        }
        let mut child = command
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} ({})", self.name, self.program.display()))?;
        let stdout = child.stdout.take().context("stdout")?;
        let stderr = child.stderr.take().context("stderr")?;
        let mut log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .await?;
        log.write_all(format!("---- start {}\n", self.name).as_bytes())
            .await?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = self.ready;
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                log.write_all(line.as_bytes()).await?;
                log.write_all(b"\n").await?;
                if line.contains(ready) {
                    return Ok(true);
                }
            }
            Ok::<bool, std::io::Error>(false)
        })
        .await;
        match waited {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => bail!(
                "{} exited before it was ready; see {}",
                self.name,
                self.log.display()
            ),
            Ok(Err(e)) => return Err(e).context(format!("read {}'s output", self.name)),
            Err(_) => bail!("{} was not ready within 60 s", self.name),
        }
        tokio::spawn(drain(lines, log.try_clone().await?));
        tokio::spawn(drain(BufReader::new(stderr).lines(), log));
        self.child = Some(child);
        self.started_at.push(Instant::now());
        Ok(())
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.killed_at.push(Instant::now());
            // SIGKILL on Unix: no shutdown code runs.
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

async fn drain<R: tokio::io::AsyncBufRead + Unpin>(
    mut lines: tokio::io::Lines<R>,
    mut log: tokio::fs::File,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        if log.write_all(line.as_bytes()).await.is_err() || log.write_all(b"\n").await.is_err() {
            return;
        }
    }
}

/// A port for a process that is killed and restarted on it. Chosen below the kernel's
/// ephemeral range: while a gateway is down its port is free, and a port the kernel hands out
/// for other sockets (every outgoing connection takes one) could be taken meanwhile.
fn free_port() -> Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_low > 11_000 {
        for _ in 0..100 {
            let port = fastrand::u16(10_000..ephemeral_low);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The gateways' base URLs: one a side, or A1, A2 and B1, B2 with `--postgres`.
struct Topology {
    a_urls: Vec<String>,
    b_urls: Vec<String>,
}

/// The run's two PostgreSQL databases (`--postgres`), made through the admin connection:
/// A1 and A2 share one, B1 and B2 the other.
struct PgDatabases {
    admin: String,
    a: String,
    b: String,
}

impl PgDatabases {
    async fn create(admin: &str, seed: u64) -> Result<PgDatabases> {
        let base = format!("wsr_chaos_{seed}_{}", std::process::id());
        let dbs = PgDatabases {
            admin: admin.to_owned(),
            a: format!("{base}_a"),
            b: format!("{base}_b"),
        };
        // Checked before anything is created: the gateways' URLs are made from it.
        dbs.url(&dbs.a)?;
        let mut conn = dbs.connect().await?;
        for name in [&dbs.a, &dbs.b] {
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await
                .with_context(|| format!("create database {name}"))?;
        }
        let _ = conn.close().await;
        Ok(dbs)
    }

    async fn connect(&self) -> Result<sqlx::PgConnection> {
        sqlx::PgConnection::connect(&self.admin)
            .await
            .context("connect to PostgreSQL through the --postgres URL")
    }

    /// The admin URL with the database replaced by `name` (user, host and options kept).
    fn url(&self, name: &str) -> Result<String> {
        let mut url = reqwest::Url::parse(&self.admin).context("the --postgres URL")?;
        url.set_path(&format!("/{name}"));
        Ok(url.to_string())
    }

    /// Drops both, with any connection still open to them.
    async fn drop_both(&self) -> Result<()> {
        let mut conn = self.connect().await?;
        for name in [&self.a, &self.b] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await
            .with_context(|| format!("drop database {name}"))?;
        }
        let _ = conn.close().await;
        Ok(())
    }
}

/// B's Basic user name for A (B's `[partners.a]`, A's `our_username`).
const A_USERNAME: &str = "gateway-a";

/// A fresh password for A towards B, written to the file A's config names (not logged).
fn write_password(dir: &Path) -> Result<(PathBuf, String)> {
    // Not from the run's seed: the seed is printed.
    let mut rng = fastrand::Rng::new();
    let password: String = (0..32).map(|_| rng.alphanumeric()).collect();
    let path = dir.join("a-to-b.pass");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        // Readable by the run's user only, from the moment it exists.
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    std::io::Write::write_all(&mut file, password.as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    Ok((path, password))
}

/// The password's PHC hash for B's config, made by the gateway itself (`hash-secret`).
async fn hash_secret(gateway: &Path, secret: &str) -> Result<String> {
    let mut child = Command::new(gateway)
        .arg("hash-secret")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {} hash-secret", gateway.display()))?;
    let mut stdin = child.stdin.take().context("hash-secret's stdin")?;
    stdin.write_all(secret.as_bytes()).await?;
    stdin.write_all(b"\n").await?;
    drop(stdin);
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!(
            "{} hash-secret failed ({}): {}",
            gateway.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let hash = String::from_utf8(output.stdout)
        .context("hash-secret printed something that is not UTF-8")?
        .trim()
        .to_owned();
    if !hash.starts_with("$argon2") {
        bail!("hash-secret printed no PHC hash");
    }
    Ok(hash)
}

/// An HTTPS client that trusts only the run's CA (the harness's and consumers' API calls).
pub fn https_client(ca_pem: &[u8], timeout: Duration) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(ca_pem).context("the run's CA certificate")?;
    Ok(reqwest::Client::builder()
        .tls_certs_only([ca])
        .timeout(timeout)
        .build()?)
}

pub async fn run(args: RunArgs) -> Result<bool> {
    let settings = args.settings();
    let me = std::env::current_exe()?;
    let gateway = match &args.gateway_bin {
        Some(p) => p.clone(),
        None => me.with_file_name("wsr-gateway"),
    };
    let (dir, temporary) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "wsr-chaos-{}-{}",
                settings.seed,
                std::process::id()
            )),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    println!(
        "chaos: seed={} messages={} groups={} kills={} consumers={} active={}s quiet≤{}s dir={}",
        settings.seed,
        settings.messages,
        settings.groups,
        settings.kills,
        args.consumers,
        settings.active.as_secs(),
        settings.quiet.as_secs(),
        dir.display()
    );
    if settings.messages < settings.groups || settings.groups == 0 {
        bail!("need at least one message per group");
    }

    // On SQLite one gateway a side, each on its own file; on PostgreSQL two a side, the
    // side's two sharing the side's database (and the same config but for the port).
    let postgres = match &args.postgres {
        Some(admin) => {
            let dbs = PgDatabases::create(admin, settings.seed).await?;
            println!(
                "chaos: postgres: A1, A2 on database {}; B1, B2 on database {}",
                dbs.a, dbs.b
            );
            Some(dbs)
        }
        None => None,
    };
    let per_side = if postgres.is_some() { 2 } else { 1 };
    let names = |side: &str| -> Vec<String> {
        if per_side == 1 {
            vec![side.to_owned()]
        } else {
            (1..=per_side).map(|i| format!("{side}{i}")).collect()
        }
    };
    let (a_names, b_names) = (names("a"), names("b"));
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < 2 * per_side + 2 {
        let port = free_port()?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    let a_ports = ports[..per_side].to_vec();
    let b_ports = ports[per_side..2 * per_side].to_vec();
    let (to_b_port, to_a_port) = (ports[2 * per_side], ports[2 * per_side + 1]);
    let https = |port: &u16| format!("https://127.0.0.1:{port}");
    let top = Topology {
        a_urls: a_ports.iter().map(https).collect(),
        b_urls: b_ports.iter().map(https).collect(),
    };
    // The gateways talk only through the proxies, over mutual TLS: A → proxy-to-b → B for
    // messages and polls, B → proxy-to-a → A for callbacks. With two gateways a side each
    // proxy takes them in turn (and passes a refused connection on to the other).
    let to_b = format!("https://127.0.0.1:{to_b_port}");
    let to_a = format!("https://127.0.0.1:{to_a_port}");
    let certs = certs::make(&dir.join("certs"))?;
    let ca_pem = certs.ca_pem()?;
    let (password_file, password) = write_password(&dir)?;
    let password_hash = hash_secret(&gateway, &password).await?;
    drop(password);
    let path = |p: PathBuf| p.display().to_string();
    let (a_database, b_database) = match &postgres {
        Some(dbs) => (dbs.url(&dbs.a)?, dbs.url(&dbs.b)?),
        None => (path(dir.join("a.db")), path(dir.join("b.db"))),
    };
    let tls = |name: &str| {
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n\n",
            path(certs.cert(name)),
            path(certs.key(name)),
            path(certs.ca()),
        )
    };
    for (name, port) in a_names.iter().zip(&a_ports) {
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "listen = \"127.0.0.1:{port}\"\ndatabase = {a_database:?}\n\
                 # The ReplyTo of A's Callback-pattern messages: B calls back through proxy-to-a.\n\
                 public_url = {to_a:?}\n\
                 poll_interval_ms = 500\n\
                 # B is a wsr-gateway: it keeps delivered IDs an hour past expiry.\n\
                 partner_id_retention_seconds = 3600\n\n{}\
                 [[tokens]]\ntoken = {PRODUCER_TOKEN:?}\n\
                 principal = \"chaos-app\"\nscopes = [\"produce\"]\n\n\
                 [partners.b]\n\
                 # B's callbacks arrive through proxy-to-a, which presents B's client certificate.\n\
                 cert_names = [\"gateway-b.example\"]\n\
                 # Messages and polls go to proxy-to-b, which presents A's client certificate; A\n\
                 # adds Basic credentials, which the proxy passes on unchanged.\n\
                 address = \"{to_b}/wsr/default\"\nca_file = {:?}\n\
                 client_cert_file = {:?}\nclient_key_file = {:?}\n\
                 our_username = {A_USERNAME:?}\nour_password_file = {:?}\n\n\
                 # B's request-response channels: the same B, at other addresses. Their\n\
                 # messages use the Response pattern, so B never calls back for them.\n{}",
                tls("a"),
                path(certs.ca()),
                path(certs.cert("a-client")),
                path(certs.key("a-client")),
                path(password_file.clone()),
                ["rr", "rr-fail"]
                    .iter()
                    .map(|channel| format!(
                        "[partners.b-{channel}]\naddress = \"{to_b}/wsr/{channel}\"\n\
                         ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\n\
                         our_username = {A_USERNAME:?}\nour_password_file = {:?}\n\n",
                        path(certs.ca()),
                        path(certs.cert("a-client")),
                        path(certs.key("a-client")),
                        path(password_file.clone()),
                    ))
                    .collect::<String>(),
            ),
        )?;
    }
    // The run's clock: the backend's calls and the kills are both timed on it.
    let epoch = Instant::now();
    let rr_backend = Backend::start(epoch, Duration::from_millis(250), settings.seed ^ 3).await?;
    let backend = rr_backend.url.clone();
    for (name, port) in b_names.iter().zip(&b_ports) {
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "listen = \"127.0.0.1:{port}\"\ndatabase = {b_database:?}\n\
                 callback_retry_initial_ms = 200\ncallback_retry_max_ms = 2000\n\n{}\
                 # Not anonymous: only partner a may post here.\n\
                 [[channels]]\nname = \"default\"\n\n\
                 # Request-response (D16): the recording SOAP backend answers; a kill between\n\
                 # its call and the commit is called again (rr) or failed for good (rr-fail).\n\
                 [[channels]]\nname = \"rr\"\noperation = \"request-response\"\n\
                 on_unknown = \"retry\"\n\
                 [channels.backend]\nurl = \"{backend}/rr\"\ntimeout_ms = 10000\n\
                 max_concurrency = 8\n\n\
                 [[channels]]\nname = \"rr-fail\"\noperation = \"request-response\"\n\
                 on_unknown = \"fail\"\n\
                 [channels.backend]\nurl = \"{backend}/rr-fail\"\ntimeout_ms = 10000\n\
                 max_concurrency = 8\n\n\
                 [[tokens]]\ntoken = {CONSUMER_TOKEN:?}\nprincipal = \"chaos-consumer\"\n\
                 scopes = [\"consume\"]\n\n\
                 [partners.a]\nchannels = [\"default\", \"rr\", \"rr-fail\"]\n\
                 # A proves itself twice: Basic, and its client certificate (via proxy-to-b).\n\
                 username = {A_USERNAME:?}\npassword_hash = {password_hash:?}\n\
                 cert_names = [\"gateway-a.example\"]\n\
                 callback_endpoints = [\"{to_a}/wsr/_callback\"]\n\
                 # Callbacks towards A: proxy-to-a's certificate is checked against the CA, and\n\
                 # B presents its own client certificate.\n\
                 ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\n",
                tls("b"),
                path(certs.ca()),
                path(certs.cert("b-client")),
                path(certs.key("b-client")),
            ),
        )?;
    }

    let rates = serde_json::to_string(&args.rates())?;
    // Each proxy terminates TLS (its own certificate; a client certificate required) and
    // presents the sender's client certificate upstream, so that the receiving gateway
    // still authenticates the real partner.
    let proxy_args = |name: &str, listen: u16, upstreams: &[u16], sender: &str, seed: u64| {
        let upstreams: Vec<String> = upstreams
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        vec![
            "proxy".to_owned(),
            "--listen".into(),
            format!("127.0.0.1:{listen}"),
            "--upstream".into(),
            upstreams.join(","),
            "--seed".into(),
            seed.to_string(),
            "--rates".into(),
            rates.clone(),
            "--tls-cert".into(),
            path(certs.cert(name)),
            "--tls-key".into(),
            path(certs.key(name)),
            "--tls-client-ca".into(),
            path(certs.ca()),
            "--upstream-ca".into(),
            path(certs.ca()),
            "--upstream-client-cert".into(),
            path(certs.cert(sender)),
            "--upstream-client-key".into(),
            path(certs.key(sender)),
        ]
    };
    // proxy-to-b writes down B's answers to the request-response messages (every copy's).
    let answer_log = dir.join("rr-answers.jsonl");
    let mut to_b_args = proxy_args(
        "proxy-to-b",
        to_b_port,
        &b_ports,
        "a-client",
        settings.seed ^ 1,
    );
    to_b_args.extend([
        "--record-answers".to_owned(),
        path(answer_log.clone()),
        "--record-marker".to_owned(),
        RR_NAMESPACE.to_owned(),
    ]);
    let mut proxies = vec![
        Proc::new("proxy-to-b", &me, to_b_args, "listening", &dir),
        Proc::new(
            "proxy-to-a",
            &me,
            proxy_args(
                "proxy-to-a",
                to_a_port,
                &a_ports,
                "b-client",
                settings.seed ^ 2,
            ),
            "listening",
            &dir,
        ),
    ];
    for p in &mut proxies {
        p.start().await?;
    }
    let serve = |name: &String| {
        let args = vec![
            "serve".to_owned(),
            "--config".into(),
            dir.join(format!("{name}.toml")).display().to_string(),
        ];
        Proc::new(name, &gateway, args, "listening", &dir)
    };
    let mut a_gateways: Vec<Proc> = a_names.iter().map(serve).collect();
    let mut b_gateways: Vec<Proc> = b_names.iter().map(serve).collect();
    for g in a_gateways.iter_mut().chain(b_gateways.iter_mut()) {
        g.start().await?;
    }

    let http = https_client(&ca_pem, Duration::from_secs(20))?;
    // Once, through the first B: the subscription lives in B's database.
    let subscription = create_subscription(&http, &top.b_urls[0]).await?;
    let app_db = dir.join("app.db");
    drop(open_app_db(&app_db).await?);
    // Consumer i talks to B(i mod the B count): sessions, leases and receipts live in B's
    // database, whichever B a consumer reaches.
    let mut consumers: Vec<Proc> = (0..args.consumers)
        .map(|i| {
            let args = vec![
                "consume".to_owned(),
                "--url".into(),
                top.b_urls[i % top.b_urls.len()].clone(),
                "--token".into(),
                CONSUMER_TOKEN.into(),
                "--subscription".into(),
                subscription.to_string(),
                "--app-db".into(),
                app_db.display().to_string(),
                "--name".into(),
                format!("c{i}"),
                "--ca".into(),
                path(certs.ca()),
            ];
            Proc::new(&format!("c{i}"), &me, args, "running", &dir)
        })
        .collect();
    for c in &mut consumers {
        c.start().await?;
    }

    let mut rng = fastrand::Rng::with_seed(settings.seed);
    let plan = make_plan(&mut rng, settings.messages, settings.groups);
    let refused: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let started = Instant::now();
    let mut drivers = tokio::task::JoinSet::new();
    for g in plan.clone() {
        let (http, a_urls, refused) = (http.clone(), top.a_urls.clone(), refused.clone());
        let spread = settings.active.mul_f64(0.7);
        let seed = rng.u64(..);
        drivers.spawn(async move { drive(&http, &a_urls, &g, spread, seed, &refused).await });
    }

    // Kills, spread over the active period, round-robin over A, B and a random consumer so
    // that every kind of process dies; with two gateways a side, over A1, B1, a consumer, A2,
    // B2, a consumer (the same share of each kind). With two B gateways they also die
    // together, and both stay down: at the kill nearest the middle, and once more later in a
    // run of 12 kills or more; each such time counts as two kills.
    let together_at: Vec<usize> = if b_gateways.len() > 1 && settings.kills >= 2 {
        let mut at = vec![settings.kills / 2];
        if settings.kills >= 12 {
            at.push(settings.kills * 3 / 4 + 1);
        }
        at
    } else {
        Vec::new()
    };
    let mut kills = 0;
    let mut single_kills = 0;
    let mut both_b_down = 0;
    let mut proxy_restarts = 0;
    let occasions = settings.kills - together_at.len() * (b_gateways.len() - 1);
    let per_kill = settings.active.div_f64(occasions.max(1) as f64);
    while kills < settings.kills {
        tokio::time::sleep(per_kill.mul_f64(0.5 + rng.f64())).await;
        if together_at.contains(&(kills + 1)) {
            for b in &mut b_gateways {
                b.kill().await;
            }
            let first = kills + 1;
            kills += b_gateways.len();
            both_b_down += 1;
            let names: Vec<&str> = b_gateways.iter().map(|b| b.name.as_str()).collect();
            println!(
                "chaos: t={:>4}s kill -9 {} together (#{first}-#{kills}): both B gateways down",
                started.elapsed().as_secs(),
                names.join(" and ")
            );
            // Down together for at least a second: A's sends, the consumers' fetches and
            // the proxy's next-upstream all find nobody.
            tokio::time::sleep(Duration::from_millis(rng.u64(1000..=3000))).await;
            for b in &mut b_gateways {
                b.start().await?;
            }
            continue;
        }
        let slot = single_kills % 6;
        single_kills += 1;
        let victim = match slot % 3 {
            0 => {
                let i = (slot / 3) % a_gateways.len();
                &mut a_gateways[i]
            }
            1 => {
                let i = (slot / 3) % b_gateways.len();
                &mut b_gateways[i]
            }
            _ => {
                let i = rng.usize(0..consumers.len().max(1));
                match consumers.get_mut(i) {
                    Some(c) => c,
                    None => &mut b_gateways[0],
                }
            }
        };
        victim.kill().await;
        kills += 1;
        println!(
            "chaos: t={:>4}s kill -9 {} (#{kills})",
            started.elapsed().as_secs(),
            victim.name
        );
        // Now and then a proxy dies too: its side then sees refused connections.
        let proxy = if rng.f64() < 0.25 {
            let p = &mut proxies[rng.usize(0..2)];
            p.kill().await;
            proxy_restarts += 1;
            println!(
                "chaos: t={:>4}s kill -9 {}",
                started.elapsed().as_secs(),
                p.name
            );
            Some(p)
        } else {
            None
        };
        // Down for up to 3 s: long enough for short-lived messages to expire meanwhile.
        tokio::time::sleep(Duration::from_millis(rng.u64(100..=3000))).await;
        victim.start().await?;
        if let Some(p) = proxy {
            p.start().await?;
        }
    }
    while let Some(done) = drivers.join_next().await {
        done.context("a driver task")??;
    }
    let together = if postgres.is_some() {
        format!(", both B down together {both_b_down} time(s)")
    } else {
        String::new()
    };
    println!(
        "chaos: t={:>4}s all submitted, {kills} kills (and {proxy_restarts} of proxies){together}; quiet period",
        started.elapsed().as_secs()
    );

    let quiet_until = Instant::now() + settings.quiet;
    while Instant::now() < quiet_until {
        if settled(&http, &top, subscription).await.unwrap_or(false) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("chaos: t={:>4}s collecting", started.elapsed().as_secs());

    let mut fates = a_fates(&http, &top.a_urls).await?;
    for (hid, reason) in refused
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .iter()
    {
        fates.insert(hid.clone(), Fate::Refused(reason.clone()));
    }
    for c in &mut consumers {
        c.kill().await;
    }
    for g in a_gateways.iter_mut().chain(b_gateways.iter_mut()) {
        g.kill().await;
    }
    for p in &mut proxies {
        p.kill().await;
    }
    let mut facts = Facts {
        planned: planned(&plan),
        fates,
        kills,
        ..Facts::default()
    };
    match &postgres {
        Some(dbs) => read_inbox_postgres(&dbs.url(&dbs.b)?, &mut facts).await?,
        None => read_inbox(&dir.join("b.db"), &mut facts).await?,
    }
    read_app_db(&app_db, &mut facts).await?;
    facts.rr_calls = rr_backend.calls();
    facts.rr_answers = read_answer_log(&answer_log)?;
    // The B gateways' kills and starts on the backend's clock.
    let b_times = |times: fn(&Proc) -> &[Instant]| -> Vec<Duration> {
        b_gateways
            .iter()
            .flat_map(times)
            .map(|at| at.saturating_duration_since(epoch))
            .collect()
    };
    facts.b_kills = b_times(|b| &b.killed_at);
    facts.b_starts = b_times(|b| &b.started_at);
    facts.exchanges = match &postgres {
        Some(dbs) => read_exchanges_postgres(&dbs.url(&dbs.b)?).await?,
        None => read_exchanges(&dir.join("b.db")).await?,
    };
    let summary = check::check(&facts);
    for p in &proxies {
        println!("chaos: {} {}", p.name, proxy_totals(&p.log));
    }
    println!("chaos: failures by kind: {}", check::failure_kinds(&facts));
    print!("{}", check::report(&summary));
    let mut line = summary.line();
    if postgres.is_some() {
        println!("chaos: both B gateways down together {both_b_down} time(s)");
        line.push_str(&format!(" both_b_down={both_b_down}"));
    }
    println!("{line}");
    let passed = summary.violations() == 0;
    if passed && temporary {
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(dbs) = &postgres
            && let Err(e) = dbs.drop_both().await
        {
            println!("chaos: could not drop the run's PostgreSQL databases: {e:#}");
        }
    } else {
        if !passed {
            println!("chaos: FAILED; stores and logs kept in {}", dir.display());
        }
        if let Some(dbs) = &postgres {
            println!(
                "chaos: PostgreSQL databases kept: {} (A1, A2) and {} (B1, B2)",
                dbs.a, dbs.b
            );
        }
    }
    Ok(passed)
}

async fn create_subscription(http: &reqwest::Client, b: &str) -> Result<i64> {
    let answer = http
        .post(format!("{b}/api/v1/subscriptions"))
        .bearer_auth(CONSUMER_TOKEN)
        .json(&json!({
            "name": "$share/chaos/default/#",
            "ordering": "group",
            "ack_wait_ms": 10_000,
            "max_deliveries": 1_000_000,
            "backoff_ms": [100, 500],
            "start": "oldest",
        }))
        .send()
        .await?;
    let status = answer.status();
    let body: Value = answer.json().await?;
    if !status.is_success() {
        bail!("creating the subscription: {status} {body}");
    }
    body["id"].as_i64().context("subscription id")
}

/// Submits one group's messages in order, spread over `spread`, each with its harness id as
/// the Idempotency-Key so that a submit lost to a kill is retried safely.
///
/// With several A gateways (on one database) the submits go to them in turn, and one that
/// cannot be reached or answers 5xx is retried at the next: the key is known to all of them,
/// so a retry through another A is as safe as through the same one.
async fn drive(
    http: &reqwest::Client,
    a_urls: &[String],
    g: &GroupPlan,
    spread: Duration,
    seed: u64,
    refused: &Mutex<HashMap<String, String>>,
) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    // Whose turn it is; the first from the seed, not drawn from `rng`, so that with one A
    // the draws are the same as ever.
    let mut turn = (seed % a_urls.len().max(1) as u64) as usize;
    let step = spread.div_f64(g.count as f64);
    let mut group_id: Option<String> = None;
    for seq in 0..g.count {
        tokio::time::sleep(step.mul_f64(rng.f64() * 2.0)).await;
        let id = hid(g, seq);
        let namespace = match g.channel {
            Channel::Default => "urn:chaos",
            Channel::Rr { .. } => RR_NAMESPACE,
        };
        let mut request = json!({
            // The partner by name: A sends to its address with its TLS and credentials.
            "destination": g.channel.partner(),
            "agreement": {
                "ack_requested": true,
                "duplicate_elimination": g.duplicate_elimination,
                "message_order": g.kind == Kind::Ordered,
                "reply_pattern": g.reply,
                "expiry_seconds": g.expiry_secs,
                "waits_ms": g.waits_ms,
            },
            "soap_version": g.soap,
            "body": format!("<c:Item xmlns:c=\"{namespace}\" id=\"{id}\">{}</c:Item>", "x".repeat(64)),
        });
        if g.kind != Kind::Singles {
            request["group"] = json!({ "id": group_id, "last": seq + 1 == g.count });
        }
        loop {
            let a = &a_urls[turn % a_urls.len()];
            let answer = http
                .post(format!("{a}/api/v1/messages"))
                .bearer_auth(PRODUCER_TOKEN)
                .header("Idempotency-Key", &id)
                .json(&request)
                .send()
                .await;
            let Ok(answer) = answer else {
                // A is down (being killed or restarting): the key makes the retry safe, at
                // the other A too.
                turn += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let status = answer.status();
            if status.as_u16() == 429 {
                // The drivers share one source address, and a gateway slowed by a restart
                // can hold the source's whole share of requests in flight: lawful, and a
                // well-behaved client waits as told and sends again (the key keeps it safe).
                let wait = answer
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(1)
                    .min(10);
                tokio::time::sleep(Duration::from_secs(wait)).await;
                continue;
            }
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            if status.as_u16() == 202 {
                group_id = body["group_id"].as_str().map(str::to_owned);
                turn += 1;
                break;
            }
            if status.as_u16() == 409 && g.kind == Kind::Ordered {
                // An earlier message of the ordered group failed: nothing after it can be
                // delivered, and A says so instead of taking it.
                let reason = body["reason"].as_str().unwrap_or("refused").to_owned();
                let mut refused = refused.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                for rest in seq..g.count {
                    refused.insert(hid(g, rest), reason.clone());
                }
                return Ok(());
            }
            if status.is_server_error() {
                turn += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            bail!("A ({a}) refused {id}: {status} {body}");
        }
    }
    Ok(())
}

/// GETs `path` (with its query) as JSON from the first of `bases` that answers: the
/// gateways of a side share their database, so any live one tells the same.
async fn get_json(
    http: &reqwest::Client,
    bases: &[String],
    path: &str,
    token: &str,
) -> Result<Value> {
    let mut last = None;
    for base in bases {
        let answer = async {
            http.get(format!("{base}{path}"))
                .bearer_auth(token)
                .send()
                .await?
                .json::<Value>()
                .await
        }
        .await;
        match answer {
            Ok(value) => return Ok(value),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e.into()),
        None => bail!("no gateway to ask"),
    }
}

/// Whether everything has come to rest: nothing queued or sent at A, nothing waiting or in
/// flight at B.
async fn settled(http: &reqwest::Client, top: &Topology, subscription: i64) -> Result<bool> {
    for state in ["queued", "sent"] {
        let path = format!("/api/v1/messages?state={state}&limit=1");
        let page = get_json(http, &top.a_urls, &path, PRODUCER_TOKEN).await?;
        if page["messages"].as_array().is_none_or(|m| !m.is_empty()) {
            return Ok(false);
        }
    }
    let path = format!("/api/v1/subscriptions/{subscription}");
    let sub = get_json(http, &top.b_urls, &path, CONSUMER_TOKEN).await?;
    let b = &sub["backlog"];
    Ok(["waiting", "in_flight", "unmatched"]
        .iter()
        .all(|k| b[k].as_u64() == Some(0)))
}

/// A's final states, by Idempotency-Key (the harness id).
async fn a_fates(http: &reqwest::Client, a_urls: &[String]) -> Result<HashMap<String, Fate>> {
    let mut fates = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = "/api/v1/messages?limit=1000".to_owned();
        if let Some(after) = &after {
            path.push_str(&format!("&after={after}"));
        }
        let page = get_json(http, a_urls, &path, PRODUCER_TOKEN).await?;
        let messages = page["messages"].as_array().cloned().unwrap_or_default();
        if messages.is_empty() {
            return Ok(fates);
        }
        for m in &messages {
            let Some(key) = m["idempotency_key"].as_str() else {
                continue;
            };
            let text = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            let fate = match m["state"].as_str() {
                Some("acked") => Fate::Acked,
                Some("failed") => Fate::Failed(text("reason")),
                Some("faulted") => Fate::Faulted(text("fault")),
                other => Fate::Pending(other.unwrap_or_default().to_owned()),
            };
            if fates.insert(key.to_owned(), fate).is_some() {
                bail!("A holds two messages for Idempotency-Key {key}");
            }
        }
        after = page["next_after"].as_str().map(str::to_owned);
        if after.is_none() {
            return Ok(fates);
        }
    }
}

async fn read_inbox(b_db: &Path, facts: &mut Facts) -> Result<()> {
    let pool = open_read_only(b_db).await?;
    let rows = sqlx::query("SELECT payload FROM inbox ORDER BY offset")
        .fetch_all(&pool)
        .await?;
    for row in rows {
        let payload: String = row.get(0);
        facts
            .inbox
            .push(harness_id(&payload).unwrap_or("?").to_owned());
    }
    Ok(())
}

/// B's inbox on PostgreSQL (`--postgres`): the payload is BYTEA there.
async fn read_inbox_postgres(b_url: &str, facts: &mut Facts) -> Result<()> {
    let mut conn = sqlx::PgConnection::connect(b_url)
        .await
        .context("connect to B's PostgreSQL database")?;
    let payloads: Vec<Vec<u8>> =
        sqlx::query_scalar(r#"SELECT payload FROM inbox ORDER BY "offset""#)
            .fetch_all(&mut conn)
            .await?;
    let _ = conn.close().await;
    for payload in payloads {
        // Not UTF-8: no harness id, so the checker counts it as never planned.
        let hid = String::from_utf8(payload)
            .ok()
            .and_then(|p| harness_id(&p).map(str::to_owned));
        facts.inbox.push(hid.unwrap_or_else(|| "?".to_owned()));
    }
    Ok(())
}

/// proxy-to-b's record of B's answers to request-response messages (`proxy::AnswerLog`).
fn read_answer_log(path: &Path) -> Result<Vec<RrAnswer>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let mut answers = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("a line of {}: {line}", path.display()))?;
        let hex = v["body"].as_str().unwrap_or_default();
        let body = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .context("an answer's hex body")?;
        answers.push(RrAnswer {
            hid: v["hid"].as_str().unwrap_or("?").to_owned(),
            status: v["status"].as_u64().unwrap_or(0) as u16,
            content_type: v["content_type"].as_str().unwrap_or_default().to_owned(),
            body,
        });
    }
    Ok(answers)
}

fn exchange_row(group_id: String, number: i64, state: String, body: Option<Vec<u8>>) -> Exchange {
    let hid = body.and_then(|b| {
        let text = String::from_utf8_lossy(&b).into_owned();
        let start = text.find("ItemResponse")?;
        harness_id(&text[start..]).map(str::to_owned)
    });
    Exchange {
        group_id,
        number,
        state,
        hid,
    }
}

async fn read_exchanges(b_db: &Path) -> Result<Vec<Exchange>> {
    let pool = open_read_only(b_db).await?;
    let rows: Vec<(String, i64, String, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT group_id, number, state, body FROM exchanges")
            .fetch_all(&pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(g, n, state, body)| exchange_row(g, n, state, body))
        .collect())
}

async fn read_exchanges_postgres(b_url: &str) -> Result<Vec<Exchange>> {
    let mut conn = sqlx::PgConnection::connect(b_url)
        .await
        .context("connect to B's PostgreSQL database")?;
    let rows: Vec<(String, i64, String, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT group_id, number, state, body FROM exchanges")
            .fetch_all(&mut conn)
            .await?;
    let _ = conn.close().await;
    Ok(rows
        .into_iter()
        .map(|(g, n, state, body)| exchange_row(g, n, state, body))
        .collect())
}

async fn read_app_db(app_db: &Path, facts: &mut Facts) -> Result<()> {
    let pool = open_read_only(app_db).await?;
    let processed: Vec<(i64, String)> = sqlx::query_as("SELECT serial, hid FROM processed")
        .fetch_all(&pool)
        .await?;
    facts.processed = processed
        .into_iter()
        .map(|(serial, hid)| Processed { serial, hid })
        .collect();
    let handed: Vec<(String, i64, i64, i64)> =
        sqlx::query_as("SELECT hid, offset, attempt, batch FROM deliveries")
            .fetch_all(&pool)
            .await?;
    facts.handed = handed
        .into_iter()
        .map(|(hid, offset, attempt, batch)| Handed {
            hid,
            offset,
            attempt,
            batch,
        })
        .collect();
    let settled: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT offset, attempt, status FROM settles")
            .fetch_all(&pool)
            .await?;
    facts.settled = settled
        .into_iter()
        .map(|(offset, attempt, status)| Settled {
            offset,
            attempt,
            status,
        })
        .collect();
    Ok(())
}

async fn open_read_only(path: &Path) -> Result<sqlx::SqlitePool> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true);
    sqlx::SqlitePool::connect_with(options)
        .await
        .with_context(|| format!("open {}", path.display()))
}

/// A proxy's fault counts over all its lives: the last stats line before each restart, summed.
fn proxy_totals(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut totals: Vec<(String, u64)> = Vec::new();
    for life in text.split("---- start") {
        let Some(line) = life.lines().rev().find(|l| l.starts_with("requests=")) else {
            continue;
        };
        for (i, kv) in line.split_whitespace().enumerate() {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match totals.get_mut(i) {
                Some((_, total)) => *total += v,
                None => totals.push((k.to_owned(), v)),
            }
        }
    }
    let parts: Vec<String> = totals.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(" ")
}
