//! The lifecycle operations of the PostgreSQL backend: policy, readiness, the barrier, and
//! the test hooks.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::rmp::group::Policy;
use crate::store::backend::Backend;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::{StoreStats, SubscriptionStats};

impl Backend for PostgresStore {
    fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    fn gateway_id(&self) -> &str {
        self.gateway()
    }

    fn panic_on_group(&self, group: Option<&str>) {
        *self
            .shared
            .panicking_group
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = group.map(str::to_owned);
    }

    fn cap_database_size<'a>(&'a self, _capped: bool) -> StoreFuture<'a, Result<(), StoreError>> {
        // A full disk is the database server's to report; no gateway can simulate it there.
        Box::pin(async move {
            Err(StoreError::Refused(
                "a database size cap is a SQLite test hook; PostgreSQL has none".into(),
            ))
        })
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

    fn fail_next_commits(&self, n: usize) {
        self.shared.failing_commits.store(n, Ordering::SeqCst);
    }

    fn flush<'a>(&'a self) -> StoreFuture<'a, Result<(), StoreError>> {
        // Every write commits before it answers: there is no queue to drain.
        Box::pin(async move { Ok(()) })
    }

    fn stats<'a>(&'a self) -> StoreFuture<'a, Result<StoreStats, StoreError>> {
        Box::pin(stats(&self.pool))
    }

    fn prefill_delivered<'a>(
        &'a self,
        channel: &'a str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.fill_delivered(channel, groups, per_group, payload_bytes, now))
    }
}

/// `Backend::stats`: one COUNT or GROUP BY per table, and per subscription three counts on
/// the `deliveries_waiting` index (subscription, state, offset).
async fn stats(pool: &sqlx::PgPool) -> Result<StoreStats, StoreError> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let (pending_callbacks, buffered_messages): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM pending_callbacks), (SELECT COUNT(*) FROM buffered)",
    )
    .fetch_one(pool)
    .await?;
    let by = |sql| async move {
        let rows: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(pool).await?;
        Ok::<_, StoreError>(rows.into_iter().map(|(k, n)| (k, count(n))).collect())
    };
    let groups = by("SELECT status, COUNT(*) FROM groups GROUP BY status ORDER BY status").await?;
    let outbound =
        by("SELECT state, COUNT(*) FROM out_messages GROUP BY state ORDER BY state").await?;
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT s.name, \
         (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'available'), \
         (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'acquired'), \
         (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'dead') \
         FROM subscriptions s ORDER BY s.name",
    )
    .fetch_all(pool)
    .await?;
    Ok(StoreStats {
        pending_callbacks: count(pending_callbacks),
        buffered_messages: count(buffered_messages),
        groups,
        outbound,
        subscriptions: rows
            .into_iter()
            .map(|(name, waiting, in_flight, dead)| SubscriptionStats {
                name,
                waiting: count(waiting),
                in_flight: count(in_flight),
                dead_letters: count(dead),
            })
            .collect(),
    })
}
