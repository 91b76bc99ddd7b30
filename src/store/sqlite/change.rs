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
use super::job::{Change, ChangeJob, Job, Ran};
use super::shared::Wakes;
use crate::store::error::StoreError;
use crate::store::future::Committed;

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

    /// Runs `change` as `keep` does, but answers as soon as it has run, with what makes it
    /// durable: every job sent after that answer is committed with it or after it.
    pub(super) async fn keep_in_order<T, F>(&self, change: F) -> Result<(T, Committed), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Connection) -> Result<(T, Wakes), StoreError> + Send + 'static,
    {
        let (ran_tx, ran_rx) = oneshot::channel();
        let (committed_tx, committed_rx) = oneshot::channel();
        let task = InOrder {
            change: Some(change),
            ran: Some(ran_tx),
            committed: committed_tx,
        };
        self.jobs
            .send(Job::Change(Box::new(task)))
            .await
            .map_err(|_| StoreError::Closed)?;
        let value = ran_rx.await.map_err(|_| {
            StoreError::Failed("the change did not run; nothing was applied".into())
        })??;
        Ok((value, Committed::pending(committed_rx)))
    }
}

/// A `keep_in_order` change: answers once when it has run, and once more after the commit.
struct InOrder<F, T> {
    change: Option<F>,
    ran: Option<oneshot::Sender<Result<T, StoreError>>>,
    committed: oneshot::Sender<Result<(), StoreError>>,
}

impl<F, T> ChangeJob for InOrder<F, T>
where
    T: Send + 'static,
    F: FnOnce(&rusqlite::Connection) -> Result<(T, Wakes), StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &rusqlite::Connection) -> Result<Ran, StoreError> {
        let change = self
            .change
            .take()
            .ok_or_else(|| StoreError::Failed("a change ran twice".into()))?;
        let (value, wakes) = change(conn)?;
        if let Some(ran) = self.ran.take() {
            let _ = ran.send(Ok(value));
        }
        Ok(Ran::Keep(wakes))
    }

    fn answer(self: Box<Self>, outcome: Result<(), StoreError>) {
        // Failed before it ran (or alone, as it ran): the caller still waits for the run.
        if let (Some(ran), Err(e)) = (self.ran, &outcome) {
            let _ = ran.send(Err(StoreError::Failed(e.to_string())));
        }
        let _ = self.committed.send(outcome);
    }
}
