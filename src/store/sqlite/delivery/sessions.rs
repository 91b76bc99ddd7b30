//! Members coming and going, and what time alone changes: sessions that lapse, leases that
//! lapse, ephemeral subscriptions abandoned, inbox messages nobody needs any more. Each runs
//! inside a change; the decisions are `delivery::session`, `lease` and `wake`.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use rusqlite::{Connection, params};

use super::rows::{self, select_lease};
use crate::delivery::lease::Policy;
use crate::delivery::{session, wake};
use crate::store::StoreError;
use crate::store::delivery::{DeliveryError, Maintenance, Session};
use crate::store::sqlite::group_json::millis;

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
        if session::lapsed(
            crate::store::sqlite::group_json::from_millis(expires_at),
            now,
        ) {
            end_session(conn, &id, now)?;
            lapsed += 1;
        }
    }
    Ok(lapsed)
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
    let mut live = rows::session_by_id(conn, session_id)?
        .filter(|s| !session::lapsed(s.expires_at, now))
        .ok_or_else(not_found)?;
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

/// Leases whose deadline passed without a settle: failed attempts (`Lease::expire`).
pub(super) fn lapse_leases(
    conn: &Connection,
    subscription: Option<i64>,
    now: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT subscription_id, offset, state, attempt, failures, consumer, due, avoid, reason, \
         group_key FROM deliveries WHERE state = 'acquired' AND due < ?1 \
         AND (?2 IS NULL OR subscription_id = ?2) LIMIT 10000",
    )?;
    let overdue: Vec<(i64, rows::LeaseRow)> = stmt
        .query_map(params![millis(now), subscription], |r| {
            Ok((r.get(0)?, rows::LeaseRow::read(r, 1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    drop(stmt);
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
        let since = crate::store::sqlite::group_json::from_millis(since);
        if wake::abandoned(since, grace, now) && rows::remove_subscription(conn, id)? {
            report.subscriptions_removed += 1;
        }
    }
    // Needed: beyond some subscription's cursor (not yet matched), or leased, waiting or
    // dead-lettered in one. Purged once no longer needed and both its arrival and its last
    // settling are older than the retention. Walked by arrival (the received_at index): by
    // offset it would scan the whole inbox on every pass.
    let before = now
        .checked_sub_signed(retention)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    report.inbox_purged = conn
        .prepare_cached(
            "DELETE FROM inbox WHERE offset IN (SELECT offset FROM inbox WHERE received_at < ?1 \
             AND offset <= (SELECT COALESCE(MIN(cursor), 9223372036854775807) FROM subscriptions) \
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.offset = inbox.offset \
                             AND (d.state != 'done' OR d.due >= ?1)) \
             ORDER BY received_at LIMIT 10000)",
        )?
        .execute([millis(before)])? as u64;
    if report.inbox_purged > 0 {
        conn.prepare_cached(
            "DELETE FROM deliveries WHERE state = 'done' AND NOT EXISTS \
             (SELECT 1 FROM inbox WHERE inbox.offset = deliveries.offset)",
        )?
        .execute([])?;
        // A group keeps its member while any of its messages is retained.
        conn.prepare_cached(
            "DELETE FROM group_affinity WHERE NOT EXISTS (SELECT 1 FROM deliveries d \
             WHERE d.subscription_id = group_affinity.subscription_id \
             AND d.group_key = group_affinity.group_key)",
        )?
        .execute([])?;
    }
    Ok(report)
}
