//! The backend trait: the three storage traits and the lifecycle operations. It must never
//! carry a test hook or a benchmark fixture (`test_hooks.rs`, `prefill.rs`): every backend
//! implements it and the running gateway calls all of it.

use chrono::{DateTime, Utc};

use super::console::ConsoleStore;
use super::delivery::DeliveryStore;
use super::error::StoreError;
use super::exchange::ExchangeStore;
use super::future::StoreFuture;
use super::nonces::NonceStore;
use super::outbound::OutboundStore;
use super::overview::{InboxFilter, InboxPage, Member, Rates, Traffic};
use super::receiver::ReceiverStore;
use super::stats::StoreStats;
use super::traces::TraceStore;
use crate::rmp::group::Policy;

/// A storage backend: the three storage traits and the lifecycle operations. `Store` holds
/// one as `Arc<dyn Backend>`.
pub trait Backend:
    ReceiverStore
    + DeliveryStore
    + OutboundStore
    + ExchangeStore
    + ConsoleStore
    + NonceStore
    + TraceStore
{
    fn policy(&self) -> &Policy;

    /// This gateway among those sharing the database ("" when it is the only one, as on a
    /// SQLite file): part of the ids of the members it runs itself (push workers), so that
    /// two gateways' workers on one subscription are two members, not one they fight over.
    fn gateway_id(&self) -> &str;

    /// Whether the store can commit now (`/readyz`): `Err(reason)` while the writer is gone
    /// or its commits fail. Without a recent successful commit, a small write goes through the
    /// writer to find out, at most once per `PROBE_EVERY` however often this is asked.
    fn readiness<'a>(&'a self) -> StoreFuture<'a, Result<(), String>>;

    /// A barrier through the writer's queue: returns once everything queued before it has
    /// been committed (or failed). Shutdown flushes the writer with it.
    fn flush<'a>(&'a self) -> StoreFuture<'a, Result<(), StoreError>>;

    /// What the store holds now, counted (`/metrics`' gauges): the same answer on every
    /// gateway sharing the database.
    fn stats<'a>(&'a self) -> StoreFuture<'a, Result<StoreStats, StoreError>>;

    /// The console's overview: what reached the inbox since `since` and what waits, by
    /// channel and partner; what we send, by partner (`overview::read_traffic!`).
    fn traffic<'a>(&'a self, since: DateTime<Utc>) -> StoreFuture<'a, Result<Traffic, StoreError>>;

    /// The console's rates over time: per minute of the last hour up to `now`, what was
    /// received, sent, and ended acked, failed or faulted (`overview::read_rates!`).
    fn rates<'a>(&'a self, now: DateTime<Utc>) -> StoreFuture<'a, Result<Rates, StoreError>>;

    /// The live members (sessions) of a subscription at `now`, at most `limit`, the
    /// longest-lived first.
    fn members<'a>(
        &'a self,
        subscription_id: i64,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<Member>, StoreError>>;

    /// Delivered messages after `after` that `filter` keeps, oldest first: a page of at most
    /// `limit`, having looked through at most `overview::SEARCH_SPAN` offsets.
    fn search_inbox<'a>(
        &'a self,
        filter: &'a InboxFilter,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<InboxPage, StoreError>>;
}
