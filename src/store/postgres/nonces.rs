//! `NonceStore` for PostgreSQL: one statement on the pool; the primary key decides between
//! two gateways using one nonce at once.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::nonces::NonceStore;
use crate::store::time::millis;

impl NonceStore for PostgresStore {
    fn use_nonce<'a>(
        &'a self,
        scope: &'a str,
        nonce: &'a str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            // A row whose window ended may be taken again; one still in its window not.
            let fresh: Option<i32> = sqlx::query_scalar(
                "INSERT INTO used_nonces (scope, nonce, until) VALUES ($1, $2, $3) \
                 ON CONFLICT (scope, nonce) DO UPDATE SET until = EXCLUDED.until \
                 WHERE used_nonces.until < $4 RETURNING 1",
            )
            .bind(scope)
            .bind(nonce)
            .bind(millis(until))
            .bind(millis(now))
            .fetch_optional(&self.pool)
            .await?;
            Ok(fresh.is_some())
        })
    }

    fn purge_nonces<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let purged = sqlx::query("DELETE FROM used_nonces WHERE until < $1")
                .bind(millis(now))
                .execute(&self.pool)
                .await?
                .rows_affected();
            Ok(purged)
        })
    }
}
