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
    crate::store::console::audit_reads!();

    fn record_audit<'a>(
        &'a self,
        entry: &'a crate::store::console::AuditEntry,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(crate::store::console::RECORD_AUDIT_SQL)
                .bind(millis(entry.at))
                .bind(&entry.principal)
                .bind(&entry.action)
                .bind(&entry.target)
                .bind(&entry.detail)
                .bind(&entry.result)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

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
        audit_before: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let purged = sqlx::query("DELETE FROM console_signouts WHERE until < $1")
                .bind(millis(now))
                .execute(&self.pool)
                .await?
                .rows_affected();
            sqlx::query("DELETE FROM audit_log WHERE at < $1")
                .bind(millis(audit_before))
                .execute(&self.pool)
                .await?;
            Ok(purged)
        })
    }
}
