//! The SQLite backend of `OutboundStore`: reads on the pool (`read`), every write through
//! `SqliteStore::change` on the writer's connection (`write`), one row mapping (`rows`).

mod read;
mod response;
mod rows;
mod submit;
mod write;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{SqliteStore, Wakes};
use crate::rmp::replies::Verdicts;
use crate::rmp::sender::{AttemptNote, OutState, Outbound};
use crate::store::outbound::{
    Due, IdempotencyKey, KeptResponse, OutEvent, OutFilter, OutMessage, OutboundStore, ReplySource,
    Submission, SubmitError, Submitted,
};
use crate::store::{StoreError, StoreFuture};
use crate::wsr::{GroupId, Reply};

impl SqliteStore {
    /// A change that saves states: answers the messages that reached a final state.
    async fn saves<F>(&self, change: F) -> Result<Vec<String>, StoreError>
    where
        F: FnOnce(&rusqlite::Connection) -> Result<write::Saved, StoreError> + Send + 'static,
    {
        self.keep(move |conn| {
            let saved = change(conn)?;
            Ok((saved.finished, saved.wakes))
        })
        .await
    }
}

impl OutboundStore for SqliteStore {
    crate::store::outbound::history_reads!();

    fn earlier_submission<'a>(
        &'a self,
        idem: &'a IdempotencyKey,
    ) -> StoreFuture<'a, Result<Option<Submitted>, SubmitError>> {
        Box::pin(self.durable(read::earlier_submission(&self.pool, idem)))
    }

    fn submit<'a>(
        &'a self,
        s: Submission,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Submitted, SubmitError>> {
        Box::pin(async move {
            self.change(move |conn| submit::submit(conn, &s, now))
                .await
                .map_err(SubmitError::Store)?
        })
    }

    fn outbound_due(&self) -> &tokio::sync::Notify {
        &self.shared.outbound_due
    }

    fn out_message<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<OutMessage>, StoreError>> {
        Box::pin(self.durable(read::out_message(&self.pool, id)))
    }

    fn out_messages_of<'a>(
        &'a self,
        filter: &'a OutFilter<'a>,
        after: Option<&'a str>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(self.durable(read::out_messages_of(&self.pool, filter, after, limit)))
    }

    fn due_outbound<'a>(
        &'a self,
        now: DateTime<Utc>,
        window: u64,
        windows: &'a BTreeMap<String, u64>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Due, StoreError>> {
        Box::pin(self.durable(read::due_outbound(&self.pool, now, window, windows, limit)))
    }

    fn awaiting_poll<'a>(
        &'a self,
        after: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(self.durable(read::awaiting_poll(&self.pool, after, limit)))
    }

    fn next_outbound_due(
        &self,
        after: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(self.durable(read::next_outbound_due(&self.pool, after)))
    }

    fn claim_attempt<'a>(
        &'a self,
        id: &'a str,
        before: &'a Outbound,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<String>, StoreError>> {
        let (id, before, after) = (id.to_owned(), before.clone(), after.clone());
        Box::pin(self.keep(move |conn| write::claim_attempt(conn, &id, &before, &after, now)))
    }

    fn save_unreached<'a>(
        &'a self,
        id: &'a str,
        after: &'a Outbound,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (id, after) = (id.to_owned(), after.clone());
        Box::pin(self.keep(move |conn| {
            write::save_unreached(conn, &id, &after)?;
            Ok(((), Wakes::NONE))
        }))
    }

    fn keep_response<'a>(
        &'a self,
        id: &'a str,
        response: &'a KeptResponse,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        let (id, response) = (id.to_owned(), response.clone());
        Box::pin(self.keep(move |conn| {
            let kept = response::keep(conn, &id, &response)?;
            Ok((kept, Wakes::NONE))
        }))
    }

    fn out_response<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<KeptResponse>, StoreError>> {
        Box::pin(self.durable(response::out_response(&self.pool, id)))
    }

    fn record_attempts<'a>(
        &'a self,
        partner: &'a str,
        notes: &'a [(String, AttemptNote)],
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        let (partner, notes) = (partner.to_owned(), notes.to_vec());
        Box::pin(self.keep(move |conn| {
            write::record_attempts(conn, &partner, &notes)?;
            Ok(((), Wakes::NONE))
        }))
    }

    fn save_outbound<'a>(
        &'a self,
        id: &'a str,
        before: &'a OutState,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        let (id, before, after) = (id.to_owned(), before.clone(), after.clone());
        Box::pin(self.saves(move |conn| {
            let mut saved = write::Saved::default();
            write::save(conn, &mut saved, &id, &before, &after, now)?;
            Ok(saved)
        }))
    }

    fn not_held<'a>(
        &'a self,
        ids: &'a [String],
        asked_at: DateTime<Utc>,
        kept_for: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        let ids = ids.to_vec();
        Box::pin(self.saves(move |conn| write::not_held(conn, &ids, asked_at, kept_for, now)))
    }

    fn apply_replies<'a>(
        &'a self,
        replies: &'a [Reply],
        source: ReplySource<'a>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        let verdicts = Verdicts::new(replies);
        let source = write::Source::of(&source);
        Box::pin(async move {
            if verdicts.is_empty() {
                return Ok(Vec::new());
            }
            self.saves(move |conn| write::apply_replies(conn, &verdicts, &source, now))
                .await
        })
    }

    fn out_events_of<'a>(
        &'a self,
        principal: Option<&'a str>,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>> {
        Box::pin(self.durable(read::out_events_of(&self.pool, principal, after, limit)))
    }

    fn out_message_events<'a>(
        &'a self,
        message_id: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>> {
        Box::pin(self.durable(read::out_message_events(&self.pool, message_id, limit)))
    }

    fn close_group<'a>(
        &'a self,
        group_id: &'a GroupId,
        principal: Option<&'a str>,
    ) -> StoreFuture<'a, Result<Option<u64>, SubmitError>> {
        let (group_id, principal) = (group_id.clone(), principal.map(str::to_owned));
        Box::pin(async move {
            self.change(move |conn| submit::close_group(conn, &group_id, principal.as_deref()))
                .await
                .map_err(SubmitError::Store)?
        })
    }
}
