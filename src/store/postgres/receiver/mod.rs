//! `ReceiverStore` for PostgreSQL. Decisions about one stored group are serialised across
//! gateways by a transaction-scoped advisory lock on (partner, group id), taken before the
//! group is read (or, by the writer, before its version is checked) and held to the commit; a
//! new group's, by its row's unique key; inbox offsets come from the `sequences` row, taken
//! last and also held to the commit, so that offsets become visible in commit order with no
//! gap. Received messages are decided and stored by the group-commit writer (`writer/`); the
//! sweep is `sweep.rs`, callback acks (claimed with a lease, so that one gateway POSTs each and
//! another takes over when it dies) `callbacks.rs`, polls and recorded faults `polls.rs`; the
//! group, inbox and endpoint reads are here. None of those files imports this one.

mod callbacks;
mod polls;
mod sweep;

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::sync::{Notify, oneshot};

use super::PostgresStore;
use super::failure::retrying;
use super::group_state::decode;
use crate::rmp::group::GroupState;
use crate::rmp::replies::ReplyItem;
use crate::store::received::{
    Endpoints, InboxEntry, InboxExcerpt, PendingCallback, Received, ReceivedMessage, SweepReport,
};
use crate::store::receiver::ReceiverStore;
use crate::store::time::{from_millis, millis};
use crate::store::{StoreError, StoreFuture};
use crate::wsr::{FaultCode, MessageKey, RefToMessageIds, Response};

/// The SELECT list `inbox_entry` reads; callers add `FROM inbox WHERE …`.
pub(in crate::store) const SELECT_INBOX: &str = "SELECT \"offset\", channel, topic, group_id, \
     number, payload, namespaces, received_at, expiry, partner ";

/// An inbox row read with `SELECT_INBOX`.
pub(in crate::store) fn inbox_entry(r: &PgRow) -> Result<InboxEntry, sqlx::Error> {
    Ok(InboxEntry {
        payload: crate::store::received::payload_text(r.try_get::<&[u8], _>(5)?),
        ..inbox_entry_without_payload(r)?
    })
}

/// A `SELECT_INBOX` row (or one with another column 5) without its payload.
pub(in crate::store) fn inbox_entry_without_payload(r: &PgRow) -> Result<InboxEntry, sqlx::Error> {
    Ok(InboxEntry {
        offset: r.try_get(0)?,
        partner: r.try_get(9)?,
        channel: r.try_get(1)?,
        topic: r.try_get(2)?,
        group_id: r.try_get(3)?,
        number: r.try_get::<Option<i64>, _>(4)?.map(|n| n as u64),
        payload: String::new(),
        namespaces: r.try_get(6)?,
        received_at: from_millis(r.try_get(7)?),
        expiry: from_millis(r.try_get(8)?),
    })
}

impl ReceiverStore for PostgresStore {
    fn receive<'a>(
        &'a self,
        message: ReceivedMessage,
    ) -> StoreFuture<'a, Result<Received, StoreError>> {
        Box::pin(async move {
            // A backend's answer first (D16), committed before the delivery is enqueued: the
            // delivery is never durable without it.
            if let Some(kept) = &message.answer {
                let key = message.request.key();
                let kept = crate::store::ExchangeStore::call_answered(
                    self,
                    &message.partner,
                    &key,
                    kept.attempt,
                    &kept.answer,
                )
                .await?;
                if !kept {
                    return Err(StoreError::Superseded);
                }
            }
            let received = self.shared.writer.enqueue(message).await;
            if let Err(e) = &received {
                // Refusals of this message alone say nothing about the database's health.
                let database_failed = match e {
                    StoreError::Backend(_) | StoreError::Failed(_) => true,
                    #[cfg(feature = "test-hooks")]
                    StoreError::Injected => true,
                    _ => false,
                };
                if database_failed {
                    self.shared.health.failed(&e.to_string());
                }
            }
            received
        })
    }

    fn sweep<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<SweepReport, StoreError>> {
        Box::pin(async move { retrying(|| sweep::sweep_once(self, now)).await })
    }

    fn abort_group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { retrying(|| sweep::abort_once(self, partner, group_id, now)).await })
    }

    fn watch_delivery(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()> {
        self.shared.watch(partner, key)
    }

    fn forget_watchers(&self, partner: &str, key: &MessageKey) {
        self.shared.forget(partner, key)
    }

    fn callbacks_due(&self) -> &Notify {
        &self.shared.callbacks_due
    }

    fn deadlines_changed(&self) -> &Notify {
        &self.shared.deadlines_changed
    }

    fn sweeper_sleeps_until(&self, wakeup: DateTime<Utc>) {
        self.shared
            .sweeper_wakeup
            .store(millis(wakeup), Ordering::SeqCst);
    }

    fn group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
    ) -> StoreFuture<'a, Result<Option<GroupState>, StoreError>> {
        Box::pin(async move {
            let bin: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT state_bin FROM groups WHERE partner = $1 AND group_id = $2",
            )
            .bind(partner)
            .bind(group_id)
            .fetch_optional(&self.pool)
            .await?;
            bin.map(|b| decode(&b)).transpose()
        })
    }

    fn groups<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<(String, GroupState)>, StoreError>> {
        Box::pin(async move {
            let (after_partner, after_group) = after.unwrap_or(("", ""));
            // COLLATE "C": pages in byte order, as SQLite's, whatever the database's locale.
            let rows = sqlx::query(
                "SELECT partner, state_bin FROM groups \
                 WHERE (partner COLLATE \"C\", group_id COLLATE \"C\") > ($1, $2) \
                 ORDER BY partner COLLATE \"C\", group_id COLLATE \"C\" LIMIT $3",
            )
            .bind(after_partner)
            .bind(after_group)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, decode(r.try_get::<&[u8], _>(1)?)?)))
                .collect()
        })
    }

    fn inbox<'a>(
        &'a self,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<InboxEntry>, StoreError>> {
        Box::pin(async move {
            let sql = format!(
                "{SELECT_INBOX} FROM inbox WHERE \"offset\" > $1 ORDER BY \"offset\" LIMIT $2"
            );
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
            Ok(rows.iter().map(inbox_entry).collect::<Result<_, _>>()?)
        })
    }

    fn inbox_excerpt<'a>(
        &'a self,
        offset: i64,
        head: usize,
    ) -> StoreFuture<'a, Result<Option<InboxExcerpt>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT \"offset\", channel, topic, group_id, number, \
                 substring(payload FROM 1 FOR $2), namespaces, received_at, expiry, partner, \
                 octet_length(payload) FROM inbox WHERE \"offset\" = $1",
            )
            .bind(offset)
            .bind(i32::try_from(head).unwrap_or(i32::MAX))
            .fetch_optional(&self.pool)
            .await?;
            let Some(r) = row else {
                return Ok(None);
            };
            let head_bytes = r.try_get::<Vec<u8>, _>(5)?;
            let size = r.try_get::<i32, _>(10)?.max(0) as u64;
            let entry = inbox_entry_without_payload(&r)?;
            Ok(Some(InboxExcerpt {
                entry,
                head: head_bytes,
                size,
            }))
        })
    }

    fn next_deadline<'a>(&'a self) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move {
            let ms: Option<i64> = sqlx::query_scalar(
                "SELECT MIN(next_deadline) FROM groups WHERE next_deadline IS NOT NULL",
            )
            .fetch_one(&self.pool)
            .await?;
            Ok(ms.map(from_millis))
        })
    }

    fn endpoints<'a>(
        &'a self,
        kind: Endpoints,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let sql = match kind {
                // Every partner's, each URL once.
                Endpoints::Callback => {
                    "SELECT DISTINCT url COLLATE \"C\" FROM callback_endpoints ORDER BY 1"
                }
                Endpoints::Push => "SELECT url FROM push_endpoints ORDER BY url COLLATE \"C\"",
            };
            Ok(sqlx::query_scalar(sql).fetch_all(&self.pool).await?)
        })
    }

    fn is_push_endpoint<'a>(&'a self, url: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM push_endpoints WHERE url = $1)")
                    .bind(url)
                    .fetch_one(&self.pool)
                    .await?,
            )
        })
    }

    fn may_push_to<'a>(
        &'a self,
        principal: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM push_endpoint_grants g \
                 JOIN push_endpoints e ON e.url = g.url \
                 WHERE g.url = $1 AND g.principal IN ($2, '*'))",
            )
            .bind(url)
            .bind(principal)
            .fetch_one(&self.pool)
            .await?)
        })
    }

    fn push_grants<'a>(&'a self) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(async move {
            Ok(sqlx::query_as(
                "SELECT principal, url FROM push_endpoint_grants \
                 ORDER BY url COLLATE \"C\", principal COLLATE \"C\"",
            )
            .fetch_all(&self.pool)
            .await?)
        })
    }

    fn is_callback_endpoint<'a>(
        &'a self,
        partner: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Ok(sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM callback_endpoints WHERE partner = $1 AND url = $2)",
            )
            .bind(partner)
            .bind(url)
            .fetch_one(&self.pool)
            .await?)
        })
    }

    fn add_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let added = match kind {
                Endpoints::Callback => {
                    sqlx::query(
                        "INSERT INTO callback_endpoints (partner, url, created_at) \
                         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    )
                    .bind(partner.unwrap_or(""))
                    .bind(url)
                    .bind(millis(now))
                    .execute(&self.pool)
                    .await?
                }
                Endpoints::Push => {
                    // One statement: the webhook and its grant together.
                    // The webhook's row is locked (the no-op update) while its grant is
                    // added: a removal of its last grant at the same moment cannot take the
                    // row away from under the new grant.
                    sqlx::query(
                        "WITH hook AS (INSERT INTO push_endpoints (url, created_at) \
                         VALUES ($1, $2) ON CONFLICT (url) DO UPDATE \
                         SET created_at = push_endpoints.created_at) \
                         INSERT INTO push_endpoint_grants (url, principal) VALUES ($1, $3) \
                         ON CONFLICT DO NOTHING",
                    )
                    .bind(url)
                    .bind(millis(now))
                    .bind(partner.unwrap_or("*"))
                    .execute(&self.pool)
                    .await?
                }
            }
            .rows_affected();
            Ok(added == 1)
        })
    }

    fn remove_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let removed = match (kind, partner) {
                (Endpoints::Callback, partner) => {
                    sqlx::query("DELETE FROM callback_endpoints WHERE partner = $1 AND url = $2")
                        .bind(partner.unwrap_or(""))
                        .bind(url)
                        .execute(&self.pool)
                        .await?
                        .rows_affected()
                }
                (Endpoints::Push, Some(principal)) => {
                    let mut tx = self.pool.begin().await?;
                    // Locked first, as an addition locks it: the last grant's removal and a
                    // new grant's addition do not interleave.
                    sqlx::query("SELECT 1 FROM push_endpoints WHERE url = $1 FOR UPDATE")
                        .bind(url)
                        .execute(&mut *tx)
                        .await?;
                    let removed = sqlx::query(
                        "DELETE FROM push_endpoint_grants WHERE url = $1 AND principal = $2",
                    )
                    .bind(url)
                    .bind(principal)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    sqlx::query(
                        "DELETE FROM push_endpoints WHERE url = $1 AND NOT EXISTS \
                         (SELECT 1 FROM push_endpoint_grants WHERE url = $1)",
                    )
                    .bind(url)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    removed
                }
                (Endpoints::Push, None) => {
                    // One statement: the webhook with all its grants.
                    sqlx::query(
                        "WITH grants AS (DELETE FROM push_endpoint_grants WHERE url = $1) \
                         DELETE FROM push_endpoints WHERE url = $1",
                    )
                    .bind(url)
                    .execute(&self.pool)
                    .await?
                    .rows_affected()
                }
            };
            Ok(removed == 1)
        })
    }

    fn callback_endpoints<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(async move {
            Ok(sqlx::query_as(
                "SELECT partner, url FROM callback_endpoints \
                 ORDER BY partner COLLATE \"C\", url COLLATE \"C\"",
            )
            .fetch_all(&self.pool)
            .await?)
        })
    }

    fn due_callbacks<'a>(
        &'a self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<PendingCallback>, StoreError>> {
        Box::pin(callbacks::due(self, now, limit))
    }

    fn owe_callbacks<'a>(
        &'a self,
        partner: &'a str,
        endpoint: &'a str,
        soap12: bool,
        replies: &'a [ReplyItem],
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(callbacks::owe(
            self, partner, endpoint, soap12, replies, expiry, now,
        ))
    }

    fn record_fault<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        code: FaultCode,
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(polls::record_fault(self, partner, key, code, expiry, now))
    }

    fn poll_answer<'a>(
        &'a self,
        partner: &'a str,
        refs: &'a [RefToMessageIds],
    ) -> StoreFuture<'a, Result<Option<Response>, StoreError>> {
        Box::pin(polls::answer(self, partner, refs))
    }

    fn next_callback_due<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(callbacks::next_due(self))
    }

    fn callbacks_sent<'a>(&'a self, ids: &'a [i64]) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(callbacks::sent(self, ids))
    }

    fn callbacks_failed<'a>(
        &'a self,
        ids: &'a [i64],
        next: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(callbacks::failed(self, ids, next))
    }
}
