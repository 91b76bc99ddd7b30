//! The trace context a message came in with (`telemetry`): kept only while traces are
//! exported, so that the message's later work — a consumer's fetch and settle, a push, our
//! sends of a submitted message — joins the trace it began in. A message is named as WS-R
//! names it (partner, group, number; `slot` 0 for a singleton) on the receiving side, by its
//! id on the sending side. Kept `TRACES_KEPT`, then purged by the sweeper: observability, not
//! state — a trace context lost is a new trace, never a lost message.

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::future::StoreFuture;

/// How long a message's trace context is kept.
pub const TRACES_KEPT: chrono::Duration = chrono::Duration::days(7);

/// A received message as the trace table names it: (partner, group id, slot).
pub type MessageKey = (String, String, i64);

/// The key of `partner`'s message `number` of `group_id` (`None`: a singleton, slot 0, as its
/// group state counts it).
pub fn message_key(partner: &str, group_id: &str, number: Option<u64>) -> MessageKey {
    (
        partner.to_owned(),
        group_id.to_owned(),
        // A u64 kept bit for bit in the i64 column, as the other tables keep numbers.
        crate::rmp::group::slot(number) as i64,
    )
}

pub trait TraceStore: Send + Sync {
    /// Keeps the `traceparent` a received message came in with (the first one kept stays).
    fn keep_message_trace<'a>(
        &'a self,
        key: &'a MessageKey,
        traceparent: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// The trace context of a received message, by its key.
    fn message_trace<'a>(
        &'a self,
        key: &'a MessageKey,
    ) -> StoreFuture<'a, Result<Option<String>, StoreError>>;

    /// The trace context of the received message at inbox `offset`.
    fn offset_trace<'a>(
        &'a self,
        offset: i64,
    ) -> StoreFuture<'a, Result<Option<String>, StoreError>>;

    /// Keeps the `traceparent` of the request that submitted outbound message `id`.
    fn keep_out_trace<'a>(
        &'a self,
        id: &'a str,
        traceparent: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// The trace context outbound message `id` was submitted in.
    fn out_trace<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Result<Option<String>, StoreError>>;

    /// Forgets trace contexts kept before `before`.
    fn purge_traces<'a>(
        &'a self,
        before: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>>;
}

/// The writes, one SQL text for both backends (`$n`; SQLite's writer reads them as `?n`).
pub(in crate::store) const KEEP_MESSAGE_TRACE_SQL: &str = "INSERT INTO message_traces \
     (partner, group_id, number, traceparent, at) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (partner, group_id, number) DO NOTHING";
pub(in crate::store) const KEEP_OUT_TRACE_SQL: &str = "INSERT INTO out_traces \
     (message_id, traceparent, at) VALUES ($1, $2, $3) ON CONFLICT (message_id) DO NOTHING";

/// The reads both backends share (one SQL text, `$n` placeholders, through the pool).
macro_rules! trace_reads {
    () => {
        fn message_trace<'a>(
            &'a self,
            key: &'a $crate::store::traces::MessageKey,
        ) -> $crate::store::StoreFuture<'a, Result<Option<String>, $crate::store::StoreError>> {
            Box::pin(self.durable(async move {
                Ok(sqlx::query_scalar(
                    "SELECT traceparent FROM message_traces \
                     WHERE partner = $1 AND group_id = $2 AND number = $3",
                )
                .bind(&key.0)
                .bind(&key.1)
                .bind(key.2)
                .fetch_optional(&self.pool)
                .await?)
            }))
        }

        fn offset_trace<'a>(
            &'a self,
            offset: i64,
        ) -> $crate::store::StoreFuture<'a, Result<Option<String>, $crate::store::StoreError>> {
            Box::pin(self.durable(async move {
                Ok(sqlx::query_scalar(
                    "SELECT t.traceparent FROM inbox i JOIN message_traces t \
                     ON t.partner = i.partner AND t.group_id = i.group_id \
                     AND t.number = COALESCE(i.number, 0) WHERE i.\"offset\" = $1",
                )
                .bind(offset)
                .fetch_optional(&self.pool)
                .await?)
            }))
        }

        fn out_trace<'a>(
            &'a self,
            id: &'a str,
        ) -> $crate::store::StoreFuture<'a, Result<Option<String>, $crate::store::StoreError>> {
            Box::pin(self.durable(async move {
                Ok(
                    sqlx::query_scalar("SELECT traceparent FROM out_traces WHERE message_id = $1")
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?,
                )
            }))
        }
    };
}
pub(in crate::store) use trace_reads;
