//! Stored state of delivery to applications (DESIGN §5): subscriptions and their cursors,
//! grants, consumer sessions, one lease per (subscription, message), group affinity, dead
//! letters and inbox retention. The decisions are `delivery::lease` and `delivery::pick`;
//! this file loads their inputs and saves their results, each operation in one transaction.
//!
//! A subscription's deliveries are created lazily: a fetch first matches the inbox beyond the
//! subscription's cursor against its filter. Ingest never pays for subscriptions.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Duration, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnection, SqliteRow};

use super::sqlite::SqliteStore;
use super::sqlite::group_json::{from_millis, millis};
use super::{InboxEntry, StoreError};
use crate::delivery::filter::Filter;
use crate::delivery::lease::{Lease, Outcome, Policy, Stale, State};
use crate::delivery::pick::{Candidate, Members, pick};
use crate::delivery::receipt::Receipt;
use crate::delivery::subscription::{Ordering, Rules, SettleMode, Spec, Start};

/// Inbox messages matched against one subscription's filter per pass.
const MATCH_BATCH: i64 = 2_000;

/// Pages of candidates one fetch looks through at most.
const CANDIDATE_PAGES: usize = 8;

/// `SELECT` of a subscription row (as `with_grants` reads it) followed by `$rest`.
macro_rules! select_subscription {
    ($rest:literal) => {
        concat!(
            "SELECT id, name, filter, owner, rules, created_at FROM subscriptions ",
            $rest
        )
    };
}

/// `SELECT` of lease rows followed by `$rest`: `lease_from_row` reads columns 0..=7; 8 is the
/// group, 9 the group's affinity where a query joins it, 10 the subscription.
macro_rules! select_lease {
    ($rest:literal) => {
        concat!(
            "SELECT offset, state, attempt, failures, consumer, due, avoid, reason, group_key, \
             NULL, subscription_id FROM deliveries ",
            $rest
        )
    };
}

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
        self.owner == principal || self.grants.iter().any(|g| g == principal)
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
}

/// What a maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    pub sessions_lapsed: usize,
    pub leases_lapsed: usize,
    pub subscriptions_removed: usize,
    pub inbox_purged: u64,
}

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

impl From<sqlx::Error> for DeliveryError {
    fn from(e: sqlx::Error) -> DeliveryError {
        DeliveryError::Store(StoreError::from(e))
    }
}

/// What to do with dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterChange {
    Replay,
    Purge,
}

impl SqliteStore {
    /// Wakes when subscriptions may have something new to hand out.
    pub fn delivery_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.deliveries_changed.subscribe()
    }

    /// The secret receipts are signed with, created on first use and kept so that receipts
    /// stay valid across restarts.
    pub async fn receipt_secret(&self) -> Result<Vec<u8>, StoreError> {
        let mut fresh = [0u8; 32];
        aws_lc_rs::rand::fill(&mut fresh)
            .map_err(|_| StoreError::Failed("no randomness for the receipt key".into()))?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let conn = &mut *tx;
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ('receipt_key', ?) ON CONFLICT DO NOTHING",
        )
        .bind(&fresh[..])
        .execute(&mut *conn)
        .await?;
        let secret: Vec<u8> =
            sqlx::query_scalar("SELECT value FROM settings WHERE key = 'receipt_key'")
                .fetch_one(&mut *conn)
                .await?;
        tx.commit().await?;
        Ok(secret)
    }

    /// Creates a subscription, or returns the existing one when its owner asks again with the
    /// same rules (`false`: not newly created). The identity of a subscription belongs to its
    /// owner: another principal naming it gets a conflict, never a way in.
    pub async fn create_subscription(
        &self,
        spec: &Spec,
        owner: &str,
        now: DateTime<Utc>,
    ) -> Result<(Subscription, bool), DeliveryError> {
        let name = spec.id.to_string();
        let (spec, owner) = (spec.clone(), owner.to_owned());
        self.in_writer(move |conn| {
            Box::pin(async move {
        if let Some(existing) = subscription_by_name(&mut *conn, &name).await? {
            if existing.owner != owner {
                return Err(DeliveryError::Conflict(format!(
                    "subscription {name:?} belongs to another application"
                )));
            }
            if existing.rules != spec.rules || existing.filter != spec.id.filter().as_str() {
                return Err(DeliveryError::Conflict(format!(
                    "subscription {name:?} exists with other rules; delete it first"
                )));
            }
            return Ok(((existing, false), false));
        }
        let cursor: i64 = match spec.start {
            Start::Oldest => 0,
            Start::New => {
                sqlx::query_scalar("SELECT COALESCE(MAX(offset), 0) FROM inbox")
                    .fetch_one(&mut *conn)
                    .await?
            }
        };
        let rules = serde_json::to_string(&spec.rules)
            .map_err(|e| StoreError::Failed(format!("cannot encode rules: {e}")))?;
        sqlx::query(
            "INSERT INTO subscriptions (name, filter, owner, rules, cursor, created_at, idle_since) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&name)
        .bind(spec.id.filter().as_str())
        .bind(&owner)
        .bind(rules)
        .bind(cursor)
        .bind(millis(now))
        .bind((!spec.rules.durable).then_some(millis(now)))
        .execute(&mut *conn)
        .await?;
        let created = subscription_by_name(&mut *conn, &name)
            .await?
            .ok_or_else(|| StoreError::Failed("the new subscription vanished".into()))?;
        Ok(((created, true), false))
            })
        })
        .await
    }

    pub async fn subscription(&self, id: i64) -> Result<Option<Subscription>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        subscription_by_id(&mut conn, id).await
    }

    pub async fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(select_subscription!("ORDER BY id"))
            .fetch_all(&mut *conn)
            .await?;
        let mut subs = Vec::with_capacity(rows.len());
        for row in &rows {
            subs.push(with_grants(&mut conn, row).await?);
        }
        Ok(subs)
    }

    /// Deletes a subscription with its sessions, leases and dead letters.
    pub async fn delete_subscription(&self, id: i64) -> Result<bool, DeliveryError> {
        self.in_writer(move |conn| {
            Box::pin(async move { Ok((remove_subscription(conn, id).await?, false)) })
        })
        .await
    }

    pub async fn grant(&self, id: i64, principal: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO grants (subscription_id, principal) VALUES (?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(principal)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Withdraws a grant; the principal's sessions on the subscription end with it (what they
    /// held goes back to the others at once).
    pub async fn revoke(
        &self,
        id: i64,
        principal: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, DeliveryError> {
        let principal = principal.to_owned();
        self.in_writer(move |conn| {
            Box::pin(async move {
                let done =
                    sqlx::query("DELETE FROM grants WHERE subscription_id = ? AND principal = ?")
                        .bind(id)
                        .bind(&principal)
                        .execute(&mut *conn)
                        .await?;
                let sessions: Vec<String> = sqlx::query_scalar(
                    "SELECT id FROM sessions WHERE subscription_id = ? AND principal = ?",
                )
                .bind(id)
                .bind(&principal)
                .fetch_all(&mut *conn)
                .await?;
                for session in &sessions {
                    end_session(conn, session, now).await?;
                }
                Ok((done.rows_affected() == 1, !sessions.is_empty()))
            })
        })
        .await
    }

    /// Starts a consumer session (a member) on a subscription.
    pub async fn join(
        &self,
        subscription_id: i64,
        session_id: &str,
        principal: &str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<Session, DeliveryError> {
        let expires_at = now + ttl;
        let (session_id, principal) = (session_id.to_owned(), principal.to_owned());
        self.in_writer(move |conn| {
            Box::pin(async move {
                // Checked here, in the writer: a subscription deleted meanwhile gets no member.
                let exists: Option<i64> =
                    sqlx::query_scalar("SELECT 1 FROM subscriptions WHERE id = ?")
                        .bind(subscription_id)
                        .fetch_optional(&mut *conn)
                        .await?;
                if exists.is_none() {
                    return Err(DeliveryError::NotFound(format!(
                        "no subscription {subscription_id}"
                    )));
                }
                // A session id reused (a push worker restarting) first gives up what it held.
                end_session(&mut *conn, &session_id, now).await?;
                sqlx::query(
                    "INSERT INTO sessions (id, subscription_id, principal, ttl_ms, expires_at) \
             VALUES (?, ?, ?, ?, ?)",
                )
                .bind(&session_id)
                .bind(subscription_id)
                .bind(&principal)
                .bind(ttl.num_milliseconds())
                .bind(millis(expires_at))
                .execute(&mut *conn)
                .await?;
                sqlx::query("UPDATE subscriptions SET idle_since = NULL WHERE id = ?")
                    .bind(subscription_id)
                    .execute(&mut *conn)
                    .await?;
                let session = Session {
                    id: session_id,
                    subscription_id,
                    principal,
                    ttl,
                    expires_at,
                };
                // A new member may take what others were kept from.
                Ok((session, true))
            })
        })
        .await
    }

    /// The live session `id`, if any.
    pub async fn session(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Session>, StoreError> {
        let row = sqlx::query(
            "SELECT id, subscription_id, principal, ttl_ms, expires_at FROM sessions \
             WHERE id = ? AND expires_at >= ?",
        )
        .bind(id)
        .bind(millis(now))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(session_from_row))
    }

    /// Renews a live session by its TTL.
    pub async fn heartbeat(
        &self,
        session_id: &str,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, DeliveryError> {
        let session_id = session_id.to_owned();
        self.in_writer(move |conn| {
            Box::pin(async move { Ok((renew(conn, &session_id, now).await?, false)) })
        })
        .await
    }

    /// Ends a session: what it held goes back to the other members at once.
    pub async fn leave(&self, session_id: &str, now: DateTime<Utc>) -> Result<bool, DeliveryError> {
        let session_id = session_id.to_owned();
        self.in_writer(move |conn| {
            Box::pin(async move { Ok((end_session(conn, &session_id, now).await?, true)) })
        })
        .await
    }

    /// Hands up to `max` messages to the session's member: renews the session, lapses what is
    /// overdue in its subscription, matches new inbox messages, picks and leases.
    pub async fn fetch(
        &self,
        session_id: &str,
        max: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<Handed>, DeliveryError> {
        let session_id = session_id.to_owned();
        self.in_writer(move |conn| Box::pin(fetch_in(conn, session_id, max, now)))
            .await
    }

    /// Settles the attempt a receipt names; `None` settles with the default outcome.
    pub async fn settle(
        &self,
        receipt: &Receipt,
        outcome: Option<Outcome>,
        now: DateTime<Utc>,
    ) -> Result<(), DeliveryError> {
        let mut results = self.settle_many(&[(receipt.clone(), outcome)], now).await?;
        results.pop().unwrap_or(Ok(()))
    }

    /// Settles several attempts in one transaction; each gets its own answer (a stale or
    /// unknown receipt refuses that settlement alone). The outer error: nothing was settled.
    pub async fn settle_many(
        &self,
        settlements: &[(Receipt, Option<Outcome>)],
        now: DateTime<Utc>,
    ) -> Result<Vec<Result<(), DeliveryError>>, DeliveryError> {
        let settlements = settlements.to_vec();
        self.in_writer(move |conn| Box::pin(settle_in(conn, settlements, now)))
            .await
    }

    /// Extends the live attempt a receipt names by one ack-wait; the confirmed new deadline.
    pub async fn extend(
        &self,
        receipt: &Receipt,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, DeliveryError> {
        let receipt = receipt.clone();
        self.in_writer(move |conn| {
            Box::pin(async move {
                let (sub, mut lease) = leased(conn, &receipt, &mut HashMap::new()).await?;
                let deadline =
                    lease.extend(receipt.attempt, &receipt.consumer, now, &sub.rules.policy())?;
                save_lease(conn, sub.id, receipt.offset, &lease, now).await?;
                Ok((deadline, false))
            })
        })
        .await
    }

    /// Dead letters of a subscription with offsets above `after`, oldest first.
    pub async fn dead_letters(
        &self,
        subscription_id: i64,
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(
            "SELECT offset, reason, attempt FROM deliveries WHERE subscription_id = ? \
             AND state = 'dead' AND offset > ? ORDER BY offset LIMIT ?",
        )
        .bind(subscription_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
        let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let mut messages = inbox_entries(&mut conn, &offsets).await?;
        Ok(rows
            .iter()
            .map(|row| {
                let offset: i64 = row.get(0);
                DeadLetter {
                    offset,
                    reason: row.get::<Option<String>, _>(1).unwrap_or_default(),
                    attempts: row.get::<i64, _>(2) as u32,
                    message: messages.remove(&offset),
                }
            })
            .collect())
    }

    /// Replays dead letters (back in the subscription as new: their failure count starts
    /// over) or purges them for good: all of the subscription's, or those at `offsets`.
    pub async fn change_dead_letters(
        &self,
        subscription_id: i64,
        offsets: Option<&[i64]>,
        change: DeadLetterChange,
        now: DateTime<Utc>,
    ) -> Result<u64, DeliveryError> {
        // ?2: one offset, or NULL for all of them.
        let sql = match change {
            DeadLetterChange::Replay => {
                "UPDATE deliveries SET state = 'available', failures = 0, consumer = NULL, \
                 due = ?3, avoid = '[]', reason = NULL \
                 WHERE subscription_id = ?1 AND state = 'dead' AND (?2 IS NULL OR offset = ?2)"
            }
            DeadLetterChange::Purge => {
                "UPDATE deliveries SET state = 'done', due = ?3 \
                 WHERE subscription_id = ?1 AND state = 'dead' AND (?2 IS NULL OR offset = ?2)"
            }
        };
        let targets: Vec<Option<i64>> = match offsets {
            None => vec![None],
            Some(offsets) => offsets.iter().copied().map(Some).collect(),
        };
        self.in_writer(move |conn| {
            Box::pin(async move {
                let mut changed = 0;
                for offset in targets {
                    changed += sqlx::query(sql)
                        .bind(subscription_id)
                        .bind(offset)
                        .bind(millis(now))
                        .execute(&mut *conn)
                        .await?
                        .rows_affected();
                    if change == DeadLetterChange::Replay {
                        // A replayed message of a group may come before the group's head.
                        sqlx::query(
                            "INSERT INTO group_heads (subscription_id, group_key, head) \
                             SELECT subscription_id, group_key, offset FROM deliveries \
                             WHERE subscription_id = ?1 AND group_key IS NOT NULL \
                             AND state = 'available' AND due = ?3 AND failures = 0 \
                             AND (?2 IS NULL OR offset = ?2) \
                             ON CONFLICT DO UPDATE SET head = MIN(head, excluded.head)",
                        )
                        .bind(subscription_id)
                        .bind(offset)
                        .bind(millis(now))
                        .execute(&mut *conn)
                        .await?;
                    }
                }
                // Replayed messages wait for members again.
                let wakes = matches!(change, DeadLetterChange::Replay) && changed > 0;
                Ok((changed, wakes))
            })
        })
        .await
    }

    /// What is overdue at `now`: lapsed sessions give back what they held, lapsed leases count
    /// as failed attempts, ephemeral subscriptions without members for `grace` are removed,
    /// and inbox messages no subscription needs any more are purged once older than
    /// `retention`.
    pub async fn maintain_deliveries(
        &self,
        now: DateTime<Utc>,
        grace: Duration,
        retention: Duration,
    ) -> Result<Maintenance, DeliveryError> {
        self.in_writer(move |conn| Box::pin(maintain_in(conn, now, grace, retention)))
            .await
    }

    pub async fn backlog(&self, subscription_id: i64) -> Result<Backlog, StoreError> {
        let row = sqlx::query(
            "SELECT \
             (SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = 'available'), \
             (SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = 'acquired'), \
             (SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = 'dead'), \
             (SELECT COUNT(*) FROM inbox WHERE offset > \
                (SELECT cursor FROM subscriptions WHERE id = ?1))",
        )
        .bind(subscription_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            waiting: row.get::<i64, _>(0) as u64,
            in_flight: row.get::<i64, _>(1) as u64,
            dead_letters: row.get::<i64, _>(2) as u64,
            unmatched: row.get::<i64, _>(3) as u64,
        })
    }

    pub async fn push_subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        Ok(self
            .subscriptions()
            .await?
            .into_iter()
            .filter(|s| {
                matches!(
                    s.rules.mode,
                    crate::delivery::subscription::Mode::Push { .. }
                )
            })
            .collect())
    }
}

/// The body of `Store::maintain_deliveries`, in the writer's transaction.
async fn maintain_in(
    conn: &mut SqliteConnection,
    now: DateTime<Utc>,
    grace: Duration,
    retention: Duration,
) -> Result<(Maintenance, bool), DeliveryError> {
    let mut report = Maintenance {
        sessions_lapsed: lapse_sessions(&mut *conn, now).await?,
        leases_lapsed: lapse_leases(&mut *conn, None, now, &mut HashMap::new()).await?,
        ..Maintenance::default()
    };
    let abandoned: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM subscriptions WHERE idle_since IS NOT NULL AND idle_since < ?",
    )
    .bind(millis(now - grace))
    .fetch_all(&mut *conn)
    .await?;
    for id in abandoned {
        remove_subscription(&mut *conn, id).await?;
        report.subscriptions_removed += 1;
    }
    // Needed: beyond some subscription's cursor (not yet matched), or leased, waiting or
    // dead-lettered in one. Purged once no longer needed and both its arrival and its last
    // settling are older than the retention. Walked by arrival (the received_at index): by
    // offset it would scan the whole inbox on every pass.
    report.inbox_purged = sqlx::query(
        "DELETE FROM inbox WHERE offset IN (SELECT offset FROM inbox WHERE received_at < ?1 \
             AND offset <= (SELECT COALESCE(MIN(cursor), 9223372036854775807) FROM subscriptions) \
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.offset = inbox.offset \
                             AND (d.state != 'done' OR d.due >= ?1)) \
             ORDER BY received_at LIMIT 10000)",
    )
    .bind(millis(now - retention))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if report.inbox_purged > 0 {
        sqlx::query(
            "DELETE FROM deliveries WHERE state = 'done' AND NOT EXISTS \
                 (SELECT 1 FROM inbox WHERE inbox.offset = deliveries.offset)",
        )
        .execute(&mut *conn)
        .await?;
        // A group keeps its member while any of its messages is retained.
        sqlx::query(
            "DELETE FROM group_affinity WHERE NOT EXISTS (SELECT 1 FROM deliveries d \
             WHERE d.subscription_id = group_affinity.subscription_id \
             AND d.group_key = group_affinity.group_key)",
        )
        .execute(&mut *conn)
        .await?;
    }
    let wakes = report.sessions_lapsed + report.leases_lapsed > 0;
    Ok((report, wakes))
}

/// The body of `Store::settle_many`, in the writer's transaction: the leases are read with
/// one statement and written with one per subscription; settlements apply in order (the same
/// receipt twice counts once).
async fn settle_in(
    conn: &mut SqliteConnection,
    settlements: Vec<(Receipt, Option<Outcome>)>,
    now: DateTime<Utc>,
) -> Result<(Vec<Result<(), DeliveryError>>, bool), DeliveryError> {
    let not_found = || DeliveryError::NotFound("no such delivery".into());
    let keys: Vec<serde_json::Value> = settlements
        .iter()
        .filter_map(|(r, _)| {
            let sub: i64 = r.subscription.parse().ok()?;
            Some(serde_json::json!([sub, r.offset]))
        })
        .collect();
    // CROSS JOIN keeps the receipts as the outer loop: one primary-key probe each.
    let rows = sqlx::query(
        "SELECT d.offset, d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, d.reason, \
         d.group_key, NULL, d.subscription_id FROM json_each(?) AS j CROSS JOIN deliveries AS d \
         ON d.subscription_id = j.value->>0 AND d.offset = j.value->>1",
    )
    .bind(serde_json::Value::Array(keys).to_string())
    .fetch_all(&mut *conn)
    .await?;
    let mut leases: HashMap<(i64, i64), Lease> = HashMap::new();
    for row in &rows {
        leases.insert((row.get(10), row.get(0)), lease_from_row(row)?);
    }
    let mut subs: HashMap<i64, Option<Subscription>> = HashMap::new();
    let mut changed: Vec<(i64, i64)> = Vec::new();
    let mut results = Vec::with_capacity(settlements.len());
    let mut wakes = false;
    for (receipt, outcome) in &settlements {
        let Ok(sub_id) = receipt.subscription.parse::<i64>() else {
            results.push(Err(not_found()));
            continue;
        };
        let sub = match subs.entry(sub_id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(subscription_by_id(conn, sub_id).await?),
        };
        let (Some(sub), Some(lease)) = (sub.as_ref(), leases.get_mut(&(sub_id, receipt.offset)))
        else {
            results.push(Err(not_found()));
            continue;
        };
        let outcome = outcome
            .clone()
            .unwrap_or_else(|| sub.rules.default_outcome.outcome());
        let policy = sub.rules.policy();
        match lease.settle(receipt.attempt, &receipt.consumer, outcome, now, &policy) {
            Ok(()) => {
                // Back in the subscription, or the group's next is free.
                wakes |= matches!(lease.state, State::Available { .. })
                    || sub.rules.ordering == Ordering::Group;
                changed.push((sub_id, receipt.offset));
                results.push(Ok(()));
            }
            Err(stale) => results.push(Err(DeliveryError::Stale(stale))),
        }
    }
    let mut by_sub: HashMap<i64, Vec<(i64, &Lease)>> = HashMap::new();
    for (sub_id, offset) in &changed {
        if let Some(lease) = leases.get(&(*sub_id, *offset)) {
            by_sub.entry(*sub_id).or_default().push((*offset, lease));
        }
    }
    for (sub_id, leases) in by_sub {
        save_leases(conn, sub_id, &leases, now).await?;
    }
    Ok((results, wakes))
}

/// The body of `Store::fetch`, in the writer's transaction.
async fn fetch_in(
    conn: &mut SqliteConnection,
    session_id: String,
    max: usize,
    now: DateTime<Utc>,
) -> Result<(Vec<Handed>, bool), DeliveryError> {
    let session_id = session_id.as_str();
    let mut lapsed = lapse_sessions(&mut *conn, now).await?;
    renew(&mut *conn, session_id, now).await?;
    let session = session_row(&mut *conn, session_id).await?;
    let sub = subscription_by_id(&mut *conn, session.subscription_id)
        .await?
        .ok_or_else(|| DeliveryError::NotFound("the subscription was deleted".into()))?;
    lapsed += lapse_leases(&mut *conn, Some(sub.id), now, &mut HashMap::new()).await?;
    match_new_messages(&mut *conn, &sub).await?;

    let live: BTreeSet<String> =
        sqlx::query_scalar("SELECT id FROM sessions WHERE subscription_id = ?")
            .bind(sub.id)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
    let settled = sub.rules.settle_mode == SettleMode::Settled;
    let members = Members {
        me: session_id,
        live: &live,
        strict_avoid: settled,
    };
    // Candidates page by page: those held back (by another member's group affinity, or kept
    // from this member) must not hide the ones after them.
    let page = (max as i64).saturating_mul(4).saturating_add(32);
    let mut after = 0i64;
    let mut handed = Vec::new();
    let mut released = false;
    for _ in 0..CANDIDATE_PAGES {
        // ordering = group: only each group's head, and only while nothing of the group is
        // leased (a replayed dead letter can be a head behind a leased message).
        let sql = if sub.rules.ordering == Ordering::Group {
            "SELECT d.offset, d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, \
             d.reason, d.group_key, a.consumer FROM group_heads h \
             JOIN deliveries d ON d.subscription_id = h.subscription_id AND d.offset = h.head \
             LEFT JOIN group_affinity a \
             ON a.subscription_id = h.subscription_id AND a.group_key = h.group_key \
             WHERE h.subscription_id = ?1 AND h.head > ?4 \
             AND d.state = 'available' AND d.due <= ?2 \
             AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.subscription_id = ?1 \
                  AND e.group_key = h.group_key AND e.state = 'acquired') \
             ORDER BY h.head LIMIT ?3"
        } else {
            "SELECT d.offset, d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, \
             d.reason, d.group_key, a.consumer FROM deliveries d LEFT JOIN group_affinity a \
             ON a.subscription_id = d.subscription_id AND a.group_key = d.group_key \
             WHERE d.subscription_id = ?1 AND d.state = 'available' AND d.due <= ?2 \
             AND d.offset > ?4 ORDER BY d.offset LIMIT ?3"
        };
        let rows = sqlx::query(sql)
            .bind(sub.id)
            .bind(millis(now))
            .bind(page)
            .bind(after)
            .fetch_all(&mut *conn)
            .await?;
        let mut candidates = Vec::with_capacity(rows.len());
        for row in &rows {
            candidates.push(Candidate {
                offset: row.get(0),
                lease: lease_from_row(row)?,
                affinity: row.get(9),
            });
        }
        let last_offset = candidates.last().map(|c| c.offset);
        let picked: Vec<(Candidate, Option<String>)> =
            pick(&candidates, &members, max - handed.len(), now)
                .into_iter()
                .map(|i| (candidates[i].clone(), rows[i].get(8)))
                .collect();
        for h in hand_out(conn, &sub, session_id, picked, settled, now).await? {
            released |= h.released;
            handed.push(h.handed);
        }
        match last_offset {
            Some(last) if handed.len() < max && rows.len() as i64 == page => after = last,
            _ => break,
        }
    }
    // What lapsed, and what the default outcome of settle mode `settled` released, is
    // for the other members now.
    let wakes = lapsed > 0 || released;
    Ok((handed, wakes))
}

/// One message handed out, and whether that put it straight back in the subscription (the
/// default outcome of settle mode `settled` releasing it).
struct HandedOut {
    handed: Handed,
    released: bool,
}

/// Leases the picked messages to `session_id` (or, in settle mode `settled`, settles them as
/// sent) and binds their groups to the member: one read and one write per table for them all.
async fn hand_out(
    conn: &mut SqliteConnection,
    sub: &Subscription,
    session_id: &str,
    picked: Vec<(Candidate, Option<String>)>,
    settled: bool,
    now: DateTime<Utc>,
) -> Result<Vec<HandedOut>, StoreError> {
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let offsets: Vec<i64> = picked.iter().map(|(c, _)| c.offset).collect();
    let mut messages = inbox_entries(conn, &offsets).await?;
    let policy = sub.rules.policy();
    let mut out = Vec::with_capacity(picked.len());
    let mut leases = Vec::with_capacity(picked.len());
    let mut affinity = Vec::new();
    for (
        Candidate {
            offset, mut lease, ..
        },
        group,
    ) in picked
    {
        let Some(message) = messages.remove(&offset) else {
            tracing::error!(
                offset,
                subscription = sub.id,
                "a leased message is missing from the inbox"
            );
            continue;
        };
        let (attempt, deadline) = if settled {
            let outcome = Some(sub.rules.default_outcome.outcome());
            (lease.send_settled(session_id, outcome, now, &policy), None)
        } else {
            let attempt = lease.acquire(session_id, now, &policy);
            (attempt, Some(now + policy.ack_wait))
        };
        if let Some(group) = group {
            affinity.push(group);
        }
        out.push(HandedOut {
            released: matches!(lease.state, State::Available { .. }),
            handed: Handed {
                receipt: Receipt {
                    subscription: sub.id.to_string(),
                    offset,
                    attempt,
                    consumer: session_id.to_owned(),
                },
                deadline,
                message,
            },
        });
        leases.push((offset, lease));
    }
    let refs: Vec<(i64, &Lease)> = leases.iter().map(|(o, l)| (*o, l)).collect();
    save_leases(conn, sub.id, &refs, now).await?;
    if !affinity.is_empty() {
        sqlx::query(
            "INSERT INTO group_affinity (subscription_id, group_key, consumer) \
             SELECT ?1, value, ?2 FROM json_each(?3) WHERE true \
             ON CONFLICT DO UPDATE SET consumer = excluded.consumer",
        )
        .bind(sub.id)
        .bind(session_id)
        .bind(serde_json::json!(affinity).to_string())
        .execute(&mut *conn)
        .await?;
    }
    Ok(out)
}

async fn with_grants(
    conn: &mut SqliteConnection,
    row: &SqliteRow,
) -> Result<Subscription, StoreError> {
    let id: i64 = row.get(0);
    let rules: &str = row.get(4);
    let rules = serde_json::from_str(rules)
        .map_err(|e| StoreError::Corrupt(format!("subscription {id} rules: {e}")))?;
    let grants =
        sqlx::query_scalar("SELECT principal FROM grants WHERE subscription_id = ? ORDER BY 1")
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
    Ok(Subscription {
        id,
        name: row.get(1),
        filter: row.get(2),
        owner: row.get(3),
        rules,
        grants,
        created_at: from_millis(row.get(5)),
    })
}

async fn subscription_by_id(
    conn: &mut SqliteConnection,
    id: i64,
) -> Result<Option<Subscription>, StoreError> {
    let row = sqlx::query(select_subscription!("WHERE id = ?"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        Some(row) => Ok(Some(with_grants(conn, &row).await?)),
        None => Ok(None),
    }
}

async fn subscription_by_name(
    conn: &mut SqliteConnection,
    name: &str,
) -> Result<Option<Subscription>, StoreError> {
    let row = sqlx::query(select_subscription!("WHERE name = ?"))
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        Some(row) => Ok(Some(with_grants(conn, &row).await?)),
        None => Ok(None),
    }
}

async fn remove_subscription(conn: &mut SqliteConnection, id: i64) -> Result<bool, StoreError> {
    for delete in [
        "DELETE FROM deliveries WHERE subscription_id = ?",
        "DELETE FROM sessions WHERE subscription_id = ?",
        "DELETE FROM grants WHERE subscription_id = ?",
        "DELETE FROM group_affinity WHERE subscription_id = ?",
        "DELETE FROM group_heads WHERE subscription_id = ?",
    ] {
        sqlx::query(delete).bind(id).execute(&mut *conn).await?;
    }
    let done = sqlx::query("DELETE FROM subscriptions WHERE id = ?")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

fn session_from_row(row: &SqliteRow) -> Session {
    Session {
        id: row.get(0),
        subscription_id: row.get(1),
        principal: row.get(2),
        ttl: Duration::milliseconds(row.get(3)),
        expires_at: from_millis(row.get(4)),
    }
}

async fn session_row(conn: &mut SqliteConnection, id: &str) -> Result<Session, DeliveryError> {
    let row = sqlx::query(
        "SELECT id, subscription_id, principal, ttl_ms, expires_at FROM sessions WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref()
        .map(session_from_row)
        .ok_or_else(|| DeliveryError::NotFound(format!("no live session {id:?}; join again")))
}

/// Renews a live session by its TTL; a lapsed or unknown one is not found.
async fn renew(
    conn: &mut SqliteConnection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, DeliveryError> {
    let expires: Option<i64> = sqlx::query_scalar(
        "UPDATE sessions SET expires_at = ?2 + ttl_ms WHERE id = ?1 AND expires_at >= ?2 \
         RETURNING expires_at",
    )
    .bind(session_id)
    .bind(millis(now))
    .fetch_optional(&mut *conn)
    .await?;
    expires.map(from_millis).ok_or_else(|| {
        DeliveryError::NotFound(format!(
            "no live session {session_id:?} (unknown or lapsed); join again"
        ))
    })
}

/// Ends one session: its leases go back to the others at once (not counted as failures), its
/// groups lose their affinity, and an ephemeral subscription left without members starts its
/// grace period.
async fn end_session(
    conn: &mut SqliteConnection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let sub: Option<i64> =
        sqlx::query_scalar("DELETE FROM sessions WHERE id = ? RETURNING subscription_id")
            .bind(session_id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(sub_id) = sub else {
        return Ok(false);
    };
    let Some(sub) = subscription_by_id(conn, sub_id).await? else {
        return Ok(true);
    };
    let policy = sub.rules.policy();
    let rows = sqlx::query(select_lease!(
        "WHERE subscription_id = ? AND state = 'acquired' AND consumer = ?"
    ))
    .bind(sub_id)
    .bind(session_id)
    .fetch_all(&mut *conn)
    .await?;
    for row in &rows {
        let mut lease = lease_from_row(row)?;
        lease.holder_gone(session_id, now, &policy);
        save_lease(conn, sub_id, row.get(0), &lease, now).await?;
    }
    sqlx::query("DELETE FROM group_affinity WHERE subscription_id = ? AND consumer = ?")
        .bind(sub_id)
        .bind(session_id)
        .execute(&mut *conn)
        .await?;
    if !sub.rules.durable {
        sqlx::query(
            "UPDATE subscriptions SET idle_since = ?2 WHERE id = ?1 AND NOT EXISTS \
             (SELECT 1 FROM sessions WHERE subscription_id = ?1)",
        )
        .bind(sub_id)
        .bind(millis(now))
        .execute(&mut *conn)
        .await?;
    }
    Ok(true)
}

/// Ends every session whose TTL passed without a fetch or heartbeat.
async fn lapse_sessions(
    conn: &mut SqliteConnection,
    now: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let lapsed: Vec<String> = sqlx::query_scalar("SELECT id FROM sessions WHERE expires_at < ?")
        .bind(millis(now))
        .fetch_all(&mut *conn)
        .await?;
    for id in &lapsed {
        end_session(conn, id, now).await?;
    }
    Ok(lapsed.len())
}

/// Leases whose deadline passed without a settle: failed attempts (`expire`).
async fn lapse_leases(
    conn: &mut SqliteConnection,
    subscription: Option<i64>,
    now: DateTime<Utc>,
    policies: &mut HashMap<i64, Policy>,
) -> Result<usize, StoreError> {
    let rows = sqlx::query(select_lease!(
        "WHERE state = 'acquired' AND due < ?1 AND (?2 IS NULL OR subscription_id = ?2) \
         LIMIT 10000"
    ))
    .bind(millis(now))
    .bind(subscription)
    .fetch_all(&mut *conn)
    .await?;
    for row in &rows {
        let sub_id: i64 = row.get(10);
        let policy = match policies.entry(sub_id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => {
                let Some(sub) = subscription_by_id(conn, sub_id).await? else {
                    continue;
                };
                slot.insert(sub.rules.policy())
            }
        };
        let mut lease = lease_from_row(row)?;
        lease.expire(now, policy);
        save_lease(conn, sub_id, row.get(0), &lease, now).await?;
    }
    Ok(rows.len())
}

/// Matches inbox messages beyond the subscription's cursor against its filter and gives each
/// match a lease, then moves the cursor past them.
async fn match_new_messages(
    conn: &mut SqliteConnection,
    sub: &Subscription,
) -> Result<(), StoreError> {
    let filter = Filter::parse(&sub.filter)
        .map_err(|e| StoreError::Corrupt(format!("subscription {} filter: {e}", sub.id)))?;
    let grouped = sub.rules.ordering == Ordering::Group;
    let mut cursor: i64 = sqlx::query_scalar("SELECT cursor FROM subscriptions WHERE id = ?")
        .bind(sub.id)
        .fetch_one(&mut *conn)
        .await?;
    let rows = sqlx::query(
        // The ordering group is the sender's: (partner, group id), as one opaque key.
        "SELECT offset, topic, json_array(partner, group_id), received_at FROM inbox \
         WHERE offset > ? \
         ORDER BY offset LIMIT ?",
    )
    .bind(cursor)
    .bind(MATCH_BATCH)
    .fetch_all(&mut *conn)
    .await?;
    let mut matched = Vec::new();
    for row in &rows {
        let offset: i64 = row.get(0);
        cursor = offset;
        if filter.matches(row.get::<&str, _>(1)) {
            let group: Option<&str> = if grouped { Some(row.get(2)) } else { None };
            matched.push(serde_json::json!([offset, group, row.get::<i64, _>(3)]));
        }
    }
    if !matched.is_empty() {
        let matched = serde_json::Value::Array(matched).to_string();
        sqlx::query(
            "INSERT INTO deliveries (subscription_id, offset, group_key, state, attempt, failures, \
             due, avoid) SELECT ?1, value->>0, value->>1, 'available', 0, 0, value->>2, '[]' \
             FROM json_each(?2) WHERE true ON CONFLICT DO NOTHING",
        )
        .bind(sub.id)
        .bind(&matched)
        .execute(&mut *conn)
        .await?;
        if grouped {
            // A group with nothing pending gets its first new message as head.
            sqlx::query(
                "INSERT INTO group_heads (subscription_id, group_key, head) \
                 SELECT ?1, value->>1, value->>0 FROM json_each(?2) WHERE true \
                 ON CONFLICT DO UPDATE SET head = MIN(head, excluded.head)",
            )
            .bind(sub.id)
            .bind(&matched)
            .execute(&mut *conn)
            .await?;
        }
    }
    if !rows.is_empty() {
        sqlx::query("UPDATE subscriptions SET cursor = ? WHERE id = ?")
            .bind(cursor)
            .bind(sub.id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The subscription and the stored lease a receipt names; `known` keeps the subscriptions
/// already read in this transaction.
async fn leased(
    conn: &mut SqliteConnection,
    receipt: &Receipt,
    known: &mut HashMap<i64, Subscription>,
) -> Result<(Subscription, Lease), DeliveryError> {
    let not_found = || DeliveryError::NotFound("no such delivery".into());
    let sub_id: i64 = receipt.subscription.parse().map_err(|_| not_found())?;
    let sub = match known.entry(sub_id) {
        Entry::Occupied(sub) => sub.into_mut(),
        Entry::Vacant(slot) => slot.insert(
            subscription_by_id(conn, sub_id)
                .await?
                .ok_or_else(not_found)?,
        ),
    };
    let row = sqlx::query(select_lease!("WHERE subscription_id = ? AND offset = ?"))
        .bind(sub_id)
        .bind(receipt.offset)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(not_found)?;
    Ok((sub.clone(), lease_from_row(&row)?))
}

fn lease_from_row(row: &SqliteRow) -> Result<Lease, StoreError> {
    let offset: i64 = row.get(0);
    let corrupt = |why: String| StoreError::Corrupt(format!("lease at offset {offset}: {why}"));
    let avoid: BTreeSet<String> =
        serde_json::from_str(row.get::<&str, _>(6)).map_err(|e| corrupt(e.to_string()))?;
    let due = from_millis(row.get(5));
    let state = match row.get::<&str, _>(1) {
        "available" => State::Available {
            not_before: due,
            avoid,
        },
        "acquired" => State::Acquired {
            consumer: row
                .get::<Option<String>, _>(4)
                .ok_or_else(|| corrupt("acquired without a consumer".into()))?,
            deadline: due,
            avoid,
        },
        "done" => State::Done,
        "dead" => State::DeadLettered {
            reason: row.get::<Option<String>, _>(7).unwrap_or_default(),
        },
        other => return Err(corrupt(format!("unknown state {other:?}"))),
    };
    Ok(Lease {
        state,
        attempt: row.get::<i64, _>(2) as u32,
        failures: row.get::<i64, _>(3) as u32,
    })
}

/// Stores a lease. `due` holds the lease's time: not-before, deadline, or — for a settled or
/// dead-lettered one — when that happened (`now`), from which inbox retention counts.
async fn save_lease(
    conn: &mut SqliteConnection,
    subscription_id: i64,
    offset: i64,
    lease: &Lease,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    save_leases(conn, subscription_id, &[(offset, lease)], now).await
}

/// Stores leases of one subscription with one statement.
async fn save_leases(
    conn: &mut SqliteConnection,
    subscription_id: i64,
    leases: &[(i64, &Lease)],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    if leases.is_empty() {
        return Ok(());
    }
    let none = BTreeSet::new();
    let mut rows = Vec::with_capacity(leases.len());
    for (offset, lease) in leases {
        let (state, consumer, due, avoid, reason) = match &lease.state {
            State::Available { not_before, avoid } => {
                ("available", None, millis(*not_before), avoid, None)
            }
            State::Acquired {
                consumer,
                deadline,
                avoid,
            } => (
                "acquired",
                Some(consumer.as_str()),
                millis(*deadline),
                avoid,
                None,
            ),
            State::Done => ("done", None, millis(now), &none, None),
            State::DeadLettered { reason } => {
                ("dead", None, millis(now), &none, Some(reason.as_str()))
            }
        };
        let avoid = serde_json::to_string(avoid)
            .map_err(|e| StoreError::Failed(format!("cannot encode a lease: {e}")))?;
        rows.push(serde_json::json!([
            offset,
            state,
            lease.attempt,
            lease.failures,
            consumer,
            due,
            avoid,
            reason
        ]));
    }
    // An upsert of rows that all exist: the JSON rows drive the loop, each a primary-key
    // probe (an UPDATE … FROM would scan the subscription's deliveries instead).
    sqlx::query(
        "INSERT INTO deliveries (subscription_id, offset, state, attempt, failures, consumer, \
         due, avoid, reason) SELECT ?1, value->>0, value->>1, value->>2, value->>3, value->>4, \
         value->>5, value->>6, value->>7 FROM json_each(?2) WHERE true \
         ON CONFLICT (subscription_id, offset) DO UPDATE SET state = excluded.state, \
         attempt = excluded.attempt, failures = excluded.failures, \
         consumer = excluded.consumer, due = excluded.due, avoid = excluded.avoid, \
         reason = excluded.reason",
    )
    .bind(subscription_id)
    .bind(serde_json::Value::Array(rows).to_string())
    .execute(&mut *conn)
    .await?;
    let settled: Vec<i64> = leases
        .iter()
        .filter(|(_, l)| matches!(l.state, State::Done | State::DeadLettered { .. }))
        .map(|(offset, _)| *offset)
        .collect();
    advance_heads(conn, subscription_id, &settled).await
}

/// Groups whose head was settled or dead-lettered move on to their next pending message (or,
/// with none, lose their head row until one arrives).
async fn advance_heads(
    conn: &mut SqliteConnection,
    subscription_id: i64,
    settled: &[i64],
) -> Result<(), StoreError> {
    if settled.is_empty() {
        return Ok(());
    }
    let settled = serde_json::json!(settled).to_string();
    sqlx::query(
        "UPDATE group_heads SET head = COALESCE((SELECT d.offset FROM deliveries d \
           WHERE d.subscription_id = group_heads.subscription_id \
           AND d.group_key = group_heads.group_key AND d.offset > group_heads.head \
           AND d.state IN ('available', 'acquired') ORDER BY d.offset LIMIT 1), -1) \
         WHERE subscription_id = ?1 AND head IN (SELECT value FROM json_each(?2))",
    )
    .bind(subscription_id)
    .bind(&settled)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM group_heads WHERE subscription_id = ? AND head = -1")
        .bind(subscription_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The inbox messages at `offsets`, by offset.
async fn inbox_entries(
    conn: &mut SqliteConnection,
    offsets: &[i64],
) -> Result<HashMap<i64, InboxEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT offset, channel, topic, group_id, number, payload, namespaces, received_at, \
         expiry, partner FROM inbox WHERE offset IN (SELECT value FROM json_each(?))",
    )
    .bind(serde_json::json!(offsets).to_string())
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .iter()
        .map(super::sqlite::inbox_from_row)
        .map(|e| (e.offset, e))
        .collect())
}
