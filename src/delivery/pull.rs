//! Long-poll fetch: a fetch that finds nothing waits — until the inbox grows, something is
//! released, or its wait ends — and tries again. Each try renews the member's session.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Clock;
use crate::store::Store;
use crate::store::delivery::{DeliveryError, Handed};

/// Longest pause between tries while waiting: backoff delays and lapsed leases become
/// available without an announcement, and the session is renewed by every try.
const RECHECK: Duration = Duration::from_millis(500);

pub async fn fetch_waiting(
    store: &Store,
    clock: &Arc<dyn Clock>,
    session: &str,
    max: usize,
    wait: Duration,
) -> Result<Vec<Handed>, DeliveryError> {
    let until = Instant::now() + wait;
    let mut changes = store.delivery_changes();
    loop {
        // Mark what we have seen before looking, so a change while we look wakes us.
        changes.borrow_and_update();
        let handed = store.fetch(session, max, clock.now()).await?;
        let now = Instant::now();
        if !handed.is_empty() || now >= until {
            return Ok(handed);
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep_until(until.min(now + RECHECK)) => {}
        }
    }
}
