//! Rows of the delivery tables as the pure rules see them, the per-subscription lock, and the
//! primitive statements that read and write them inside an operation's transaction.

use crate::store::postgres::usage::{change_usage, freed_by};
use crate::store::source_usage::UsageChanges;
use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use sqlx::{PgConnection, PgExecutor};

use super::Fail;
use crate::delivery::group;
use crate::delivery::lease::{Lease, State};
use crate::store::delivery::{Session, Subscription};
use crate::store::time::{from_millis, millis};
use crate::store::{InboxEntry, StoreError};

/// Takes the lock every writer of a subscription's delivery state holds to its commit, in
/// whichever gateway: the decisions about one subscription are made one at a time across
/// processes. `false`: no such subscription.
pub(super) async fn lock_subscription(conn: &mut PgConnection, id: i64) -> Result<bool, Fail> {
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT id FROM subscriptions WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(locked.is_some())
}

/// Takes the subscription's lock only if nobody holds it (or this transaction already does):
/// for work on other subscriptions that whoever holds theirs, or a later pass, does as well.
/// `false`: busy elsewhere, or gone.
pub(super) async fn try_lock_subscription(conn: &mut PgConnection, id: i64) -> Result<bool, Fail> {
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT id FROM subscriptions WHERE id = $1 FOR UPDATE SKIP LOCKED")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(locked.is_some())
}

/// `SELECT` of lease rows followed by `$rest`; they decode as `LeaseRow`.
macro_rules! select_lease {
    ($rest:literal) => {
        concat!(
            "SELECT \"offset\", state, attempt, failures, consumer, due, avoid, reason, \
             group_key FROM deliveries ",
            $rest
        )
    };
}
pub(super) use select_lease;

/// One row of `deliveries`: the state of one message in one subscription.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(super) struct LeaseRow {
    pub offset: i64,
    state: String,
    attempt: i32,
    failures: i32,
    consumer: Option<String>,
    due: i64,
    avoid: String,
    reason: Option<String>,
    /// The ordering group (`ordering = group` only).
    #[sqlx(rename = "group_key")]
    pub group: Option<String>,
}

impl LeaseRow {
    pub fn lease(&self) -> Result<Lease, StoreError> {
        let offset = self.offset;
        let corrupt = |why: String| StoreError::Corrupt(format!("lease at offset {offset}: {why}"));
        let avoid: BTreeSet<String> =
            serde_json::from_str(&self.avoid).map_err(|e| corrupt(e.to_string()))?;
        let due = from_millis(self.due);
        let state = match self.state.as_str() {
            "available" => State::Available {
                not_before: due,
                avoid,
            },
            "acquired" => State::Acquired {
                consumer: self
                    .consumer
                    .clone()
                    .ok_or_else(|| corrupt("acquired without a consumer".into()))?,
                deadline: due,
                avoid,
            },
            "done" => State::Done,
            "dead" => State::DeadLettered {
                reason: self.reason.clone().unwrap_or_default(),
            },
            other => return Err(corrupt(format!("unknown state {other:?}"))),
        };
        Ok(Lease {
            state,
            attempt: u32::try_from(self.attempt).map_err(|e| corrupt(e.to_string()))?,
            failures: u32::try_from(self.failures).map_err(|e| corrupt(e.to_string()))?,
        })
    }
}

/// The lease row at (subscription, offset).
pub(super) async fn lease_at(
    conn: &mut PgConnection,
    sub_id: i64,
    offset: i64,
) -> Result<Option<LeaseRow>, Fail> {
    Ok(sqlx::query_as(select_lease!(
        "WHERE subscription_id = $1 AND \"offset\" = $2"
    ))
    .bind(sub_id)
    .bind(offset)
    .fetch_optional(&mut *conn)
    .await?)
}

/// The stored columns of a lease: state, attempt, failures, consumer, due, avoid (JSON),
/// reason. `due` holds the lease's time: not-before, deadline, or — for a settled or
/// dead-lettered one — when that happened (`now`), from which inbox retention counts.
struct Columns<'a> {
    state: &'static str,
    attempt: i32,
    failures: i32,
    consumer: Option<&'a str>,
    due: i64,
    avoid: String,
    reason: Option<&'a str>,
}

fn columns(lease: &Lease, now: DateTime<Utc>) -> Result<Columns<'_>, StoreError> {
    let none = BTreeSet::new();
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
        State::DeadLettered { reason } => ("dead", None, millis(now), &none, Some(reason.as_str())),
    };
    let avoid = serde_json::to_string(avoid)
        .map_err(|e| StoreError::Failed(format!("cannot encode a lease: {e}")))?;
    let count = |n: u32, what: &str| {
        i32::try_from(n).map_err(|_| StoreError::Failed(format!("a lease's {what} {n} is too big")))
    };
    Ok(Columns {
        state,
        attempt: count(lease.attempt, "attempt")?,
        failures: count(lease.failures, "failure count")?,
        consumer,
        due,
        avoid,
        reason,
    })
}

/// Gives newly matched messages their leases (offset, group, lease, the time its columns are
/// written at), in one statement; nothing for a message that has one.
pub(super) async fn insert_leases(
    conn: &mut PgConnection,
    subscription_id: i64,
    leases: &[(i64, Option<String>, Lease, DateTime<Utc>)],
) -> Result<(), Fail> {
    if leases.is_empty() {
        return Ok(());
    }
    let mut offsets = Vec::with_capacity(leases.len());
    let mut groups = Vec::with_capacity(leases.len());
    let mut states = Vec::with_capacity(leases.len());
    let mut attempts = Vec::with_capacity(leases.len());
    let mut failures = Vec::with_capacity(leases.len());
    let mut consumers = Vec::with_capacity(leases.len());
    let mut dues = Vec::with_capacity(leases.len());
    let mut avoids = Vec::with_capacity(leases.len());
    let mut reasons = Vec::with_capacity(leases.len());
    for (offset, group, lease, at) in leases {
        let c = columns(lease, *at)?;
        offsets.push(*offset);
        groups.push(group.as_deref());
        states.push(c.state);
        attempts.push(c.attempt);
        failures.push(c.failures);
        consumers.push(c.consumer);
        dues.push(c.due);
        avoids.push(c.avoid);
        reasons.push(c.reason);
    }
    sqlx::query(
        "INSERT INTO deliveries (subscription_id, \"offset\", group_key, state, attempt, \
         failures, consumer, due, avoid, reason) \
         SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::INTEGER[], \
         $6::INTEGER[], $7::TEXT[], $8::BIGINT[], $9::TEXT[], $10::TEXT[]) \
         ON CONFLICT DO NOTHING",
    )
    .bind(subscription_id)
    .bind(&offsets)
    .bind(&groups)
    .bind(&states)
    .bind(&attempts)
    .bind(&failures)
    .bind(&consumers)
    .bind(&dues)
    .bind(&avoids)
    .bind(&reasons)
    .execute(&mut *conn)
    .await?;
    // Settled the moment they were handed out (the `settled` mode).
    let settled = leases.iter().filter(|(_, _, l, _)| l.state == State::Done);
    release_consumed(conn, settled.map(|(offset, ..)| *offset).collect()).await
}

/// Stores leases of one subscription, then moves the heads of the groups whose head finished.
pub(super) async fn save_leases(
    conn: &mut PgConnection,
    subscription_id: i64,
    leases: &[(i64, &Lease)],
    now: DateTime<Utc>,
) -> Result<(), Fail> {
    for (offset, lease) in leases {
        let c = columns(lease, now)?;
        sqlx::query(
            "UPDATE deliveries SET state = $3, attempt = $4, failures = $5, consumer = $6, \
             due = $7, avoid = $8, reason = $9 WHERE subscription_id = $1 AND \"offset\" = $2",
        )
        .bind(subscription_id)
        .bind(offset)
        .bind(c.state)
        .bind(c.attempt)
        .bind(c.failures)
        .bind(c.consumer)
        .bind(c.due)
        .bind(&c.avoid)
        .bind(c.reason)
        .execute(&mut *conn)
        .await?;
    }
    for (offset, lease) in leases {
        if lease.finished() {
            advance_head(conn, subscription_id, *offset).await?;
        }
    }
    let settled = leases.iter().filter(|(_, l)| l.state == State::Done);
    release_consumed(conn, settled.map(|(offset, _)| *offset).collect()).await
}

/// Of the messages just settled, those every subscription has now matched and settled are
/// consumed: their bytes are freed for their sources' storage quota (D13). A message some
/// subscription has not yet matched stays counted until it is purged. (A settle elsewhere
/// still uncommitted keeps a message counted until its purge: never freed twice.)
async fn release_consumed(conn: &mut PgConnection, settled: Vec<i64>) -> Result<(), Fail> {
    if settled.is_empty() {
        return Ok(());
    }
    let gone: Vec<(String, i64)> = sqlx::query_as(
        "UPDATE inbox i SET consumed = true WHERE i.\"offset\" = ANY($1) AND NOT i.consumed \
         AND i.\"offset\" <= (SELECT min(cursor) FROM subscriptions) \
         AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.\"offset\" = i.\"offset\" \
         AND d.state <> 'done') RETURNING i.source, octet_length(i.payload)::bigint",
    )
    .bind(&settled)
    .fetch_all(&mut *conn)
    .await?;
    let mut freed = UsageChanges::default();
    freed_by(gone, &mut freed);
    change_usage(conn, &freed).await?;
    Ok(())
}

/// Later messages of a group read per page while looking for its next pending one.
const GROUP_PAGE: i64 = 64;

/// A finished message that was its group's head hands the head on (`group::after_finish`).
async fn advance_head(
    conn: &mut PgConnection,
    subscription_id: i64,
    finished: i64,
) -> Result<(), Fail> {
    let group: Option<String> = sqlx::query_scalar(
        "SELECT group_key FROM group_heads WHERE subscription_id = $1 AND head = $2",
    )
    .bind(subscription_id)
    .bind(finished)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(group) = group else {
        return Ok(());
    };
    let mut next = None;
    let mut after = finished;
    'pages: loop {
        let later: Vec<LeaseRow> = sqlx::query_as(select_lease!(
            "WHERE subscription_id = $1 AND group_key = $2 AND \"offset\" > $3 \
             ORDER BY \"offset\" LIMIT $4"
        ))
        .bind(subscription_id)
        .bind(&group)
        .bind(after)
        .bind(GROUP_PAGE)
        .fetch_all(&mut *conn)
        .await?;
        for row in &later {
            if group::pending(&row.lease()?) {
                next = Some(row.offset);
                break 'pages;
            }
        }
        match later.last() {
            Some(last) if later.len() as i64 == GROUP_PAGE => after = last.offset,
            _ => break,
        }
    }
    match group::after_finish(finished, finished, next) {
        Some(Some(head)) => set_head(conn, subscription_id, &group, head).await,
        Some(None) => {
            sqlx::query("DELETE FROM group_heads WHERE subscription_id = $1 AND group_key = $2")
                .bind(subscription_id)
                .bind(&group)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
        None => Ok(()),
    }
}

/// The head of one group, if it has one.
pub(super) async fn head(
    conn: &mut PgConnection,
    subscription_id: i64,
    group: &str,
) -> Result<Option<i64>, Fail> {
    Ok(sqlx::query_scalar(
        "SELECT head FROM group_heads WHERE subscription_id = $1 AND group_key = $2",
    )
    .bind(subscription_id)
    .bind(group)
    .fetch_optional(&mut *conn)
    .await?)
}

pub(super) async fn set_head(
    conn: &mut PgConnection,
    subscription_id: i64,
    group: &str,
    head: i64,
) -> Result<(), Fail> {
    sqlx::query(
        "INSERT INTO group_heads (subscription_id, group_key, head) VALUES ($1, $2, $3) \
         ON CONFLICT (subscription_id, group_key) DO UPDATE SET head = excluded.head",
    )
    .bind(subscription_id)
    .bind(group)
    .bind(head)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// `SELECT` of subscription rows (`s`) with their grants, followed by `$rest`; they decode as
/// `SubscriptionRow`. Grants in byte order, as SQLite sorts them, whatever the collation.
macro_rules! select_subscription {
    ($rest:literal) => {
        concat!(
            "SELECT s.id, s.name, s.filter, s.owner, s.rules, s.created_at, \
             COALESCE((SELECT array_agg(g.principal ORDER BY g.principal COLLATE \"C\") \
               FROM grants g WHERE g.subscription_id = s.id), '{}') AS grants \
             FROM subscriptions s ",
            $rest
        )
    };
}
pub(super) use select_subscription;

/// One subscription as stored, with its grants.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct SubscriptionRow {
    id: i64,
    name: String,
    filter: String,
    owner: String,
    rules: String,
    created_at: i64,
    grants: Vec<String>,
}

impl SubscriptionRow {
    pub fn subscription(self) -> Result<Subscription, StoreError> {
        let id = self.id;
        let rules = serde_json::from_str(&self.rules)
            .map_err(|e| StoreError::Corrupt(format!("subscription {id} rules: {e}")))?;
        Ok(Subscription {
            id,
            name: self.name,
            filter: self.filter,
            owner: self.owner,
            rules,
            grants: self.grants,
            created_at: from_millis(self.created_at),
        })
    }
}

pub(super) async fn subscription_by_id<'e>(
    executor: impl PgExecutor<'e>,
    id: i64,
) -> Result<Option<Subscription>, Fail> {
    let row: Option<SubscriptionRow> = sqlx::query_as(select_subscription!("WHERE s.id = $1"))
        .bind(id)
        .fetch_optional(executor)
        .await?;
    Ok(row.map(SubscriptionRow::subscription).transpose()?)
}

pub(super) async fn subscription_by_name(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<Subscription>, Fail> {
    let row: Option<SubscriptionRow> = sqlx::query_as(select_subscription!("WHERE s.name = $1"))
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.map(SubscriptionRow::subscription).transpose()?)
}

/// Deletes a subscription (locked by the caller) with everything of it.
pub(super) async fn remove_subscription(conn: &mut PgConnection, id: i64) -> Result<bool, Fail> {
    for delete in [
        "DELETE FROM deliveries WHERE subscription_id = $1",
        "DELETE FROM sessions WHERE subscription_id = $1",
        "DELETE FROM grants WHERE subscription_id = $1",
        "DELETE FROM group_affinity WHERE subscription_id = $1",
        "DELETE FROM group_heads WHERE subscription_id = $1",
    ] {
        sqlx::query(delete).bind(id).execute(&mut *conn).await?;
    }
    let removed = sqlx::query("DELETE FROM subscriptions WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(removed.rows_affected() == 1)
}

/// One row of `sessions`.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct SessionRow {
    id: String,
    subscription_id: i64,
    principal: String,
    ttl_ms: i64,
    expires_at: i64,
}

impl From<SessionRow> for Session {
    fn from(row: SessionRow) -> Session {
        Session {
            id: row.id,
            subscription_id: row.subscription_id,
            principal: row.principal,
            ttl: Duration::milliseconds(row.ttl_ms),
            expires_at: from_millis(row.expires_at),
        }
    }
}

/// A session by id, lapsed or not.
pub(super) async fn session_by_id<'e>(
    executor: impl PgExecutor<'e>,
    id: &str,
) -> Result<Option<Session>, Fail> {
    let row: Option<SessionRow> = sqlx::query_as(
        "SELECT id, subscription_id, principal, ttl_ms, expires_at FROM sessions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Session::from))
}

/// A session by id (lapsed or not) with its subscription locked, read again under that lock:
/// what was read before it may have changed meanwhile in another gateway. `None`: no such
/// session.
pub(super) async fn lock_session(
    conn: &mut PgConnection,
    id: &str,
) -> Result<Option<Session>, Fail> {
    let mut unlocked = session_by_id(&mut *conn, id).await?;
    while let Some(seen) = unlocked {
        lock_subscription(conn, seen.subscription_id).await?;
        let now_seen = session_by_id(&mut *conn, id).await?;
        match now_seen {
            Some(s) if s.subscription_id != seen.subscription_id => unlocked = Some(s),
            locked => return Ok(locked),
        }
    }
    Ok(None)
}

/// `SELECT` of inbox rows followed by `$rest`; they decode as `InboxRow`.
macro_rules! select_inbox {
    ($rest:literal) => {
        concat!(
            "SELECT \"offset\", channel, topic, group_id, number, payload, namespaces, \
             received_at, expiry, partner FROM inbox ",
            $rest
        )
    };
}
pub(super) use select_inbox;

/// One inbox message as stored.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct InboxRow {
    offset: i64,
    channel: String,
    topic: String,
    group_id: String,
    number: Option<i64>,
    payload: Vec<u8>,
    namespaces: String,
    received_at: i64,
    expiry: i64,
    partner: String,
}

impl From<InboxRow> for InboxEntry {
    fn from(row: InboxRow) -> InboxEntry {
        InboxEntry {
            offset: row.offset,
            partner: row.partner,
            channel: row.channel,
            topic: row.topic,
            group_id: row.group_id,
            // u64 sequence numbers are stored bit for bit.
            number: row.number.map(|n| n as u64),
            payload: String::from_utf8(row.payload)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            namespaces: row.namespaces,
            received_at: from_millis(row.received_at),
            expiry: from_millis(row.expiry),
        }
    }
}

/// The inbox message at `offset`.
pub(super) async fn inbox_entry(
    conn: &mut PgConnection,
    offset: i64,
) -> Result<Option<InboxEntry>, Fail> {
    let row: Option<InboxRow> = sqlx::query_as(select_inbox!("WHERE \"offset\" = $1"))
        .bind(offset)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.map(InboxEntry::from))
}
