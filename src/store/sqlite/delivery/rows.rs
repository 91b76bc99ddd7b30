//! Rows of the delivery tables as the pure rules see them, and the primitive statements that
//! read and write them on the writer's connection (inside a change's transaction).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use chrono::{DateTime, Duration, Utc};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::delivery::group;
use crate::delivery::lease::{Lease, State};
use crate::store::delivery::{Session, Subscription};
use crate::store::received::payload_text;
use crate::store::source_usage::UsageChanges;
use crate::store::sqlite::batch::write_usage;
use crate::store::sqlite::multi_row::{bind_row, in_chunks, per_chunk_size, values_rows};
use crate::store::sqlite::select_inbox;
use crate::store::time::{from_millis, millis};
use crate::store::{InboxEntry, StoreError};

/// The columns `LeaseRow::read` takes, each after `$table` (`""`, or an alias and a dot for
/// queries that join other tables).
macro_rules! lease_columns {
    ($table:literal) => {
        concat!(
            $table,
            "offset, ",
            $table,
            "state, ",
            $table,
            "attempt, ",
            $table,
            "failures, ",
            $table,
            "consumer, ",
            $table,
            "due, ",
            $table,
            "avoid, ",
            $table,
            "reason, ",
            $table,
            "group_key"
        )
    };
}
pub(super) use lease_columns;

/// `SELECT` of lease rows followed by `$rest`; `LeaseRow::read(row, 0)` reads them.
macro_rules! select_lease {
    ($rest:literal) => {
        concat!(
            "SELECT ",
            crate::store::sqlite::delivery::rows::lease_columns!(""),
            " FROM deliveries ",
            $rest
        )
    };
}
pub(super) use select_lease;

/// Columns `LeaseRow::read` takes, for queries that join other tables.
pub(super) const LEASE_COLUMNS: usize = 9;

/// One row of `deliveries`: the state of one message in one subscription.
#[derive(Debug, Clone)]
pub(super) struct LeaseRow {
    pub offset: i64,
    state: String,
    attempt: i64,
    failures: i64,
    consumer: Option<String>,
    due: i64,
    avoid: String,
    reason: Option<String>,
    /// The ordering group (`ordering = group` only).
    pub group: Option<String>,
}

impl LeaseRow {
    /// The lease columns starting at column `at`.
    pub fn read(r: &Row, at: usize) -> rusqlite::Result<LeaseRow> {
        Ok(LeaseRow {
            offset: r.get(at)?,
            state: r.get(at + 1)?,
            attempt: r.get(at + 2)?,
            failures: r.get(at + 3)?,
            consumer: r.get(at + 4)?,
            due: r.get(at + 5)?,
            avoid: r.get(at + 6)?,
            reason: r.get(at + 7)?,
            group: r.get(at + 8)?,
        })
    }

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

/// The lease rows one statement returns.
pub(super) fn lease_rows<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> Result<Vec<LeaseRow>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt
        .query_map(params, |r| LeaseRow::read(r, 0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// The stored columns of a lease: state, consumer, due, avoid (JSON), reason. `due` holds the
/// lease's time: not-before, deadline, or — for a settled or dead-lettered one — when that
/// happened (`now`), from which inbox retention counts.
type Columns<'a> = (&'static str, Option<&'a str>, i64, String, Option<&'a str>);

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
    Ok((state, consumer, due, avoid, reason))
}

/// A lease to insert: a newly matched message's offset, its ordering group and its lease.
pub(super) type NewLease<'a> = (i64, Option<&'a str>, Lease);

/// Gives newly matched messages of one subscription their leases (nothing for one that has
/// its lease already), a multi-row statement per chunk (`multi_row`).
pub(super) fn insert_leases(
    conn: &Connection,
    subscription_id: i64,
    leases: &[NewLease<'_>],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    write_leases(
        conn,
        &INSERT_LEASES,
        subscription_id,
        leases,
        |statement, at, (offset, group, lease)| {
            bind_row(statement, at, &[offset, group])?;
            bind_lease(statement, at, lease, now)
        },
    )?;
    // Settled the moment they were handed out (the `settled` mode).
    let settled = leases.iter().filter(|(_, _, l)| l.state == State::Done);
    release_consumed(conn, settled.map(|(offset, ..)| *offset))
}

/// Stores leases of one subscription (each offset once), a multi-row statement per chunk
/// (`multi_row`), then moves the heads of the groups whose head finished.
pub(super) fn save_leases(
    conn: &Connection,
    subscription_id: i64,
    leases: &[(i64, &Lease)],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    write_leases(
        conn,
        &SAVE_LEASES,
        subscription_id,
        leases,
        |statement, at, (offset, lease)| {
            bind_row(statement, at, &[offset])?;
            bind_lease(statement, at, lease, now)
        },
    )?;
    let mut finished = leases.iter().filter(|(_, l)| l.finished()).peekable();
    // Only `ordering = group` keeps heads: asked once, not once per message finished.
    if finished.peek().is_some() && has_group_heads(conn, subscription_id)? {
        for (offset, _) in finished {
            advance_head(conn, subscription_id, *offset)?;
        }
    }
    let settled = leases.iter().filter(|(_, l)| l.state == State::Done);
    release_consumed(conn, settled.map(|(offset, _)| *offset))
}

/// Runs `statements[size]` (`per_chunk_size`) over `leases` in chunks: `?1` is the
/// subscription, `bind` binds each lease's parameters from `?2` on.
fn write_leases<T>(
    conn: &Connection,
    statements: &[String],
    subscription_id: i64,
    leases: &[T],
    bind: impl Fn(&mut rusqlite::Statement<'_>, &mut usize, &T) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    in_chunks(leases, |size, chunk| {
        let sql = statements
            .get(size)
            .ok_or_else(|| StoreError::Failed(format!("no statement for chunk size {size}")))?;
        let mut statement = conn.prepare_cached(sql)?;
        statement.raw_bind_parameter(1, subscription_id)?;
        let mut at = 2;
        for lease in chunk {
            bind(&mut statement, &mut at, lease)?;
        }
        statement.raw_execute()?;
        Ok(())
    })
}

/// Binds a lease's stored columns (`columns`) from `at` on, after the row's key.
fn bind_lease(
    statement: &mut rusqlite::Statement<'_>,
    at: &mut usize,
    lease: &Lease,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let (state, consumer, due, avoid, reason) = columns(lease, now)?;
    bind_row(
        statement,
        at,
        &[
            &state,
            &lease.attempt,
            &lease.failures,
            &consumer,
            &due,
            &avoid,
            &reason,
        ],
    )?;
    Ok(())
}

/// `insert_leases`' statements: rows of (offset, group_key, state, attempt, failures,
/// consumer, due, avoid, reason).
static INSERT_LEASES: LazyLock<Vec<String>> = LazyLock::new(|| {
    per_chunk_size(|rows| {
        format!(
            "INSERT INTO deliveries (subscription_id, offset, group_key, state, attempt, \
             failures, consumer, due, avoid, reason) VALUES {} ON CONFLICT DO NOTHING",
            values_rows(rows, 9, 2, "?1, ")
        )
    })
});

/// `save_leases`' statements: rows of (offset, state, attempt, failures, consumer, due,
/// avoid, reason), each updating the lease at (`?1`, offset) — found by its key, the values
/// walked once (`plans.rs` holds the planner to that).
pub(super) static SAVE_LEASES: LazyLock<Vec<String>> = LazyLock::new(|| {
    per_chunk_size(|rows| {
        format!(
            "UPDATE deliveries SET state = v.column2, attempt = v.column3, failures = v.column4, \
             consumer = v.column5, due = v.column6, avoid = v.column7, reason = v.column8 \
             FROM (VALUES {}) AS v \
             WHERE deliveries.subscription_id = ?1 AND deliveries.offset = v.column1",
            values_rows(rows, 8, 2, "")
        )
    })
});

/// Whether the subscription has any group head (only `ordering = group` has them).
fn has_group_heads(conn: &Connection, subscription_id: i64) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM group_heads WHERE subscription_id = ?1)")?
        .query_row([subscription_id], |r| r.get(0))?)
}

/// Offsets as the JSON array a statement driven by them reads with `json_each`: one key
/// lookup per offset, where `offset IN (…)` let the planner walk a whole index instead.
pub(super) fn json_offsets(offsets: Vec<i64>) -> String {
    serde_json::Value::from(offsets).to_string()
}

/// Of the messages just settled, those every subscription has now matched and settled are
/// consumed: their bytes are freed for their sources' storage quota (D13). A message some
/// subscription has not yet matched stays counted until it is purged.
fn release_consumed(
    conn: &Connection,
    settled: impl Iterator<Item = i64>,
) -> Result<(), StoreError> {
    let mut settled = settled.peekable();
    if settled.peek().is_none() {
        return Ok(());
    }
    let min_cursor: Option<i64> = conn
        .prepare_cached("SELECT MIN(cursor) FROM subscriptions")?
        .query_row([], |r| r.get(0))?;
    let Some(min_cursor) = min_cursor else {
        return Ok(());
    };
    let mut matched_by_all: Vec<i64> = settled.filter(|o| *o <= min_cursor).collect();
    // Each once: a message is marked consumed once.
    matched_by_all.sort_unstable();
    matched_by_all.dedup();
    if matched_by_all.is_empty() {
        return Ok(());
    }
    // One statement for the whole batch, driven by its offsets (one key lookup each), rather
    // than one per message settled.
    let offsets = json_offsets(matched_by_all);
    let consumed: Vec<(i64, String, i64)> = conn
        .prepare_cached(
            "SELECT i.offset, i.source, i.size FROM json_each(?1) AS j CROSS JOIN inbox AS i \
             WHERE i.offset = j.value \
             AND NOT EXISTS (SELECT 1 FROM inbox_consumed c WHERE c.offset = i.offset) \
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.offset = i.offset \
             AND d.state <> 'done')",
        )?
        .query_map([&offsets], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    if consumed.is_empty() {
        return Ok(());
    }
    let mut freed = UsageChanges::default();
    let mut offsets = Vec::with_capacity(consumed.len());
    for (offset, source, size) in consumed {
        offsets.push(offset);
        freed.freed(&source, u64::try_from(size).unwrap_or(0));
    }
    conn.prepare_cached("INSERT INTO inbox_consumed (offset) SELECT value FROM json_each(?1)")?
        .execute([json_offsets(offsets)])?;
    write_usage(conn, &freed)
}

/// A finished message that was its group's head hands the head on (`group::after_finish`).
fn advance_head(conn: &Connection, subscription_id: i64, finished: i64) -> Result<(), StoreError> {
    let group: Option<String> = conn
        .prepare_cached(
            "SELECT group_key FROM group_heads WHERE subscription_id = ?1 AND head = ?2",
        )?
        .query_row(params![subscription_id, finished], |r| r.get(0))
        .optional()?;
    let Some(group) = group else {
        return Ok(());
    };
    let mut next = None;
    let mut later = conn.prepare_cached(select_lease!(
        "WHERE subscription_id = ?1 AND group_key = ?2 AND offset > ?3 ORDER BY offset"
    ))?;
    let mut rows = later.query(params![subscription_id, group, finished])?;
    while let Some(row) = rows.next()? {
        let lease_row = LeaseRow::read(row, 0)?;
        if group::pending(&lease_row.lease()?) {
            next = Some(lease_row.offset);
            break;
        }
    }
    match group::after_finish(finished, finished, next) {
        Some(Some(head)) => set_head(conn, subscription_id, &group, head),
        Some(None) => {
            conn.prepare_cached(
                "DELETE FROM group_heads WHERE subscription_id = ?1 AND group_key = ?2",
            )?
            .execute(params![subscription_id, group])?;
            Ok(())
        }
        None => Ok(()),
    }
}

/// The head of one group, if it has one.
pub(super) fn head(
    conn: &Connection,
    subscription_id: i64,
    group: &str,
) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT head FROM group_heads WHERE subscription_id = ?1 AND group_key = ?2",
        )?
        .query_row(params![subscription_id, group], |r| r.get(0))
        .optional()?)
}

pub(super) fn set_head(
    conn: &Connection,
    subscription_id: i64,
    group: &str,
    head: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO group_heads (subscription_id, group_key, head) VALUES (?1, ?2, ?3) \
         ON CONFLICT DO UPDATE SET head = excluded.head",
    )?
    .execute(params![subscription_id, group, head])?;
    Ok(())
}

/// `SELECT` of a subscription's columns, its grants among them as a JSON array, followed by
/// `$rest` (`WHERE …` on `subscriptions s`); `subscription_from` reads a row of it. One
/// statement per subscription, not a second for its grants: on the read pool every statement
/// is a round trip to the connection's thread, and a consumer's fetch and settle each read
/// their subscription.
macro_rules! select_subscription {
    ($rest:literal) => {
        concat!(
            "SELECT s.id, s.name, s.filter, s.owner, s.rules, s.created_at, \
             (SELECT json_group_array(g.principal) FROM grants g \
             WHERE g.subscription_id = s.id) FROM subscriptions s ",
            $rest
        )
    };
}
pub(super) use select_subscription;

/// A subscription's stored columns, as `select_subscription!` reads them.
pub(super) type SubscriptionColumns = (i64, String, String, String, String, i64, String);

/// A subscription from its stored columns; its grants in order.
pub(super) fn subscription_from(
    (id, name, filter, owner, rules, created_at, grants): SubscriptionColumns,
) -> Result<Subscription, StoreError> {
    let rules = serde_json::from_str(&rules)
        .map_err(|e| StoreError::Corrupt(format!("subscription {id} rules: {e}")))?;
    let mut grants: Vec<String> = serde_json::from_str(&grants)
        .map_err(|e| StoreError::Corrupt(format!("subscription {id} grants: {e}")))?;
    grants.sort_unstable();
    Ok(Subscription {
        id,
        name,
        filter,
        owner,
        rules,
        grants,
        created_at: from_millis(created_at),
    })
}

fn subscription_where(
    conn: &Connection,
    sql: &str,
    key: impl rusqlite::ToSql,
) -> Result<Option<Subscription>, StoreError> {
    let row: Option<SubscriptionColumns> = conn
        .prepare_cached(sql)?
        .query_row([key], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })
        .optional()?;
    row.map(subscription_from).transpose()
}

pub(super) fn subscription_by_id(
    conn: &Connection,
    id: i64,
) -> Result<Option<Subscription>, StoreError> {
    subscription_where(conn, select_subscription!("WHERE s.id = ?1"), id)
}

pub(super) fn subscription_by_name(
    conn: &Connection,
    name: &str,
) -> Result<Option<Subscription>, StoreError> {
    subscription_where(conn, select_subscription!("WHERE s.name = ?1"), name)
}

/// Deletes a subscription with everything of it.
pub(super) fn remove_subscription(conn: &Connection, id: i64) -> Result<bool, StoreError> {
    for delete in [
        "DELETE FROM deliveries WHERE subscription_id = ?1",
        "DELETE FROM sessions WHERE subscription_id = ?1",
        "DELETE FROM grants WHERE subscription_id = ?1",
        "DELETE FROM group_affinity WHERE subscription_id = ?1",
        "DELETE FROM group_heads WHERE subscription_id = ?1",
    ] {
        conn.prepare_cached(delete)?.execute([id])?;
    }
    let removed = conn
        .prepare_cached("DELETE FROM subscriptions WHERE id = ?1")?
        .execute([id])?;
    Ok(removed == 1)
}

/// A session by id, lapsed or not.
pub(super) fn session_by_id(conn: &Connection, id: &str) -> Result<Option<Session>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, subscription_id, principal, ttl_ms, expires_at FROM sessions WHERE id = ?1",
        )?
        .query_row([id], |r| {
            Ok(Session {
                id: r.get(0)?,
                subscription_id: r.get(1)?,
                principal: r.get(2)?,
                ttl: Duration::milliseconds(r.get(3)?),
                expires_at: from_millis(r.get(4)?),
            })
        })
        .optional()?)
}

/// The inbox message at `offset`.
pub(super) fn inbox_entry(
    conn: &Connection,
    offset: i64,
) -> Result<Option<InboxEntry>, StoreError> {
    Ok(conn
        .prepare_cached(concat!(select_inbox!(), "FROM inbox WHERE offset = ?1"))?
        .query_row([offset], |r| {
            Ok(InboxEntry {
                offset: r.get(0)?,
                partner: r.get(9)?,
                channel: r.get(1)?,
                topic: r.get(2)?,
                group_id: r.get(3)?,
                number: r.get::<_, Option<i64>>(4)?.map(|n| n as u64),
                payload: text(r.get_ref(5)?),
                namespaces: r.get(6)?,
                received_at: from_millis(r.get(7)?),
                expiry: from_millis(r.get(8)?),
            })
        })
        .optional()?)
}

/// A payload stored as TEXT or BLOB (see `payload_text`).
fn text(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Text(t) | ValueRef::Blob(t) => payload_text(t),
        _ => String::new(),
    }
}
