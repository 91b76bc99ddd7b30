//! The background sweeper: sleeps until the earliest group deadline (expiry, idle, a buffered
//! message expiring, purge) or until a commit announces an earlier one, then lets the store
//! apply what is due. No polling loop.

use std::sync::Arc;
use std::time::Duration;

use super::Store;
use crate::clock::Clock;

/// Longest sleep without a deadline, so that a clock jump is noticed eventually.
const IDLE_RECHECK: Duration = Duration::from_secs(60);

pub async fn run(store: Store, clock: Arc<dyn Clock>) {
    loop {
        match store.sweep(clock.now()).await {
            Ok(report) if report != Default::default() => {
                tracing::debug!(?report, "swept group deadlines");
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "sweep failed; retrying later"),
        }
        let wait = match store.next_deadline().await {
            Ok(Some(deadline)) => (deadline - clock.now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .min(IDLE_RECHECK),
            Ok(None) => IDLE_RECHECK,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the next deadline");
                IDLE_RECHECK
            }
        };
        if wait.is_zero() {
            // Due already (more than one sweep batch): go again, yielding first.
            tokio::task::yield_now().await;
            continue;
        }
        store.sweeper_sleeps_until(
            clock.now() + chrono::Duration::from_std(wait).unwrap_or_default(),
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = store.deadlines_changed().notified() => {}
        }
    }
}
