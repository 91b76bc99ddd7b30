//! The closed-loop discipline shared by the in-process phases (JetStream, RabbitMQ): C workers,
//! each with exactly one operation outstanding, for D seconds. Only completed operations count;
//! failures are tallied by kind. The gateway phases use the gateway's own load generator, which
//! follows the same discipline and reports the same figures as JSON.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::task::JoinSet;

/// No single operation may hold a worker longer than this; it then counts as an error.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed operation, so a broken connection does not spin a worker.
const ERROR_BACKOFF: Duration = Duration::from_millis(20);

/// What one worker saw.
#[derive(Debug, Default)]
pub struct Recorder {
    latencies_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
}

impl Recorder {
    /// Runs one operation with the per-operation timeout and records its latency on success,
    /// its error kind otherwise.
    pub async fn time<T, F>(&mut self, op: F) -> Option<T>
    where
        F: Future<Output = anyhow::Result<T>>,
    {
        let started = Instant::now();
        match tokio::time::timeout(OP_TIMEOUT, op).await {
            Ok(Ok(value)) => {
                self.latency(started.elapsed());
                Some(value)
            }
            Ok(Err(e)) => {
                self.error(&e);
                tokio::time::sleep(ERROR_BACKOFF).await;
                None
            }
            Err(_) => {
                self.error_kind("timeout");
                None
            }
        }
    }

    /// Records one completed operation with a latency measured elsewhere.
    pub fn latency(&mut self, d: Duration) {
        self.latencies_us
            .push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
    }

    pub fn error(&mut self, e: &anyhow::Error) {
        // The outermost context names the operation; the root cause says what went wrong.
        let kind = format!("{e}: {}", e.root_cause());
        self.error_kind(&kind);
    }

    pub fn error_kind(&mut self, kind: &str) {
        let kind: String = kind.chars().take(100).collect();
        *self.errors.entry(kind).or_default() += 1;
    }

    pub fn merge(&mut self, other: Recorder) {
        self.latencies_us.extend(other.latencies_us);
        for (kind, n) in other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
    }

    /// The figures for everything recorded over `elapsed`.
    pub fn figures(mut self, elapsed: Duration) -> Figures {
        self.latencies_us.sort_unstable();
        let lat = &self.latencies_us;
        let pct = |q: f64| -> f64 {
            if lat.is_empty() {
                return f64::NAN;
            }
            // Nearest rank: the smallest value with at least q of the samples at or below it.
            let rank = ((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len());
            f64::from(lat[rank - 1]) / 1e3
        };
        let count = lat.len() as u64;
        Figures {
            count,
            elapsed_s: elapsed.as_secs_f64(),
            msgs_per_s: count as f64 / elapsed.as_secs_f64().max(1e-9),
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            p999_ms: pct(0.999),
            max_ms: lat.last().map_or(f64::NAN, |&us| f64::from(us) / 1e3),
            errors: self.errors,
            server_cpu_us: None,
        }
    }
}

/// The result of one measured phase.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Completed operations.
    pub count: u64,
    pub elapsed_s: f64,
    pub msgs_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub errors: BTreeMap<String, u64>,
    /// The server's CPU time per completed operation over the phase, in µs (`cpu.rs`);
    /// `None` where the server is this tool itself (the ceiling) or could not be read.
    pub server_cpu_us: Option<f64>,
}

impl Figures {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The most frequent error kind with its count, for the table's notes.
    pub fn top_error(&self) -> Option<(&str, u64)> {
        self.errors
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(k, n)| (k.as_str(), *n))
    }

    /// One line for the progress log.
    pub fn summary(&self) -> String {
        let ms = |v: f64| {
            if v.is_finite() {
                format!("{v:.2} ms")
            } else {
                "-".to_owned()
            }
        };
        let mut s = format!(
            "{} ops in {:.1} s: {:.0} msgs/s, p50 {}, p99 {}, p99.9 {}, max {}",
            self.count,
            self.elapsed_s,
            self.msgs_per_s,
            ms(self.p50_ms),
            ms(self.p99_ms),
            ms(self.p999_ms),
            ms(self.max_ms)
        );
        let errors = self.error_count();
        if errors > 0 {
            s.push_str(&format!("; {errors} errors"));
            if let Some((kind, n)) = self.top_error() {
                s.push_str(&format!(" (most: {n}× {kind})"));
            }
        }
        s
    }
}

/// Runs `workers` tasks built by `worker(i)`, each returning its own [`Recorder`], and merges
/// them. Each task is expected to stop by itself at its deadline; the tasks are awaited with a
/// bound of `deadline + OP_TIMEOUT + slack` so that a stuck one cannot hang the run.
pub async fn run_workers<F, Fut>(
    workers: usize,
    bound: Duration,
    mut worker: F,
) -> anyhow::Result<Recorder>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Recorder> + Send + 'static,
{
    let mut set = JoinSet::new();
    for i in 0..workers {
        set.spawn(worker(i));
    }
    let mut total = Recorder::default();
    let joined = tokio::time::timeout(bound, async {
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(rec) => total.merge(rec),
                Err(e) => total.error_kind(&format!("worker task failed: {e}")),
            }
        }
    })
    .await;
    if joined.is_err() {
        set.abort_all();
        anyhow::bail!("workers did not stop within {bound:?}");
    }
    Ok(total)
}

/// The bound for [`run_workers`] given the load duration.
pub fn worker_bound(duration: Duration) -> Duration {
    duration + OP_TIMEOUT + Duration::from_secs(5)
}

/// A 1 KiB-style payload: `len` bytes, the first 8 of which may be overwritten with a
/// timestamp.
pub fn payload(len: usize) -> Vec<u8> {
    (0..len.max(8)).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Writes `since` (nanoseconds since a phase's start) into the first 8 bytes.
pub fn stamp(buf: &mut [u8], since: Duration) {
    let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
    buf[..8].copy_from_slice(&nanos.to_le_bytes());
}

/// Reads a timestamp written by [`stamp`].
pub fn read_stamp(buf: &[u8]) -> anyhow::Result<Duration> {
    let bytes: [u8; 8] = buf
        .get(..8)
        .context("payload shorter than its timestamp")?
        .try_into()
        .context("payload timestamp")?;
    Ok(Duration::from_nanos(u64::from_le_bytes(bytes)))
}

/// The load shape shared by every phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// C: concurrent workers, one operation outstanding each.
    pub connections: usize,
    /// D: how long each phase loads.
    pub duration: Duration,
    /// Message payload in bytes.
    pub payload: usize,
    /// K: consumers in the end-to-end phases.
    pub consumers: usize,
    /// Messages per fetch in the end-to-end phases.
    pub batch: usize,
}
