//! `TraceStore` for PostgreSQL.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::time::millis;
use crate::store::traces::{KEEP_MESSAGE_TRACE_SQL, KEEP_OUT_TRACE_SQL, MessageKey, TraceStore};

impl TraceStore for PostgresStore {
    fn keep_message_trace<'a>(
        &'a self,
        key: &'a MessageKey,
        traceparent: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(KEEP_MESSAGE_TRACE_SQL)
                .bind(&key.0)
                .bind(&key.1)
                .bind(key.2)
                .bind(traceparent)
                .bind(millis(now))
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn keep_out_trace<'a>(
        &'a self,
        id: &'a str,
        traceparent: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(KEEP_OUT_TRACE_SQL)
                .bind(id)
                .bind(traceparent)
                .bind(millis(now))
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn purge_traces<'a>(
        &'a self,
        before: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut purged = 0;
            for sql in [
                "DELETE FROM message_traces WHERE at < $1",
                "DELETE FROM out_traces WHERE at < $1",
            ] {
                purged += sqlx::query(sql)
                    .bind(millis(before))
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
            }
            Ok(purged)
        })
    }

    crate::store::traces::trace_reads!();
}
