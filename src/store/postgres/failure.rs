//! Why a PostgreSQL transaction failed, and whether it is worth another attempt. A leaf: it
//! owns the retry rule every write of this backend follows, and must never import another file
//! of the backend (the writer, the trait implementations and the pool's callers all use it).

use crate::store::StoreError;

/// Attempts at a transaction PostgreSQL aborted to break a deadlock between gateways.
const ATTEMPTS: usize = 5;

/// Why a transaction failed: the database (maybe worth another attempt), or the store's own
/// reasons (corrupt rows, a panic, the test hook).
pub(in crate::store) enum Failure {
    Db(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Failure {
        Failure::Db(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

impl From<Failure> for StoreError {
    fn from(f: Failure) -> StoreError {
        match f {
            Failure::Db(e) => e.into(),
            Failure::Store(e) => e,
        }
    }
}

/// Whether a failed statement is worth running again in a new transaction: PostgreSQL broke a
/// deadlock or a serialisation conflict between gateways by aborting this one.
pub(in crate::store) fn retryable(e: &sqlx::Error) -> bool {
    matches!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("40001" | "40P01")
    )
}

/// Whether a transaction that failed with `failure` on its `tries`th attempt is run again:
/// PostgreSQL aborted it to break a deadlock between gateways, and attempts are left.
pub(super) fn worth_again(failure: &Failure, tries: usize) -> bool {
    match failure {
        Failure::Db(e) if retryable(e) && tries < ATTEMPTS => {
            tracing::debug!(error = %e, "transaction aborted by the database; again");
            true
        }
        _ => false,
    }
}

/// Runs `attempt` again while PostgreSQL aborts it to break a deadlock between gateways.
pub(super) async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Err(failure) if worth_again(&failure, tries) => {}
            other => return other.map_err(StoreError::from),
        }
    }
}
