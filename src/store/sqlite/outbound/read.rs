//! Outbound reads on the read pool: they decide nothing (the send window is decided over
//! their rows by `send_group::in_window`; claims and saves check again in their own
//! transaction).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqlitePool;

use super::rows::{COLUMNS, Columns, EARLIER_SUBMISSION, select_messages};
use crate::rmp::send_group::{Candidate, awaits_poll, in_window, window_for};
use crate::store::StoreError;
use crate::store::outbound::{
    Due, IdempotencyKey, KeyedSubmission, OutEvent, OutFilter, OutMessage, SubmitError, Submitted,
};
use crate::store::time::{from_millis, millis};

pub(super) async fn earlier_submission(
    pool: &SqlitePool,
    idem: &IdempotencyKey,
) -> Result<Option<Submitted>, SubmitError> {
    let row = sqlx::query(EARLIER_SUBMISSION)
        .bind(&idem.principal)
        .bind(&idem.key)
        .fetch_optional(pool)
        .await
        .map_err(StoreError::from)?;
    row.map(|row| {
        idem.replay(KeyedSubmission {
            id: row.get(0),
            group_id: row.get(1),
            number: row.get::<Option<i64>, _>(2).map(|n| n as u64),
            fingerprint: row.get(3),
        })
    })
    .transpose()
}

pub(super) async fn out_message(
    pool: &SqlitePool,
    id: &str,
) -> Result<Option<OutMessage>, StoreError> {
    let row = sqlx::query(select_messages!("WHERE m.id = ?"))
        .bind(id)
        .fetch_optional(pool)
        .await?;
    row.as_ref()
        .map(|r| Columns::of_pool(r).message())
        .transpose()
}

pub(super) async fn out_messages_of(
    pool: &SqlitePool,
    filter: &OutFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<OutMessage>, StoreError> {
    // In doubt as `Outbound::in_doubt` says it, in SQL.
    let sql = if filter.newest_first {
        select_messages!(
            "WHERE (?1 IS NULL OR m.state = ?1) AND (?2 IS NULL OR m.group_id = ?2) \
         AND (?5 IS NULL OR m.principal = ?5) AND (?6 IS NULL OR m.partner = ?6) \
         AND (?7 = 0 OR (m.state IN ('queued', 'sent') AND m.attempts > m.unreached \
                         AND (m.next_attempt IS NULL OR m.next_attempt >= m.expiry))) \
         AND (?3 = '' OR m.id < ?3) ORDER BY m.id DESC LIMIT ?4"
        )
    } else {
        select_messages!(
            "WHERE (?1 IS NULL OR m.state = ?1) AND (?2 IS NULL OR m.group_id = ?2) \
         AND (?5 IS NULL OR m.principal = ?5) AND (?6 IS NULL OR m.partner = ?6) \
         AND (?7 = 0 OR (m.state IN ('queued', 'sent') AND m.attempts > m.unreached \
                         AND (m.next_attempt IS NULL OR m.next_attempt >= m.expiry))) \
         AND m.id > ?3 ORDER BY m.id LIMIT ?4"
        )
    };
    let rows = sqlx::query(sql)
        .bind(filter.state)
        .bind(filter.group)
        .bind(after.unwrap_or(""))
        .bind(limit)
        .bind(filter.principal)
        .bind(filter.partner)
        .bind(i64::from(filter.in_doubt))
        .fetch_all(pool)
        .await?;
    rows.iter().map(|r| Columns::of_pool(r).message()).collect()
}

/// Due messages are read a page at a time in due order, each with the lowest number of its
/// ordered group not acknowledged yet, and the send window picks those that may go out, until
/// `limit` are picked or none are left.
pub(super) async fn due_outbound(
    pool: &SqlitePool,
    now: DateTime<Utc>,
    window: u64,
    windows: &BTreeMap<String, u64>,
    limit: i64,
) -> Result<Due, StoreError> {
    let wanted = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
    let mut due = Due::default();
    // The position after the last row read: (next_attempt, group_id, number or -1).
    let mut after: (i64, String, i64) = (i64::MIN, String::new(), i64::MIN);
    while due.messages.len() < wanted {
        let rows = sqlx::query(select_messages!(
            ", CASE WHEN g.ordered THEN (SELECT MIN(o.number) FROM out_messages o \
               WHERE o.group_id = m.group_id AND o.state <> 'acked') END",
            "WHERE m.next_attempt <= ?1 \
             AND (m.next_attempt, m.group_id, COALESCE(m.number, -1)) > (?2, ?3, ?4) \
             ORDER BY m.next_attempt, m.group_id, COALESCE(m.number, -1) LIMIT ?5"
        ))
        .bind(millis(now))
        .bind(after.0)
        .bind(&after.1)
        .bind(after.2)
        .bind(limit)
        .fetch_all(pool)
        .await?;
        for r in &rows {
            let lowest_open: Option<i64> = r.get(COLUMNS);
            let m = Columns::of_pool(r).message()?;
            after = (
                m.outbound.next_attempt.map_or(i64::MIN, millis),
                m.group_id.as_str().to_owned(),
                m.number.map_or(-1, |n| n as i64),
            );
            let candidate = Candidate {
                ordered: m.ordered,
                number: m.number,
                expiry: m.outbound.expiry,
                lowest_open: lowest_open.map(|n| n as u64),
            };
            let window = window_for(&m.destination, windows, window);
            if !in_window(&candidate, window, now) {
                let expiry = m.outbound.expiry;
                due.held_until = Some(due.held_until.map_or(expiry, |t| t.min(expiry)));
            } else if due.messages.len() < wanted {
                due.messages.push(m);
            }
        }
        if (rows.len() as i64) < limit {
            break;
        }
    }
    Ok(due)
}

/// Sent messages are read a page at a time by id, and `send_group::awaits_poll` picks those
/// only a poll can settle, until `limit` are picked or none are left.
pub(super) async fn awaiting_poll(
    pool: &SqlitePool,
    after: &str,
    limit: i64,
) -> Result<Vec<OutMessage>, StoreError> {
    let wanted = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
    let mut picked = Vec::new();
    let mut after = after.to_owned();
    while picked.len() < wanted {
        let rows = sqlx::query(select_messages!(
            @envelope "''",
            "",
            "WHERE m.state = 'sent' AND m.id > ? ORDER BY m.id LIMIT ?"
        ))
        .bind(&after)
        .bind(limit)
        .fetch_all(pool)
        .await?;
        for r in &rows {
            let m = Columns::of_pool(r).message()?;
            after.clone_from(&m.id);
            if picked.len() < wanted && awaits_poll(&m.reply, &m.outbound) {
                picked.push(m);
            }
        }
        if (rows.len() as i64) < limit {
            break;
        }
    }
    Ok(picked)
}

pub(super) async fn next_outbound_due(
    pool: &SqlitePool,
    after: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    // The condition lets SQLite answer from the partial index, not a table scan.
    let ms: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(next_attempt) FROM out_messages \
         WHERE next_attempt IS NOT NULL AND next_attempt > ?",
    )
    .bind(millis(after))
    .fetch_one(pool)
    .await?;
    Ok(ms.map(from_millis))
}

pub(super) async fn out_events_of(
    pool: &SqlitePool,
    principal: Option<&str>,
    after: i64,
    limit: i64,
) -> Result<Vec<OutEvent>, StoreError> {
    let rows = sqlx::query(
        "SELECT e.seq, e.message_id, e.state, e.detail, e.at FROM out_events e \
         WHERE e.seq > ?1 AND (?2 IS NULL OR EXISTS (SELECT 1 FROM out_messages m \
           WHERE m.id = e.message_id AND m.principal = ?2)) \
         ORDER BY e.seq LIMIT ?3",
    )
    .bind(after)
    .bind(principal)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(event).collect())
}

pub(super) async fn out_message_events(
    pool: &SqlitePool,
    message_id: &str,
    limit: i64,
) -> Result<Vec<OutEvent>, StoreError> {
    let rows = sqlx::query(
        "SELECT seq, message_id, state, detail, at FROM out_events \
         WHERE message_id = ?1 ORDER BY seq LIMIT ?2",
    )
    .bind(message_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(event).collect())
}

/// An `out_events` row read as `seq, message_id, state, detail, at`.
fn event(r: &sqlx::sqlite::SqliteRow) -> OutEvent {
    OutEvent {
        seq: r.get(0),
        message_id: r.get(1),
        state: r.get(2),
        detail: r.get(3),
        at: from_millis(r.get(4)),
    }
}
