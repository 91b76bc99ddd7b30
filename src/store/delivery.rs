//! The delivery store (DESIGN §5, §7): what delivery to applications needs from storage —
//! subscriptions and their cursors, grants, consumer sessions, one lease per (subscription,
//! message), group heads and affinity, dead letters — as one dyn-compatible trait speaking in
//! the rows below. The decisions are pure (`delivery::lease`, `pick`, `group`, `session`,
//! `settle`, `wake`); a backend reads their inputs and writes their results, each operation
//! in one transaction. `store::sqlite::delivery` is the SQLite backend.
//!
//! A subscription's deliveries are created lazily: a fetch first matches the inbox beyond the
//! subscription's cursor against its filter. Ingest never pays for subscriptions.

use chrono::{DateTime, Duration, Utc};
use tokio::sync::watch;

use super::{InboxEntry, StoreError, StoreFuture};
use crate::delivery::access::{self, Held};
use crate::delivery::lease::{Outcome, Stale};
use crate::delivery::receipt::Receipt;
use crate::delivery::subscription::{Mode, Rules, Spec};
pub use crate::delivery::wake::Deadlines;

/// One subscription as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub id: i64,
    /// A plain name, or `$share/{share}/{filter}`.
    pub name: String,
    pub filter: String,
    pub owner: String,
    pub rules: Rules,
    pub grants: Vec<String>,
    pub created_at: DateTime<Utc>,
}

impl Subscription {
    /// Whether `principal` may join it, fetch from it and settle its deliveries.
    pub fn admits(&self, principal: &str) -> bool {
        access::admits(&self.held(), principal)
    }

    /// What access to it depends on, for `delivery::access`.
    pub fn held(&self) -> Held<'_> {
        Held {
            owner: &self.owner,
            grants: &self.grants,
            filter: &self.filter,
            push: matches!(self.rules.mode, Mode::Push { .. }),
        }
    }
}

/// A consumer session (a member of a subscription).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub subscription_id: i64,
    pub principal: String,
    pub ttl: Duration,
    pub expires_at: DateTime<Utc>,
}

/// One message handed to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    pub receipt: Receipt,
    /// When the lease ends; `None` in settle mode `settled` (nothing to settle).
    pub deadline: Option<DateTime<Utc>>,
    pub message: InboxEntry,
}

/// A dead-lettered message of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub offset: i64,
    pub reason: String,
    pub attempts: u32,
    pub message: Option<InboxEntry>,
}

/// How many of a subscription's matched messages are in each state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Waiting for a member (including those in a backoff delay).
    pub waiting: u64,
    /// Leased to a member.
    pub in_flight: u64,
    pub dead_letters: u64,
    /// Inbox messages not yet matched against the filter (the next fetch does).
    pub unmatched: u64,
    /// Sessions of its members (lapsed ones until housekeeping removes them).
    pub members: u64,
}

/// What a maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    pub sessions_lapsed: usize,
    pub leases_lapsed: usize,
    pub subscriptions_removed: usize,
    pub inbox_purged: u64,
}

/// Why a delivery operation was refused (nothing of it applied), or the store failed.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A settle or extend that names an attempt which is not the live one.
    #[error(transparent)]
    Stale(#[from] Stale),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The stored rules of subscription `id` (`None`: there is none) with its push paused or
/// resumed, as stored again — one decision for both backends' `set_push_paused`.
pub(in crate::store) fn rules_paused(
    id: i64,
    stored: Option<String>,
    paused: bool,
) -> Result<String, DeliveryError> {
    let stored = stored.ok_or_else(|| DeliveryError::NotFound(format!("no subscription {id}")))?;
    let rules: crate::delivery::subscription::Rules = serde_json::from_str(&stored)
        .map_err(|e| StoreError::Corrupt(format!("subscription {id}'s rules: {e}")))?;
    let rules = rules
        .with_push_paused(paused)
        .map_err(DeliveryError::Conflict)?;
    serde_json::to_string(&rules)
        .map_err(|e| DeliveryError::Store(StoreError::Corrupt(format!("rules: {e}"))))
}

/// What to do with dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterChange {
    Replay,
    Purge,
}

impl DeadLetterChange {
    /// Its name in the audit trail.
    pub fn action(self) -> &'static str {
        match self {
            DeadLetterChange::Replay => "replay_dead_letters",
            DeadLetterChange::Purge => "purge_dead_letters",
        }
    }
}

/// One settle of a batch: the receipt and the outcome (`None`: the default outcome).
/// A settle: the attempt, its outcome (`None`: the subscription's default) and who settled
/// and why — the principal, or the push endpoint and what it answered — which a dead
/// letter's reason names.
pub type Settlement = (Receipt, Option<Outcome>, Option<String>);

/// Storage for delivery to applications. Every write is one transaction that decides on the
/// rows it reads inside it; a refusal (not found, conflict, stale receipt) changes nothing.
/// A commit that changes the delivery state wakes `delivery_changes`; one that appends inbox
/// messages wakes `inbox_appends`.
pub trait DeliveryStore: Send + Sync {
    /// Wakes when the delivery state changed: releases, lapsed leases, settles that free a
    /// group, sessions, subscriptions created or deleted. Not for inbox appends (a commit a
    /// millisecond under load), which only fetchers wait for.
    fn delivery_changes(&self) -> watch::Receiver<u64>;

    /// Wakes when inbox messages were appended (received or released from the buffer).
    fn inbox_appends(&self) -> watch::Receiver<u64>;

    /// The secret receipts are signed with, created on first use and kept so that receipts
    /// stay valid across restarts.
    fn receipt_secret(&self) -> StoreFuture<'_, Result<Vec<u8>, StoreError>>;

    /// Creates a subscription, or returns the existing one when its owner asks again with the
    /// same rules (`false`: not newly created). Another principal naming it gets a conflict.
    fn create_subscription<'a>(
        &'a self,
        spec: &'a Spec,
        owner: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(Subscription, bool), DeliveryError>>;

    fn subscription(&self, id: i64) -> StoreFuture<'_, Result<Option<Subscription>, StoreError>>;

    fn subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>>;

    /// The subscriptions whose member is the gateway's push worker.
    fn push_subscriptions(&self) -> StoreFuture<'_, Result<Vec<Subscription>, StoreError>> {
        Box::pin(async move {
            Ok(self
                .subscriptions()
                .await?
                .into_iter()
                .filter(|s| matches!(s.rules.mode, Mode::Push { .. }))
                .collect())
        })
    }

    /// Deletes a subscription with its sessions, leases and dead letters.
    /// Pauses (or resumes) push subscription `id`: its rules say so, and the push
    /// supervisor stops (starts) its worker. `NotFound` for no such subscription, `Conflict`
    /// for a pull one.
    fn set_push_paused(&self, id: i64, paused: bool) -> StoreFuture<'_, Result<(), DeliveryError>>;

    fn delete_subscription(&self, id: i64) -> StoreFuture<'_, Result<bool, DeliveryError>>;

    fn grant<'a>(&'a self, id: i64, principal: &'a str) -> StoreFuture<'a, Result<(), StoreError>>;

    /// Withdraws a grant; the principal's sessions on the subscription end with it (what they
    /// held goes back to the others at once).
    fn revoke<'a>(
        &'a self,
        id: i64,
        principal: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>>;

    /// Starts a consumer session (a member) on a subscription. A session id reused first
    /// gives up what it held.
    fn join<'a>(
        &'a self,
        subscription_id: i64,
        session_id: &'a str,
        principal: &'a str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Session, DeliveryError>>;

    /// The live session `id`, if any.
    fn session<'a>(
        &'a self,
        id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<Session>, StoreError>>;

    /// The live session `id` and its subscription, as a member's request checks them
    /// before it acts: read together where the backend can (a read is a round trip).
    fn member<'a>(
        &'a self,
        id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<(Session, Subscription)>, StoreError>> {
        Box::pin(async move {
            let Some(session) = self.session(id, now).await? else {
                return Ok(None);
            };
            let subscription = self.subscription(session.subscription_id).await?;
            Ok(subscription.map(|sub| (session, sub)))
        })
    }

    /// Renews a live session by its TTL; the new expiry.
    fn heartbeat<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>>;

    /// Ends a session: what it held goes back to the other members at once.
    fn leave<'a>(
        &'a self,
        session_id: &'a str,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<bool, DeliveryError>>;

    /// Hands messages to the session's member, as many as `take` allows: renews the session,
    /// lapses what is overdue, matches new inbox messages, picks and leases.
    fn fetch<'a>(
        &'a self,
        session_id: &'a str,
        take: crate::delivery::fetch::Take,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Handed>, DeliveryError>>;

    /// Settles the attempt a receipt names; `None` settles with the default outcome.
    fn settle<'a>(
        &'a self,
        receipt: &'a Receipt,
        outcome: Option<Outcome>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), DeliveryError>> {
        self.settle_by(receipt, outcome, None, now)
    }

    /// `settle`, saying who settled and why (`Settlement`).
    fn settle_by<'a>(
        &'a self,
        receipt: &'a Receipt,
        outcome: Option<Outcome>,
        by: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let one = [(receipt.clone(), outcome, by)];
            let mut results = self.settle_many(&one, now).await?;
            results.pop().unwrap_or(Ok(()))
        })
    }

    /// Settles several attempts in one transaction; each gets its own answer (a stale or
    /// unknown receipt refuses that settlement alone). The outer error: nothing was settled.
    fn settle_many<'a>(
        &'a self,
        settlements: &'a [Settlement],
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<Result<(), DeliveryError>>, DeliveryError>>;

    /// Extends the live attempt a receipt names by one ack-wait; the confirmed new deadline.
    fn extend<'a>(
        &'a self,
        receipt: &'a Receipt,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<DateTime<Utc>, DeliveryError>>;

    /// Dead letters of a subscription with offsets above `after`, oldest first.
    fn dead_letters(
        &self,
        subscription_id: i64,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'_, Result<Vec<DeadLetter>, StoreError>>;

    /// Replays dead letters (back in the subscription as new: their failure count starts
    /// over) or purges them for good: all of the subscription's, or those at `offsets`.
    fn change_dead_letters<'a>(
        &'a self,
        subscription_id: i64,
        offsets: Option<&'a [i64]>,
        change: DeadLetterChange,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<u64, DeliveryError>>;

    /// What is overdue at `now`: lapsed sessions give back what they held, lapsed leases count
    /// as failed attempts, ephemeral subscriptions without members for `grace` are removed,
    /// and inbox messages no subscription needs any more are purged once older than
    /// `retention`.
    fn maintain_deliveries(
        &self,
        now: DateTime<Utc>,
        grace: Duration,
        retention: Duration,
    ) -> StoreFuture<'_, Result<Maintenance, DeliveryError>>;

    fn backlog(&self, subscription_id: i64) -> StoreFuture<'_, Result<Backlog, StoreError>>;

    /// The sessions a subscription has (lapsed ones until housekeeping removes them): what
    /// its cap counts, without the backlog's counts of messages.
    fn session_count(&self, subscription_id: i64) -> StoreFuture<'_, Result<u64, StoreError>>;

    /// The earliest time-driven changes after `now`, in one subscription (`Some`: backoffs,
    /// leases and sessions of it) or in all (`None`: leases, sessions, idle ephemeral
    /// subscriptions and the oldest inbox message).
    fn delivery_deadlines(
        &self,
        subscription_id: Option<i64>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Deadlines, StoreError>>;
}

/// `DeliveryStore` stays dyn-compatible: the facade holds any backend behind `dyn`.
const _: Option<&dyn DeliveryStore> = None;
