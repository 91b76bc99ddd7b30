//! The receiver side's storage trait: storing received messages by the receive plan, the
//! ordered buffer's waiters, poll answers, the callback queue, registered endpoints, and the
//! reads of groups and the inbox. Every backend implements it; callers hold `Store`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, oneshot};

use super::error::StoreError;
use super::future::StoreFuture;
use super::received::{
    Endpoints, InboxEntry, InboxExcerpt, PendingCallback, Received, ReceivedMessage, SweepReport,
};
use crate::rmp::group::GroupState;
use crate::rmp::replies::ReplyItem;
use crate::wsr::{FaultCode, MessageKey, RefToMessageIds, Response};

/// A received request on its way to `ReceiverStore::receive`: read, being decided, not yet
/// handed to the store. While such requests exist, a group commit about to start may wait a
/// moment for their messages to join it (SQLite's writer: one `fsync` for all of them instead
/// of one per few). The token says so until `arrived` is called or it is dropped — whichever
/// comes first, on every way out of the request.
#[derive(Debug)]
pub struct Arriving {
    count: Option<Arc<AtomicUsize>>,
    arrived: AtomicBool,
}

impl Arriving {
    /// A request no commit waits for (a backend that does not batch this way).
    pub fn uncounted() -> Arriving {
        Arriving {
            count: None,
            arrived: AtomicBool::new(true),
        }
    }

    /// A request counted in `count` until it arrives.
    pub fn counted(count: &Arc<AtomicUsize>) -> Arriving {
        count.fetch_add(1, Ordering::Relaxed);
        Arriving {
            count: Some(count.clone()),
            arrived: AtomicBool::new(false),
        }
    }

    /// The request's message is about to be handed to the store — or none will be: no commit
    /// should wait for it any longer.
    pub fn arrived(&self) {
        if !self.arrived.swap(true, Ordering::Relaxed)
            && let Some(count) = &self.count
        {
            count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Arriving {
    fn drop(&mut self) {
        self.arrived();
    }
}

pub trait ReceiverStore: Send + Sync {
    /// A token for a received request from the moment it is read until its message is handed
    /// to `receive` (see `Arriving`).
    fn arriving(&self) -> Arriving {
        Arriving::uncounted()
    }

    /// Decides, stores and commits one reliable message; the verdict is durable when this
    /// returns.
    fn receive<'a>(
        &'a self,
        message: ReceivedMessage,
    ) -> StoreFuture<'a, Result<Received, StoreError>>;

    /// Applies every group deadline due at `now` (expiry, idle, abort, purge) and drops
    /// callback acks whose messages expired.
    fn sweep<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<SweepReport, StoreError>>;

    /// A receiver that fires when `partner`'s buffered message `key` is delivered. Register
    /// before submitting the message, so that a delivery in the very next commit is not
    /// missed.
    fn watch_delivery(&self, partner: &str, key: &MessageKey) -> oneshot::Receiver<()>;

    /// Forgets watchers that gave up (their receivers were dropped).
    fn forget_watchers(&self, partner: &str, key: &MessageKey);

    fn callbacks_due(&self) -> &Notify;

    fn deadlines_changed(&self) -> &Notify;

    /// The sweeper says when it will wake next; commits with an earlier deadline wake it.
    fn sweeper_sleeps_until(&self, wakeup: DateTime<Utc>);

    /// An operator's abort of `partner`'s open sequenced group `group_id` (a stuck ordered
    /// group, D7, `receive_plan::plan_abort`): its buffered messages discarded with
    /// `GroupAborted` owed to their senders, every later message `GroupAborted`. `false`: no
    /// such group, or it ended already.
    fn abort_group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// `partner`'s group `group_id` ("" for an anonymous caller's).
    fn group<'a>(
        &'a self,
        partner: &'a str,
        group_id: &'a str,
    ) -> StoreFuture<'a, Result<Option<GroupState>, StoreError>>;

    /// Groups with their partners, ordered by (partner, group id), after `after` (a
    /// (partner, group id) pair), at most `limit`.
    fn groups<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<(String, GroupState)>, StoreError>>;

    /// Delivered messages with offsets above `after`, oldest first.
    fn inbox<'a>(
        &'a self,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<InboxEntry>, StoreError>>;

    /// The delivered message at `offset` with the first `head` bytes of its payload and the
    /// payload's size, if it is in the inbox.
    fn inbox_excerpt<'a>(
        &'a self,
        offset: i64,
        head: usize,
    ) -> StoreFuture<'a, Result<Option<InboxExcerpt>, StoreError>>;

    /// The earliest group deadline, for the sweeper.
    fn next_deadline<'a>(&'a self) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>>;

    /// The registered endpoints of one kind.
    fn endpoints<'a>(&'a self, kind: Endpoints)
    -> StoreFuture<'a, Result<Vec<String>, StoreError>>;

    /// Whether `url` is a registered push webhook (the only URLs a push or notify POST may go
    /// to); callback endpoints are asked per partner with `is_callback_endpoint`.
    fn is_push_endpoint<'a>(&'a self, url: &'a str) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// Whether `principal` may aim a push subscription at `url`: it is registered for that
    /// principal, or for every principal (`*`).
    fn may_push_to<'a>(
        &'a self,
        principal: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// The push webhooks' grants as (principal, url), `*` for every principal.
    fn push_grants<'a>(&'a self) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>>;

    /// Whether `partner` ("" for an anonymous caller) may name `url` as a callback ReplyTo:
    /// a partner may name only the endpoints registered for it (D10, D14).
    fn is_callback_endpoint<'a>(
        &'a self,
        partner: &'a str,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// Registers an endpoint: a callback one for `partner` (`None`: for anonymous callers), or
    /// a push webhook for the principal `partner` names (`None`: for every principal, `*`);
    /// returns false if it was already registered so.
    fn add_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// Unregisters an endpoint: a callback one of `partner` (`None`: of anonymous callers); a
    /// push webhook's grant to the principal `partner` names (the webhook goes with its last
    /// grant), or (`None`) the webhook with all its grants.
    fn remove_endpoint<'a>(
        &'a self,
        kind: Endpoints,
        partner: Option<&'a str>,
        url: &'a str,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// The registered callback endpoints as (partner, url), "" for anonymous callers'.
    fn callback_endpoints<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Vec<(String, String)>, StoreError>>;

    /// Callback acks due at `now`, oldest first.
    fn due_callbacks<'a>(
        &'a self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<PendingCallback>, StoreError>>;

    /// Queues replies about `partner`'s messages for a callback endpoint outside the receive
    /// path (faults of messages refused on arrival, poll answers sent by callback).
    fn owe_callbacks<'a>(
        &'a self,
        partner: &'a str,
        endpoint: &'a str,
        soap12: bool,
        replies: &'a [ReplyItem],
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// Remembers the fault of `partner`'s message that left no group state, for its sender's
    /// polls.
    fn record_fault<'a>(
        &'a self,
        partner: &'a str,
        key: &'a MessageKey,
        code: FaultCode,
        expiry: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// The answer to `partner`'s PollRequest from stored state (D11); `None` when there is
    /// nothing to say. Only that partner's groups are read: a poll naming another partner's
    /// group is answered as for an unknown group (D14).
    ///
    /// Read after a barrier through the writer's queue: every message whose decision was
    /// queued before the poll arrived is committed first, so a sender polling after its
    /// message's ExpiryTime can take "nothing" as "not delivered". The reading itself stays
    /// outside the writer, so a large poll does not hold up deliveries.
    fn poll_answer<'a>(
        &'a self,
        partner: &'a str,
        refs: &'a [RefToMessageIds],
    ) -> StoreFuture<'a, Result<Option<Response>, StoreError>>;

    /// The earliest moment a callback is due.
    fn next_callback_due<'a>(
        &'a self,
    ) -> StoreFuture<'a, Result<Option<DateTime<Utc>>, StoreError>>;

    /// The acks were POSTed: forget them.
    fn callbacks_sent<'a>(&'a self, ids: &'a [i64]) -> StoreFuture<'a, Result<(), StoreError>>;

    /// The POST failed: try again at `next`, or drop those whose messages expired before then.
    fn callbacks_failed<'a>(
        &'a self,
        ids: &'a [i64],
        next: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_as_arriving_until_it_arrives_or_is_dropped_and_only_once() {
        let count = Arc::new(AtomicUsize::new(0));
        let handed_over = Arriving::counted(&count);
        let refused = Arriving::counted(&count);
        assert_eq!(count.load(Ordering::Relaxed), 2);
        handed_over.arrived();
        handed_over.arrived();
        assert_eq!(count.load(Ordering::Relaxed), 1);
        drop(handed_over);
        assert_eq!(
            count.load(Ordering::Relaxed),
            1,
            "arrived already: not counted again"
        );
        drop(refused);
        assert_eq!(
            count.load(Ordering::Relaxed),
            0,
            "a way out without arriving"
        );
        Arriving::uncounted().arrived();
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }
}
