//! The gateway under test: a child process per configuration, each on a fresh store, loaded by
//! the lean client (`lean.rs`) or, with `--client codec`, by the gateway's own full-codec load
//! generator (`wsr-gateway bench --json`), whose figures are parsed here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::load::{Figures, Params};

/// The consumer token written into each gateway's config, for `bench --mode e2e`.
pub const CONSUMER_TOKEN: &str = "compare-consumer-token-0001";

/// How long a started gateway may take to answer `/healthz`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Slack over the load duration for one `bench` run (start-up, e2e drain, JSON).
const BENCH_SLACK: Duration = Duration::from_secs(60);

/// Checks that the gateway binary exists, so that missing builds are reported as such.
pub fn check_binary(bin: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(bin).with_context(|| {
        format!(
            "gateway binary {} not found (build it first: cargo build --release)",
            bin.display()
        )
    })?;
    if !meta.is_file() {
        bail!("{} is not a file", bin.display());
    }
    Ok(())
}

/// Removes every `WSR_*` variable from a child's environment: they would override the config
/// file (`serve`) or the flags (`bench --token`).
fn scrub_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WSR_") {
            cmd.env_remove(&name);
        }
    }
}

/// Where a gateway keeps its state.
#[derive(Debug, Clone, Copy)]
pub enum Store<'a> {
    /// A fresh SQLite file in the gateway's temporary directory.
    Sqlite,
    /// A PostgreSQL database (`postgres://…`), made fresh by the caller (`postgres.rs`) and
    /// possibly shared by several gateways.
    Postgres(&'a str),
}

/// A running `wsr-gateway serve` with its own temporary directory (config, store, log).
pub struct Gateway {
    child: Child,
    pid: u32,
    port: u16,
    log: PathBuf,
    // Dropped last: the store goes when the process is gone.
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts a gateway with `durability` on a fresh SQLite store and waits until `/healthz`
    /// answers.
    pub async fn start(bin: &Path, durability: &str) -> anyhow::Result<Gateway> {
        Gateway::start_with(bin, durability, Store::Sqlite, "").await
    }

    /// As [`Gateway::start`], on `store`, with `extra` top-level settings (TOML lines) in the
    /// config.
    pub async fn start_with(
        bin: &Path,
        durability: &str,
        store: Store<'_>,
        extra: &str,
    ) -> anyhow::Result<Gateway> {
        let dir = tempfile::Builder::new()
            .prefix("wsr-compare-gw-")
            .tempdir()
            .context("creating a temporary directory for the gateway")?;
        let port = free_port()?;
        let config = dir.path().join("gateway.toml");
        let db = match store {
            Store::Sqlite => dir.path().join("gw.db").to_string_lossy().into_owned(),
            Store::Postgres(url) => url.to_owned(),
        };
        let log = dir.path().join("gateway.log");
        let text = format!(
            concat!(
                "listen = \"127.0.0.1:{port}\"\n",
                "database = {db}\n",
                "durability = \"{durability}\"\n",
                // The load comes from one address: no storage quota per source (D13).
                "max_stored_bytes_per_source = 0\n",
                "max_messages_per_second_per_source = 0\n",
                "{extra}",
                "\n",
                "[[tokens]]\n",
                "token = \"{token}\"\n",
                "principal = \"bench\"\n",
                "scopes = [\"consume\"]\n",
            ),
            port = port,
            db = toml_string(&db),
            durability = durability,
            extra = extra,
            token = CONSUMER_TOKEN,
        );
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let log_err = log_file
            .try_clone()
            .with_context(|| format!("opening {} twice", log.display()))?;

        let mut cmd = crate::pin::server_command(bin);
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .kill_on_drop(true);
        scrub_env(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} serve", bin.display()))?;
        let pid = child.id().context("the gateway exited at once")?;
        let mut gateway = Gateway {
            child,
            pid,
            port,
            log,
            _dir: dir,
        };
        gateway.wait_healthy().await?;
        Ok(gateway)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/wsr/default", self.port)
    }

    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .context("checking on the gateway process")?
            {
                bail!(
                    "the gateway exited during start-up ({status}); its log:\n{}",
                    log_tail(&self.log)
                );
            }
            if healthz(self.port).await {
                return Ok(());
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                bail!(
                    "the gateway did not answer GET /healthz within {STARTUP_TIMEOUT:?}; its log:\n{}",
                    log_tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines of the gateway's log, to show when a phase had errors (the log goes
    /// with the gateway's directory).
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Peak resident set size so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        self.status_kib("VmHWM:")
    }

    /// The gateway process, for its CPU time (`cpu.rs`).
    pub fn server(&self) -> crate::cpu::Server {
        crate::cpu::Server::pid(self.pid)
    }

    /// Resident set size now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        self.status_kib("VmRSS:")
    }

    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .with_context(|| format!("no {field} in {path}"))?;
        line.trim_start_matches(field)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("parsing {line:?}"))
    }

    /// Kills the process (its store is thrown away) and waits for it.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if self
            .child
            .try_wait()
            .context("checking on the gateway process")?
            .is_some()
        {
            bail!(
                "the gateway had exited before the end of its phases; its log:\n{}",
                log_tail(&self.log)
            );
        }
        self.child.start_kill().context("killing the gateway")?;
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .context("the gateway did not exit within 10 s of SIGKILL")?
            .context("waiting for the gateway")?;
        Ok(())
    }
}

/// `GET /healthz` answered 200.
async fn healthz(port: u16) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        std::io::Result::Ok(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Ok(true))
    )
}

/// A port that was free a moment ago: bind 127.0.0.1:0 and let go.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr().context("local address")?.port())
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => tail(&text, 20),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `wsr-gateway bench` load modes.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Response,
    Ordered,
    E2e,
}

impl Mode {
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Response => "response",
            Mode::Ordered => "ordered",
            Mode::E2e => "e2e",
        }
    }
}

/// Runs the gateway's load generator against `url` and parses its `--json` report. `mode`
/// `None` passes no `--mode` (used against the ceiling server).
pub async fn bench(
    bin: &Path,
    url: &str,
    mode: Option<Mode>,
    params: &Params,
) -> anyhow::Result<BenchReport> {
    let mut cmd = Command::new(bin);
    cmd.arg("bench")
        .args(["--url", url])
        .args(["-c", &params.connections.to_string()])
        .args(["-d", &params.duration.as_secs().to_string()])
        .args(["--body-bytes", &params.payload.to_string()])
        .arg("--json");
    if let Some(mode) = mode {
        cmd.args(["--mode", mode.arg()]);
    }
    if let Some(Mode::E2e) = mode {
        cmd.args(["--token", CONSUMER_TOKEN])
            .args(["--consumers", &params.consumers.to_string()])
            .args(["--batch", &params.batch.to_string()]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    scrub_env(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} bench", bin.display()))?;
    let bound = params.duration + BENCH_SLACK;
    let output = tokio::time::timeout(bound, child.wait_with_output())
        .await
        .with_context(|| format!("`wsr-gateway bench` did not finish within {bound:?}"))?
        .context("waiting for `wsr-gateway bench`")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!(
            "`wsr-gateway bench` failed ({}): {}",
            output.status,
            tail(stderr.trim(), 5)
        );
    }
    let report = parse_report(&stdout).with_context(|| {
        format!(
            "parsing the `--json` report of `wsr-gateway bench`; stdout: {:?}",
            tail(stdout.trim(), 3)
        )
    })?;
    // The report must describe the load that was asked for.
    if let (Some(asked), Some(got)) = (mode, report.mode.as_deref())
        && asked.arg() != got
    {
        bail!(
            "asked for --mode {} but the report is for mode {got:?}",
            asked.arg()
        );
    }
    if let Some(got) = report.connections
        && got != params.connections as u64
    {
        bail!(
            "asked for -c {} but the report is for {got} connections",
            params.connections
        );
    }
    Ok(report)
}

/// The `--json` report of `wsr-gateway bench`.
#[derive(Debug, Clone, Deserialize)]
pub struct BenchReport {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub connections: Option<u64>,
    pub acked: u64,
    pub elapsed_s: f64,
    pub msgs_per_s: f64,
    // Percentiles are null when nothing was acked.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    #[serde(default)]
    pub p999_ms: Option<f64>,
    #[serde(default)]
    pub max_ms: Option<f64>,
    #[serde(default)]
    pub errors: Errors,
    #[serde(default)]
    pub e2e: Option<E2eReport>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct E2eReport {
    pub accepted: u64,
    pub msgs_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    #[serde(default)]
    pub errors: Errors,
}

/// Errors by kind, or just a count.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Errors {
    ByKind(BTreeMap<String, u64>),
    Count(u64),
}

impl Default for Errors {
    fn default() -> Self {
        Errors::Count(0)
    }
}

impl Errors {
    fn into_map(self) -> BTreeMap<String, u64> {
        match self {
            Errors::ByKind(map) => map.into_iter().filter(|(_, n)| *n > 0).collect(),
            Errors::Count(0) => BTreeMap::new(),
            Errors::Count(n) => BTreeMap::from([("error".to_owned(), n)]),
        }
    }
}

/// The report is one JSON object on stdout; anything else printed there is tolerated as long
/// as the last non-empty line is that object.
pub fn parse_report(stdout: &str) -> anyhow::Result<BenchReport> {
    let trimmed = stdout.trim();
    if let Ok(report) = serde_json::from_str(trimmed) {
        return Ok(report);
    }
    let last = trimmed
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("empty output")?;
    serde_json::from_str(last.trim()).context("not the expected JSON object")
}

fn num(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

impl BenchReport {
    /// The ingest figures.
    pub fn figures(&self) -> Figures {
        Figures {
            count: self.acked,
            elapsed_s: self.elapsed_s,
            msgs_per_s: self.msgs_per_s,
            p50_ms: num(self.p50_ms),
            p99_ms: num(self.p99_ms),
            p999_ms: num(self.p999_ms),
            max_ms: num(self.max_ms),
            errors: self.errors.clone().into_map(),
            server_cpu_us: None,
        }
    }

    /// The end-to-end figures (`--mode e2e`).
    pub fn e2e_figures(&self) -> Option<Figures> {
        self.e2e.as_ref().map(|e| Figures {
            count: e.accepted,
            elapsed_s: self.elapsed_s,
            msgs_per_s: e.msgs_per_s,
            p50_ms: num(e.p50_ms),
            p99_ms: num(e.p99_ms),
            p999_ms: f64::NAN,
            max_ms: f64::NAN,
            errors: e.errors.clone().into_map(),
            server_cpu_us: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_response_report() {
        let r = parse_report(
            r#"{"mode":"response","connections":64,"acked":12345,"elapsed_s":10.0,"msgs_per_s":1234.5,"p50_ms":1.2,"p99_ms":3.4,"p999_ms":5.6,"max_ms":7.8,"errors":{"timeout":2},"e2e":null}"#,
        )
        .expect("parses");
        let f = r.figures();
        assert_eq!(f.count, 12345);
        assert_eq!(f.error_count(), 2);
        assert!(r.e2e_figures().is_none());
    }

    #[test]
    fn parses_the_e2e_report_after_other_output() {
        let r = parse_report(
            "warming up\n{\"mode\":\"e2e\",\"connections\":64,\"acked\":10,\"elapsed_s\":1.0,\"msgs_per_s\":10.0,\"p50_ms\":1.0,\"p99_ms\":2.0,\"p999_ms\":null,\"max_ms\":2.0,\"errors\":0,\"e2e\":{\"accepted\":9,\"errors\":1,\"msgs_per_s\":9.0,\"p50_ms\":3.0,\"p99_ms\":4.0}}\n",
        )
        .expect("parses");
        let e = r.e2e_figures().expect("e2e");
        assert_eq!(e.count, 9);
        assert_eq!(e.error_count(), 1);
        assert!(r.figures().p999_ms.is_nan());
    }

    #[test]
    fn escapes_toml_strings() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
