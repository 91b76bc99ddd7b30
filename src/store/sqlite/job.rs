//! What the writer thread is asked to do, and how a change tells it how it went. A leaf: the
//! store's handle sends these, the writer runs them, neither file imports the other.

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use super::shared::Wakes;
use crate::store::error::StoreError;
use crate::store::received::{Received, ReceivedMessage, SweepReport};

/// Most jobs one commit takes; more wait for the next one.
pub(super) const MAX_BATCH: usize = 256;

pub(super) enum Job {
    Receive(
        Box<ReceivedMessage>,
        oneshot::Sender<Result<Received, StoreError>>,
    ),
    Sweep(
        DateTime<Utc>,
        oneshot::Sender<Result<SweepReport, StoreError>>,
    ),
    /// A change (`SqliteStore::change`): runs in a savepoint of its own.
    Change(Box<dyn ChangeJob>),
}

/// How a change ended.
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
