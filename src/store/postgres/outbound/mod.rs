//! The PostgreSQL backend of `OutboundStore` (not built yet: every operation fails).
#![allow(unused_variables, reason = "stubs until the port lands")]

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::rmp::sender::{OutState, Outbound};
use crate::store::outbound::{
    Due, IdempotencyKey, OutEvent, OutMessage, OutboundStore, ReplySource, Submission, SubmitError,
    Submitted,
};
use crate::store::postgres::PostgresStore;
use crate::store::{StoreError, StoreFuture};
use crate::wsr::{GroupId, Reply};

fn not_built(what: &str) -> StoreError {
    StoreError::Failed(format!("PostgreSQL backend: {what} is not built yet"))
}

impl OutboundStore for PostgresStore {
    fn earlier_submission<'a>(
        &'a self,
        idem: &'a IdempotencyKey,
    ) -> StoreFuture<'a, Result<Option<Submitted>, SubmitError>> {
        Box::pin(async move { Err(not_built("earlier_submission").into()) })
    }

    fn submit<'a>(
        &'a self,
        s: Submission,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Submitted, SubmitError>> {
        Box::pin(async move { Err(not_built("submit").into()) })
    }

    fn outbound_due(&self) -> &tokio::sync::Notify {
        &self.shared.outbound_due
    }

    fn out_message<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<OutMessage>, StoreError>> {
        Box::pin(async move { Err(not_built("out_message").into()) })
    }

    fn out_messages_of<'a>(
        &'a self,
        principal: Option<&'a str>,
        state: Option<&'a str>,
        group: Option<&'a str>,
        after: Option<&'a str>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(async move { Err(not_built("out_messages_of").into()) })
    }

    fn due_outbound<'a>(
        &'a self,
        now: DateTime<Utc>,
        window: u64,
        windows: &'a BTreeMap<String, u64>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Due, StoreError>> {
        Box::pin(async move { Err(not_built("due_outbound").into()) })
    }

    fn awaiting_poll<'a>(
        &'a self,
        after: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(async move { Err(not_built("awaiting_poll").into()) })
    }

    fn next_outbound_due(
        &self,
        after: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move { Err(not_built("next_outbound_due").into()) })
    }

    fn claim_attempt<'a>(
        &'a self,
        id: &'a str,
        before: &'a Outbound,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move { Err(not_built("claim_attempt").into()) })
    }

    fn save_unreached<'a>(
        &'a self,
        id: &'a str,
        after: &'a Outbound,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("save_unreached").into()) })
    }

    fn record_failure<'a>(
        &'a self,
        ids: &'a [String],
        cause: &'a str,
        at: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("record_failure").into()) })
    }

    fn save_outbound<'a>(
        &'a self,
        id: &'a str,
        before: &'a OutState,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { Err(not_built("save_outbound").into()) })
    }

    fn not_held<'a>(
        &'a self,
        ids: &'a [String],
        asked_at: DateTime<Utc>,
        kept_for: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { Err(not_built("not_held").into()) })
    }

    fn apply_replies<'a>(
        &'a self,
        replies: &'a [Reply],
        source: ReplySource<'a>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { Err(not_built("apply_replies").into()) })
    }

    fn out_events_of<'a>(
        &'a self,
        principal: Option<&'a str>,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>> {
        Box::pin(async move { Err(not_built("out_events_of").into()) })
    }

    fn close_group<'a>(
        &'a self,
        group_id: &'a GroupId,
        principal: Option<&'a str>,
    ) -> StoreFuture<'a, Result<Option<u64>, SubmitError>> {
        Box::pin(async move { Err(not_built("close_group").into()) })
    }
}
