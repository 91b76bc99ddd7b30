//! The one error type of every storage trait. Its public face names no database crate: a
//! backend turns its driver's errors into `Backend` (with what it was doing) at its edge.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed a statement (the text says what and why).
    #[error("database error: {0}")]
    Backend(String),
    #[error("database migration failed: {0}")]
    Migrate(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The request was not stored (its transaction failed or the store cannot be reached).
    #[error("not stored: {0}")]
    Failed(String),
    /// A commit failed because a test asked it to (`TestHooks::fail_next_commits`).
    #[cfg(feature = "test-hooks")]
    #[error("commit failed (injected fault)")]
    Injected,
    /// A bug: the job panicked. It failed alone; the writer carries on.
    #[error("the store job failed unexpectedly: {0}")]
    Panicked(String),
    /// Another gateway (or another store in this process) holds the database.
    #[error("{0}")]
    Locked(String),
    /// The database belongs to something else, or cannot be opened.
    #[error("{0}")]
    Refused(String),
    #[error("the store is shut down")]
    Closed,
    /// A call's answer came after its exchange was taken over by another call (or purged):
    /// neither it nor its request's delivery was stored.
    #[error("the exchange is no longer this call's: its answer was not kept")]
    Superseded,
}

/// The text a panic carried, for the log.
pub(in crate::store) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
