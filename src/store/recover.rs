//! What an operator runs to keep and recover a store, for either backend: `check-store`,
//! `backup`, `restore`. SQLite does its own (`sqlite/backup.rs`, `sqlite/check.rs`); a
//! PostgreSQL database is backed up and restored with PostgreSQL's tools (the README says
//! which), and checked here.

use std::path::Path;

use chrono::{DateTime, Utc};

use super::check::StoreCheck;
use super::config::Database;
use super::error::StoreError;
pub use super::sqlite::backup::{BackedUp, Restored};

/// Checks every invariant of `store::check` on a store (a running gateway's or a backup).
pub async fn check_store(
    database: &Database,
    now: DateTime<Utc>,
) -> Result<StoreCheck, StoreError> {
    let now_ms = now.timestamp_millis();
    match database {
        Database::Sqlite(path) => super::sqlite::check::check(path, now_ms).await,
        Database::Postgres(_) => super::postgres::check::check(database, now_ms).await,
    }
}

/// A consistent copy of a running gateway's SQLite store in a new file `to`.
pub async fn backup_store(database: &Database, to: &Path) -> Result<BackedUp, StoreError> {
    match database {
        Database::Sqlite(path) => super::sqlite::backup::backup(path, to).await,
        Database::Postgres(_) => Err(StoreError::Refused(format!(
            "{database} is PostgreSQL: back it up with PostgreSQL's tools (pg_dump for a \
             copy, pg_basebackup with WAL archiving for point-in-time recovery; README \
             \"Backup and restore\")"
        ))),
    }
}

/// Puts the SQLite backup `from` in place of the store of a stopped gateway, after checking
/// it; refused while a gateway holds the store.
pub async fn restore_store(
    from: &Path,
    database: &Database,
    now: DateTime<Utc>,
) -> Result<Restored, StoreError> {
    match database {
        Database::Sqlite(path) => {
            super::sqlite::backup::restore(from, path, now.timestamp_millis()).await
        }
        Database::Postgres(_) => Err(StoreError::Refused(format!(
            "{database} is PostgreSQL: restore it with PostgreSQL's tools (pg_restore, or a \
             base backup and its WAL; README \"Backup and restore\")"
        ))),
    }
}
