//! Reads that decide nothing, on the pool (each one statement, so one snapshot, unless said
//! otherwise): subscriptions, sessions, dead letters, backlogs and the earliest deadlines the
//! delivery workers wait for.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::rows::{self, InboxRow, SubscriptionRow, select_inbox, select_subscription};
use crate::delivery::session;
use crate::delivery::wake::Deadlines;
use crate::store::delivery::{Backlog, DeadLetter, Session, Subscription};
use crate::store::time::{from_millis, millis};
use crate::store::{InboxEntry, StoreError};

fn decoded(rows: Vec<SubscriptionRow>) -> Result<Vec<Subscription>, StoreError> {
    rows.into_iter()
        .map(SubscriptionRow::subscription)
        .collect()
}

pub(super) async fn subscription(
    pool: &PgPool,
    id: i64,
) -> Result<Option<Subscription>, StoreError> {
    rows::subscription_by_id(pool, id)
        .await
        .map_err(|e| e.into_store("read a subscription"))
}

pub(super) async fn subscriptions(pool: &PgPool) -> Result<Vec<Subscription>, StoreError> {
    let rows = sqlx::query_as(select_subscription!("ORDER BY s.id"))
        .fetch_all(pool)
        .await?;
    decoded(rows)
}

/// The push subscriptions: one statement, so that the push supervisor, woken by every
/// delivery change, costs next to nothing while there are none.
pub(super) async fn push_subscriptions(pool: &PgPool) -> Result<Vec<Subscription>, StoreError> {
    let rows = sqlx::query_as(select_subscription!(
        "WHERE s.rules::JSONB ->> 'mode' = 'push' ORDER BY s.id"
    ))
    .fetch_all(pool)
    .await?;
    decoded(rows)
}

pub(super) async fn session(
    pool: &PgPool,
    id: &str,
    now: DateTime<Utc>,
) -> Result<Option<Session>, StoreError> {
    Ok(rows::session_by_id(pool, id)
        .await
        .map_err(|e| e.into_store("read a session"))?
        .filter(|s| !session::lapsed(s.expires_at, now)))
}

/// Dead letters with their messages (two statements: a message purged meanwhile reads as
/// gone, as it would a moment later).
pub(super) async fn dead_letters(
    pool: &PgPool,
    subscription_id: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<DeadLetter>, StoreError> {
    let rows: Vec<(i64, Option<String>, i32)> = sqlx::query_as(
        "SELECT \"offset\", reason, attempt FROM deliveries WHERE subscription_id = $1 \
         AND state = 'dead' AND \"offset\" > $2 ORDER BY \"offset\" LIMIT $3",
    )
    .bind(subscription_id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let offsets: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let messages: Vec<InboxRow> = sqlx::query_as(select_inbox!("WHERE \"offset\" = ANY($1)"))
        .bind(&offsets)
        .fetch_all(pool)
        .await?;
    let mut messages: std::collections::HashMap<i64, InboxEntry> = messages
        .into_iter()
        .map(|m| {
            let m = InboxEntry::from(m);
            (m.offset, m)
        })
        .collect();
    rows.into_iter()
        .map(|(offset, reason, attempts)| {
            Ok(DeadLetter {
                offset,
                reason: reason.unwrap_or_default(),
                attempts: u32::try_from(attempts).map_err(|e| {
                    StoreError::Corrupt(format!("dead letter at offset {offset}: attempt: {e}"))
                })?,
                message: messages.remove(&offset),
            })
        })
        .collect()
}

pub(super) async fn backlog(pool: &PgPool, subscription_id: i64) -> Result<Backlog, StoreError> {
    let (waiting, in_flight, dead_letters, unmatched, members): (i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT \
         (SELECT COUNT(*) FROM deliveries WHERE subscription_id = $1 AND state = 'available'), \
         (SELECT COUNT(*) FROM deliveries WHERE subscription_id = $1 AND state = 'acquired'), \
         (SELECT COUNT(*) FROM deliveries WHERE subscription_id = $1 AND state = 'dead'), \
         (SELECT COUNT(*) FROM inbox WHERE \"offset\" > \
            (SELECT cursor FROM subscriptions WHERE id = $1)), \
         (SELECT COUNT(*) FROM sessions WHERE subscription_id = $1)",
        )
        .bind(subscription_id)
        .fetch_one(pool)
        .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Backlog {
        waiting: count(waiting),
        in_flight: count(in_flight),
        dead_letters: count(dead_letters),
        unmatched: count(unmatched),
        members: count(members),
    })
}

pub(super) async fn deadlines(
    pool: &PgPool,
    subscription_id: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Deadlines, StoreError> {
    let at = |ms: Option<i64>| ms.map(from_millis);
    let Some(sub) = subscription_id else {
        let (lease, session, idle, oldest): (Option<i64>, Option<i64>, Option<i64>, Option<i64>) =
            sqlx::query_as(
                "SELECT (SELECT MIN(due) FROM deliveries WHERE state = 'acquired'), \
                 (SELECT MIN(expires_at) FROM sessions), \
                 (SELECT MIN(idle_since) FROM subscriptions WHERE idle_since IS NOT NULL), \
                 (SELECT MIN(received_at) FROM inbox)",
            )
            .fetch_one(pool)
            .await?;
        return Ok(Deadlines {
            backoff_ends: None,
            lease_deadline: at(lease),
            session_expiry: at(session),
            idle_since: at(idle),
            oldest_inbox: at(oldest),
        });
    };
    let (backoff, lease, session): (Option<i64>, Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT (SELECT MIN(due) FROM deliveries WHERE subscription_id = $1 \
                 AND state = 'available' AND due > $2), \
         (SELECT MIN(due) FROM deliveries WHERE subscription_id = $1 AND state = 'acquired'), \
         (SELECT MIN(expires_at) FROM sessions WHERE subscription_id = $1)",
    )
    .bind(sub)
    .bind(millis(now))
    .fetch_one(pool)
    .await?;
    Ok(Deadlines {
        backoff_ends: at(backoff),
        lease_deadline: at(lease),
        session_expiry: at(session),
        idle_since: None,
        oldest_inbox: None,
    })
}
