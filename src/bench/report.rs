//! What a bench run tells: the progress line while it runs, and the report after (text or
//! JSON, latency quantiles). It only formats figures; it never sends or measures anything.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Mode, Shared};

#[derive(Debug)]
pub struct BenchReport {
    pub mode: Mode,
    pub connections: usize,
    pub acked: u64,
    pub errors: BTreeMap<String, u64>,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
    /// e2e: what the consumers accepted within the run.
    pub consumed: Option<Consumed>,
    /// Stopped early (Ctrl-C): the figures cover the time it ran.
    pub interrupted: bool,
}

#[derive(Debug)]
pub struct Consumed {
    pub accepted: u64,
    pub errors: u64,
    /// Ingest (POST sent) → accept answered.
    pub p50: Duration,
    pub p99: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl BenchReport {
    fn rate(&self, n: u64) -> f64 {
        n as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The machine-readable form (`--json`); the comparison tool reads it.
    pub fn to_json(&self) -> Value {
        json!({
            "mode": self.mode,
            "connections": self.connections,
            "acked": self.acked,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "msgs_per_s": self.rate(self.acked),
            "p50_ms": ms(self.p50),
            "p99_ms": ms(self.p99),
            "p999_ms": ms(self.p999),
            "max_ms": ms(self.max),
            "errors": self.errors,
            "interrupted": self.interrupted,
            "e2e": self.consumed.as_ref().map(|c| json!({
                "accepted": c.accepted,
                "errors": c.errors,
                "msgs_per_s": self.rate(c.accepted),
                "p50_ms": ms(c.p50),
                "p99_ms": ms(c.p99),
            })),
        })
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errors: u64 = self.errors.values().sum();
        if self.interrupted {
            writeln!(f, "interrupted: partial results")?;
        }
        write!(
            f,
            "{:?}: acked {} messages in {:.1} s: {:.0} msgs/s; latency p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms; {} errors",
            self.mode,
            self.acked,
            self.elapsed.as_secs_f64(),
            self.rate(self.acked),
            ms(self.p50),
            ms(self.p99),
            ms(self.p999),
            ms(self.max),
            errors
        )?;
        for (kind, n) in &self.errors {
            write!(f, "\n  {kind}: {n}")?;
        }
        if let Some(c) = &self.consumed {
            write!(
                f,
                "\nend to end: accepted {} messages: {:.0} msgs/s; ingest→accept p50 {:.2} ms, p99 {:.2} ms; {} errors",
                c.accepted,
                self.rate(c.accepted),
                ms(c.p50),
                ms(c.p99),
                c.errors
            )?;
        }
        Ok(())
    }
}

/// The `q` quantile of `sorted` (zero when it is empty).
pub(super) fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Once a second until aborted: elapsed time, acks so far and the rate of the last second.
pub(super) async fn show_progress(shared: Arc<Shared>) {
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let acked = shared.acked.load(Ordering::Relaxed);
        eprint!(
            "\r{:>4.0} s of {}: {acked} acked, {} msgs/s   ",
            shared.started.elapsed().as_secs_f64(),
            shared.args.duration,
            acked.saturating_sub(last)
        );
        last = acked;
    }
}
