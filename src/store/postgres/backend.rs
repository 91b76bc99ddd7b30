//! The lifecycle operations of the PostgreSQL backend: policy, readiness, the barrier.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::rmp::group::Policy;
use crate::store::StoreStats;
use crate::store::backend::Backend;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::overview::{InboxFilter, InboxPage, Member, Rates, Traffic};

impl Backend for PostgresStore {
    fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    fn gateway_id(&self) -> &str {
        self.gateway()
    }

    fn readiness<'a>(&'a self) -> StoreFuture<'a, Result<(), String>> {
        Box::pin(async move {
            const PROBE_EVERY: Duration = Duration::from_secs(1);
            const PROBE_WAIT: Duration = Duration::from_secs(2);
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
            // A write, not a read: a server in recovery or read-only answers reads.
            let probe = tokio::time::timeout(PROBE_WAIT, async {
                sqlx::query(
                    "INSERT INTO settings (key, value) VALUES ('ready_probe', gen_random_uuid()::text::bytea) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )
                .execute(&self.pool)
                .await
            })
            .await;
            match probe {
                Ok(Ok(_)) => {
                    health.committed(false);
                    health.state()
                }
                Ok(Err(e)) => {
                    let why = format!("the database refuses writes: {e}");
                    health.failed(&why);
                    Err(why)
                }
                Err(_) => Err(format!(
                    "the database did not answer within {} s",
                    PROBE_WAIT.as_secs()
                )),
            }
        })
    }

    fn flush<'a>(&'a self) -> StoreFuture<'a, Result<(), StoreError>> {
        // Every write commits before it answers: there is no queue to drain.
        Box::pin(async move { Ok(()) })
    }

    fn stats<'a>(&'a self) -> StoreFuture<'a, Result<StoreStats, StoreError>> {
        Box::pin(stats(&self.pool))
    }

    fn traffic<'a>(&'a self, since: DateTime<Utc>) -> StoreFuture<'a, Result<Traffic, StoreError>> {
        Box::pin(traffic(&self.pool, since))
    }

    fn rates<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<Rates, StoreError>> {
        Box::pin(rates(&self.pool, now))
    }

    fn members<'a>(
        &'a self,
        subscription_id: i64,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<Member>, StoreError>> {
        Box::pin(members(&self.pool, subscription_id, now, limit))
    }

    fn search_inbox<'a>(
        &'a self,
        filter: &'a InboxFilter,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<InboxPage, StoreError>> {
        Box::pin(search_inbox(&self.pool, filter, after, limit))
    }
}

/// `Backend::stats`, as both backends read it.
async fn stats(pool: &sqlx::PgPool) -> Result<StoreStats, StoreError> {
    crate::store::stats::read_stats!(pool)
}

crate::store::overview::operator_reads!(
    sqlx::PgPool,
    "SELECT \"offset\", channel, topic, group_id, number, ''::bytea, namespaces, received_at, \
     expiry, partner, octet_length(payload)::bigint ",
    super::receiver::inbox_entry_without_payload
);
