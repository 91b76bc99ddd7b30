//! Online backup and offline restore of a SQLite store (`wsr-gateway backup` / `restore`).
//!
//! A backup is `VACUUM INTO`: one read transaction copies the snapshot it began with, whatever
//! the writer commits meanwhile (WAL readers never block the writer, nor it them). SQLite's
//! paged online backup API would restart on every commit of a busy writer and might never
//! finish. The copy is written under a `.partial` name, flushed to disk and then renamed, so a
//! file under the asked-for name is always whole.
//!
//! A restore holds the store's lock (a running gateway holds it, so a restore is refused
//! beside one), checks the backup first (`check-store`'s invariants), moves the current file
//! and its WAL aside rather than deleting them, and puts a copy of the backup in their place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::check::open_existing;
use crate::store::error::StoreError;

/// What a backup copied: the file, its size and the rows of the tables that matter.
#[derive(Debug)]
pub struct BackedUp {
    pub to: PathBuf,
    pub bytes: u64,
    pub rows: Vec<(&'static str, i64)>,
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    pub database: PathBuf,
    pub bytes: u64,
    /// Where the store that was there before now is (with its `-wal`, when it had one).
    pub moved_aside: Option<PathBuf>,
}

/// The tables a backup's summary counts.
const COUNTED: &[&str] = &[
    "inbox",
    "groups",
    "buffered",
    "subscriptions",
    "deliveries",
    "out_messages",
    "audit_log",
];

fn io_error(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Failed(format!("cannot {what} {}: {e}", path.display()))
}

/// `path` + `suffix`, as a sibling file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Flushes a file's bytes, then its directory's entry for it, to disk.
fn sync_file_and_dir(path: &Path) -> Result<(), StoreError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_error("flush", path, e))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    std::fs::File::open(dir.unwrap_or(Path::new(".")))
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("flush the directory of", path, e))
}

pub(crate) async fn backup(database: &Path, to: &Path) -> Result<BackedUp, StoreError> {
    if to.exists() {
        return Err(StoreError::Refused(format!(
            "{} exists; a backup never overwrites a file — name a new one",
            to.display()
        )));
    }
    let partial = with_suffix(to, ".partial");
    if partial.exists() {
        return Err(StoreError::Refused(format!(
            "{} exists (an earlier backup that did not finish?); remove it first",
            partial.display()
        )));
    }
    let target = partial
        .to_str()
        .ok_or_else(|| StoreError::Refused(format!("{} is not a UTF-8 path", partial.display())))?;
    let mut conn = open_existing(database).await?;
    super::require_ours(&mut conn, database).await?;
    if let Err(e) = sqlx::query("VACUUM INTO ?1")
        .bind(target)
        .execute(&mut conn)
        .await
    {
        let _ = std::fs::remove_file(&partial);
        return Err(StoreError::Failed(format!(
            "cannot copy {} into {}: {e}",
            database.display(),
            partial.display()
        )));
    }
    drop(conn);
    sync_file_and_dir(&partial)?;
    std::fs::rename(&partial, to).map_err(|e| io_error("rename the backup to", to, e))?;
    sync_file_and_dir(to)?;

    let bytes = std::fs::metadata(to)
        .map_err(|e| io_error("read", to, e))?
        .len();
    let mut copy = open_existing(to).await?;
    let mut rows = Vec::new();
    for table in COUNTED {
        // `table` is one of ours (COUNTED).
        let sql = sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}"));
        let n: i64 = sqlx::query_scalar(sql).fetch_one(&mut copy).await?;
        rows.push((*table, n));
    }
    Ok(BackedUp {
        to: to.to_owned(),
        bytes,
        rows,
    })
}

pub(crate) async fn restore(
    from: &Path,
    database: &Path,
    now_ms: i64,
) -> Result<Restored, StoreError> {
    let check = super::check::check(from, now_ms).await?;
    if !check.is_sound() {
        return Err(StoreError::Refused(format!(
            "{} fails the store check; not restored:\n{check}",
            from.display()
        )));
    }
    // No wait: a gateway holding the store keeps it.
    let _lock = super::hold_lock(database, Duration::ZERO)
        .await
        .map_err(|e| match e {
            StoreError::Locked(_) => StoreError::Locked(format!(
                "{} is in use by a running wsr-gateway; stop it before restoring",
                database.display()
            )),
            other => other,
        })?;
    let moved_aside = if database.exists() {
        let stamp = chrono::DateTime::from_timestamp_millis(now_ms)
            .unwrap_or_default()
            .format("%Y%m%dT%H%M%S");
        let aside = with_suffix(database, &format!(".before-restore-{stamp}"));
        // The WAL holds committed transactions not yet in the main file: it moves with it
        // (under the name SQLite looks for beside the moved file); the shared-memory index
        // is rebuilt from it.
        for suffix in ["-wal", "-shm", ""] {
            let file = with_suffix(database, suffix);
            if file.exists() {
                let moved = with_suffix(&aside, suffix);
                std::fs::rename(&file, &moved).map_err(|e| io_error("move aside", &file, e))?;
            }
        }
        Some(aside)
    } else {
        None
    };
    let restoring = with_suffix(database, ".restoring");
    std::fs::copy(from, &restoring).map_err(|e| io_error("copy the backup to", &restoring, e))?;
    sync_file_and_dir(&restoring)?;
    std::fs::rename(&restoring, database).map_err(|e| io_error("put in place", database, e))?;
    sync_file_and_dir(database)?;
    let bytes = std::fs::metadata(database)
        .map_err(|e| io_error("read", database, e))?
        .len();
    Ok(Restored {
        database: database.to_owned(),
        bytes,
        moved_aside,
    })
}

impl std::fmt::Display for BackedUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "backed up to {} ({} bytes):",
            self.to.display(),
            self.bytes
        )?;
        for (table, n) in &self.rows {
            writeln!(f, "  {table:<14} {n}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "restored {} ({} bytes); start the gateway on it",
            self.database.display(),
            self.bytes
        )?;
        if let Some(aside) = &self.moved_aside {
            writeln!(f, "the store that was there is now {}", aside.display())?;
        }
        Ok(())
    }
}
