//! `ConsoleStore` for SQLite: sign-outs written through the writer (`keep`, answered after
//! the commit), read from the pool.

use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{SqliteStore, Wakes};
use crate::store::console::ConsoleStore;
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::time::millis;

impl ConsoleStore for SqliteStore {
    crate::store::console::console_reads!();
    crate::store::console::audit_reads!();

    fn record_audit<'a>(
        &'a self,
        entry: &'a crate::store::console::AuditEntry,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let entry = entry.clone();
        Box::pin(self.keep(move |conn| {
            static INSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                crate::store::console::RECORD_AUDIT_SQL.replace('$', "?")
            });
            conn.prepare_cached(&INSERT)?.execute(params![
                millis(entry.at),
                entry.principal,
                entry.action,
                entry.target,
                entry.detail,
                entry.result
            ])?;
            Ok(((), Wakes::NONE))
        }))
    }

    fn sign_out_console<'a>(
        &'a self,
        nonce: &'a str,
        until: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let nonce = nonce.to_owned();
        let until = millis(until);
        Box::pin(async move {
            self.keep(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO console_signouts (nonce, until) VALUES (?1, ?2) \
                     ON CONFLICT (nonce) DO NOTHING",
                )?
                .execute(params![nonce, until])?;
                Ok(((), Wakes::NONE))
            })
            .await
        })
    }

    fn purge_console_sign_outs<'a>(
        &'a self,
        now: DateTime<Utc>,
        audit_before: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>> {
        let (now, audit_before) = (millis(now), millis(audit_before));
        Box::pin(async move {
            self.keep(move |conn| {
                let purged = conn
                    .prepare_cached("DELETE FROM console_signouts WHERE until < ?1")?
                    .execute(params![now])?;
                conn.prepare_cached("DELETE FROM audit_log WHERE at < ?1")?
                    .execute(params![audit_before])?;
                Ok((purged as u64, Wakes::NONE))
            })
            .await
        })
    }
}
