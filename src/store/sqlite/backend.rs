//! The lifecycle operations of the SQLite backend: policy, readiness, the writer barrier.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{SqliteStore, Wakes};
use crate::rmp::group::Policy;
use crate::store::StoreStats;
use crate::store::backend::Backend;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::overview::{InboxFilter, InboxPage, Member, Rates, Traffic};

impl Backend for SqliteStore {
    fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    fn gateway_id(&self) -> &str {
        ""
    }

    fn readiness<'a>(&'a self) -> StoreFuture<'a, Result<(), String>> {
        Box::pin(async move {
            const PROBE_EVERY: Duration = Duration::from_secs(1);
            const PROBE_WAIT: Duration = Duration::from_secs(2);
            if self.jobs.is_closed() {
                return Err("the store writer has stopped".into());
            }
            let health = &self.shared.health;
            if health.committed_within(PROBE_EVERY) {
                return Ok(());
            }
            let mut last_probe = self.shared.probe.lock().await;
            if health.committed_within(PROBE_EVERY)
                || last_probe.is_some_and(|t| t.elapsed() < PROBE_EVERY)
            {
                return health.state();
            }
            *last_probe = Some(std::time::Instant::now());
            // A writer stuck reconnecting must not hang the probe: that is an answer too.
            let probe = tokio::time::timeout(
                PROBE_WAIT,
                self.keep(|conn| {
                    conn.prepare_cached(
                        "INSERT INTO settings (key, value) VALUES ('ready_probe', randomblob(8)) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    )?
                    .execute([])?;
                    Ok(((), Wakes::NONE))
                }),
            )
            .await;
            match probe {
                Ok(Ok(())) => health.state(),
                Ok(Err(e)) => Err(health.state().err().unwrap_or_else(|| e.to_string())),
                Err(_) => Err(format!(
                    "the store writer did not answer within {} s",
                    PROBE_WAIT.as_secs()
                )),
            }
        })
    }

    fn flush<'a>(&'a self) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.keep(|_| Ok(((), Wakes::NONE))).await })
    }

    fn stats<'a>(&'a self) -> StoreFuture<'a, Result<StoreStats, StoreError>> {
        Box::pin(self.durable(stats(&self.pool)))
    }

    fn traffic<'a>(&'a self, since: DateTime<Utc>) -> StoreFuture<'a, Result<Traffic, StoreError>> {
        Box::pin(self.durable(traffic(&self.pool, since)))
    }

    fn rates<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<Rates, StoreError>> {
        Box::pin(self.durable(rates(&self.pool, now)))
    }

    fn members<'a>(
        &'a self,
        subscription_id: i64,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<Member>, StoreError>> {
        Box::pin(self.durable(members(&self.pool, subscription_id, now, limit)))
    }

    fn search_inbox<'a>(
        &'a self,
        filter: &'a InboxFilter,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<InboxPage, StoreError>> {
        Box::pin(self.durable(search_inbox(&self.pool, filter, after, limit)))
    }
}

/// `Backend::stats`, as both backends read it.
async fn stats(pool: &sqlx::SqlitePool) -> Result<StoreStats, StoreError> {
    crate::store::stats::read_stats!(pool)
}

crate::store::overview::operator_reads!(
    sqlx::SqlitePool,
    concat!(
        "SELECT offset, channel, topic, group_id, number, X'', namespaces, received_at, \
         expiry, partner, ",
        crate::store::sqlite::payload_size!(),
        " "
    ),
    |r| Ok::<_, sqlx::Error>(crate::store::sqlite::inbox_from_row_without_payload(r))
);
