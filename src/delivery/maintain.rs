//! The delivery housekeeper: lapses sessions and leases whose time passed, removes abandoned
//! ephemeral subscriptions and purges inbox messages nobody needs any more. Fetches lapse their
//! own subscription's overdue state themselves; this pass covers the subscriptions nobody is
//! fetching from (so a lapsed member's messages are free even before the next fetch).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::DeliverySettings;
use crate::store::Store;

const PASS_EVERY: Duration = Duration::from_millis(500);

pub async fn run(store: Store, clock: Arc<dyn Clock>, settings: DeliverySettings) {
    let mut tick = tokio::time::interval(PASS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store
            .maintain_deliveries(
                clock.now(),
                settings.ephemeral_grace,
                settings.inbox_retention,
            )
            .await
        {
            Ok(report) if report != Default::default() => {
                tracing::debug!(?report, "delivery maintenance")
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "delivery maintenance failed; next pass retries"),
        }
    }
}
