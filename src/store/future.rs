//! The future every storage trait method returns.

/// What every storage trait method returns: a boxed future, so that the traits stay
/// dyn-compatible and `Store` can hold any backend.
pub type StoreFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
