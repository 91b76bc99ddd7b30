//! The background sweeper: sleeps until the earliest group deadline (expiry, idle, a buffered
//! message expiring, purge) or until a commit announces an earlier one, then lets the store
//! apply what is due. No polling loop. On its way round (at least once a minute) it also
//! purges what has no deadline of its own: kept request-response answers and console
//! sign-outs past their keeping.

use std::sync::Arc;
use std::time::Duration;

use super::Store;
use crate::clock::Clock;

/// How long a console sign-out is kept past its sign-in's end: more than the clock skew
/// between gateways of a cluster can be.
const SIGN_OUT_SKEW: chrono::Duration = chrono::Duration::minutes(10);

/// Longest sleep without a deadline, so that a clock jump is noticed eventually.
const IDLE_RECHECK: Duration = Duration::from_secs(60);

/// Pause after a failed pass, so a persistent failure cannot spin the sweeper.
const AFTER_ERROR: Duration = Duration::from_secs(1);

/// How often request-response answers past their keeping (D16) and console sign-outs of
/// sign-ins that ended anyway are purged: they carry no deadline of their own, and a late
/// purge only keeps bytes a little longer.
const PURGE_ANSWERS_EVERY: Duration = Duration::from_secs(60);

/// `audit_kept`: how long the audit trail keeps an entry (`audit_retention_days`).
pub async fn run(store: Store, clock: Arc<dyn Clock>, audit_kept: chrono::Duration) {
    let mut answers_purged = tokio::time::Instant::now();
    loop {
        if answers_purged.elapsed() >= PURGE_ANSWERS_EVERY {
            answers_purged = tokio::time::Instant::now();
            match store.purge_exchanges(clock.now()).await {
                Ok(n) => tracing::debug!(purged = n, "purged request-response answers"),
                Err(e) => tracing::error!(error = %e, "cannot purge request-response answers"),
            }
            // Kept a while past their sign-in's end: a gateway of the cluster whose clock is
            // behind the sweeper's must still find them while it takes the cookie as valid.
            let sign_outs_until = clock.now() - SIGN_OUT_SKEW;
            let audit_before = clock.now() - audit_kept;
            match store
                .purge_console_sign_outs(sign_outs_until, audit_before)
                .await
            {
                Ok(n) => tracing::debug!(purged = n, "purged console sign-outs"),
                Err(e) => tracing::error!(error = %e, "cannot purge console sign-outs"),
            }
            match store
                .purge_traces(clock.now() - super::traces::TRACES_KEPT)
                .await
            {
                Ok(n) => tracing::debug!(purged = n, "purged trace contexts"),
                Err(e) => tracing::error!(error = %e, "cannot purge trace contexts"),
            }
            match store.purge_nonces(clock.now()).await {
                Ok(n) => tracing::debug!(purged = n, "purged used nonces"),
                Err(e) => tracing::error!(error = %e, "cannot purge used nonces"),
            }
        }
        // Until the wake-up time is set below, any new deadline counts as earlier: a commit
        // that lands while we look still wakes us.
        store.sweeper_sleeps_until(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        let next = match store.next_deadline().await {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the next deadline; retrying shortly");
                tokio::time::sleep(AFTER_ERROR).await;
                continue;
            }
        };
        let now = clock.now();
        if next.is_some_and(|d| d <= now) {
            // Due: the sweep goes through the writer, so only when there is work.
            match store.sweep(now).await {
                Ok(report) => tracing::debug!(?report, "swept group deadlines"),
                Err(e) => {
                    tracing::error!(error = %e, "sweep failed; retrying shortly");
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
            tokio::task::yield_now().await;
            continue;
        }
        let wait = next
            .map(|d| (d - now).to_std().unwrap_or(Duration::ZERO))
            .unwrap_or(IDLE_RECHECK)
            .min(IDLE_RECHECK);
        store.sweeper_sleeps_until(crate::wsr::datetime::saturating_add_std(now, wait));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = store.deadlines_changed().notified() => {}
        }
    }
}
