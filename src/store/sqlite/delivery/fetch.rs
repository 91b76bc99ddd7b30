//! A fetch inside one change: renew the member, lapse what is overdue, match new inbox
//! messages against the filter, read the candidates, let `delivery::pick` choose and
//! `delivery::settle::hand` hand them out, and write the leases back.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::rows::{self, LEASE_COLUMNS, LeaseRow};
use super::sessions;
use crate::delivery::filter::Filter;
use crate::delivery::group;
use crate::delivery::lease::Lease;
use crate::delivery::pick::{Candidate, Members, pick};
use crate::delivery::receipt::Receipt;
use crate::delivery::settle;
use crate::delivery::subscription::{Ordering, SettleMode};
use crate::store::StoreError;
use crate::store::delivery::{DeliveryError, Handed, Subscription};
use crate::store::time::{from_millis, millis};

/// Inbox messages matched against one subscription's filter per pass.
const MATCH_BATCH: i64 = 2_000;

/// Pages of candidates one fetch looks through at most.
const CANDIDATE_PAGES: usize = 8;

/// What a fetch handed out, and whether others may now take something (lapses, releases).
pub(super) fn fetch(
    conn: &Connection,
    session_id: &str,
    max: usize,
    now: DateTime<Utc>,
) -> Result<(Vec<Handed>, bool), DeliveryError> {
    let mut lapsed = sessions::lapse_sessions(conn, now)?;
    let session = sessions::renew(conn, session_id, now)?;
    let sub = rows::subscription_by_id(conn, session.subscription_id)?
        .ok_or_else(|| DeliveryError::NotFound("the subscription was deleted".into()))?;
    lapsed += sessions::lapse_leases(conn, Some(sub.id), now)?;
    match_new_messages(conn, &sub)?;

    let live: BTreeSet<String> = conn
        .prepare_cached("SELECT id FROM sessions WHERE subscription_id = ?1")?
        .query_map([sub.id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let members = Members {
        me: session_id,
        live: &live,
        strict_avoid: sub.rules.settle_mode == SettleMode::Settled,
    };
    // Candidates page by page: those held back (by another member's group affinity, or kept
    // from this member) must not hide the ones after them.
    let page = (max as i64).saturating_mul(4).saturating_add(32);
    let mut after = 0i64;
    let mut handed = Vec::new();
    let mut released = false;
    for _ in 0..CANDIDATE_PAGES {
        let (candidates, groups) = candidates(conn, &sub, now, after, page)?;
        let picked = pick(&candidates, &members, max - handed.len(), now);
        for i in picked {
            let (candidate, group) = (&candidates[i], groups[i].as_deref());
            if let Some(h) = hand_out(conn, &sub, session_id, candidate, group, now)? {
                released |= h.1;
                handed.push(h.0);
            }
        }
        match candidates.last() {
            Some(last) if handed.len() < max && candidates.len() as i64 == page => {
                after = last.offset
            }
            _ => break,
        }
    }
    Ok((handed, lapsed > 0 || released))
}

/// One page of waiting messages due by `now` beyond `after`, in offset order, with their
/// groups. ordering = group: each group's head only, with its affinity and whether another
/// message of the group is leased (`pick` decides what that means).
fn candidates(
    conn: &Connection,
    sub: &Subscription,
    now: DateTime<Utc>,
    after: i64,
    page: i64,
) -> Result<(Vec<Candidate>, Vec<Option<String>>), StoreError> {
    let sql = if sub.rules.ordering == Ordering::Group {
        "SELECT d.offset, d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, d.reason, \
         d.group_key, a.consumer, EXISTS (SELECT 1 FROM deliveries e \
           WHERE e.subscription_id = ?1 AND e.group_key = h.group_key AND e.state = 'acquired') \
         FROM group_heads h \
         JOIN deliveries d ON d.subscription_id = h.subscription_id AND d.offset = h.head \
         LEFT JOIN group_affinity a \
         ON a.subscription_id = h.subscription_id AND a.group_key = h.group_key \
         WHERE h.subscription_id = ?1 AND h.head > ?4 AND d.state = 'available' AND d.due <= ?2 \
         ORDER BY h.head LIMIT ?3"
    } else {
        "SELECT d.offset, d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, d.reason, \
         d.group_key, NULL, 0 FROM deliveries d \
         WHERE d.subscription_id = ?1 AND d.state = 'available' AND d.due <= ?2 \
         AND d.offset > ?4 ORDER BY d.offset LIMIT ?3"
    };
    let rows: Vec<(LeaseRow, Option<String>, bool)> = conn
        .prepare_cached(sql)?
        .query_map(params![sub.id, millis(now), page, after], |r| {
            Ok((
                LeaseRow::read(r, 0)?,
                r.get(LEASE_COLUMNS)?,
                r.get(LEASE_COLUMNS + 1)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut candidates = Vec::with_capacity(rows.len());
    let mut groups = Vec::with_capacity(rows.len());
    for (row, affinity, group_busy) in rows {
        candidates.push(Candidate {
            offset: row.offset,
            lease: row.lease()?,
            affinity,
            group_busy,
        });
        groups.push(row.group);
    }
    Ok((candidates, groups))
}

/// Hands one picked message to the member (`settle::hand`) and binds its group to it; with
/// whether that released it at once. `None`: the message is gone from the inbox.
fn hand_out(
    conn: &Connection,
    sub: &Subscription,
    session_id: &str,
    candidate: &Candidate,
    group: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Option<(Handed, bool)>, StoreError> {
    let offset = candidate.offset;
    let Some(message) = rows::inbox_entry(conn, offset)? else {
        tracing::error!(
            offset,
            subscription = sub.id,
            "a leased message is missing from the inbox"
        );
        return Ok(None);
    };
    let mut lease = candidate.lease.clone();
    let handing = settle::hand(&sub.rules, &mut lease, session_id, now);
    rows::save_leases(conn, sub.id, &[(offset, &lease)], now)?;
    if let Some(group) = group {
        conn.prepare_cached(
            "INSERT INTO group_affinity (subscription_id, group_key, consumer) \
             VALUES (?1, ?2, ?3) ON CONFLICT DO UPDATE SET consumer = excluded.consumer",
        )?
        .execute(params![sub.id, group, session_id])?;
    }
    Ok(Some((
        Handed {
            receipt: Receipt {
                subscription: sub.id.to_string(),
                offset,
                attempt: handing.attempt,
                consumer: session_id.to_owned(),
            },
            deadline: handing.deadline,
            message,
        },
        handing.released,
    )))
}

/// Matches inbox messages beyond the subscription's cursor against its filter and gives each
/// match a lease (and, ordering = group, its group a head), then moves the cursor past them.
fn match_new_messages(conn: &Connection, sub: &Subscription) -> Result<(), StoreError> {
    let filter = Filter::parse(&sub.filter)
        .map_err(|e| StoreError::Corrupt(format!("subscription {} filter: {e}", sub.id)))?;
    let grouped = sub.rules.ordering == Ordering::Group;
    let cursor: i64 = conn
        .prepare_cached("SELECT cursor FROM subscriptions WHERE id = ?1")?
        .query_row([sub.id], |r| r.get(0))?;
    // The ordering group is the sender's: (partner, group id), as one opaque key.
    let rows: Vec<(i64, String, String, i64)> = conn
        .prepare_cached(
            "SELECT offset, topic, json_array(partner, group_id), received_at FROM inbox \
             WHERE offset > ?1 ORDER BY offset LIMIT ?2",
        )?
        .query_map(params![cursor, MATCH_BATCH], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let Some(last) = rows.last().map(|r| r.0) else {
        return Ok(());
    };
    let mut matched = Vec::new();
    for (offset, topic, group_key, received_at) in &rows {
        if filter.matches(topic) {
            let group = grouped.then_some(group_key.as_str());
            let lease = Lease::new(from_millis(*received_at));
            rows::insert_lease(
                conn,
                sub.id,
                *offset,
                group,
                &lease,
                from_millis(*received_at),
            )?;
            if let Some(group) = group {
                matched.push((*offset, group));
            }
        }
    }
    // A group with nothing pending gets its first new message as head.
    for (group, first) in group::first_of_each(matched) {
        let head = group::head_with(rows::head(conn, sub.id, group)?, first);
        rows::set_head(conn, sub.id, group, head)?;
    }
    conn.prepare_cached("UPDATE subscriptions SET cursor = ?2 WHERE id = ?1")?
        .execute(params![sub.id, last])?;
    Ok(())
}
