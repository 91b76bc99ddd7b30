//! Writes a transaction's changes of the bytes stored per source (D13) outside the writer's
//! call (which makes its own, migration 0009): purges and sweeps. Last in the transaction;
//! `wsr_change_usage` takes the rows in byte order (migration 0017), as every writer of
//! `source_usage` does.

use sqlx::PgConnection;

use crate::store::source_usage::UsageChanges;

pub(super) async fn change_usage(
    conn: &mut PgConnection,
    changes: &UsageChanges,
) -> Result<(), sqlx::Error> {
    if changes.is_empty() {
        return Ok(());
    }
    let (sources, deltas): (Vec<&str>, Vec<i64>) = changes.iter().unzip();
    sqlx::query("SELECT wsr_change_usage($1, $2)")
        .bind(&sources)
        .bind(&deltas)
        .execute(conn)
        .await?;
    Ok(())
}

/// Adds the `(source, bytes)` rows a DELETE … RETURNING answered to what is freed.
pub(super) fn freed_by(rows: Vec<(String, i64)>, freed: &mut UsageChanges) {
    for (source, bytes) in rows {
        freed.freed(&source, u64::try_from(bytes).unwrap_or(0));
    }
}
