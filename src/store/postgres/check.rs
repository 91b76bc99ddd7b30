//! `check-store` on a PostgreSQL database: our invariants (`store::check`) over one
//! repeatable-read, read-only transaction — a consistent snapshot beside running gateways. The
//! server's own structure is PostgreSQL's business (`pg_amcheck`; the README says so).

use std::str::FromStr as _;

use futures_util::TryStreamExt as _;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use crate::store::check::{Checker, StoreCheck, feed_messages, run_sql_checks};
use crate::store::config::Database;
use crate::store::error::StoreError;

pub(crate) async fn check(database: &Database, now_ms: i64) -> Result<StoreCheck, StoreError> {
    let Database::Postgres(url) = database else {
        return Err(StoreError::Refused(format!(
            "{database} is not a PostgreSQL URL"
        )));
    };
    let shown = database.to_string();
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| StoreError::Refused(format!("{shown}: not a usable URL: {e}")))?;
    let connect = PgConnection::connect_with(&options);
    let mut conn = tokio::time::timeout(super::CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| StoreError::Refused(format!("cannot connect to {shown}: no answer")))?
        .map_err(|e| StoreError::Refused(format!("cannot connect to {shown}: {e}")))?;
    // No such table at all is the same answer as someone else's name in it.
    let application: Option<String> = sqlx::query_scalar("SELECT application FROM wsr_identity")
        .fetch_optional(&mut conn)
        .await
        .unwrap_or(None);
    if application.as_deref() != Some(super::APPLICATION) {
        return Err(StoreError::Refused(format!(
            "{shown} is not a wsr-gateway database"
        )));
    }

    let mut tx = conn.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let mut checker = Checker::new(StoreCheck::new(shown), now_ms);
    {
        let mut groups = sqlx::query_as::<_, (i64, String, String, Vec<u8>)>(
            "SELECT id, partner, group_id, state_bin FROM groups ORDER BY id",
        )
        .fetch(&mut *tx);
        while let Some((id, partner, group_id, bin)) = groups.try_next().await? {
            let state = crate::store::group_state::decode(&bin);
            checker.group(id, partner, group_id, state);
        }
    }
    feed_messages!(tx, checker);
    let mut report = checker.finish();
    run_sql_checks!(
        tx,
        "(SELECT last FROM sequences WHERE name = 'inbox')",
        report
    );
    tx.rollback().await?;
    Ok(report)
}
