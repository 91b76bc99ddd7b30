//! Reads that decide nothing, on the read pool: the subscriptions, sessions, dead letters,
//! backlogs and the earliest deadlines the delivery workers wait for. (One subscription, and
//! a member's session with its subscription, are read on the writer's: `read_on_writer`.)

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqlitePool;

use super::rows::{SubscriptionColumns, select_subscription, subscription_from};
use crate::delivery::session;
use crate::delivery::wake::Deadlines;
use crate::store::StoreError;
use crate::store::delivery::{Backlog, DeadLetter, Session, Subscription};
use crate::store::sqlite::{inbox_from_row, select_inbox};
use crate::store::time::{from_millis, millis};

fn columns(r: &sqlx::sqlite::SqliteRow) -> SubscriptionColumns {
    (
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        r.get(6),
    )
}

fn subscriptions_of(rows: &[sqlx::sqlite::SqliteRow]) -> Result<Vec<Subscription>, StoreError> {
    rows.iter().map(|r| subscription_from(columns(r))).collect()
}

pub(super) async fn subscriptions(pool: &SqlitePool) -> Result<Vec<Subscription>, StoreError> {
    let rows = sqlx::query(select_subscription!("ORDER BY s.id"))
        .fetch_all(pool)
        .await?;
    subscriptions_of(&rows)
}

/// The push subscriptions: one statement, so that the push supervisor, woken by every
/// delivery change, costs next to nothing while there are none.
pub(super) async fn push_subscriptions(pool: &SqlitePool) -> Result<Vec<Subscription>, StoreError> {
    let rows = sqlx::query(select_subscription!(
        "WHERE s.rules ->> '$.mode' = 'push' ORDER BY s.id"
    ))
    .fetch_all(pool)
    .await?;
    subscriptions_of(&rows)
}

pub(super) async fn session(
    pool: &SqlitePool,
    id: &str,
    now: DateTime<Utc>,
) -> Result<Option<Session>, StoreError> {
    let row = sqlx::query(
        "SELECT id, subscription_id, principal, ttl_ms, expires_at FROM sessions WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(row
        .map(|r| Session {
            id: r.get(0),
            subscription_id: r.get(1),
            principal: r.get(2),
            ttl: chrono::Duration::milliseconds(r.get(3)),
            expires_at: from_millis(r.get(4)),
        })
        .filter(|s| !session::lapsed(s.expires_at, now)))
}

pub(super) async fn dead_letters(
    pool: &SqlitePool,
    subscription_id: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    let rows = sqlx::query(
        "SELECT offset, reason, attempt FROM deliveries WHERE subscription_id = ? \
         AND state = 'dead' AND offset > ? ORDER BY offset LIMIT ?",
    )
    .bind(subscription_id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut dead = Vec::with_capacity(rows.len());
    for row in &rows {
        let offset: i64 = row.get(0);
        let message = sqlx::query(concat!(select_inbox!(), "FROM inbox WHERE offset = ?"))
            .bind(offset)
            .fetch_optional(pool)
            .await?;
        dead.push(DeadLetter {
            offset,
            reason: row.get::<Option<String>, _>(1).unwrap_or_default(),
            attempts: row.get::<i64, _>(2) as u32,
            message: message.as_ref().map(inbox_from_row),
        });
    }
    Ok(dead)
}

pub(super) async fn backlog(
    pool: &SqlitePool,
    subscription_id: i64,
) -> Result<Backlog, StoreError> {
    let row = sqlx::query(
        "SELECT \
         (SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = 'available'), \
         (SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = 'acquired'), \
         (SELECT COUNT(*) FROM deliveries WHERE subscription_id = ?1 AND state = 'dead'), \
         (SELECT COUNT(*) FROM inbox WHERE offset > \
            (SELECT cursor FROM subscriptions WHERE id = ?1)), \
         (SELECT COUNT(*) FROM sessions WHERE subscription_id = ?1)",
    )
    .bind(subscription_id)
    .fetch_one(pool)
    .await?;
    Ok(Backlog {
        waiting: row.get::<i64, _>(0) as u64,
        in_flight: row.get::<i64, _>(1) as u64,
        dead_letters: row.get::<i64, _>(2) as u64,
        unmatched: row.get::<i64, _>(3) as u64,
        members: row.get::<i64, _>(4) as u64,
    })
}

/// The earliest lease deadline, session expiry, idle subscription and inbox message. Leases
/// are indexed by subscription (`deliveries_acquired`): the earliest deadline of each, then the
/// earliest of those.
pub(super) const EARLIEST_OF_ALL: &str = "SELECT (SELECT MIN((SELECT MIN(d.due) \
     FROM deliveries d WHERE d.subscription_id = s.id AND d.state = 'acquired')) \
     FROM subscriptions s), \
     (SELECT MIN(expires_at) FROM sessions), \
     (SELECT MIN(idle_since) FROM subscriptions WHERE idle_since IS NOT NULL), \
     (SELECT MIN(received_at) FROM inbox)";

pub(super) async fn deadlines(
    pool: &SqlitePool,
    subscription_id: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Deadlines, StoreError> {
    let at = |ms: Option<i64>| ms.map(from_millis);
    let Some(sub) = subscription_id else {
        let row = sqlx::query(EARLIEST_OF_ALL).fetch_one(pool).await?;
        return Ok(Deadlines {
            backoff_ends: None,
            lease_deadline: at(row.get(0)),
            session_expiry: at(row.get(1)),
            idle_since: at(row.get(2)),
            oldest_inbox: at(row.get(3)),
        });
    };
    let row = sqlx::query(
        "SELECT (SELECT MIN(due) FROM deliveries WHERE subscription_id = ?1 \
                 AND state = 'available' AND due > ?2), \
         (SELECT MIN(due) FROM deliveries WHERE subscription_id = ?1 AND state = 'acquired'), \
         (SELECT MIN(expires_at) FROM sessions WHERE subscription_id = ?1)",
    )
    .bind(sub)
    .bind(millis(now))
    .fetch_one(pool)
    .await?;
    Ok(Deadlines {
        backoff_ends: at(row.get(0)),
        lease_deadline: at(row.get(1)),
        session_expiry: at(row.get(2)),
        idle_since: None,
        oldest_inbox: None,
    })
}
