//! Background tasks of one gateway's store (the writer, the listener), aborted when their
//! owner goes. A leaf: it must never import another file of the backend.

use std::sync::Mutex;

/// Background tasks of this gateway's store, stopped when their owner goes.
#[derive(Default)]
pub(super) struct Tasks(Mutex<Vec<tokio::task::JoinHandle<()>>>);

impl Tasks {
    pub(super) fn add(&self, task: tokio::task::JoinHandle<()>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in self
            .0
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}
