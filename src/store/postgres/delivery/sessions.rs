//! Members coming and going, and what time alone changes: sessions that lapse, leases that
//! lapse, ephemeral subscriptions abandoned, inbox messages nobody needs any more. Each runs
//! inside an operation's transaction; the decisions are `delivery::session`, `lease`, `wake`
//! and `retention`. Work on subscriptions other than the one an operation is about takes their
//! locks with SKIP LOCKED: whoever holds one does (or a later pass does) the same work.

use crate::store::postgres::usage::{change_usage, freed_by};
use crate::store::source_usage::UsageChanges;
use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use sqlx::PgConnection;

use super::rows::{self, LeaseRow, select_lease};
use super::{Fail, PURGE_LOCK};
use crate::delivery::retention::{self, Hold};
use crate::delivery::{session, wake};
use crate::store::delivery::{DeliveryError, Maintenance, Session};
use crate::store::time::{from_millis, millis};

/// Ends one session: its leases go back to the others at once (not counted as failures), its
/// groups lose their affinity, and an ephemeral subscription left without members starts its
/// grace period. `false`: no such session.
pub(super) async fn end_session(
    conn: &mut PgConnection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, Fail> {
    let Some(gone) = rows::lock_session(conn, session_id).await? else {
        return Ok(false);
    };
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(session_id)
        .execute(&mut *conn)
        .await?;
    let sub_id = gone.subscription_id;
    let Some(sub) = rows::subscription_by_id(&mut *conn, sub_id).await? else {
        return Ok(true);
    };
    let held: Vec<LeaseRow> = sqlx::query_as(select_lease!(
        "WHERE subscription_id = $1 AND state = 'acquired' AND consumer = $2"
    ))
    .bind(sub_id)
    .bind(session_id)
    .fetch_all(&mut *conn)
    .await?;
    let held = held
        .iter()
        .map(|row| Ok((row.offset, row.lease()?)))
        .collect::<Result<Vec<_>, Fail>>()?;
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE subscription_id = $1")
        .bind(sub_id)
        .fetch_one(&mut *conn)
        .await?;
    let ended = session::end(
        session_id,
        held,
        &sub.rules.policy(),
        sub.rules.durable,
        usize::try_from(left).unwrap_or(0),
        now,
    );
    let released: Vec<(i64, &_)> = ended.released.iter().map(|(o, l)| (*o, l)).collect();
    rows::save_leases(conn, sub_id, &released, now).await?;
    sqlx::query("DELETE FROM group_affinity WHERE subscription_id = $1 AND consumer = $2")
        .bind(sub_id)
        .bind(session_id)
        .execute(&mut *conn)
        .await?;
    if let Some(idle) = ended.idle_since {
        sqlx::query("UPDATE subscriptions SET idle_since = $2 WHERE id = $1")
            .bind(sub_id)
            .bind(millis(idle))
            .execute(&mut *conn)
            .await?;
    }
    Ok(true)
}

/// Ends every session whose TTL passed without a fetch or heartbeat, of the subscriptions
/// this transaction holds or can take at once; how many.
pub(super) async fn lapse_sessions(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
) -> Result<usize, Fail> {
    // The index walk finds those expiring before now; `session::lapsed` decides, on the row
    // read again under its subscription's lock.
    let expiring: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT id, subscription_id, expires_at FROM sessions WHERE expires_at < $1 \
         ORDER BY subscription_id, id",
    )
    .bind(millis(now))
    .fetch_all(&mut *conn)
    .await?;
    let mut locked: HashMap<i64, bool> = HashMap::new();
    let mut lapsed = 0;
    for (id, sub_id, expires_at) in expiring {
        if !session::lapsed(from_millis(expires_at), now) {
            continue;
        }
        let ours = match locked.get(&sub_id) {
            Some(known) => *known,
            None => {
                let got = rows::try_lock_subscription(conn, sub_id).await?;
                locked.insert(sub_id, got);
                got
            }
        };
        if !ours {
            continue;
        }
        let still = rows::session_by_id(&mut *conn, &id)
            .await?
            .is_some_and(|s| s.subscription_id == sub_id && session::lapsed(s.expires_at, now));
        if still && end_session(conn, &id, now).await? {
            lapsed += 1;
        }
    }
    Ok(lapsed)
}

/// Renews a live session by its TTL; a lapsed or unknown one is not found. Takes the lock of
/// the session's subscription.
pub(super) async fn renew(
    conn: &mut PgConnection,
    session_id: &str,
    now: DateTime<Utc>,
) -> Result<Session, Fail> {
    let not_found = || {
        DeliveryError::NotFound(format!(
            "no live session {session_id:?} (unknown or lapsed); join again"
        ))
    };
    let mut live = rows::lock_session(conn, session_id)
        .await?
        .filter(|s| !session::lapsed(s.expires_at, now))
        .ok_or_else(not_found)?;
    live.expires_at = session::renewed(now, live.ttl);
    sqlx::query("UPDATE sessions SET expires_at = $2 WHERE id = $1")
        .bind(session_id)
        .bind(millis(live.expires_at))
        .execute(&mut *conn)
        .await?;
    Ok(live)
}

/// Starts a session; a session id reused (a push worker restarting) first gives up what it held.
pub(super) async fn join(
    conn: &mut PgConnection,
    subscription_id: i64,
    session_id: &str,
    principal: &str,
    ttl: Duration,
    now: DateTime<Utc>,
) -> Result<Session, Fail> {
    // Checked under its lock: a subscription deleted meanwhile gets no member.
    if !rows::lock_subscription(conn, subscription_id).await? {
        return Err(DeliveryError::NotFound(format!("no subscription {subscription_id}")).into());
    }
    end_session(conn, session_id, now).await?;
    let session = Session {
        id: session_id.to_owned(),
        subscription_id,
        principal: principal.to_owned(),
        ttl,
        expires_at: session::renewed(now, ttl),
    };
    let inserted = sqlx::query(
        "INSERT INTO sessions (id, subscription_id, principal, ttl_ms, expires_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&session.id)
    .bind(subscription_id)
    .bind(&session.principal)
    .bind(ttl.num_milliseconds())
    .bind(millis(session.expires_at))
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        // Another gateway started a session of this id (on another subscription) after ours
        // ended it: the next attempt ends that one, as a reused id does.
        return Err(Fail::Raced("the session id was taken meanwhile"));
    }
    sqlx::query("UPDATE subscriptions SET idle_since = NULL WHERE id = $1")
        .bind(subscription_id)
        .execute(&mut *conn)
        .await?;
    Ok(session)
}

/// Withdraws a grant and ends the principal's sessions on the subscription: (whether the
/// grant existed, whether sessions ended).
pub(super) async fn revoke(
    conn: &mut PgConnection,
    id: i64,
    principal: &str,
    now: DateTime<Utc>,
) -> Result<(bool, bool), Fail> {
    rows::lock_subscription(conn, id).await?;
    let done = sqlx::query("DELETE FROM grants WHERE subscription_id = $1 AND principal = $2")
        .bind(id)
        .bind(principal)
        .execute(&mut *conn)
        .await?;
    let sessions: Vec<String> =
        sqlx::query_scalar("SELECT id FROM sessions WHERE subscription_id = $1 AND principal = $2")
            .bind(id)
            .bind(principal)
            .fetch_all(&mut *conn)
            .await?;
    for session in &sessions {
        end_session(conn, session, now).await?;
    }
    Ok((done.rows_affected() == 1, !sessions.is_empty()))
}

/// Overdue leases lapsed per pass at most.
const LAPSE_BATCH: i64 = 10_000;

/// Leases whose deadline passed without a settle: failed attempts (`Lease::expire`). Of one
/// subscription (whose lock the caller holds) or of all this transaction can take at once.
pub(super) async fn lapse_leases(
    conn: &mut PgConnection,
    subscription: Option<i64>,
    now: DateTime<Utc>,
) -> Result<usize, Fail> {
    let subs: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT subscription_id FROM deliveries WHERE state = 'acquired' AND due < $1 \
         AND ($2::BIGINT IS NULL OR subscription_id = $2) ORDER BY subscription_id",
    )
    .bind(millis(now))
    .bind(subscription)
    .fetch_all(&mut *conn)
    .await?;
    let mut lapsed = 0;
    for sub_id in subs {
        let budget = LAPSE_BATCH - lapsed as i64;
        if budget <= 0 {
            break;
        }
        if !rows::try_lock_subscription(conn, sub_id).await? {
            continue;
        }
        let Some(sub) = rows::subscription_by_id(&mut *conn, sub_id).await? else {
            continue;
        };
        let policy = sub.rules.policy();
        let overdue: Vec<LeaseRow> = sqlx::query_as(select_lease!(
            "WHERE subscription_id = $1 AND state = 'acquired' AND due < $2 \
             ORDER BY \"offset\" LIMIT $3"
        ))
        .bind(sub_id)
        .bind(millis(now))
        .bind(budget)
        .fetch_all(&mut *conn)
        .await?;
        for row in overdue {
            let mut lease = row.lease()?;
            if lease.overdue(now) {
                lease.expire(now, &policy);
                rows::save_leases(conn, sub_id, &[(row.offset, &lease)], now).await?;
                lapsed += 1;
            }
        }
    }
    Ok(lapsed)
}

/// The body of `maintain_deliveries`.
pub(super) async fn maintain(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    grace: Duration,
    retention: Duration,
) -> Result<Maintenance, Fail> {
    let mut report = Maintenance {
        sessions_lapsed: lapse_sessions(conn, now).await?,
        leases_lapsed: lapse_leases(conn, None, now).await?,
        ..Maintenance::default()
    };
    let idle: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM subscriptions WHERE idle_since IS NOT NULL ORDER BY id")
            .fetch_all(&mut *conn)
            .await?;
    for id in idle {
        if !rows::try_lock_subscription(conn, id).await? {
            continue;
        }
        // Read again under the lock: a member may have joined meanwhile.
        let since: Option<i64> =
            sqlx::query_scalar("SELECT idle_since FROM subscriptions WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
                .flatten();
        let Some(since) = since else { continue };
        if wake::abandoned(from_millis(since), grace, now)
            && rows::remove_subscription(conn, id).await?
        {
            report.subscriptions_removed += 1;
        }
    }
    report.inbox_purged = purge_inbox(conn, now, retention).await?;
    Ok(report)
}

/// Inbox messages purged per pass at most.
const PURGE_BATCH: u64 = 10_000;

/// Inbox messages looked at per page.
const PURGE_PAGE: i64 = 1_000;

/// Purges the inbox messages `retention::purgeable` lets go (at most `PURGE_BATCH`), with
/// their settled deliveries; how many. Walked by arrival (the received_at index), page by page.
///
/// One gateway at a time, and never while a subscription is being created: a new one starts
/// at its cursor, which the decision ("matched by all") must count. A gateway finding another
/// at it leaves the purge to that one. The deliveries it reads belong to subscriptions whose
/// locks it does not hold, which is safe: a message every cursor passed has all its leases,
/// and a settled lease is never written again.
async fn purge_inbox(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<u64, Fail> {
    let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(PURGE_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !ours {
        return Ok(0);
    }
    let before = millis(retention::purge_before(now, retention));
    let min_cursor: Option<i64> = sqlx::query_scalar("SELECT MIN(cursor) FROM subscriptions")
        .fetch_one(&mut *conn)
        .await?;
    let mut purged = 0;
    let mut emptied: Vec<i64> = Vec::new();
    let mut freed = UsageChanges::default();
    let mut after: (i64, i64) = (i64::MIN, i64::MIN);
    while purged < PURGE_BATCH {
        let page: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT received_at, \"offset\" FROM inbox WHERE received_at < $1 \
             AND (received_at, \"offset\") > ($2, $3) ORDER BY received_at, \"offset\" LIMIT $4",
        )
        .bind(before)
        .bind(after.0)
        .bind(after.1)
        .bind(PURGE_PAGE)
        .fetch_all(&mut *conn)
        .await?;
        let Some(last) = page.last() else {
            break;
        };
        after = *last;
        let offsets: Vec<i64> = page.iter().map(|(_, offset)| *offset).collect();
        let held: Vec<(i64, i64, String, i64)> = sqlx::query_as(
            "SELECT \"offset\", subscription_id, state, due FROM deliveries \
             WHERE \"offset\" = ANY($1)",
        )
        .bind(&offsets)
        .fetch_all(&mut *conn)
        .await?;
        let mut holds: BTreeMap<i64, Vec<Hold>> = BTreeMap::new();
        let mut holders: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        for (offset, sub_id, state, due) in held {
            holds.entry(offset).or_default().push(if state == "done" {
                Hold::Settled(from_millis(due))
            } else {
                Hold::Open
            });
            holders.entry(offset).or_default().push(sub_id);
        }
        let mut going = Vec::new();
        for (received_at, offset) in page {
            let matched_by_all = min_cursor.is_none_or(|cursor| offset <= cursor);
            let of_it = holds.get(&offset).map_or(&[][..], Vec::as_slice);
            if retention::purgeable(
                from_millis(received_at),
                matched_by_all,
                of_it,
                now,
                retention,
            ) {
                going.push(offset);
                emptied.extend(holders.get(&offset).into_iter().flatten());
                purged += 1;
                if purged >= PURGE_BATCH {
                    break;
                }
            }
        }
        if !going.is_empty() {
            let gone = sqlx::query_as(
                "DELETE FROM inbox WHERE \"offset\" = ANY($1) RETURNING source, \
                 CASE WHEN consumed THEN 0 ELSE octet_length(payload)::bigint END",
            )
            .bind(&going)
            .fetch_all(&mut *conn)
            .await?;
            freed_by(gone, &mut freed);
            sqlx::query("DELETE FROM deliveries WHERE \"offset\" = ANY($1)")
                .bind(&going)
                .execute(&mut *conn)
                .await?;
        }
    }
    change_usage(&mut *conn, &freed).await?;
    emptied.sort_unstable();
    emptied.dedup();
    for sub_id in emptied {
        // A group keeps its member while any of its messages is retained. Under the
        // subscription's lock, so that no fetch binds a group meanwhile. One busy elsewhere
        // keeps these bindings until a later purge of its messages: a group's next message
        // may then go first to its former member, which orders nothing differently.
        if rows::try_lock_subscription(conn, sub_id).await? {
            sqlx::query(
                "DELETE FROM group_affinity a WHERE a.subscription_id = $1 \
                 AND NOT EXISTS (SELECT 1 FROM deliveries d \
                 WHERE d.subscription_id = a.subscription_id AND d.group_key = a.group_key)",
            )
            .bind(sub_id)
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(purged)
}
