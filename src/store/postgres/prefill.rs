//! `Prefill` for PostgreSQL: refused. The growth benchmark's fixture fills SQLite stores
//! only; this file must never write.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::prefill::Prefill;

impl Prefill for PostgresStore {
    fn prefill_delivered<'a>(
        &'a self,
        _channel: &'a str,
        _groups: u64,
        _per_group: u64,
        _payload_bytes: usize,
        _now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            Err(StoreError::Refused(
                "prefill fills SQLite stores only (a benchmark fixture)".into(),
            ))
        })
    }
}
