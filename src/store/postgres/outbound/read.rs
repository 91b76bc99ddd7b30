//! Outbound reads on the pool: they decide nothing (the send window is decided over their
//! rows by `send_group::in_window`; claims and saves check again in their own transaction).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgPool;

use super::Doing;
use super::rows::{COLUMNS, EARLIER_SUBMISSION, keyed, message, select_messages};
use crate::rmp::send_group::{Candidate, awaits_poll, in_window, window_for};
use crate::store::StoreError;
use crate::store::outbound::{
    Due, IdempotencyKey, OutEvent, OutFilter, OutMessage, SubmitError, Submitted,
};
use crate::store::time::{from_millis, millis};

pub(super) async fn earlier_submission(
    pool: &PgPool,
    idem: &IdempotencyKey,
) -> Result<Option<Submitted>, SubmitError> {
    let row = sqlx::query(EARLIER_SUBMISSION)
        .bind(&idem.principal)
        .bind(&idem.key)
        .fetch_optional(pool)
        .await
        .doing("looking up an idempotency key")
        .map_err(StoreError::from)?;
    match row {
        Some(row) => idem.replay(keyed(&row)?).map(Some),
        None => Ok(None),
    }
}

pub(super) async fn out_message(pool: &PgPool, id: &str) -> Result<Option<OutMessage>, StoreError> {
    let row = sqlx::query(select_messages!("WHERE m.id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await
        .doing("reading an outbound message")?;
    row.as_ref().map(message).transpose()
}

pub(super) async fn out_messages_of(
    pool: &PgPool,
    filter: &OutFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<OutMessage>, StoreError> {
    // In doubt as `Outbound::in_doubt` says it, in SQL.
    let sql = if filter.newest_first {
        select_messages!(
            "WHERE ($1::text IS NULL OR m.state = $1) AND ($2::text IS NULL OR m.group_id = $2) \
         AND ($5::text IS NULL OR m.principal = $5) AND ($6::text IS NULL OR m.partner = $6) \
         AND (NOT $7 OR (m.state IN ('queued', 'sent') AND m.attempts > m.unreached \
                         AND (m.next_attempt IS NULL OR m.next_attempt >= m.expiry))) \
         AND ($3 = '' OR m.id < $3) ORDER BY m.id DESC LIMIT $4"
        )
    } else {
        select_messages!(
            "WHERE ($1::text IS NULL OR m.state = $1) AND ($2::text IS NULL OR m.group_id = $2) \
         AND ($5::text IS NULL OR m.principal = $5) AND ($6::text IS NULL OR m.partner = $6) \
         AND (NOT $7 OR (m.state IN ('queued', 'sent') AND m.attempts > m.unreached \
                         AND (m.next_attempt IS NULL OR m.next_attempt >= m.expiry))) \
         AND m.id > $3 ORDER BY m.id LIMIT $4"
        )
    };
    let rows = sqlx::query(sql)
        .bind(filter.state)
        .bind(filter.group)
        .bind(after.unwrap_or(""))
        .bind(limit)
        .bind(filter.principal)
        .bind(filter.partner)
        .bind(filter.in_doubt)
        .fetch_all(pool)
        .await
        .doing("listing outbound messages")?;
    rows.iter().map(message).collect()
}

/// Due messages are read a page at a time in due order, each with the lowest number of its
/// ordered group not acknowledged yet, and the send window picks those that may go out, until
/// `limit` are picked or none are left.
pub(super) async fn due_outbound(
    pool: &PgPool,
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
            "WHERE m.next_attempt <= $1 \
             AND (m.next_attempt, m.group_id, COALESCE(m.number, -1)) > ($2, $3, $4) \
             ORDER BY m.next_attempt, m.group_id, COALESCE(m.number, -1) LIMIT $5"
        ))
        .bind(millis(now))
        .bind(after.0)
        .bind(&after.1)
        .bind(after.2)
        .bind(limit)
        .fetch_all(pool)
        .await
        .doing("reading the due outbound messages")?;
        for r in &rows {
            let lowest_open: Option<i64> = r
                .try_get(COLUMNS)
                .map_err(|e| StoreError::Corrupt(format!("lowest open number: {e}")))?;
            let m = message(r)?;
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
    pool: &PgPool,
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
            "WHERE m.state = 'sent' AND m.id > $1 ORDER BY m.id LIMIT $2"
        ))
        .bind(&after)
        .bind(limit)
        .fetch_all(pool)
        .await
        .doing("reading the sent outbound messages")?;
        for r in &rows {
            let m = message(r)?;
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
    pool: &PgPool,
    after: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    // The condition lets PostgreSQL answer from the partial index, not a table scan.
    let ms: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(next_attempt) FROM out_messages \
         WHERE next_attempt IS NOT NULL AND next_attempt > $1",
    )
    .bind(millis(after))
    .fetch_one(pool)
    .await
    .doing("reading the next outbound attempt")?;
    Ok(ms.map(from_millis))
}

pub(super) async fn out_events_of(
    pool: &PgPool,
    principal: Option<&str>,
    after: i64,
    limit: i64,
) -> Result<Vec<OutEvent>, StoreError> {
    let rows = sqlx::query(
        "SELECT e.seq, e.message_id, e.state, e.detail, e.at FROM out_events e \
         WHERE e.seq > $1 AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM out_messages m \
           WHERE m.id = e.message_id AND m.principal = $2)) \
         ORDER BY e.seq LIMIT $3",
    )
    .bind(after)
    .bind(principal)
    .bind(limit)
    .fetch_all(pool)
    .await
    .doing("reading outbound events")?;
    rows.iter().map(event).collect()
}

pub(super) async fn out_message_events(
    pool: &PgPool,
    message_id: &str,
    limit: i64,
) -> Result<Vec<OutEvent>, StoreError> {
    // `out_events_message` (message_id, seq) serves it.
    let rows = sqlx::query(
        "SELECT seq, message_id, state, detail, at FROM out_events \
         WHERE message_id = $1 ORDER BY seq LIMIT $2",
    )
    .bind(message_id)
    .bind(limit)
    .fetch_all(pool)
    .await
    .doing("reading a message's events")?;
    rows.iter().map(event).collect()
}

/// An `out_events` row read as `seq, message_id, state, detail, at`.
fn event(r: &sqlx::postgres::PgRow) -> Result<OutEvent, StoreError> {
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("outbound event row: {e}"));
    Ok(OutEvent {
        seq: r.try_get(0).map_err(column)?,
        message_id: r.try_get(1).map_err(column)?,
        state: r.try_get(2).map_err(column)?,
        detail: r.try_get(3).map_err(column)?,
        at: from_millis(r.try_get(4).map_err(column)?),
    })
}
