//! The SQLite backend of `DeliveryStore`. Every write is a `SqliteStore::change` on the
//! writer's connection: it reads the rows its decision needs inside the same transaction,
//! lets the pure rules of `delivery::` decide, and writes the result with primitive
//! statements; a refusal rolls back. Reads that decide nothing use the read pool, but for the
//! two that a consumer's every fetch and settle make — its session and its subscription —
//! which read on the writer's connection (`read_on_writer`).

mod fetch;
#[cfg(test)]
mod plans;
mod reads;
mod rows;
mod sessions;
mod settle;

use chrono::{DateTime, Duration, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::watch;

use crate::delivery::receipt::Receipt;
use crate::delivery::subscription::Spec;
use crate::delivery::wake::Deadlines;
use crate::store::delivery::{
    Backlog, DeadLetter, DeadLetterChange, DeliveryError, DeliveryStore, Handed, Maintenance,
    Session, Settlement, Subscription,
};
use crate::store::sqlite::{Change, SqliteStore, Wakes};
use crate::store::time::millis;
use crate::store::{StoreError, StoreFuture};

impl From<rusqlite::Error> for DeliveryError {
    fn from(e: rusqlite::Error) -> DeliveryError {
        DeliveryError::Store(e.into())
    }
}

impl SqliteStore {
    /// Runs a delivery change: `Ok((value, wakes))` commits (and, with `wakes`, tells the
    /// delivery waiters after the commit); a refusal rolls back and answers it.
    async fn delivery_change<T, F>(&self, change: F) -> Result<T, DeliveryError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<(T, bool), DeliveryError> + Send + 'static,
    {
        self.change(move |conn| match change(conn) {
            Ok((value, deliveries)) => Ok(Change::Keep(
                value,
                Wakes {
                    deliveries,
                    ..Wakes::NONE
                },
            )),
            Err(DeliveryError::Store(e)) => Err(e),
            Err(refusal) => Ok(Change::Refuse(refusal)),
        })
        .await?
    }

    /// A read that a consumer's every fetch and settle makes (its session, its subscription),
    /// run on the writer's connection as a change that writes nothing, and answered, like a
    /// `durable` read, once what it saw is durable. On the read pool, each such read found
    /// the connection's page cache emptied by the writer's commits since its last read and
    /// read its pages again from the files, after a hop to the connection's thread: about
    /// 100 µs of CPU per read under the e2e load (perf on that thread: `pread`, page-cache
    /// truncation, thread switches), against a few microseconds on the writer's hot cache.
    async fn read_on_writer<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.keep(move |conn| Ok((read(conn)?, Wakes::NONE))).await
    }
}

/// Creates the subscription `spec` names for `owner`, or finds it again.
fn create(
    conn: &Connection,
    spec: &Spec,
    owner: &str,
    now: DateTime<Utc>,
) -> Result<((Subscription, bool), bool), DeliveryError> {
    let name = spec.id.to_string();
    if let Some(existing) = rows::subscription_by_name(conn, &name)? {
        spec.again(owner, &existing.owner, &existing.filter, &existing.rules)
            .map_err(DeliveryError::Conflict)?;
        return Ok(((existing, false), false));
    }
    let newest: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(offset), 0) FROM inbox")?
        .query_row([], |r| r.get(0))?;
    let rules = serde_json::to_string(&spec.rules)
        .map_err(|e| StoreError::Failed(format!("cannot encode rules: {e}")))?;
    conn.prepare_cached(
        "INSERT INTO subscriptions (name, filter, owner, rules, cursor, created_at, idle_since) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        name,
        spec.id.filter().as_str(),
        owner,
        rules,
        spec.start.cursor(newest),
        millis(now),
        (!spec.rules.durable).then_some(millis(now)),
    ])?;
    let created = rows::subscription_by_name(conn, &name)?
        .ok_or_else(|| StoreError::Failed("the new subscription vanished".into()))?;
    // New work for the push supervisor, and (from the oldest) messages to hand out.
    Ok(((created, true), true))
}

impl DeliveryStore for SqliteStore {
    fn delivery_changes(&self) -> watch::Receiver<u64> {
        self.shared.deliveries_changed.subscribe()
    }

    fn inbox_appends(&self) -> watch::Receiver<u64> {
        self.shared.inbox_appended.subscribe()
    }

    fn receipt_secret(&self) -> StoreFuture<'_, Result<Vec<u8>, StoreError>> {
        Box::pin(async move {
            let mut fresh = [0u8; 32];
            aws_lc_rs::rand::fill(&mut fresh)
                .map_err(|_| StoreError::Failed("no randomness for the receipt key".into()))?;
            let secret = self
                .delivery_change(move |conn| {
                    conn.prepare_cached(
                        "INSERT INTO settings (key, value) VALUES ('receipt_key', ?1) \
                         ON CONFLICT DO NOTHING",
                    )?
                    .execute([&fresh[..]])?;
                    let secret: Option<Vec<u8>> = conn
                        .prepare_cached("SELECT value FROM settings WHERE key = 'receipt_key'")?
                        .query_row([], |r| r.get(0))
                        .optional()?;
                    let secret = secret
                        .ok_or_else(|| StoreError::Failed("the receipt key vanished".into()))?;
                    Ok((secret, false))
                })
                .await;
            secret.map_err(|e| match e {
                DeliveryError::Store(e) => e,
                other => StoreError::Failed(other.to_string()),
            })
        })
    }

    fn create_subscription<'a>(
        &'a self,
        spec: &'a Spec,
        owner: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(Subscription, bool), DeliveryError>> {
        let (spec, owner) = (spec.clone(), owner.to_owned());
        Box::pin(self.delivery_change(move |conn| create(conn, &spec, &owner, now)))
    }

    fn subscription(&self, id: i64) -> StoreFuture<'_, Result<Option<Subscription>, StoreError>> {
        Box::pin(self.read_on_writer(move |conn| rows::subscription_by_id(conn, id)))
    }

    fn subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>> {
        Box::pin(self.durable(reads::subscriptions(&self.pool)))
    }

    fn push_subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>> {
        Box::pin(self.durable(reads::push_subscriptions(&self.pool)))
    }

    fn set_push_paused(&self, id: i64, paused: bool) -> StoreFuture<'_, Result<(), DeliveryError>> {
        Box::pin(self.delivery_change(move |conn| {
            use rusqlite::OptionalExtension as _;
            let stored: Option<String> = conn
                .prepare_cached("SELECT rules FROM subscriptions WHERE id = ?1")
                .map_err(StoreError::from)?
                .query_row([id], |r| r.get(0))
                .optional()
                .map_err(StoreError::from)?;
            let rules = crate::store::delivery::rules_paused(id, stored, paused)?;
            conn.prepare_cached("UPDATE subscriptions SET rules = ?1 WHERE id = ?2")
                .map_err(StoreError::from)?
                .execute(rusqlite::params![rules, id])
                .map_err(StoreError::from)?;
            // The push supervisor starts or stops the subscription's worker.
            Ok(((), true))
        }))
    }

    fn delete_subscription(&self, id: i64) -> StoreFuture<'_, Result<bool, DeliveryError>> {
        Box::pin(self.delivery_change(move |conn| {
            let removed = rows::remove_subscription(conn, id)?;
            // The push supervisor stops the worker of a deleted push subscription.
            Ok((removed, removed))
        }))
    }

    fn grant<'a>(&'a self, id: i64, principal: &'a str) -> StoreFuture<'a, Result<(), StoreError>> {
        let principal = principal.to_owned();
        Box::pin(async move {
            self.delivery_change(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO grants (subscription_id, principal) VALUES (?1, ?2) \
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![id, principal])?;
                Ok(((), false))
            })
            .await
            .map_err(|e| match e {
                DeliveryError::Store(e) => e,
                other => StoreError::Failed(other.to_string()),
            })
        })
    }

    fn revoke<'a>(
        &'a self,
        id: i64,
        principal: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>> {
        let principal = principal.to_owned();
        Box::pin(self.delivery_change(move |conn| Ok(sessions::revoke(conn, id, &principal, now)?)))
    }

    fn join<'a>(
        &'a self,
        subscription_id: i64,
        session_id: &'a str,
        principal: &'a str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Session, DeliveryError>> {
        let (session_id, principal) = (session_id.to_owned(), principal.to_owned());
        Box::pin(self.delivery_change(move |conn| {
            let session = sessions::join(conn, subscription_id, &session_id, &principal, ttl, now)?;
            // A new member may take what others were kept from.
            Ok((session, true))
        }))
    }

    fn session<'a>(
        &'a self,
        id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Session>, StoreError>> {
        Box::pin(self.durable(reads::session(&self.pool, id, now)))
    }

    fn member<'a>(
        &'a self,
        id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<(Session, Subscription)>, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.read_on_writer(move |conn| {
            let Some(session) = sessions::live(conn, &id, now)? else {
                return Ok(None);
            };
            let subscription = rows::subscription_by_id(conn, session.subscription_id)?;
            Ok(subscription.map(|sub| (session, sub)))
        }))
    }

    fn heartbeat<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.delivery_change(move |conn| {
            Ok((sessions::renew(conn, &session_id, now)?.expires_at, false))
        }))
    }

    fn leave<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.delivery_change(move |conn| {
            let ended = sessions::end_session(conn, &session_id, now)?;
            Ok((ended, ended))
        }))
    }

    fn fetch<'a>(
        &'a self,
        session_id: &'a str,
        take: crate::delivery::fetch::Take,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Handed>, DeliveryError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.delivery_change(move |conn| fetch::fetch(conn, &session_id, take, now)))
    }

    fn settle_many<'a>(
        &'a self,
        settlements: &'a [Settlement],
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Result<(), DeliveryError>>, DeliveryError>> {
        let settlements = settlements.to_vec();
        Box::pin(
            self.delivery_change(move |conn| Ok(settle::settle_many(conn, &settlements, now)?)),
        )
    }

    fn extend<'a>(
        &'a self,
        receipt: &'a Receipt,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>> {
        let receipt = receipt.clone();
        Box::pin(
            self.delivery_change(move |conn| Ok((settle::extend(conn, &receipt, now)?, false))),
        )
    }

    fn dead_letters(
        &self,
        subscription_id: i64,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'_, Result<Vec<DeadLetter>, StoreError>> {
        Box::pin(self.durable(reads::dead_letters(
            &self.pool,
            subscription_id,
            after,
            limit,
        )))
    }

    fn change_dead_letters<'a>(
        &'a self,
        subscription_id: i64,
        offsets: Option<&'a [i64]>,
        change: DeadLetterChange,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, DeliveryError>> {
        let offsets = offsets.map(<[i64]>::to_vec);
        Box::pin(self.delivery_change(move |conn| {
            let changed = settle::change_dead_letters(
                conn,
                subscription_id,
                offsets.as_deref(),
                change,
                now,
            )?;
            // Replayed messages wait for members again.
            Ok((changed, change == DeadLetterChange::Replay && changed > 0))
        }))
    }

    fn maintain_deliveries(
        &self,
        now: DateTime<Utc>,
        grace: Duration,
        retention: Duration,
    ) -> StoreFuture<'_, Result<Maintenance, DeliveryError>> {
        Box::pin(self.delivery_change(move |conn| {
            let report = sessions::maintain(conn, now, grace, retention)?;
            let wakes =
                report.sessions_lapsed + report.leases_lapsed + report.subscriptions_removed > 0;
            Ok((report, wakes))
        }))
    }

    fn backlog(&self, subscription_id: i64) -> StoreFuture<'_, Result<Backlog, StoreError>> {
        Box::pin(self.durable(reads::backlog(&self.pool, subscription_id)))
    }

    fn session_count(&self, subscription_id: i64) -> StoreFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.durable(async move {
            let n: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE subscription_id = ?")
                    .bind(subscription_id)
                    .fetch_one(&self.pool)
                    .await?;
            Ok(u64::try_from(n).unwrap_or(0))
        }))
    }

    fn delivery_deadlines(
        &self,
        subscription_id: Option<i64>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Deadlines, StoreError>> {
        Box::pin(self.durable(reads::deadlines(&self.pool, subscription_id, now)))
    }
}
