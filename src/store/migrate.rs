//! `wsr-gateway migrate-store`: copies a SQLite store into a new PostgreSQL database, every
//! row of every table, in one PostgreSQL transaction (all or nothing), so that a gateway
//! started on PostgreSQL carries on where the SQLite one stopped: the same groups (duplicates
//! still recognised), inbox offsets (subscription cursors still right), leases and receipts
//! (the receipt key is copied), outbound messages with their numbering and events.
//!
//! The SQLite store is opened as a gateway would (its lock, so a running gateway on it makes
//! this refuse; its migrations, so that old files are brought up to date first). Columns are
//! matched by name; a value is converted to what the PostgreSQL column holds (SQLite keeps
//! booleans as integers, and payloads as TEXT or BLOB). Group states written as JSON by old
//! versions are rewritten in the compact record.

use futures_util::TryStreamExt as _;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row};

use super::config::StoreConfig;
use super::error::StoreError;
use super::group_state;
use super::postgres::PostgresStore;
use super::sqlite::SqliteStore;

/// The tables copied, parents before children (`grants` refers to `subscriptions`).
const TABLES: &[&str] = &[
    "settings",
    "groups",
    "inbox",
    "buffered",
    "pending_callbacks",
    "callback_endpoints",
    "push_endpoints",
    "push_endpoint_grants",
    "message_faults",
    "out_groups",
    "out_messages",
    "out_events",
    "out_attempts",
    "partner_health",
    "minute_counts",
    // The operators' actions: an audit trail moves with the store.
    "audit_log",
    "out_responses",
    "exchanges",
    "answer_quota",
    "subscriptions",
    "grants",
    "sessions",
    "deliveries",
    "group_affinity",
    "group_heads",
    // Console sign-outs: the receipt key (`settings`) is copied, so the console's cookies keep
    // verifying after the move; a cookie signed out before it must stay refused after it.
    "console_signouts",
    // The bytes each source keeps stored (its quota's count), as the copied inbox and
    // buffers hold them.
    "source_usage",
    // UsernameToken nonces used within their window: a replay stays refused after the move.
    "used_nonces",
    // Trace contexts of messages still being worked on, when traces are exported.
    "message_traces",
    "out_traces",
];

/// Tables that must be empty in the target: a database already in use is not written to.
const MUST_BE_EMPTY: &[&str] = &["groups", "inbox", "out_messages", "subscriptions"];

/// Rows per multi-row INSERT (PostgreSQL takes at most 65 535 parameters per statement).
const ROWS_PER_INSERT: usize = 500;

/// What was copied: (table, rows), in copy order.
#[derive(Debug, Default)]
pub struct Migrated {
    pub tables: Vec<(&'static str, u64)>,
}

impl std::fmt::Display for Migrated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.tables.iter().map(|(_, n)| n).sum();
        writeln!(f, "copied {total} rows:")?;
        for (table, rows) in &self.tables {
            writeln!(f, "  {table:<20} {rows}")?;
        }
        Ok(())
    }
}

/// How a column's values are carried over.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Integer,
    Boolean,
    Bytes,
    Text,
}

/// One value read from SQLite, as the PostgreSQL column takes it.
enum Value {
    Integer(Option<i64>),
    Boolean(Option<bool>),
    Bytes(Option<Vec<u8>>),
    Text(Option<String>),
}

/// Copies the SQLite store `from` into the empty PostgreSQL database `to`.
pub async fn migrate_store(from: &StoreConfig, to: &StoreConfig) -> Result<Migrated, StoreError> {
    let super::config::Database::Sqlite(path) = &from.database else {
        return Err(StoreError::Refused(format!(
            "--from must name a SQLite database, not {}",
            from.database
        )));
    };
    if !matches!(to.database, super::config::Database::Postgres(_)) {
        return Err(StoreError::Refused(format!(
            "--to must name a PostgreSQL database (postgres://…), not {}",
            to.database
        )));
    }
    if !path.exists() {
        return Err(StoreError::Refused(format!(
            "{} does not exist: nothing to migrate",
            path.display()
        )));
    }
    let source = SqliteStore::open(path, from).await?;
    let target = PostgresStore::open(to).await?;
    let mut tx = target.pool.begin().await?;
    for table in MUST_BE_EMPTY {
        let sql = format!("SELECT EXISTS (SELECT 1 FROM {table})");
        let used: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut *tx)
            .await?;
        if used {
            return Err(StoreError::Refused(format!(
                "{} already holds a gateway's data (table {table} is not empty); migrate into \
                 a new database",
                to.database
            )));
        }
    }
    // The target's own settings (a receipt key a gateway made at its first start) give way
    // to the source's, so that receipts handed out before the move stay valid.
    sqlx::query("DELETE FROM settings")
        .execute(&mut *tx)
        .await?;
    let mut migrated = Migrated::default();
    for table in TABLES {
        let rows = copy_table(&source, &mut tx, table).await?;
        migrated.tables.push((table, rows));
    }
    // Offsets and ids continue after the copied ones.
    sqlx::query(
        "UPDATE sequences SET last = (SELECT COALESCE(MAX(\"offset\"), 0) FROM inbox) \
         WHERE name = 'inbox'",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE sequences SET last = (SELECT COALESCE(MAX(seq), 0) FROM out_events) \
         WHERE name = 'out_events'",
    )
    .execute(&mut *tx)
    .await?;
    for table in ["groups", "pending_callbacks", "subscriptions"] {
        let sql = format!(
            "SELECT setval(pg_get_serial_sequence('{table}', 'id'), \
             COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    target.close().await;
    Ok(migrated)
}

/// The columns both sides have, in the PostgreSQL table's order, with how each is carried.
async fn shared_columns(
    source: &SqliteStore,
    target: &mut PgConnection,
    table: &str,
) -> Result<Vec<(String, Kind)>, StoreError> {
    let theirs: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(&mut *target)
    .await?;
    let ours: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info(?)")
        .bind(table)
        .fetch_all(&source.pool)
        .await?;
    let mut columns = Vec::new();
    for (name, data_type) in theirs {
        if !ours.contains(&name) {
            // PostgreSQL's own (leases): left to their defaults.
            continue;
        }
        let kind = match data_type.as_str() {
            "bigint" | "integer" | "smallint" => Kind::Integer,
            "boolean" => Kind::Boolean,
            "bytea" => Kind::Bytes,
            "text" => Kind::Text,
            other => {
                return Err(StoreError::Failed(format!(
                    "{table}.{name}: no conversion to PostgreSQL type {other}"
                )));
            }
        };
        columns.push((name, kind));
    }
    Ok(columns)
}

/// Copies one table, streaming its rows; answers how many.
async fn copy_table(
    source: &SqliteStore,
    target: &mut PgConnection,
    table: &'static str,
) -> Result<u64, StoreError> {
    let columns = shared_columns(source, target, table).await?;
    // A group's state is read from whichever form its row holds (`state`, the JSON of old
    // rows, or `state_bin`) and written as the compact record.
    let groups = table == "groups";
    let select: Vec<String> = columns
        .iter()
        .map(|(name, _)| {
            if groups && name == "state_bin" {
                "state, state_bin".to_owned()
            } else if table == "inbox" && name == "consumed" {
                // SQLite keeps which messages are consumed beside the inbox (0029).
                "EXISTS (SELECT 1 FROM inbox_consumed c WHERE c.offset = inbox.offset)".to_owned()
            } else {
                format!("\"{name}\"")
            }
        })
        .collect();
    let sql = format!("SELECT {} FROM {table}", select.join(", "));
    let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch(&source.pool);
    let mut pending: Vec<Vec<Value>> = Vec::with_capacity(ROWS_PER_INSERT);
    let mut copied = 0u64;
    while let Some(row) = rows.try_next().await? {
        pending.push(read_row(&row, &columns, groups, table)?);
        if pending.len() == ROWS_PER_INSERT {
            copied += insert(target, table, &columns, std::mem::take(&mut pending)).await?;
        }
    }
    if !pending.is_empty() {
        copied += insert(target, table, &columns, pending).await?;
    }
    Ok(copied)
}

fn read_row(
    row: &SqliteRow,
    columns: &[(String, Kind)],
    groups: bool,
    table: &str,
) -> Result<Vec<Value>, StoreError> {
    let mut values = Vec::with_capacity(columns.len());
    let mut i = 0;
    for (name, kind) in columns {
        let value = if groups && name == "state_bin" {
            let json: Option<String> = row.try_get_unchecked(i)?;
            let bin: Option<Vec<u8>> = row.try_get_unchecked(i + 1)?;
            i += 2;
            let state = super::sqlite::group_state::decode_stored(
                json.as_deref().unwrap_or(""),
                bin.as_deref(),
            )
            .map_err(|e| StoreError::Corrupt(format!("{table}: a group's state: {e}")))?;
            let mut encoded = Vec::new();
            group_state::encode(&state, &mut encoded);
            Value::Bytes(Some(encoded))
        } else {
            let value = match kind {
                Kind::Integer => Value::Integer(row.try_get_unchecked(i)?),
                Kind::Boolean => {
                    Value::Boolean(row.try_get_unchecked::<Option<i64>, _>(i)?.map(|v| v != 0))
                }
                // Payloads are TEXT when small and BLOB when big; both are the UTF-8 received.
                Kind::Bytes => Value::Bytes(row.try_get_unchecked(i)?),
                Kind::Text => Value::Text(row.try_get_unchecked(i)?),
            };
            i += 1;
            value
        };
        values.push(value);
    }
    Ok(values)
}

async fn insert(
    target: &mut PgConnection,
    table: &str,
    columns: &[(String, Kind)],
    rows: Vec<Vec<Value>>,
) -> Result<u64, StoreError> {
    let names: Vec<String> = columns.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    let mut insert = QueryBuilder::new(format!("INSERT INTO {table} ({}) ", names.join(", ")));
    let count = rows.len() as u64;
    insert.push_values(rows, |mut b, row| {
        for value in row {
            match value {
                Value::Integer(v) => b.push_bind(v),
                Value::Boolean(v) => b.push_bind(v),
                Value::Bytes(v) => b.push_bind(v),
                Value::Text(v) => b.push_bind(v),
            };
        }
    });
    insert
        .build()
        .execute(target)
        .await
        .map_err(|e| StoreError::Failed(format!("copying {table}: {e}")))?;
    Ok(count)
}
