//! The PostgreSQL backend of `OutboundStore`: reads on the pool (`read`), every write one
//! transaction (`submit`, `write`) that reads the rows its decision needs under `FOR UPDATE`,
//! lets `rmp::send_group` / `rmp::sender` decide, and writes what they decided. Several
//! gateways may run the same operation on the same rows at once; each waits for the other's
//! locks, and a try PostgreSQL aborts to break a deadlock is run again (`retrying`).
//!
//! Locks are taken in one order, so that gateways wait for each other instead of deadlocking:
//! an ordered group's row (several: by group id) before any of its messages, messages by id,
//! and the `out_events` sequence row last of all (`write::Events`).

mod read;
mod response;
mod rows;
mod submit;
mod write;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::rmp::sender::{AttemptNote, OutState, Outbound};
use crate::store::outbound::{
    Due, IdempotencyKey, KeptResponse, OutEvent, OutFilter, OutMessage, OutboundStore, ReplySource,
    Submission, SubmitError, Submitted,
};
use crate::store::postgres::{PostgresStore, retryable};
use crate::store::{StoreError, StoreFuture};
use crate::wsr::{GroupId, Reply};

/// How many times one operation is tried before its failure is answered.
const TRIES: u32 = 5;

/// Why one try of an operation failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// A statement failed; `doing` says what it was for.
    Sql {
        doing: &'static str,
        error: sqlx::Error,
    },
    /// Another gateway stored a message under the same idempotency key after this try looked
    /// the key up: the next try finds that message.
    KeyTaken,
    Store(StoreError),
}

impl Failure {
    fn worth_retrying(&self) -> bool {
        match self {
            Failure::Sql { error, .. } => retryable(error),
            Failure::KeyTaken => true,
            Failure::Store(_) => false,
        }
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
            Failure::Sql { doing, error } => StoreError::Backend(format!("{doing}: {error}")),
            Failure::KeyTaken => StoreError::Failed(format!(
                "the idempotency key was being stored by other gateways in {TRIES} tries"
            )),
            Failure::Store(e) => e,
        }
    }
}

/// Names what a statement was for, should it fail.
pub(super) trait Doing<T> {
    fn doing(self, doing: &'static str) -> Result<T, Failure>;
}

impl<T> Doing<T> for Result<T, sqlx::Error> {
    fn doing(self, doing: &'static str) -> Result<T, Failure> {
        self.map_err(|error| Failure::Sql { doing, error })
    }
}

/// Runs `once` (one transaction) until it succeeds, fails for good, or has been tried `TRIES`
/// times. A try that fails rolls back as its transaction is dropped.
async fn retrying<T, F, Fut>(mut once: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut tried = 1;
    loop {
        match once().await {
            Err(failure) if tried < TRIES && failure.worth_retrying() => {
                tracing::debug!(
                    ?failure,
                    tried,
                    "outbound transaction aborted; trying again"
                );
                tried += 1;
            }
            done => return done.map_err(StoreError::from),
        }
    }
}

impl OutboundStore for PostgresStore {
    crate::store::outbound::history_reads!();

    fn earlier_submission<'a>(
        &'a self,
        idem: &'a IdempotencyKey,
    ) -> StoreFuture<'a, Result<Option<Submitted>, SubmitError>> {
        Box::pin(read::earlier_submission(&self.pool, idem))
    }

    fn submit<'a>(
        &'a self,
        s: Submission,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Submitted, SubmitError>> {
        Box::pin(async move { retrying(|| submit::submit(self, &s, now)).await? })
    }

    fn outbound_due(&self) -> &tokio::sync::Notify {
        &self.shared.outbound_due
    }

    fn out_message<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<OutMessage>, StoreError>> {
        Box::pin(read::out_message(&self.pool, id))
    }

    fn out_messages_of<'a>(
        &'a self,
        filter: &'a OutFilter<'a>,
        after: Option<&'a str>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(read::out_messages_of(&self.pool, filter, after, limit))
    }

    fn due_outbound<'a>(
        &'a self,
        now: DateTime<Utc>,
        window: u64,
        windows: &'a BTreeMap<String, u64>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Due, StoreError>> {
        Box::pin(read::due_outbound(&self.pool, now, window, windows, limit))
    }

    fn awaiting_poll<'a>(
        &'a self,
        after: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(read::awaiting_poll(&self.pool, after, limit))
    }

    fn next_outbound_due(
        &self,
        after: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(read::next_outbound_due(&self.pool, after))
    }

    fn claim_attempt<'a>(
        &'a self,
        id: &'a str,
        before: &'a Outbound,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(retrying(move || {
            write::claim_attempt(self, id, before, after, now)
        }))
    }

    fn save_unreached<'a>(
        &'a self,
        id: &'a str,
        after: &'a Outbound,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(retrying(move || write::save_unreached(self, id, after)))
    }

    fn keep_response<'a>(
        &'a self,
        id: &'a str,
        response: &'a KeptResponse,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(retrying(move || response::keep(self, id, response)))
    }

    fn out_response<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<KeptResponse>, StoreError>> {
        Box::pin(response::out_response(&self.pool, id))
    }

    fn record_attempts<'a>(
        &'a self,
        partner: &'a str,
        notes: &'a [(String, AttemptNote)],
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(retrying(move || {
            write::record_attempts(self, partner, notes)
        }))
    }

    fn save_outbound<'a>(
        &'a self,
        id: &'a str,
        before: &'a OutState,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(retrying(move || {
            write::save_outbound(self, id, before, after, now)
        }))
    }

    fn not_held<'a>(
        &'a self,
        ids: &'a [String],
        asked_at: DateTime<Utc>,
        kept_for: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(retrying(move || {
            write::not_held(self, ids, asked_at, kept_for, now)
        }))
    }

    fn apply_replies<'a>(
        &'a self,
        replies: &'a [Reply],
        source: ReplySource<'a>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let verdicts = crate::rmp::replies::Verdicts::new(replies);
            if verdicts.is_empty() {
                return Ok(Vec::new());
            }
            retrying(|| write::apply_replies(self, &verdicts, source, now)).await
        })
    }

    fn out_events_of<'a>(
        &'a self,
        principal: Option<&'a str>,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>> {
        Box::pin(read::out_events_of(&self.pool, principal, after, limit))
    }

    fn out_message_events<'a>(
        &'a self,
        message_id: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>> {
        Box::pin(read::out_message_events(&self.pool, message_id, limit))
    }

    fn close_group<'a>(
        &'a self,
        group_id: &'a GroupId,
        principal: Option<&'a str>,
    ) -> StoreFuture<'a, Result<Option<u64>, SubmitError>> {
        Box::pin(async move { retrying(|| submit::close_group(self, group_id, principal)).await? })
    }
}
