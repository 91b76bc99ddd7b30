//! The PostgreSQL backend (DESIGN §7: several gateways on one database): opening, migrating
//! and claiming the database. Several gateways may start against one database at once, so
//! everything `open` does to the schema happens under one session-level advisory lock: the
//! first migrates (the first migration writes the identity row), the others wait and then
//! find it done.
//!
//! Every write is one transaction that reads the rows its decision needs with the locks that
//! keep other gateways off them (a group: `pg_advisory_xact_lock`; queued work: `FOR UPDATE
//! SKIP LOCKED`), lets the pure rules decide, writes the result and announces what it made
//! possible with NOTIFY (`notify.rs`), delivered at the commit to every gateway. The trait
//! implementations are in `receiver/`, `backend.rs`, `delivery/` and `outbound/` (and, apart
//! from `Backend`, `prefill.rs` and, with the `test-hooks` feature, `test_hooks.rs`).
//!
//! Imports run one way: the leaves (`failure.rs`, `group_state.rs`, `tasks.rs`) import no
//! other file here, `job.rs` only `tasks.rs`, `shared.rs` only those, `notify.rs` only those
//! and `shared.rs`; the writer and the trait implementations import from all of these and
//! from this file, and nothing they import imports them back.

mod backend;
pub(crate) mod check;
mod console;
mod delivery;
mod exchange;
mod failure;
mod group_state;
mod job;
mod nonces;
mod notify;
mod outbound;
mod prefill;
mod quota_view;
mod receiver;
mod shared;
mod tasks;
#[cfg(feature = "test-hooks")]
mod test_hooks;
mod traces;
mod usage;
mod writer;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::ConnectOptions as _;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

pub(in crate::store) use self::failure::retryable;
pub(in crate::store) use self::notify::Announcement;
use self::shared::Shared;
use crate::store::config::{Database, Durability, StoreConfig};
use crate::store::error::StoreError;

/// The advisory lock key every gateway takes while it migrates and claims a database (any
/// fixed 64-bit number no other application is likely to pick: "wsr-gate" in ASCII).
const MIGRATION_LOCK: i64 = 0x7773_722d_6761_7465;

/// What `wsr_identity.application` says in a database of ours.
const APPLICATION: &str = "wsr-gateway";

/// Connections one gateway keeps to the database.
const POOL_SIZE: u32 = 8;
/// How long the first connection at start may take before the start fails saying so.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A handle to the PostgreSQL backend; cheap to clone.
#[derive(Clone)]
pub struct PostgresStore {
    pub(in crate::store) pool: PgPool,
    pub(in crate::store) shared: Arc<Shared>,
}

impl PostgresStore {
    /// A read, as the reads both backends share ask for it (`SqliteStore::durable`): here a
    /// commit is durable before any other session sees it (`synchronous_commit = on`).
    pub(in crate::store) async fn durable<T, E: From<StoreError>>(
        &self,
        read: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        read.await
    }
}

impl PostgresStore {
    /// Connects, migrates (once, whichever gateway comes first) and checks that the database
    /// is ours. A database holding tables of something else is refused, untouched.
    pub async fn open(config: &StoreConfig) -> Result<PostgresStore, StoreError> {
        let Database::Postgres(url) = &config.database else {
            return Err(StoreError::Refused(format!(
                "{} is not a PostgreSQL URL",
                config.database
            )));
        };
        let shown = config.database.to_string();
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Refused(format!("{shown}: not a usable URL: {e}")))?
            // Durability "full": the ack waits for the WAL flush on the server; "os" lets the
            // server acknowledge before it, as SQLite's synchronous=NORMAL does.
            .options([(
                "synchronous_commit",
                match config.durability {
                    Durability::Full => "on",
                    Durability::Os => "off",
                },
            )]);
        // SQL text (statements, slow ones) only at DEBUG: it is the driver's business, and
        // it would put every statement's text in the log.
        let options = options
            .log_statements(tracing::log::LevelFilter::Debug)
            .log_slow_statements(tracing::log::LevelFilter::Debug, Duration::from_secs(1));
        // One connection first, alone: a refused connection, a wrong password or an unknown
        // database is said at once, in the server's words — the pool would retry it quietly
        // until its acquire timeout and say only "pool timed out".
        let first = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| {
                StoreError::Refused(format!(
                    "cannot connect to {shown}: no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| StoreError::Refused(format!("cannot connect to {shown}: {e}")))?;
        drop(first);
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Refused(format!("cannot connect to {shown}: {e}")))?;
        let mut conn = pool.acquire().await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
        let claimed = claim_and_migrate(&mut conn, &pool, &shown).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        claimed?;
        if let Err(e) = unlocked {
            // The lock dies with the session: close this connection rather than return it
            // to the pool still holding the lock.
            conn.detach();
            tracing::warn!(error = %e, "could not release the migration lock; connection closed");
        }
        let (writer, jobs) = job::Writer::new();
        let shared = Arc::new(Shared::new(config.policy.clone(), writer));
        writer::spawn(&pool, &shared, jobs);
        notify::start(&pool, &shared).await?;
        Ok(PostgresStore { pool, shared })
    }

    /// This gateway's id: the owner its leases name.
    pub(in crate::store) fn gateway(&self) -> &str {
        &self.shared.gateway
    }

    pub(in crate::store) async fn begin(
        &self,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    /// Commits `tx` with its announcement (sent inside it, so other gateways hear of the
    /// change only if it commits), then wakes this gateway's own waiters.
    pub(in crate::store) async fn commit(
        &self,
        mut tx: Transaction<'static, Postgres>,
        announcement: Announcement,
    ) -> Result<(), StoreError> {
        notify::announce(&mut tx, &announcement).await?;
        tx.commit().await?;
        announcement.wake_here(&self.shared);
        Ok(())
    }

    /// Closes every connection (waiting for those in use to come back).
    pub async fn close(self) {
        self.pool.close().await;
    }
}

/// With the migration lock held: refuses a database that is not ours, then migrates. sqlx's
/// migrator locks too, but only around its own statements; ours also covers the check before
/// them, and migrations to come that cannot run in one transaction.
async fn claim_and_migrate(
    conn: &mut PgConnection,
    pool: &PgPool,
    shown: &str,
) -> Result<(), StoreError> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = current_schema() ORDER BY table_name",
    )
    .fetch_all(&mut *conn)
    .await?;
    if tables.iter().any(|t| t == "wsr_identity") {
        let application: Option<String> =
            sqlx::query_scalar("SELECT application FROM wsr_identity")
                .fetch_optional(&mut *conn)
                .await?;
        if application.as_deref() != Some(APPLICATION) {
            return Err(StoreError::Refused(format!(
                "{shown} belongs to {}, not to wsr-gateway; refusing to use it",
                application
                    .as_deref()
                    .unwrap_or("nobody (an empty wsr_identity table)")
            )));
        }
    } else if let Some(first) = tables.iter().find(|t| *t != "_sqlx_migrations") {
        return Err(StoreError::Refused(format!(
            "{shown} is not a wsr-gateway database (it has tables, e.g. {first}); refusing \
             to add ours to it — point `database` at a new database or schema"
        )));
    }
    // On another connection of the pool (the migrator takes one of its own and its own lock;
    // ours, held on `conn`, is what keeps a second gateway from claiming meanwhile).
    // The first migration writes the identity row itself.
    sqlx::migrate!("./migrations/postgres").run(pool).await?;
    Ok(())
}
