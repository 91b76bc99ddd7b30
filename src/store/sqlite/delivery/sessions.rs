//! Members coming and going, and what time alone changes: sessions that lapse, leases that
//! lapse, ephemeral subscriptions abandoned, inbox messages nobody needs any more. Each runs
//! inside a change; the decisions are `delivery::session`, `lease` and `wake`.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{self, select_lease};
use crate::delivery::lease::Policy;
use crate::delivery::retention::{self, Hold};
use crate::delivery::{session, wake};
use crate::store::StoreError;
use crate::store::delivery::{DeliveryError, Maintenance, Session};
use crate::store::source_usage::UsageChanges;
use crate::store::sqlite::batch::write_usage;
use crate::store::time::{from_millis, millis};

/// Ends one session: its leases go back to the others at once (not counted as failures), its
/// groups lose their affinity, and an ephemeral subscription left without members starts its
/// grace period. `false`: no such session.
pub(super) fn end_session(
    conn: &Connection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let Some(gone) = rows::session_by_id(conn, session_id)? else {
        return Ok(false);
    };
    conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
        .execute([session_id])?;
    let sub_id = gone.subscription_id;
    let Some(sub) = rows::subscription_by_id(conn, sub_id)? else {
        return Ok(true);
    };
    let held = rows::lease_rows(
        conn,
        select_lease!("WHERE subscription_id = ?1 AND state = 'acquired' AND consumer = ?2"),
        params![sub_id, session_id],
    )?;
    let held = held
        .iter()
        .map(|row| Ok((row.offset, row.lease()?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let left: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM sessions WHERE subscription_id = ?1")?
        .query_row([sub_id], |r| r.get(0))?;
    let ended = session::end(
        session_id,
        held,
        &sub.rules.policy(),
        sub.rules.durable,
        left as usize,
        now,
    );
    let released: Vec<(i64, &_)> = ended.released.iter().map(|(o, l)| (*o, l)).collect();
    rows::save_leases(conn, sub_id, &released, now)?;
    conn.prepare_cached("DELETE FROM group_affinity WHERE subscription_id = ?1 AND consumer = ?2")?
        .execute(params![sub_id, session_id])?;
    if let Some(idle) = ended.idle_since {
        conn.prepare_cached("UPDATE subscriptions SET idle_since = ?2 WHERE id = ?1")?
            .execute(params![sub_id, millis(idle)])?;
    }
    Ok(true)
}

/// Ends every session whose TTL passed without a fetch or heartbeat; how many.
pub(super) fn lapse_sessions(conn: &Connection, now: DateTime<Utc>) -> Result<usize, StoreError> {
    // The index walk finds those expiring before now; `session::lapsed` decides.
    let expiring: Vec<(String, i64)> = conn
        .prepare_cached("SELECT id, expires_at FROM sessions WHERE expires_at < ?1")?
        .query_map([millis(now)], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut lapsed = 0;
    for (id, expires_at) in expiring {
        if session::lapsed(from_millis(expires_at), now) {
            end_session(conn, &id, now)?;
            lapsed += 1;
        }
    }
    Ok(lapsed)
}

/// The session `session_id` if it has not lapsed by `now`.
pub(super) fn live(
    conn: &Connection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<Option<Session>, StoreError> {
    Ok(rows::session_by_id(conn, session_id)?.filter(|s| !session::lapsed(s.expires_at, now)))
}

/// Renews a live session by its TTL; a lapsed or unknown one is not found.
pub(super) fn renew(
    conn: &Connection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<Session, DeliveryError> {
    let not_found = || {
        DeliveryError::NotFound(format!(
            "no live session {session_id:?} (unknown or lapsed); join again"
        ))
    };
    let mut live = live(conn, session_id, now)?.ok_or_else(not_found)?;
    live.expires_at = session::renewed(now, live.ttl);
    conn.prepare_cached("UPDATE sessions SET expires_at = ?2 WHERE id = ?1")?
        .execute(params![session_id, millis(live.expires_at)])?;
    Ok(live)
}

/// Starts a session; a session id reused (a push worker restarting) first gives up what it held.
pub(super) fn join(
    conn: &Connection,
    subscription_id: i64,
    session_id: &str,
    principal: &str,
    ttl: Duration,
    now: DateTime<Utc>,
) -> Result<Session, DeliveryError> {
    // Checked here, in the change: a subscription deleted meanwhile gets no member.
    if rows::subscription_by_id(conn, subscription_id)?.is_none() {
        return Err(DeliveryError::NotFound(format!(
            "no subscription {subscription_id}"
        )));
    }
    end_session(conn, session_id, now)?;
    let session = Session {
        id: session_id.to_owned(),
        subscription_id,
        principal: principal.to_owned(),
        ttl,
        expires_at: session::renewed(now, ttl),
    };
    conn.prepare_cached(
        "INSERT INTO sessions (id, subscription_id, principal, ttl_ms, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        session.id,
        subscription_id,
        session.principal,
        ttl.num_milliseconds(),
        millis(session.expires_at)
    ])?;
    conn.prepare_cached("UPDATE subscriptions SET idle_since = NULL WHERE id = ?1")?
        .execute([subscription_id])?;
    Ok(session)
}

/// Withdraws a grant and ends the principal's sessions on the subscription: (whether the
/// grant existed, whether sessions ended).
pub(super) fn revoke(
    conn: &Connection,
    id: i64,
    principal: &str,
    now: DateTime<Utc>,
) -> Result<(bool, bool), StoreError> {
    let done = conn
        .prepare_cached("DELETE FROM grants WHERE subscription_id = ?1 AND principal = ?2")?
        .execute(params![id, principal])?;
    let sessions: Vec<String> = conn
        .prepare_cached("SELECT id FROM sessions WHERE subscription_id = ?1 AND principal = ?2")?
        .query_map(params![id, principal], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for session in &sessions {
        end_session(conn, session, now)?;
    }
    Ok((done == 1, !sessions.is_empty()))
}

/// Leases of subscription `?2` past their deadline `?1`, with their subscription.
pub(super) const OVERDUE_OF_ONE: &str = concat!(
    "SELECT subscription_id, ",
    rows::lease_columns!(""),
    " FROM deliveries WHERE subscription_id = ?2 AND state = 'acquired' AND due < ?1 \
     LIMIT 10000"
);

/// Leases of every subscription past their deadline `?1`: leases are indexed by subscription
/// and deadline (`deliveries_acquired`), so they are looked up one subscription at a time.
pub(super) const OVERDUE_OF_ALL: &str = concat!(
    "SELECT d.subscription_id, ",
    rows::lease_columns!("d."),
    " FROM subscriptions s CROSS JOIN deliveries d \
     ON d.subscription_id = s.id AND d.state = 'acquired' AND d.due < ?1 LIMIT 10000"
);

/// Leases whose deadline passed without a settle: failed attempts (`Lease::expire`).
pub(super) fn lapse_leases(
    conn: &Connection,
    subscription: Option<i64>,
    now: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let read = |r: &rusqlite::Row| Ok((r.get(0)?, rows::LeaseRow::read(r, 1)?));
    let overdue: Vec<(i64, rows::LeaseRow)> = match subscription {
        Some(id) => conn
            .prepare_cached(OVERDUE_OF_ONE)?
            .query_map(params![millis(now), id], read)?
            .collect::<rusqlite::Result<_>>()?,
        None => conn
            .prepare_cached(OVERDUE_OF_ALL)?
            .query_map(params![millis(now)], read)?
            .collect::<rusqlite::Result<_>>()?,
    };
    let mut policies: HashMap<i64, Option<Policy>> = HashMap::new();
    let mut lapsed = 0;
    for (sub_id, row) in overdue {
        let policy = match policies.get(&sub_id) {
            Some(known) => known.clone(),
            None => {
                let policy = rows::subscription_by_id(conn, sub_id)?.map(|s| s.rules.policy());
                policies.insert(sub_id, policy.clone());
                policy
            }
        };
        let Some(policy) = policy else { continue };
        let mut lease = row.lease()?;
        if lease.overdue(now) {
            lease.expire(now, &policy);
            rows::save_leases(conn, sub_id, &[(row.offset, &lease)], now)?;
            lapsed += 1;
        }
    }
    Ok(lapsed)
}

/// The body of `maintain_deliveries`.
pub(super) fn maintain(
    conn: &Connection,
    now: DateTime<Utc>,
    grace: Duration,
    retention: Duration,
) -> Result<Maintenance, StoreError> {
    let mut report = Maintenance {
        sessions_lapsed: lapse_sessions(conn, now)?,
        leases_lapsed: lapse_leases(conn, None, now)?,
        ..Maintenance::default()
    };
    let idle: Vec<(i64, i64)> = conn
        .prepare_cached("SELECT id, idle_since FROM subscriptions WHERE idle_since IS NOT NULL")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, since) in idle {
        let since = from_millis(since);
        if wake::abandoned(since, grace, now) && rows::remove_subscription(conn, id)? {
            report.subscriptions_removed += 1;
        }
    }
    report.inbox_purged = purge_inbox(conn, now, retention)?;
    Ok(report)
}

/// Inbox messages purged per pass at most.
const PURGE_BATCH: u64 = 10_000;

/// Purges the inbox messages `retention::purgeable` lets go (at most `PURGE_BATCH`), with
/// their settled deliveries; how many. Walked by arrival (the received_at index), page by page.
fn purge_inbox(
    conn: &Connection,
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<u64, StoreError> {
    let before = millis(retention::purge_before(now, retention));
    let min_cursor: Option<i64> = conn
        .prepare_cached("SELECT MIN(cursor) FROM subscriptions")?
        .query_row([], |r| r.get(0))?;
    let mut purged = 0;
    let mut freed = UsageChanges::default();
    let mut after: (i64, i64) = (i64::MIN, i64::MIN);
    loop {
        let page: Vec<(i64, i64)> = conn
            .prepare_cached(
                "SELECT received_at, offset FROM inbox WHERE received_at < ?1 \
                 AND (received_at, offset) > (?2, ?3) ORDER BY received_at, offset LIMIT 1000",
            )?
            .query_map(params![before, after.0, after.1], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let Some(last) = page.last() else {
            break;
        };
        after = *last;
        for (received_at, offset) in page {
            let holds: Vec<Hold> = conn
                .prepare_cached("SELECT state, due FROM deliveries WHERE offset = ?1")?
                .query_map([offset], |r| {
                    let state: String = r.get(0)?;
                    let due: i64 = r.get(1)?;
                    Ok(if state == "done" {
                        Hold::Settled(from_millis(due))
                    } else {
                        Hold::Open
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            let matched_by_all = min_cursor.is_none_or(|cursor| offset <= cursor);
            if retention::purgeable(
                from_millis(received_at),
                matched_by_all,
                &holds,
                now,
                retention,
            ) {
                let gone: Option<(String, i64)> = conn
                    .prepare_cached("DELETE FROM inbox WHERE offset = ?1 RETURNING source, size")?
                    .query_row([offset], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                let consumed = conn
                    .prepare_cached("DELETE FROM inbox_consumed WHERE offset = ?1")?
                    .execute([offset])?
                    == 1;
                // A consumed message's bytes were freed when it was consumed.
                if let (Some((source, size)), false) = (gone, consumed) {
                    freed.freed(&source, u64::try_from(size).unwrap_or(0));
                }
                conn.prepare_cached("DELETE FROM deliveries WHERE offset = ?1")?
                    .execute([offset])?;
                purged += 1;
                if purged >= PURGE_BATCH {
                    break;
                }
            }
        }
        if purged >= PURGE_BATCH {
            break;
        }
    }
    write_usage(conn, &freed)?;
    if purged > 0 {
        // A group keeps its member while any of its messages is retained.
        conn.prepare_cached(
            "DELETE FROM group_affinity WHERE NOT EXISTS (SELECT 1 FROM deliveries d \
             WHERE d.subscription_id = group_affinity.subscription_id \
             AND d.group_key = group_affinity.group_key)",
        )?
        .execute([])?;
    }
    Ok(purged)
}
