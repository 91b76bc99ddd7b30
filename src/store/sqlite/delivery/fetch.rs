//! A fetch inside one change: renew the member, lapse what is overdue, match new inbox
//! messages against the filter, read the candidates page by page, let `delivery::fetch` plan
//! what each page hands out, and write the plan (leases, group affinity) back.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::rows::{self, LEASE_COLUMNS, LeaseRow};
use super::sessions;
use crate::delivery::fetch::{self, Budget, HandOut, Take};
use crate::delivery::filter::Filter;
use crate::delivery::group;
use crate::delivery::lease::Lease;
use crate::delivery::pick::{Candidate, Members};
use crate::delivery::subscription::Ordering;
use crate::store::StoreError;
use crate::store::delivery::{DeliveryError, Handed, Subscription};
use crate::store::time::{from_millis, millis};

/// Inbox messages matched against one subscription's filter per pass.
const MATCH_BATCH: i64 = 2_000;

/// What a fetch handed out, and whether others may now take something (lapses, releases).
pub(super) fn fetch(
    conn: &Connection,
    session_id: &str,
    take: Take,
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
    let members = Members::under(&sub.rules, session_id, &live);
    let page = fetch::page_size(take.max);
    let mut budget = Budget::new(take);
    let mut after = 0i64;
    let mut handed = Vec::new();
    let mut released = false;
    'pages: for _ in 0..fetch::CANDIDATE_PAGES {
        let (candidates, groups) = candidates(conn, &sub, now, after, page)?;
        let want = budget.wanted();
        let plan = fetch::plan_page(
            sub.id,
            &sub.rules,
            &members,
            &candidates,
            &groups,
            want,
            now,
        );
        for out in plan {
            match hand_out(conn, sub.id, out, &mut budget, now)? {
                HandedOut::Message(h, was_released) => {
                    released |= was_released;
                    handed.push(*h);
                }
                HandedOut::Missing => {}
                HandedOut::OverBudget => break 'pages,
            }
        }
        match fetch::next_page(&candidates, page, budget.count(), take.max) {
            Some(last) => after = last,
            None => break,
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

/// What became of one hand-out of the plan.
enum HandedOut {
    /// Leased (or released at once: true) and answered with its message.
    Message(Box<Handed>, bool),
    /// Gone from the inbox: nothing written.
    Missing,
    /// Beyond the fetch's byte budget: nothing written, and the fetch ends.
    OverBudget,
}

/// Writes one hand-out of the plan (its lease, and the group it binds to the member) if the
/// fetch's `budget` admits its message.
fn hand_out(
    conn: &Connection,
    subscription: i64,
    out: HandOut,
    budget: &mut Budget,
    now: DateTime<Utc>,
) -> Result<HandedOut, StoreError> {
    let offset = out.offset;
    let Some(message) = rows::inbox_entry(conn, offset)? else {
        tracing::error!(
            offset,
            subscription,
            "a leased message is missing from the inbox"
        );
        return Ok(HandedOut::Missing);
    };
    if !budget.admit(message.payload.len()) {
        return Ok(HandedOut::OverBudget);
    }
    rows::save_leases(conn, subscription, &[(offset, &out.lease)], now)?;
    if let Some(group) = &out.binds_group {
        conn.prepare_cached(
            "INSERT INTO group_affinity (subscription_id, group_key, consumer) \
             VALUES (?1, ?2, ?3) ON CONFLICT DO UPDATE SET consumer = excluded.consumer",
        )?
        .execute(params![subscription, group, out.receipt.consumer])?;
    }
    let handed = Handed {
        receipt: out.receipt,
        deadline: out.deadline,
        message,
    };
    Ok(HandedOut::Message(Box::new(handed), out.released))
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
