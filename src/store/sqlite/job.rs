//! What the writer thread is asked to do, how a change tells it how it went, and whom each
//! job's result is given to after the commit. A leaf: the store's handle sends these, the
//! writer runs them, neither file imports the other.

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

/// One job's result, kept until the commit.
pub(super) enum Done {
    Received(Result<Received, StoreError>),
    Swept(Result<SweepReport, StoreError>),
    /// A change ran (kept or refused); its answer is in the job. `Err`: it failed alone.
    Changed(Result<(), StoreError>),
}

/// Whom to answer for one job, without the job's input (a received message's payload is not
/// kept while the disk syncs).
pub(super) enum Reply {
    Received(oneshot::Sender<Result<Received, StoreError>>),
    Swept(oneshot::Sender<Result<SweepReport, StoreError>>),
    Changed(Box<dyn ChangeJob>),
}

impl From<Job> for Reply {
    fn from(job: Job) -> Reply {
        match job {
            Job::Receive(_, tx) => Reply::Received(tx),
            Job::Sweep(_, tx) => Reply::Swept(tx),
            Job::Change(c) => Reply::Changed(c),
        }
    }
}

impl Reply {
    /// Answers with the job's result.
    pub(super) fn give(self, done: Done) {
        match (self, done) {
            (Reply::Received(tx), Done::Received(r)) => {
                let _ = tx.send(r);
            }
            (Reply::Swept(tx), Done::Swept(r)) => {
                let _ = tx.send(r);
            }
            (Reply::Changed(c), Done::Changed(r)) => c.answer(r),
            (reply, _) => reply.fail(StoreError::Failed("mismatched job result".into())),
        }
    }

    /// Answers "not stored", for `err`.
    pub(super) fn fail(self, err: StoreError) {
        match self {
            Reply::Received(tx) => {
                let _ = tx.send(Err(err));
            }
            Reply::Swept(tx) => {
                let _ = tx.send(Err(err));
            }
            Reply::Changed(c) => c.answer(Err(err)),
        }
    }
}
