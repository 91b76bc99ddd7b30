//! `check-store` on a SQLite file: its own integrity check, then our invariants
//! (`store::check`) over one read transaction — a consistent snapshot, so it may run beside
//! the gateway (WAL readers never block the writer) or on a backup.

use futures_util::TryStreamExt as _;
use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use super::group_state::decode_stored;
use crate::store::check::{Checker, StoreCheck, feed_messages, run_sql_checks};
use crate::store::error::StoreError;

/// Opens `path` for reading without creating it, changing its journal mode or running
/// migrations: an existing store (or backup) as it is.
pub(crate) async fn open_existing(path: &std::path::Path) -> Result<SqliteConnection, StoreError> {
    if !path.is_file() {
        return Err(StoreError::Refused(format!(
            "{} is not a file",
            path.display()
        )));
    }
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .busy_timeout(std::time::Duration::from_secs(10));
    SqliteConnection::connect_with(&options)
        .await
        .map_err(|e| StoreError::Refused(format!("cannot open {}: {e}", path.display())))
}

pub(crate) async fn check(path: &std::path::Path, now_ms: i64) -> Result<StoreCheck, StoreError> {
    let mut conn = open_existing(path).await?;
    super::require_ours(&mut conn, path).await?;
    let mut report = StoreCheck::new(format!("sqlite:{}", path.display()));

    let problems: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await?;
    report.checked("integrity", 1);
    for problem in problems.into_iter().filter(|p| p != "ok") {
        report.found("integrity", "database".to_owned(), problem);
    }

    let mut tx = conn.begin().await?;
    let mut checker = Checker::new(report, now_ms);
    {
        let mut groups = sqlx::query_as::<_, (i64, String, String, String, Option<Vec<u8>>)>(
            "SELECT id, partner, group_id, state, state_bin FROM groups ORDER BY id",
        )
        .fetch(&mut *tx);
        while let Some((id, partner, group_id, json, bin)) = groups.try_next().await? {
            checker.group(id, partner, group_id, decode_stored(&json, bin.as_deref()));
        }
    }
    feed_messages!(tx, checker);
    let mut report = checker.finish();
    run_sql_checks!(
        tx,
        "(SELECT seq FROM sqlite_sequence WHERE name = 'inbox')",
        report
    );
    tx.rollback().await?;
    Ok(report)
}
