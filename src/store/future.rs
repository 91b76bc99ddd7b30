//! The future every storage trait method returns.

/// What every storage trait method returns: a boxed future, so that the traits stay
/// dyn-compatible and `Store` can hold any backend.
pub type StoreFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A change that answered as soon as it ran, before it was durable: resolves once it is (or
/// with why nothing of it was stored). Whatever the store is asked next is ordered after it:
/// it cannot be durable without this change (SQLite's writer commits its batches in order; a
/// PostgreSQL statement is committed before it answers).
#[must_use = "a change in order is durable only once `Committed` resolves"]
#[derive(Debug)]
pub struct Committed(Option<tokio::sync::oneshot::Receiver<Result<(), super::StoreError>>>);

impl Committed {
    /// A change that was durable when it answered.
    pub fn already() -> Committed {
        Committed(None)
    }

    pub(crate) fn pending(
        rx: tokio::sync::oneshot::Receiver<Result<(), super::StoreError>>,
    ) -> Committed {
        Committed(Some(rx))
    }

    /// Waits until the change is durable.
    pub async fn durable(self) -> Result<(), super::StoreError> {
        match self.0 {
            None => Ok(()),
            Some(rx) => rx.await.unwrap_or_else(|_| {
                Err(super::StoreError::Failed(
                    "the change was not committed; nothing was applied".into(),
                ))
            }),
        }
    }
}
