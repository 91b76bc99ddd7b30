//! The SQLite backend's handle: opening (WAL, the lock file, migrations) and the writer's front
//! door. Every write is a job of the one writer thread (`writer.rs`; a received message's plan
//! is applied in `batch.rs`, any other change through `change.rs`); reads go to the sqlx pool.
//! The trait implementations are in `receiver.rs`, `backend.rs`, `delivery/` and `outbound/`.

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::{Notify, mpsc, watch};

mod backend;
pub(crate) mod backup;
mod batch;
mod change;
pub(crate) mod check;
mod checkpointer;
mod console;
mod delivery;
mod exchange;
mod group_index;
pub mod group_json;
mod group_rows;
pub mod group_state;
mod job;
mod multi_row;
mod nonces;
mod outbound;
mod prefill;
mod receiver;
mod shared;
mod syncer;
#[cfg(feature = "test-hooks")]
mod test_hooks;
mod traces;
mod warm_groups;
mod writer;

use self::group_state::decode_stored;
pub(crate) use self::job::Change;
use self::job::{Job, MAX_BATCH};
use self::shared::Shared;
pub(crate) use self::shared::Wakes;
use crate::rmp::group::GroupState;
use crate::store::config::{Durability, StoreConfig};
use crate::store::error::StoreError;
use crate::store::health::Health;
use crate::store::received::InboxEntry;
use crate::store::time::from_millis;

/// A handle to the SQLite backend; cheap to clone. Nothing writes but the writer thread, which
/// begins each batch with `BEGIN IMMEDIATE` (a deferred transaction that later wants to write
/// fails at once with "database is locked" when another connection got there first).
#[derive(Clone)]
pub struct SqliteStore {
    /// Reads only. A commit is visible here before it is durable, so every read answers
    /// through `SqliteStore::durable` (the reads both backends share too).
    pub(in crate::store) pool: SqlitePool,
    jobs: mpsc::Sender<Job>,
    pub(in crate::store) shared: Arc<Shared>,
}

impl SqliteStore {
    pub async fn open(
        path: &std::path::Path,
        config: &StoreConfig,
    ) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Failed(format!("cannot create {}: {e}", dir.display())))?;
        }
        let lock = lock_database(path).await?;
        let synchronous = match config.durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Os => SqliteSynchronous::Normal,
        };
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_secs(10));
        // No ping before each acquire (sqlx's default): the pool's connections are files
        // open in this process, which a ping cannot find broken, and on the consumers' path
        // (a fetch and a settle read their session and subscription) each ping was one more
        // round trip to the connection's thread per read.
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        claim_database(&pool, path).await?;
        MIGRATIONS.run(&pool).await?;
        let writer = writer::open_writer_connection(path)?;
        if config.durability == Durability::Full {
            // Before anything is read and told: commits a stopped gateway wrote but did not
            // sync are still in the page cache, where this one would read them.
            let (database, wal) = writer::database_files(&writer)?;
            syncer::sync_at_start(&database, &wal).map_err(|e| {
                StoreError::Failed(format!("cannot sync {} at start: {e}", database.display()))
            })?;
        }
        let groups = group_index::GroupIndex::load(&writer)?;
        let shared = Arc::new(Shared {
            policy: config.policy.clone(),
            groups,
            waiters: Mutex::new(HashMap::new()),
            callbacks_due: Notify::new(),
            outbound_due: Notify::new(),
            deadlines_changed: Notify::new(),
            sweeper_wakeup: AtomicI64::new(i64::MIN),
            #[cfg(feature = "test-hooks")]
            hooks: Default::default(),
            health: Health::default(),
            probe: tokio::sync::Mutex::new(None),
            deliveries_changed: watch::channel(0).0,
            inbox_appended: watch::channel(0).0,
            arriving: Arc::default(),
            durable: Arc::default(),
            _lock: lock,
        });
        let (jobs, rx) = mpsc::channel(4 * MAX_BATCH);
        let opener = writer::Opener::new(path.to_owned(), config.durability);
        writer::spawn(writer, opener, rx, shared.clone())?;
        Ok(SqliteStore { pool, jobs, shared })
    }
}

impl SqliteStore {
    /// A read on the pool, answered once every commit it may have seen is durable: a commit is
    /// visible to the pool before the syncer has synced it (`syncer.rs`).
    pub(in crate::store) async fn durable<T, E: From<StoreError>>(
        &self,
        read: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        // Waited for whatever the read answers: a refusal can name what it read, too.
        let answer = read.await;
        self.shared.durable.caught_up().await?;
        answer
    }
}

/// The schema's migrations (`migrations/sqlite/`), embedded in the binary.
static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// A group row's state from its `state` (JSON of old rows) and `state_bin` columns, at
/// `first` and `first + 1`.
fn decode_group(r: &sqlx::sqlite::SqliteRow, first: usize) -> Result<GroupState, StoreError> {
    let json: &str = r.try_get(first)?;
    let bin: Option<&[u8]> = r.try_get(first + 1)?;
    decode_stored(json, bin).map_err(StoreError::Corrupt)
}

/// A stored payload's size in bytes, read without the payload: a big one is a BLOB, whose
/// length comes from its record's header; a small one is TEXT, counted in bytes through a
/// cast (it is small).
macro_rules! payload_size {
    () => {
        "CASE typeof(payload) WHEN 'blob' THEN length(payload) \
         ELSE length(CAST(payload AS BLOB)) END"
    };
}
pub(in crate::store) use payload_size;

/// `SELECT` of an inbox row in the column order `inbox_from_row` and the writer's
/// `rows::inbox_entry` read; callers add `FROM inbox WHERE …`.
macro_rules! select_inbox {
    () => {
        "SELECT offset, channel, topic, group_id, number, payload, namespaces, received_at, \
         expiry, partner "
    };
}
pub(in crate::store) use select_inbox;

/// An inbox row read with `select_inbox!`.
pub(in crate::store) fn inbox_from_row(r: &sqlx::sqlite::SqliteRow) -> InboxEntry {
    InboxEntry {
        payload: crate::store::received::payload_text(r.get::<&[u8], _>(5)),
        ..inbox_from_row_without_payload(r)
    }
}

/// A `select_inbox!` row (or one with another column 5) without its payload.
pub(in crate::store) fn inbox_from_row_without_payload(r: &sqlx::sqlite::SqliteRow) -> InboxEntry {
    InboxEntry {
        offset: r.get(0),
        partner: r.get(9),
        channel: r.get(1),
        topic: r.get(2),
        group_id: r.get(3),
        number: r.get::<Option<i64>, _>(4).map(|n| n as u64),
        payload: String::new(),
        namespaces: r.get(6),
        received_at: from_millis(r.get(7)),
        expiry: from_millis(r.get(8)),
    }
}

/// Ours: `PRAGMA application_id` of a wsr-gateway database ("WSRG").
const APPLICATION_ID: i64 = 0x5753_5247;
const _: () = assert!(
    APPLICATION_ID == 1_465_078_343,
    "the literal in claim_database"
);

/// Takes this process's exclusive hold on the database, beside it in `{file}.lock`, so that a
/// second gateway on the same file stops at once with a clear error instead of sharing the
/// writer's work. The OS releases the hold when the process dies, so a crash leaves nothing to
/// clean up. Opening the lock file first also names the OS's reason when the place is not
/// writable (SQLite only says "unable to open database file").
async fn lock_database(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        return Err(StoreError::Refused(format!(
            "cannot open {} for reading and writing: {e}",
            path.display()
        )));
    }
    hold_lock(path, Duration::from_secs(2)).await
}

/// `{file}.lock` for the database at `path`, beside the real file, so that two processes
/// reaching one database by other names (a symlink, a bind mount) still meet at one lock. A
/// file not there yet is named through its real directory.
pub(crate) fn lock_path(path: &std::path::Path) -> Result<std::path::PathBuf, StoreError> {
    let real = match std::fs::canonicalize(path) {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            let dir =
                std::fs::canonicalize(dir.unwrap_or(std::path::Path::new("."))).map_err(|e| {
                    StoreError::Refused(format!("cannot resolve {}: {e}", path.display()))
                })?;
            let name = path
                .file_name()
                .ok_or_else(|| StoreError::Refused(format!("{} names no file", path.display())))?;
            dir.join(name)
        }
        Err(e) => {
            return Err(StoreError::Refused(format!(
                "cannot resolve {}: {e}",
                path.display()
            )));
        }
    };
    let mut name = real.into_os_string();
    name.push(".lock");
    Ok(std::path::PathBuf::from(name))
}

/// Takes the exclusive hold on the database at `path` (its `lock_path`), waiting up to `wait`
/// for a holder that is letting go; the hold lasts as long as the returned file.
pub(crate) async fn hold_lock(
    path: &std::path::Path,
    wait: Duration,
) -> Result<std::fs::File, StoreError> {
    let lock_path = lock_path(path)?;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| StoreError::Refused(format!("cannot open {}: {e}", lock_path.display())))?;
    // A store of this process that is shutting down lets go within moments; anyone else
    // keeps it.
    let deadline = std::time::Instant::now() + wait;
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked(format!(
                    "{} is in use by another wsr-gateway (it holds {}); one database serves one \
                     gateway — give this one its own `database`",
                    path.display(),
                    lock_path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Refused(format!(
                    "cannot lock {}: {e}",
                    lock_path.display()
                )));
            }
        }
    }
    Ok(lock)
}

/// Refuses a file that is not a wsr-gateway store (by its application id), before anything
/// reads our tables in it.
pub(crate) async fn require_ours(
    conn: &mut sqlx::sqlite::SqliteConnection,
    path: &std::path::Path,
) -> Result<(), StoreError> {
    let id: i64 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(&mut *conn)
        .await?;
    if id != APPLICATION_ID {
        return Err(StoreError::Refused(format!(
            "{} is not a wsr-gateway database (application_id {id:#x})",
            path.display()
        )));
    }
    Ok(())
}

/// Refuses a database that is not ours before migrations add a single table to it: one with
/// another application id, or one with tables but no id and none of our migrations. A new,
/// empty file is marked as ours; one from before we marked them is recognised by its
/// migrations and marked.
async fn claim_database(pool: &SqlitePool, path: &std::path::Path) -> Result<(), StoreError> {
    let id: i64 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(pool)
        .await?;
    if id == APPLICATION_ID {
        return Ok(());
    }
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    let ours_before_ids = tables.iter().any(|t| t == "_sqlx_migrations")
        && tables.iter().any(|t| t == "groups")
        && tables.iter().any(|t| t == "inbox");
    if id != 0 || !(tables.is_empty() || ours_before_ids) {
        let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
        return Err(StoreError::Refused(format!(
            "{} is not a wsr-gateway database (application_id {id:#x}, tables: {}{}); \
             refusing to add ours to it — point `database` at a new file",
            path.display(),
            if shown.is_empty() {
                "none".to_owned()
            } else {
                shown.join(", ")
            },
            if tables.len() > shown.len() {
                ", …"
            } else {
                ""
            },
        )));
    }
    // 0x57535247: APPLICATION_ID (a pragma takes no parameters).
    sqlx::query("PRAGMA application_id = 1465078343")
        .execute(pool)
        .await?;
    Ok(())
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> StoreError {
        StoreError::Backend(e.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> StoreError {
        StoreError::Migrate(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Backend(e.to_string())
    }
}
