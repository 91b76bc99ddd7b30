//! The one table the tool prints, and the ratio lines under it.

use std::fmt::Write as _;

use crate::load::Figures;

/// What a phase came to.
#[derive(Debug, Clone)]
pub enum Outcome {
    Measured(Figures),
    /// The system under test could not be reached or started (a broker that is not running,
    /// a gateway binary that is not built).
    Unavailable(String),
    /// It was reached but the phase failed.
    Failed(String),
    /// Not selected (`--only`, `--skip-brokers`).
    Skipped,
}

impl Outcome {
    pub fn figures(&self) -> Option<&Figures> {
        match self {
            Outcome::Measured(f) => Some(f),
            _ => None,
        }
    }

    /// The phase's throughput when it measured something useful.
    fn rate(&self) -> Option<f64> {
        self.figures()
            .map(|f| f.msgs_per_s)
            .filter(|r| r.is_finite() && *r > 0.0)
    }
}

/// The table's rows, in print order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKey {
    Ceiling,
    BackendDirect,
    GatewayFull,
    GatewayRr,
    GatewayOs,
    GatewayOrdered,
    GatewayE2e,
    PostgresResponse,
    PostgresPair,
    JetStreamPublish,
    JetStreamE2e,
    RabbitQuorum,
    RabbitE2e,
}

impl RowKey {
    pub const ALL: [RowKey; 13] = [
        RowKey::Ceiling,
        RowKey::BackendDirect,
        RowKey::GatewayFull,
        RowKey::GatewayRr,
        RowKey::GatewayOs,
        RowKey::GatewayOrdered,
        RowKey::GatewayE2e,
        RowKey::PostgresResponse,
        RowKey::PostgresPair,
        RowKey::JetStreamPublish,
        RowKey::JetStreamE2e,
        RowKey::RabbitQuorum,
        RowKey::RabbitE2e,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RowKey::Ceiling => "HTTP ceiling (trivial hyper server)",
            RowKey::BackendDirect => "SOAP backend called directly",
            RowKey::GatewayFull => "wsr-gateway response (fsync before ack)",
            RowKey::GatewayRr => "wsr-gateway request-response (SOAP backend)",
            RowKey::GatewayOs => "wsr-gateway response durability=os",
            RowKey::GatewayOrdered => "wsr-gateway ordered",
            RowKey::GatewayE2e => "wsr-gateway e2e (ingest→fetch→accept)",
            RowKey::PostgresResponse => "wsr-gateway response (PostgreSQL)",
            RowKey::PostgresPair => "wsr-gateway response ×2 (PostgreSQL)",
            RowKey::JetStreamPublish => "JetStream publish (file, dedup)",
            RowKey::JetStreamE2e => "JetStream publish+consume e2e",
            RowKey::RabbitQuorum => "RabbitMQ quorum publish (confirms)",
            RowKey::RabbitE2e => "RabbitMQ quorum publish+consume e2e",
        }
    }

    /// Rows printed only when their phase was asked for (`--postgres`): a run without a
    /// PostgreSQL server shows nothing of them.
    fn on_request(self) -> bool {
        matches!(self, RowKey::PostgresResponse | RowKey::PostgresPair)
    }

    /// Whether the acknowledgement waits for the data to reach the disk.
    pub fn fsync(self) -> &'static str {
        match self {
            RowKey::Ceiling | RowKey::BackendDirect => "n/a (stores nothing)",
            RowKey::GatewayFull
            | RowKey::GatewayRr
            | RowKey::GatewayOrdered
            | RowKey::GatewayE2e => "yes (group commit)",
            RowKey::GatewayOs => "no (WAL, OS cache)",
            RowKey::PostgresResponse | RowKey::PostgresPair => "yes (WAL flush on commit)",
            RowKey::JetStreamPublish | RowKey::JetStreamE2e => "no (sync every 2 min)",
            RowKey::RabbitQuorum | RowKey::RabbitE2e => "yes (fdatasync)",
        }
    }
}

/// One large message POSTed to a fresh gateway.
#[derive(Debug, Clone)]
pub enum Large {
    Measured {
        payload: u64,
        /// VmRSS before the POST, VmHWM after it (KiB).
        before_kib: u64,
        peak_kib: u64,
        seconds: f64,
    },
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct Row {
    pub key: RowKey,
    pub outcome: Outcome,
}

/// Everything the report needs.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Peak RSS (VmHWM, KiB) of the `durability = "full"` gateway, which ran response,
    /// ordered and e2e, and of the `durability = "os"` one.
    pub rss_full_kib: Option<u64>,
    pub rss_os_kib: Option<u64>,
    /// VmHWM of the `durability = "full"` gateway right after the `response` phase.
    pub rss_response_kib: Option<u64>,
    /// The large-message measurement, when it ran.
    pub large: Option<Large>,
    /// Free-form notes printed under the table.
    pub notes: Vec<String>,
    /// The run's parameters, for the heading.
    pub heading: String,
}

impl Report {
    pub fn set(&mut self, key: RowKey, outcome: Outcome) {
        if let Some(row) = self.rows.iter_mut().find(|r| r.key == key) {
            row.outcome = outcome;
        } else {
            self.rows.push(Row { key, outcome });
        }
    }

    pub fn outcome_of(&self, key: RowKey) -> &Outcome {
        self.outcome(key)
    }

    fn outcome(&self, key: RowKey) -> &Outcome {
        self.rows
            .iter()
            .find(|r| r.key == key)
            .map_or(&Outcome::Skipped, |r| &r.outcome)
    }

    pub fn render(&self) -> String {
        let header = [
            "system",
            "msgs/s",
            "p50 ms",
            "p99 ms",
            "server CPU µs/msg",
            "fsyncs before ack",
        ];
        let mut lines: Vec<[String; 6]> = Vec::new();
        let mut footnotes: Vec<String> = Vec::new();
        // Rows that failed for the same reason share one note.
        let mut reasons: Vec<(String, Vec<&str>)> = Vec::new();
        // A row without figures: its state where the rate goes, dashes in the other numbers.
        let unmeasured = |state: &str| (state.to_owned(), "-".into(), "-".into(), "-".into());
        for key in RowKey::ALL {
            let outcome = self.outcome(key);
            if key.on_request() && matches!(outcome, Outcome::Skipped) {
                continue;
            }
            let mut label = key.label().to_owned();
            let (rate, p50, p99, cpu) = match outcome {
                Outcome::Measured(f) => {
                    let errors = f.error_count();
                    if errors > 0 {
                        footnotes.push(format!(
                            "{}: {} errors{}",
                            key.label(),
                            errors,
                            f.top_error()
                                .map(|(k, n)| format!(", most frequent ({n}×): {k}"))
                                .unwrap_or_default()
                        ));
                        label.push_str(" [errors]");
                    }
                    (
                        format!("{:.0}", f.msgs_per_s),
                        ms(f.p50_ms),
                        ms(f.p99_ms),
                        f.server_cpu_us
                            .map_or_else(|| "-".into(), |us| format!("{us:.1}")),
                    )
                }
                Outcome::Unavailable(why) => {
                    add_reason(&mut reasons, format!("unavailable: {why}"), key.label());
                    unmeasured("unavailable")
                }
                Outcome::Failed(why) => {
                    add_reason(&mut reasons, format!("failed: {why}"), key.label());
                    unmeasured("failed")
                }
                Outcome::Skipped => unmeasured("skipped"),
            };
            lines.push([label, rate, p50, p99, cpu, key.fsync().to_owned()]);
        }
        footnotes.extend(
            reasons
                .into_iter()
                .map(|(why, labels)| format!("{}: {why}", labels.join("; "))),
        );

        let mut widths = header.map(|h| h.chars().count());
        for line in &lines {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        if !self.heading.is_empty() {
            let _ = writeln!(out, "{}\n", self.heading);
        }
        // msgs/s, p50, p99 and CPU are numbers: right-aligned.
        let numeric = |column: usize| (1..=4).contains(&column);
        let row = |out: &mut String, cells: [&str; 6]| {
            let mut s = String::from("|");
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                if numeric(i) {
                    let _ = write!(s, " {cell:>w$} |");
                } else {
                    let _ = write!(s, " {cell:<w$} |");
                }
            }
            let _ = writeln!(out, "{s}");
        };
        row(&mut out, header);
        let rule: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(i, w)| {
                if numeric(i) {
                    format!("{}:", "-".repeat(w + 1))
                } else {
                    "-".repeat(w + 2)
                }
            })
            .collect();
        let _ = writeln!(out, "|{}|", rule.join("|"));
        for line in &lines {
            row(
                &mut out,
                [&line[0], &line[1], &line[2], &line[3], &line[4], &line[5]],
            );
        }

        out.push('\n');
        let rate = |k: RowKey| self.outcome(k).rate();
        // A row's figure when it measured something useful.
        let figure = |k: RowKey, pick: fn(&Figures) -> Option<f64>| {
            self.outcome(k)
                .figures()
                .and_then(pick)
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let p99 = |k: RowKey| figure(k, |f| Some(f.p99_ms));
        let cpu = |k: RowKey| figure(k, |f| f.server_cpu_us);
        let throughput = |num: RowKey, den: RowKey| (rate(num), rate(den));
        let cpu_per_message = |num: RowKey, den: RowKey| (cpu(num), cpu(den));
        let ratio = |(a, b): (Option<f64>, Option<f64>)| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "n/a".to_owned(),
        };
        let mut ratios = vec![
            (
                "response/RabbitMQ-quorum",
                throughput(RowKey::GatewayFull, RowKey::RabbitQuorum),
                "target >= 1.25",
            ),
            (
                "response p99/RabbitMQ p99",
                (p99(RowKey::GatewayFull), p99(RowKey::RabbitQuorum)),
                "target <= 1.00",
            ),
            (
                "response CPU/RabbitMQ CPU",
                cpu_per_message(RowKey::GatewayFull, RowKey::RabbitQuorum),
                "server CPU per message; target <= 1.00",
            ),
            (
                "response/HTTP-ceiling",
                throughput(RowKey::GatewayFull, RowKey::Ceiling),
                "target >= 0.30",
            ),
            (
                "request-response/response",
                throughput(RowKey::GatewayRr, RowKey::GatewayFull),
                "target >= 0.60",
            ),
            (
                "request-response/direct",
                throughput(RowKey::GatewayRr, RowKey::BackendDirect),
                "the gateway's overhead; no target",
            ),
            (
                "os/JetStream-publish",
                throughput(RowKey::GatewayOs, RowKey::JetStreamPublish),
                "target withdrawn: below the HTTP + SOAP + SQLite floor",
            ),
            (
                "os/response",
                throughput(RowKey::GatewayOs, RowKey::GatewayFull),
                "target >= 1.15",
            ),
            (
                "ordered/response",
                throughput(RowKey::GatewayOrdered, RowKey::GatewayFull),
                "target >= 0.90",
            ),
            (
                "e2e/RabbitMQ-e2e",
                throughput(RowKey::GatewayE2e, RowKey::RabbitE2e),
                "target >= 1.25",
            ),
            (
                "e2e CPU/RabbitMQ-e2e CPU",
                cpu_per_message(RowKey::GatewayE2e, RowKey::RabbitE2e),
                "server CPU per message; target <= 1.00",
            ),
            (
                "e2e/JetStream-e2e",
                throughput(RowKey::GatewayE2e, RowKey::JetStreamE2e),
                "target >= 0.35",
            ),
        ];
        let postgres_ran = [RowKey::PostgresResponse, RowKey::PostgresPair]
            .iter()
            .any(|k| !matches!(self.outcome(*k), Outcome::Skipped));
        if postgres_ran {
            ratios.extend([
                (
                    "postgres/RabbitMQ-quorum",
                    throughput(RowKey::PostgresResponse, RowKey::RabbitQuorum),
                    "target >= 1.00",
                ),
                // Two gateways on one database: how far the shared store lets them scale out
                // (on a machine with few cores the gateways also share the CPU).
                (
                    "postgres×2/postgres×1",
                    throughput(RowKey::PostgresPair, RowKey::PostgresResponse),
                    "scale-out; no target",
                ),
            ]);
        }
        for (name, pair, note) in ratios {
            let _ = writeln!(out, "{name:<26} {:>5}   ({note})", ratio(pair));
        }
        let mb = |kib: Option<u64>| {
            kib.map_or("n/a".to_owned(), |k| format!("{:.1} MB", k as f64 / 1024.0))
        };
        let _ = writeln!(
            out,
            "{:<24} {} (durability=full: response+ordered+e2e); {} (durability=os)",
            "gateway peak RSS",
            mb(self.rss_full_kib),
            mb(self.rss_os_kib)
        );
        let _ = writeln!(
            out,
            "{:<24} {} (VmHWM after the response phase; target < 150 MB)",
            "RSS under response load",
            mb(self.rss_response_kib)
        );
        match &self.large {
            None => {}
            Some(Large::Measured {
                payload,
                before_kib,
                peak_kib,
                seconds,
            }) => {
                let _ = writeln!(
                    out,
                    "{:<24} {:.0} MiB message accepted in {seconds:.1} s; gateway peak RSS (VmHWM) {} = {:.2}x payload (target < 1.5x); RSS before the POST {}",
                    "large message",
                    *payload as f64 / 1048576.0,
                    mb(Some(*peak_kib)),
                    (*peak_kib as f64 * 1024.0) / *payload as f64,
                    mb(Some(*before_kib)),
                );
            }
            Some(Large::Failed(why)) => {
                let _ = writeln!(out, "{:<24} failed: {why}", "large message");
            }
        }

        if !self.notes.is_empty() || !footnotes.is_empty() {
            out.push_str("\nNotes:\n");
            for note in self.notes.iter().chain(&footnotes) {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }
}

fn add_reason<'a>(reasons: &mut Vec<(String, Vec<&'a str>)>, why: String, label: &'a str) {
    match reasons.iter_mut().find(|(w, _)| *w == why) {
        Some((_, labels)) => labels.push(label),
        None => reasons.push((why, vec![label])),
    }
}

fn ms(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "-".into()
    }
}
