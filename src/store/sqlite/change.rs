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
use super::writer::Job;
use crate::store::StoreError;

/// What a committed change makes possible; the writer wakes the matching waiters after the
/// commit, never before.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wakes {
    /// Subscriptions may have something new to hand out (appends, releases, lapsed leases).
    pub deliveries: bool,
    /// An outbound message is due (submitted, or its schedule moved earlier).
    pub outbound: bool,
    /// Callback acks were queued.
    pub callbacks: bool,
}

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

/// How a change job ended inside the transaction.
pub(super) enum Ran {
    /// Keep what it wrote; wake these after the commit.
    Keep(Wakes),
    /// Refused: roll back what it wrote.
    Undo,
}

/// A change as the writer runs it: run once inside the batch's transaction (in a savepoint of
/// its own), answered once after the commit (or with the reason nothing was stored).
pub(super) trait ChangeJob: Send {
    fn run(&mut self, conn: &rusqlite::Connection) -> Result<Ran, StoreError>;
    fn answer(self: Box<Self>, outcome: Result<(), StoreError>);
}

struct Task<F, T, R> {
    change: Option<F>,
    result: Option<Result<T, R>>,
    answer: oneshot::Sender<Result<Result<T, R>, StoreError>>,
}

impl<F, T, R> ChangeJob for Task<F, T, R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: FnOnce(&rusqlite::Connection) -> Result<Change<T, R>, StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &rusqlite::Connection) -> Result<Ran, StoreError> {
        let change = self
            .change
            .take()
            .ok_or_else(|| StoreError::Failed("a change ran twice".into()))?;
        match change(conn)? {
            Change::Keep(value, wakes) => {
                self.result = Some(Ok(value));
                Ok(Ran::Keep(wakes))
            }
            Change::Refuse(refusal) => {
                self.result = Some(Err(refusal));
                Ok(Ran::Undo)
            }
        }
    }

    fn answer(self: Box<Self>, outcome: Result<(), StoreError>) {
        let answer = match (outcome, self.result) {
            (Ok(()), Some(result)) => Ok(result),
            (Ok(()), None) => Err(StoreError::Failed("the change did not run".into())),
            (Err(e), _) => Err(e),
        };
        let _ = self.answer.send(answer);
    }
}

impl SqliteStore {
    /// Runs `change` on the writer's connection inside its next transaction (in a savepoint of
    /// its own, among other requests' jobs) and answers after the commit that made it durable:
    /// `Ok(Ok(value))` kept, `Ok(Err(refusal))` refused and undone, `Err` not stored (nothing
    /// of it applied).
    pub(crate) async fn change<T, R, F>(&self, change: F) -> Result<Result<T, R>, StoreError>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: FnOnce(&rusqlite::Connection) -> Result<Change<T, R>, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let task = Task {
            change: Some(change),
            result: None,
            answer: tx,
        };
        self.jobs
            .send(Job::Change(Box::new(task)))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| {
            StoreError::Failed("the change was not committed; nothing was applied".into())
        })?
    }

    /// A change that refuses nothing.
    pub(super) async fn keep<T, F>(&self, change: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Connection) -> Result<(T, Wakes), StoreError> + Send + 'static,
    {
        let kept: Result<T, std::convert::Infallible> = self
            .change(move |conn| change(conn).map(|(value, wakes)| Change::Keep(value, wakes)))
            .await?;
        let Ok(value) = kept;
        Ok(value)
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
    // Every statement of the receive path, the sweep and the other helpers' changes stays
    // prepared.
    conn.set_prepared_statement_cache_capacity(256);
    Ok(conn)
}
