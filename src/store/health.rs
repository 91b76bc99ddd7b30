//! Whether the store can commit (what `/readyz` answers), and the logging of store failures:
//! a burst of identical errors is one line with a count, not thousands of lines a second.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one kind of store failure is logged while it keeps happening.
pub const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// Most distinct failure texts remembered at once; more start the count afresh (the log can
/// only grow by a bounded number of lines per window either way).
const MAX_KINDS: usize = 64;

/// The writer's last word on committing, kept by the writer and read by readiness checks.
#[derive(Default)]
pub struct Health {
    state: Mutex<HealthState>,
}

#[derive(Default)]
struct HealthState {
    /// The latest failed commit: why, and when.
    failure: Option<(String, Instant)>,
    last_commit: Option<Instant>,
}

/// How long a failed commit keeps the store "not ready" unless a message commits since: a
/// small write (the readiness probe, a sweep) may fit where messages do not, as on a nearly
/// full disk, so only a delivered message — or this long without a failure — clears it.
pub const FAILURE_HOLDS_FOR: Duration = Duration::from_secs(10);

impl Health {
    /// A commit succeeded; `carried_messages` when it delivered or decided messages.
    pub fn committed(&self, carried_messages: bool) {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let held = state
            .failure
            .as_ref()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) < FAILURE_HOLDS_FOR);
        if carried_messages || !held {
            state.failure = None;
        }
        state.last_commit = Some(now);
    }

    pub fn failed(&self, why: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failure = Some((why.to_owned(), Instant::now()));
    }

    /// `Err(reason)` while a failed commit holds (see `FAILURE_HOLDS_FOR`).
    pub fn state(&self) -> Result<(), String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &state.failure {
            Some((why, _)) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// Whether a commit succeeded within `within` and no failure holds (then no probe is
    /// needed).
    pub fn committed_within(&self, within: Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failure.is_none() && state.last_commit.is_some_and(|t| t.elapsed() < within)
    }
}

/// Rate-limits log lines per distinct text.
#[derive(Default)]
pub struct Bursts {
    seen: Mutex<BTreeMap<String, Burst>>,
}

/// Every store failure of the process goes through one limiter, whoever sees it.
static STORE_FAILURES: Bursts = Bursts::new();

/// Logs a store failure seen by `context` (the writer, a handler, a worker) — once per burst
/// of identical ones, with how many were not logged since the previous line.
pub fn log_store_failure(context: &str, error: &dyn std::fmt::Display) {
    let text = error.to_string();
    if let Some(repeated) = STORE_FAILURES.admit(&text, Instant::now()) {
        tracing::error!(error = %text, context, repeated, "store failure");
    }
}

struct Burst {
    logged_at: Instant,
    suppressed: u64,
}

impl Bursts {
    pub const fn new() -> Bursts {
        Bursts {
            seen: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether a line for `text` should be written at `now`: `Some(n)` with the number of
    /// identical failures not logged since the previous line, `None` to stay quiet.
    pub fn admit(&self, text: &str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(burst) = seen.get_mut(text) {
            if now.saturating_duration_since(burst.logged_at) < REPEAT_EVERY {
                burst.suppressed = burst.suppressed.saturating_add(1);
                return None;
            }
            let suppressed = burst.suppressed;
            burst.logged_at = now;
            burst.suppressed = 0;
            return Some(suppressed);
        }
        if seen.len() >= MAX_KINDS {
            seen.clear();
        }
        seen.insert(
            text.to_owned(),
            Burst {
                logged_at: now,
                suppressed: 0,
            },
        );
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_identical_failures_is_one_line_then_one_line_per_window_with_a_count() {
        let bursts = Bursts::default();
        let t0 = Instant::now();
        assert_eq!(bursts.admit("disk full", t0), Some(0));
        let within = (1..10_000)
            .filter_map(|i| bursts.admit("disk full", t0 + Duration::from_micros(i)))
            .count();
        assert_eq!(within, 0, "nothing more within the window");
        assert_eq!(
            bursts.admit("corrupt", t0),
            Some(0),
            "another failure is told"
        );
        assert_eq!(bursts.admit("disk full", t0 + REPEAT_EVERY), Some(9_999));
        assert_eq!(bursts.admit("disk full", t0 + REPEAT_EVERY * 3), Some(0));
    }

    #[test]
    fn an_old_failure_is_cleared_by_any_commit() {
        let health = Health::default();
        {
            let mut state = health.state.lock().expect("lock");
            let long_ago = Instant::now()
                .checked_sub(FAILURE_HOLDS_FOR * 2)
                .expect("an earlier instant");
            state.failure = Some(("disk full".into(), long_ago));
        }
        health.committed(false);
        assert_eq!(health.state(), Ok(()));
    }

    #[test]
    fn many_distinct_texts_stay_bounded() {
        let bursts = Bursts::default();
        let t0 = Instant::now();
        for i in 0..10 * MAX_KINDS {
            bursts.admit(&format!("error {i}"), t0);
        }
        assert!(bursts.seen.lock().expect("lock").len() <= MAX_KINDS);
    }

    #[test]
    fn health_follows_the_last_commit_attempt() {
        let health = Health::default();
        assert_eq!(health.state(), Ok(()));
        assert!(!health.committed_within(Duration::from_secs(1)));
        health.failed("database or disk is full");
        assert_eq!(health.state(), Err("database or disk is full".into()));
        health.committed(false);
        assert_eq!(
            health.state(),
            Err("database or disk is full".into()),
            "a probe's small write does not clear a fresh failure"
        );
        health.committed(true);
        assert_eq!(health.state(), Ok(()), "a delivered message does");
        assert!(health.committed_within(Duration::from_secs(1)));
    }
}
