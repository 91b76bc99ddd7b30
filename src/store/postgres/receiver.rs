//! The PostgreSQL backend of `ReceiverStore`.
#![allow(unused_variables, reason = "stubs until the port lands")]

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, oneshot};

use crate::rmp::group::GroupState;
use crate::rmp::replies::ReplyItem;
use crate::store::postgres::PostgresStore;
use crate::store::received::{
    Endpoints, InboxEntry, PendingCallback, Received, ReceivedMessage, SweepReport,
};
use crate::store::receiver::ReceiverStore;
use crate::store::time::millis;
use crate::store::{StoreError, StoreFuture};
use crate::wsr::{FaultCode, MessageKey, RefToMessageIds, Response};

fn not_built(what: &str) -> StoreError {
    StoreError::Failed(format!("PostgreSQL backend: {what} is not built yet"))
}

impl PostgresStore {
    /// Tells each held request whose message its stored group now counts as delivered.
    pub(in crate::store) async fn recheck_waiters(&self) -> Result<(), StoreError> {
        Err(not_built("recheck_waiters"))
    }

    pub(in crate::store) async fn fill_delivered(
        &self,
        channel: &str,
        groups: u64,
        per_group: u64,
        payload_bytes: usize,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        Err(not_built("prefill"))
    }
}

impl ReceiverStore for PostgresStore {
    fn receive<'a>(
        &'a self,
        message: ReceivedMessage,
    ) -> StoreFuture<'a, Result<Received, StoreError>> {
        Box::pin(async move { Err(not_built("receive").into()) })
    }

    fn sweep<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<SweepReport, StoreError>> {
        Box::pin(async move { Err(not_built("sweep").into()) })
    }

    fn watch_delivery(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()> {
        self.shared.watch(partner, key)
    }

    fn forget_watchers(&self, partner: &str, key: &MessageKey) {
        self.shared.forget(partner, key)
    }

    fn callbacks_due(&self) -> &Notify {
        &self.shared.callbacks_due
    }

    fn deadlines_changed(&self) -> &Notify {
        &self.shared.deadlines_changed
    }

    fn sweeper_sleeps_until(&self, wakeup: DateTime<Utc>) {
        self.shared
            .sweeper_wakeup
            .store(millis(wakeup), std::sync::atomic::Ordering::SeqCst);
    }

    fn group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
    ) -> StoreFuture<'a, Result<Option<GroupState>, StoreError>> {
        Box::pin(async move { Err(not_built("group").into()) })
    }

    fn groups<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<(String, GroupState)>, StoreError>> {
        Box::pin(async move { Err(not_built("groups").into()) })
    }

    fn inbox<'a>(
        &'a self,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<InboxEntry>, StoreError>> {
        Box::pin(async move { Err(not_built("inbox").into()) })
    }

    fn next_deadline<'a>(&'a self) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move { Err(not_built("next_deadline").into()) })
    }

    fn endpoints<'a>(
        &'a self,
        kind: Endpoints,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { Err(not_built("endpoints").into()) })
    }

    fn is_push_endpoint<'a>(&'a self, url: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Err(not_built("is_push_endpoint").into()) })
    }

    fn is_callback_endpoint<'a>(
        &'a self,
        partner: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Err(not_built("is_callback_endpoint").into()) })
    }

    fn add_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Err(not_built("add_endpoint").into()) })
    }

    fn remove_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Err(not_built("remove_endpoint").into()) })
    }

    fn callback_endpoints<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(async move { Err(not_built("callback_endpoints").into()) })
    }

    fn due_callbacks<'a>(
        &'a self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<PendingCallback>, StoreError>> {
        Box::pin(async move { Err(not_built("due_callbacks").into()) })
    }

    fn owe_callbacks<'a>(
        &'a self,
        partner: &'a str,
        endpoint: &'a str,
        soap12: bool,
        replies: &'a [ReplyItem],
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("owe_callbacks").into()) })
    }

    fn record_fault<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        code: FaultCode,
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("record_fault").into()) })
    }

    fn poll_answer<'a>(
        &'a self,
        partner: &'a str,
        refs: &'a [RefToMessageIds],
    ) -> StoreFuture<'a, Result<Option<Response>, StoreError>> {
        Box::pin(async move { Err(not_built("poll_answer").into()) })
    }

    fn next_callback_due<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move { Err(not_built("next_callback_due").into()) })
    }

    fn callbacks_sent<'a>(&'a self, ids: &'a [i64]) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("callbacks_sent").into()) })
    }

    fn callbacks_failed<'a>(
        &'a self,
        ids: &'a [i64],
        next: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(not_built("callbacks_failed").into()) })
    }
}
