//! What a receive hands the group-commit writer, and the queue it hands it through. A leaf
//! but for `tasks.rs`: the store's handles send jobs, the writer (`writer/`) takes them, and
//! this file must never import either.

use tokio::sync::{mpsc, oneshot};

use super::tasks::Tasks;
use crate::store::received::{Received, ReceivedMessage};
use crate::store::{StoreError, StoreFuture};

/// Messages waiting for the writer; a receive waits here when the writer falls behind.
const QUEUE: usize = 1024;

/// One received message and where its decision goes.
pub(super) struct Job {
    pub(super) message: ReceivedMessage,
    pub(super) answer: oneshot::Sender<Result<Received, StoreError>>,
}

/// Where receives hand their messages to this gateway's writer, and the writer's task.
pub(super) struct Writer {
    queue: mpsc::Sender<Job>,
    pub(super) tasks: Tasks,
}

impl Writer {
    /// The writer's end for receives, and the jobs its task (`writer::spawn`) will take.
    pub(super) fn new() -> (Writer, mpsc::Receiver<Job>) {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let writer = Writer {
            queue,
            tasks: Tasks::default(),
        };
        (writer, jobs)
    }

    /// Hands `message` to the writer and waits for its committed decision.
    pub(super) fn enqueue(
        &self,
        message: ReceivedMessage,
    ) -> StoreFuture<'_, Result<Received, StoreError>> {
        Box::pin(async move {
            let (answer, decided) = oneshot::channel();
            self.queue
                .send(Job { message, answer })
                .await
                .map_err(|_| StoreError::Closed)?;
            decided.await.map_err(|_| StoreError::Closed)?
        })
    }
}
