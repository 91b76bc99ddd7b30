//! The delivery housekeeper: lapses sessions and leases whose time passed, removes abandoned
//! ephemeral subscriptions and purges inbox messages nobody needs any more. Fetches lapse their
//! own subscription's overdue state themselves; this pass covers the subscriptions nobody is
//! fetching from (so a lapsed member's messages are free even before the next fetch). It sleeps
//! until the earliest of those deadlines (`wake::next_maintenance`), and looks at them again
//! when a commit may have brought an earlier one or the clock was moved.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::wait::Waker;
use crate::clock::Clock;
use crate::config::DeliverySettings;
use crate::delivery::wake;
use crate::store::Store;

/// Pause after a failed pass, so a persistent failure cannot spin the housekeeper.
const AFTER_ERROR: Duration = Duration::from_secs(1);

pub async fn run(store: Store, clock: Arc<dyn Clock>, settings: DeliverySettings) {
    let (grace, retention) = (settings.ephemeral_grace, settings.inbox_retention);
    let mut waker = Waker::new(&store, &clock);
    let mut last_purge = DateTime::<Utc>::MIN_UTC;
    // A pass that was due but changed nothing (a lease of a vanished subscription): wait for
    // the next commit or clock move instead of the same deadline again.
    let mut stuck = false;
    loop {
        waker.mark();
        let now = clock.now();
        let next = match store.delivery_deadlines(None, now).await {
            Ok(deadlines) => wake::next_maintenance(&deadlines, grace, retention, last_purge, now),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the delivery deadlines; retrying");
                tokio::time::sleep(AFTER_ERROR).await;
                continue;
            }
        };
        let due = next.is_some_and(|due| due <= now);
        if due && !stuck {
            match store.maintain_deliveries(now, grace, retention).await {
                Ok(report) => {
                    last_purge = now;
                    stuck = report == Default::default();
                    if !stuck {
                        tracing::debug!(?report, "delivery maintenance");
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "delivery maintenance failed; retrying");
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
            continue;
        }
        waker.wait(if due { None } else { next }).await;
        stuck = false;
    }
}
