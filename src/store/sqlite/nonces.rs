//! `NonceStore` for SQLite: through the writer, so that two uses of one nonce are decided one
//! after the other.

use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{SqliteStore, Wakes};
use crate::store::error::StoreError;
use crate::store::future::StoreFuture;
use crate::store::nonces::NonceStore;
use crate::store::time::millis;

impl NonceStore for SqliteStore {
    fn use_nonce<'a>(
        &'a self,
        scope: &'a str,
        nonce: &'a str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        let (scope, nonce) = (scope.to_owned(), nonce.to_owned());
        let (until, now) = (millis(until), millis(now));
        Box::pin(async move {
            self.keep(move |conn| {
                // A row whose window ended may be taken again; one still in its window not.
                let fresh = conn
                    .prepare_cached(
                        "INSERT INTO used_nonces (scope, nonce, until) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (scope, nonce) DO UPDATE SET until = excluded.until \
                         WHERE used_nonces.until < ?4",
                    )?
                    .execute(params![scope, nonce, until, now])?;
                Ok((fresh == 1, Wakes::NONE))
            })
            .await
        })
    }

    fn purge_nonces<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<u64, StoreError>> {
        let now = millis(now);
        Box::pin(async move {
            self.keep(move |conn| {
                let purged = conn
                    .prepare_cached("DELETE FROM used_nonces WHERE until < ?1")?
                    .execute(params![now])?;
                Ok((purged as u64, Wakes::NONE))
            })
            .await
        })
    }
}
