//! What the store keeps of operators: the console's sign-outs — sign-ins (the nonces their
//! cookies carry) ended by Log out before their time — and the audit trail of their actions. The cookie itself is checked without the store (`http::console::session`);
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
    /// as expired anyway), and audit entries from before `audit_before`; returns how many
    /// sign-outs.
    fn purge_console_sign_outs<'a>(
        &'a self,
        now: DateTime<Utc>,
        audit_before: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, StoreError>>;

    /// Adds an operator's action to the audit trail.
    fn record_audit<'a>(&'a self, entry: &'a AuditEntry)
    -> StoreFuture<'a, Result<(), StoreError>>;

    /// The audit trail, newest first: at most `limit` entries before `before` (its `seq`;
    /// `None`: from the newest).
    fn audit_entries<'a>(
        &'a self,
        before: Option<i64>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<(i64, AuditEntry)>, StoreError>>;
}

/// The audit trail's write on both backends (`$n` placeholders; SQLite reads them as `?n`).
pub(in crate::store) const RECORD_AUDIT_SQL: &str = "INSERT INTO audit_log \
     (at, principal, action, target, detail, result) VALUES ($1, $2, $3, $4, $5, $6)";

/// One operator action: who (the principal of the token or console sign-in), when, what
/// (`http::audit::AuditView` lists the actions), on what (a message id, a group, a
/// subscription, a URL without credentials), its detail, and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub at: DateTime<Utc>,
    pub principal: String,
    pub action: String,
    pub target: String,
    pub detail: Option<String>,
    /// `done`, or `refused: <why>`.
    pub result: String,
}

/// The read both backends share (one SQL text, `$n` placeholders).
macro_rules! console_reads {
    () => {
        fn console_signed_out<'a>(
            &'a self,
            nonce: &'a str,
        ) -> $crate::store::StoreFuture<'a, Result<bool, $crate::store::StoreError>> {
            Box::pin(self.durable(async move {
                let found: Option<i32> =
                    sqlx::query_scalar("SELECT 1 FROM console_signouts WHERE nonce = $1")
                        .bind(nonce)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(found.is_some())
            }))
        }
    };
}
pub(in crate::store) use console_reads;

/// The audit trail's read on either backend (one SQL text, `$n` placeholders).
macro_rules! audit_reads {
    () => {
        fn audit_entries<'a>(
            &'a self,
            before: Option<i64>,
            limit: i64,
        ) -> $crate::store::StoreFuture<
            'a,
            Result<Vec<(i64, $crate::store::console::AuditEntry)>, $crate::store::StoreError>,
        > {
            Box::pin(self.durable(async move {
                type Row = (i64, i64, String, String, String, Option<String>, String);
                let rows: Vec<Row> = sqlx::query_as(
                    "SELECT seq, at, principal, action, target, detail, result FROM audit_log \
                         WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
                )
                .bind(before.unwrap_or(i64::MAX))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows
                    .into_iter()
                    .map(|(seq, at, principal, action, target, detail, result)| {
                        let entry = $crate::store::console::AuditEntry {
                            at: $crate::store::time::from_millis(at),
                            principal,
                            action,
                            target,
                            detail,
                            result,
                        };
                        (seq, entry)
                    })
                    .collect())
            }))
        }
    };
}
pub(in crate::store) use audit_reads;
