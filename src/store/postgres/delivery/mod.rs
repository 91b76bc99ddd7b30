//! The PostgreSQL backend of `DeliveryStore` (DESIGN §7: several gateways on one database).
//! Every write is one transaction that first takes the lock of the subscription it decides
//! about (its row, `FOR UPDATE`: every writer of a subscription's delivery state holds it to
//! its commit, in whichever gateway), reads under that lock the rows the pure rules of
//! `delivery::` decide on, and writes the result with primitive statements; a refusal rolls
//! back. Nothing lives in a gateway's memory: a session, lease or receipt works against any
//! gateway of the database. When PostgreSQL breaks a deadlock between gateways, or another
//! gateway committed what an operation depended on, the whole operation runs again in a new
//! transaction. Reads that decide nothing use the pool.

mod fetch;
mod reads;
mod rows;
mod sessions;
mod settle;

use chrono::{DateTime, Duration, Utc};
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::sync::watch;

use crate::delivery::receipt::Receipt;
use crate::delivery::subscription::Spec;
use crate::delivery::wake::Deadlines;
use crate::store::delivery::{
    Backlog, DeadLetter, DeadLetterChange, DeliveryError, DeliveryStore, Handed, Maintenance,
    Session, Settlement, Subscription,
};
use crate::store::postgres::{Announcement, PostgresStore, retryable};
use crate::store::time::millis;
use crate::store::wakes::Wakes;
use crate::store::{StoreError, StoreFuture};

/// The advisory lock a subscription's creation holds shared and the inbox purge alone, so
/// that the purge never decides on cursors without the one a new subscription starts at
/// ("wsr-purg" in ASCII).
const PURGE_LOCK: i64 = 0x7773_722d_7075_7267;

/// How many times one operation runs before a deadlock or a race between gateways is answered
/// as a failure.
const TRIES: u32 = 5;

/// Why an operation's transaction did not commit.
enum Fail {
    /// A statement failed: run again when PostgreSQL aborted it to break a deadlock or a
    /// serialisation conflict between gateways.
    Sql(sqlx::Error),
    /// Another gateway committed, after it was read, what the decision depends on: run again.
    Raced(&'static str),
    /// A refusal, or a failure no second attempt mends: answered as it is.
    Answer(DeliveryError),
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Fail {
        Fail::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Fail {
        Fail::Answer(DeliveryError::Store(e))
    }
}

impl From<DeliveryError> for Fail {
    fn from(e: DeliveryError) -> Fail {
        Fail::Answer(e)
    }
}

impl Fail {
    fn worth_again(&self) -> bool {
        match self {
            Fail::Sql(e) => retryable(e),
            Fail::Raced(_) => true,
            Fail::Answer(_) => false,
        }
    }

    /// The answer, saying what was being done.
    fn answer(self, what: &str) -> DeliveryError {
        match self {
            Fail::Sql(e) => DeliveryError::Store(StoreError::Backend(format!("{what}: {e}"))),
            Fail::Raced(why) => DeliveryError::Store(StoreError::Failed(format!(
                "{what}: {why}, {TRIES} times in a row"
            ))),
            Fail::Answer(e) => e,
        }
    }

    /// The answer of an operation that refuses nothing.
    fn into_store(self, what: &str) -> StoreError {
        store_error(self.answer(what))
    }
}

fn store_error(e: DeliveryError) -> StoreError {
    match e {
        DeliveryError::Store(e) => e,
        other => StoreError::Failed(other.to_string()),
    }
}

/// What a commit tells the waiters, in this gateway and (by NOTIFY) in the others.
fn announcement(deliveries: bool) -> Announcement {
    if deliveries {
        Announcement::wakes(Wakes {
            deliveries: true,
            ..Wakes::NONE
        })
    } else {
        Announcement::default()
    }
}

/// Rolls back at once: the locks it holds (an aborted statement keeps them until then) are
/// what the other gateways, and the next attempt, wait for.
async fn abandon(tx: Transaction<'static, Postgres>, what: &str) {
    if let Err(e) = tx.rollback().await {
        tracing::warn!(error = %e, "{what}: rolling back failed; the connection is dropped");
    }
}

/// Runs `$body` (a future on the transaction's connection `$conn` answering
/// `Result<(value, deliveries changed), Fail>`) in a transaction of its own: commits it,
/// announcing a delivery change when there was one; or rolls it back and answers the refusal
/// or failure; or, after a deadlock or a race with another gateway, runs it again in a new
/// transaction.
macro_rules! transaction {
    ($store:expr, $what:literal, |$conn:ident| $body:expr) => {{
        let store: &PostgresStore = $store;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut tx = match store.begin().await {
                Ok(tx) => tx,
                Err(e) => break Err(DeliveryError::Store(e)),
            };
            let $conn: &mut PgConnection = &mut tx;
            let outcome: Result<(_, bool), Fail> = $body.await;
            match outcome {
                Ok((value, deliveries)) => {
                    break store
                        .commit(tx, announcement(deliveries))
                        .await
                        .map(|()| value)
                        .map_err(DeliveryError::Store);
                }
                Err(fail) if fail.worth_again() && tries < TRIES => {
                    abandon(tx, $what).await;
                    tracing::debug!(operation = $what, tries, "contended; running it again");
                }
                Err(fail) => {
                    abandon(tx, $what).await;
                    break Err(fail.answer($what));
                }
            }
        }
    }};
}

/// Creates the subscription `spec` names for `owner`, or finds it again (also when another
/// gateway creates it at the same moment).
async fn create(
    conn: &mut PgConnection,
    spec: &Spec,
    owner: &str,
    now: DateTime<Utc>,
) -> Result<((Subscription, bool), bool), Fail> {
    let name = spec.id.to_string();
    let found = |existing: Subscription| -> Result<((Subscription, bool), bool), Fail> {
        spec.again(owner, &existing.owner, &existing.filter, &existing.rules)
            .map_err(DeliveryError::Conflict)?;
        Ok(((existing, false), false))
    };
    if let Some(existing) = rows::subscription_by_name(conn, &name).await? {
        return found(existing);
    }
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(PURGE_LOCK)
        .execute(&mut *conn)
        .await?;
    let newest: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(\"offset\"), 0) FROM inbox")
        .fetch_one(&mut *conn)
        .await?;
    let rules = serde_json::to_string(&spec.rules)
        .map_err(|e| StoreError::Failed(format!("cannot encode rules: {e}")))?;
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO subscriptions (name, filter, owner, rules, cursor, created_at, idle_since) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING RETURNING id",
    )
    .bind(&name)
    .bind(spec.id.filter().as_str())
    .bind(owner)
    .bind(&rules)
    .bind(spec.start.cursor(newest))
    .bind(millis(now))
    .bind((!spec.rules.durable).then_some(millis(now)))
    .fetch_optional(&mut *conn)
    .await?;
    let Some(id) = inserted else {
        // Another gateway created it after our look: found as if it had been there.
        return match rows::subscription_by_name(conn, &name).await? {
            Some(existing) => found(existing),
            None => Err(Fail::Raced(
                "the subscription was created and deleted meanwhile",
            )),
        };
    };
    let created = rows::subscription_by_id(&mut *conn, id)
        .await?
        .ok_or_else(|| StoreError::Failed("the new subscription vanished".into()))?;
    // New work for the push supervisor, and (from the oldest) messages to hand out.
    Ok(((created, true), true))
}

impl DeliveryStore for PostgresStore {
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
            // The first gateway's key wins; the others read it.
            let secret = transaction!(self, "receipt_secret", |conn| async move {
                sqlx::query(
                    "INSERT INTO settings (key, value) VALUES ('receipt_key', $1) \
                     ON CONFLICT (key) DO NOTHING",
                )
                .bind(&fresh[..])
                .execute(&mut *conn)
                .await?;
                let secret: Option<Vec<u8>> =
                    sqlx::query_scalar("SELECT value FROM settings WHERE key = 'receipt_key'")
                        .fetch_optional(&mut *conn)
                        .await?;
                let secret =
                    secret.ok_or_else(|| StoreError::Failed("the receipt key vanished".into()))?;
                Ok((secret, false))
            });
            secret.map_err(store_error)
        })
    }

    fn create_subscription<'a>(
        &'a self,
        spec: &'a Spec,
        owner: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(Subscription, bool), DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "create_subscription", |conn| create(
                conn, spec, owner, now
            ))
        })
    }

    fn subscription(&self, id: i64) -> StoreFuture<'_, Result<Option<Subscription>, StoreError>> {
        Box::pin(reads::subscription(&self.pool, id))
    }

    fn subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>> {
        Box::pin(reads::subscriptions(&self.pool))
    }

    fn push_subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>> {
        Box::pin(reads::push_subscriptions(&self.pool))
    }

    fn set_push_paused(&self, id: i64, paused: bool) -> StoreFuture<'_, Result<(), DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "set_push_paused", |conn| async move {
                let stored: Option<String> =
                    sqlx::query_scalar("SELECT rules FROM subscriptions WHERE id = $1 FOR UPDATE")
                        .bind(id)
                        .fetch_optional(&mut *conn)
                        .await?;
                let rules = crate::store::delivery::rules_paused(id, stored, paused)?;
                sqlx::query("UPDATE subscriptions SET rules = $1 WHERE id = $2")
                    .bind(rules)
                    .bind(id)
                    .execute(&mut *conn)
                    .await?;
                // The push supervisor starts or stops the subscription's worker.
                Ok(((), true))
            })
        })
    }

    fn delete_subscription(&self, id: i64) -> StoreFuture<'_, Result<bool, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "delete_subscription", |conn| async move {
                if !rows::lock_subscription(conn, id).await? {
                    return Ok((false, false));
                }
                let removed = rows::remove_subscription(conn, id).await?;
                // The push supervisor stops the worker of a deleted push subscription.
                Ok((removed, removed))
            })
        })
    }

    fn grant<'a>(&'a self, id: i64, principal: &'a str) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            transaction!(self, "grant", |conn| async move {
                // Only while it exists: its grants go with it.
                if rows::lock_subscription(conn, id).await? {
                    sqlx::query(
                        "INSERT INTO grants (subscription_id, principal) VALUES ($1, $2) \
                         ON CONFLICT DO NOTHING",
                    )
                    .bind(id)
                    .bind(principal)
                    .execute(&mut *conn)
                    .await?;
                }
                Ok(((), false))
            })
            .map_err(store_error)
        })
    }

    fn revoke<'a>(
        &'a self,
        id: i64,
        principal: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "revoke", |conn| sessions::revoke(
                conn, id, principal, now
            ))
        })
    }

    fn join<'a>(
        &'a self,
        subscription_id: i64,
        session_id: &'a str,
        principal: &'a str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Session, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "join", |conn| async move {
                let session =
                    sessions::join(conn, subscription_id, session_id, principal, ttl, now).await?;
                // A new member may take what others were kept from.
                Ok((session, true))
            })
        })
    }

    fn session<'a>(
        &'a self,
        id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Session>, StoreError>> {
        Box::pin(reads::session(&self.pool, id, now))
    }

    fn heartbeat<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "heartbeat", |conn| async move {
                Ok((
                    sessions::renew(conn, session_id, now).await?.expires_at,
                    false,
                ))
            })
        })
    }

    fn leave<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "leave", |conn| async move {
                let ended = sessions::end_session(conn, session_id, now).await?;
                Ok((ended, ended))
            })
        })
    }

    fn fetch<'a>(
        &'a self,
        session_id: &'a str,
        take: crate::delivery::fetch::Take,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Handed>, DeliveryError>> {
        Box::pin(async move {
            let handed = transaction!(self, "fetch", |conn| fetch::fetch(
                conn, session_id, take, now
            ))?;
            // Settled as handed out (the `settled` mode): maybe consumed.
            if handed.iter().any(|h| h.deadline.is_none()) {
                self.shared.stored_bytes_freed();
            }
            Ok(handed)
        })
    }

    fn settle_many<'a>(
        &'a self,
        settlements: &'a [Settlement],
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Result<(), DeliveryError>>, DeliveryError>> {
        Box::pin(async move {
            let gateway = self.gateway();
            let settled = transaction!(self, "settle", |conn| settle::settle_many(
                conn,
                settlements,
                now,
                gateway
            ))?;
            self.shared.stored_bytes_freed();
            Ok(settled)
        })
    }

    fn extend<'a>(
        &'a self,
        receipt: &'a Receipt,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "extend", |conn| async move {
                Ok((settle::extend(conn, receipt, now).await?, false))
            })
        })
    }

    fn dead_letters(
        &self,
        subscription_id: i64,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'_, Result<Vec<DeadLetter>, StoreError>> {
        Box::pin(reads::dead_letters(
            &self.pool,
            subscription_id,
            after,
            limit,
        ))
    }

    fn change_dead_letters<'a>(
        &'a self,
        subscription_id: i64,
        offsets: Option<&'a [i64]>,
        change: DeadLetterChange,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, DeliveryError>> {
        Box::pin(async move {
            transaction!(self, "change_dead_letters", |conn| async move {
                let changed =
                    settle::change_dead_letters(conn, subscription_id, offsets, change, now)
                        .await?;
                // Replayed messages wait for members again.
                Ok((changed, change == DeadLetterChange::Replay && changed > 0))
            })
        })
    }

    fn maintain_deliveries(
        &self,
        now: DateTime<Utc>,
        grace: Duration,
        retention: Duration,
    ) -> StoreFuture<'_, Result<Maintenance, DeliveryError>> {
        Box::pin(async move {
            let report = transaction!(self, "maintain_deliveries", |conn| async move {
                let report = sessions::maintain(conn, now, grace, retention).await?;
                let wakes =
                    report.sessions_lapsed + report.leases_lapsed + report.subscriptions_removed
                        > 0;
                Ok((report, wakes))
            })?;
            if report.inbox_purged > 0 {
                self.shared.stored_bytes_freed();
            }
            Ok(report)
        })
    }

    fn backlog(&self, subscription_id: i64) -> StoreFuture<'_, Result<Backlog, StoreError>> {
        Box::pin(reads::backlog(&self.pool, subscription_id))
    }

    fn session_count(&self, subscription_id: i64) -> StoreFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let n: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE subscription_id = $1")
                    .bind(subscription_id)
                    .fetch_one(&self.pool)
                    .await?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn delivery_deadlines(
        &self,
        subscription_id: Option<i64>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Deadlines, StoreError>> {
        Box::pin(reads::deadlines(&self.pool, subscription_id, now))
    }
}
