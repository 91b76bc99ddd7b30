//! The console's sign-outs: sign-ins (the nonces their cookies carry) ended by Log out before
//! their time. The cookie itself is checked without the store (`http::console::session`);
//! only a sign-out is kept, in the store every gateway of a cluster reads, until the signed
//! out cookie would have ended anyway.

use chrono::{DateTime, Utc};

use super::error::StoreError;
use super::future::StoreFuture;

pub trait ConsoleStore: Send + Sync {
    /// Records that sign-in `nonce`, which would end at `until`, is signed out: from when this
    /// returns `Ok`, every gateway on the store finds it with `console_signed_out`. Recording
    /// one again changes nothing.
    fn sign_out_console<'a>(
        &'a self,
        nonce: &'a str,
        until: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// Whether sign-in `nonce` was signed out (one indexed read).
    fn console_signed_out<'a>(
        &'a self,
        nonce: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// Forgets the sign-outs of sign-ins that ended before `now` (their cookies are refused
    /// as expired anyway); returns how many.
    fn purge_console_sign_outs<'a>(
        &'a self,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>>;
}

/// The read both backends share (one SQL text, `$n` placeholders).
macro_rules! console_reads {
    () => {
        fn console_signed_out<'a>(
            &'a self,
            nonce: &'a str,
        ) -> $crate::store::StoreFuture<'a, Result<bool, $crate::store::StoreError>> {
            Box::pin(async move {
                let found: Option<i32> =
                    sqlx::query_scalar("SELECT 1 FROM console_signouts WHERE nonce = $1")
                        .bind(nonce)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(found.is_some())
            })
        }
    };
}
pub(in crate::store) use console_reads;
