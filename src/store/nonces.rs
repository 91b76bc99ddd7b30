//! Nonces that may be used once: a WS-Security UsernameToken's `Nonce` (its PasswordDigest is
//! then not replayable, D14). Kept in the store every gateway of a cluster reads, across
//! restarts, until the token's freshness window has passed anyway.

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::future::StoreFuture;

pub trait NonceStore: Send + Sync {
    /// Records `nonce` of `scope` (a partner) as used until `until`: `true` when it was not
    /// in use (the first use since its last window ended), `false` for a replay. Atomic
    /// across the gateways of a cluster.
    fn use_nonce<'a>(
        &'a self,
        scope: &'a str,
        nonce: &'a str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// Forgets the nonces whose window ended before `now`; returns how many.
    fn purge_nonces<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<u64, StoreError>>;
}
