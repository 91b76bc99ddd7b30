//! `ConsoleStore` for PostgreSQL: one statement each on the pool, committed before it
//! answers, so a sign-out recorded through one gateway is read by every other at once.

use chrono::{DateTime, Utc};

use super::PostgresStore;
use crate::store::console::ConsoleStore;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::time::millis;

impl ConsoleStore for PostgresStore {
    crate::store::console::console_reads!();

    fn sign_out_console<'a>(
        &'a self,
        nonce: &'a str,
        until: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO console_signouts (nonce, until) VALUES ($1, $2) \
                 ON CONFLICT (nonce) DO NOTHING",
            )
            .bind(nonce)
            .bind(millis(until))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn purge_console_sign_outs<'a>(
        &'a self,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let purged = sqlx::query("DELETE FROM console_signouts WHERE until < $1")
                .bind(millis(now))
                .execute(&self.pool)
                .await?
                .rows_affected();
            Ok(purged)
        })
    }
}
