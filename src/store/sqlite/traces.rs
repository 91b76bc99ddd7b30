//! `TraceStore` for SQLite: writes through the writer, reads through the pool.

use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{SqliteStore, Wakes};
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::time::millis;
use crate::store::traces::{KEEP_MESSAGE_TRACE_SQL, KEEP_OUT_TRACE_SQL, MessageKey, TraceStore};

/// A shared `$n` SQL text as the writer's rusqlite takes it (`?n`).
fn positional(sql: &str) -> String {
    sql.replace('$', "?")
}

impl TraceStore for SqliteStore {
    fn keep_message_trace<'a>(
        &'a self,
        key: &'a MessageKey,
        traceparent: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (key, traceparent, now) = (key.clone(), traceparent.to_owned(), millis(now));
        Box::pin(self.keep(move |conn| {
            static SQL: std::sync::LazyLock<String> =
                std::sync::LazyLock::new(|| positional(KEEP_MESSAGE_TRACE_SQL));
            conn.prepare_cached(&SQL)?
                .execute(params![key.0, key.1, key.2, traceparent, now])?;
            Ok(((), Wakes::NONE))
        }))
    }

    fn keep_out_trace<'a>(
        &'a self,
        id: &'a str,
        traceparent: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (id, traceparent, now) = (id.to_owned(), traceparent.to_owned(), millis(now));
        Box::pin(self.keep(move |conn| {
            static SQL: std::sync::LazyLock<String> =
                std::sync::LazyLock::new(|| positional(KEEP_OUT_TRACE_SQL));
            conn.prepare_cached(&SQL)?
                .execute(params![id, traceparent, now])?;
            Ok(((), Wakes::NONE))
        }))
    }

    fn purge_traces<'a>(
        &'a self,
        before: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        let before = millis(before);
        Box::pin(self.keep(move |conn| {
            let mut purged = 0;
            for sql in [
                "DELETE FROM message_traces WHERE at < ?1",
                "DELETE FROM out_traces WHERE at < ?1",
            ] {
                purged += conn.prepare_cached(sql)?.execute(params![before])? as u64;
            }
            Ok((purged, Wakes::NONE))
        }))
    }

    crate::store::traces::trace_reads!();
}
