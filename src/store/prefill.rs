//! The benchmark fixture behind `wsr-gateway prefill` (README "Benchmark"): a store filled
//! with delivered messages in bulk. A trait of its own, not part of `Backend`: the gateway
//! never calls it while it runs, and no storage trait may depend on it.

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::future::StoreFuture;

/// A backend that can be prefilled (SQLite; PostgreSQL refuses).
pub trait Prefill {
    /// Adds `groups` ordered groups of `per_group` delivered messages each (payload of
    /// `payload_bytes`), expiring a day after `now`; answers how many were added.
    fn prefill_delivered<'a>(
        &'a self,
        channel: &'a str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>>;
}
