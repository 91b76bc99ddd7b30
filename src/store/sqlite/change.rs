//! Changes that run on the writer's own synchronous connection (DESIGN §7): one write
//! discipline for every change that is not a received message. A change is a closure over the
//! connection, run inside a transaction it must not end; it either keeps what it did (and says
//! what the commit makes possible, so that whoever waits for that is woken by the commit, not by
//! polling) or refuses, which undoes everything it wrote.
//!
//! The closure is synchronous on purpose: it runs on the writer's thread between other jobs of
//! the same batch, and must not wait for anything but SQLite.

use tokio::sync::oneshot;

use super::SqliteStore;
use crate::store::StoreError;

/// What a committed change makes possible; the writer wakes the matching waiters after the
/// commit, never before.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(
    dead_code,
    reason = "transitional: delivery and outbound changes move onto the writer"
)]
pub(crate) struct Wakes {
    /// Subscriptions may have something new to hand out (appends, releases, lapsed leases).
    pub deliveries: bool,
    /// An outbound message is due (submitted, or its schedule moved earlier).
    pub outbound: bool,
    /// Callback acks were queued.
    pub callbacks: bool,
}

#[allow(dead_code, reason = "transitional")]
impl Wakes {
    pub(crate) const NONE: Wakes = Wakes {
        deliveries: false,
        outbound: false,
        callbacks: false,
    };

    pub(crate) fn absorb(&mut self, other: Wakes) {
        self.deliveries |= other.deliveries;
        self.outbound |= other.outbound;
        self.callbacks |= other.callbacks;
    }
}

/// How a change ended.
#[allow(
    dead_code,
    reason = "transitional: refusals come with the delivery changes"
)]
pub(crate) enum Change<T, R> {
    /// Commit what it wrote; answer `T` after the commit.
    Keep(T, Wakes),
    /// Roll back what it wrote; answer the refusal `R` (a stale receipt, a conflict…).
    Refuse(R),
}

/// A change as the writer runs it.
pub(crate) type ChangeFn<T, R> =
    Box<dyn FnOnce(&rusqlite::Connection) -> Result<Change<T, R>, StoreError> + Send>;

impl SqliteStore {
    /// Runs `change` on the writer's connection inside a transaction and answers after the
    /// commit that made it durable: `Ok(Ok(value))` kept, `Ok(Err(refusal))` refused and undone,
    /// `Err` not stored (nothing of it applied).
    pub(crate) async fn change<T, R, F>(&self, change: F) -> Result<Result<T, R>, StoreError>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: FnOnce(&rusqlite::Connection) -> Result<Change<T, R>, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let shared = self.shared.clone();
        // Transitional: one change per transaction on a mutex-held connection. The batching
        // writer thread replaces this body; the signature stays.
        tokio::task::spawn_blocking(move || {
            let conn = shared.change_conn.lock().unwrap_or_else(|p| p.into_inner());
            let outcome = run_alone(&conn, Box::new(change));
            drop(conn);
            if let Ok(Ok((_, wakes))) = &outcome {
                shared.wake(*wakes);
            }
            let _ = tx.send(outcome.map(|r| r.map(|(value, _)| value)));
        });
        rx.await.map_err(|_| {
            StoreError::Failed("the change was not committed; nothing was applied".into())
        })?
    }
}

type Kept<T> = (T, Wakes);

fn run_alone<T, R>(
    conn: &rusqlite::Connection,
    change: ChangeFn<T, R>,
) -> Result<Result<Kept<T>, R>, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| change(conn)))
        .unwrap_or_else(|_| Err(StoreError::Panicked("a store change panicked".into())));
    match outcome {
        Ok(Change::Keep(value, wakes)) => {
            conn.execute_batch("COMMIT")?;
            Ok(Ok((value, wakes)))
        }
        Ok(Change::Refuse(refusal)) => {
            conn.execute_batch("ROLLBACK")?;
            Ok(Err(refusal))
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Opens the writer's own connection with the same settings as the pool's.
pub(super) fn open_writer_connection(
    path: &std::path::Path,
    durability: crate::store::Durability,
) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let synchronous = match durability {
        crate::store::Durability::Full => "FULL",
        crate::store::Durability::Os => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON;"
    ))?;
    Ok(conn)
}
