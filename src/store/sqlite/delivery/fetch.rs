//! A fetch inside one change: renew the member, lapse what is overdue, match new inbox
//! messages against the filter, read the candidates page by page, let `delivery::fetch` plan
//! what each page hands out, and write the plan (leases, group affinity) back. A lease row is
//! written once per change it sees: a newly matched message of a subscription without ordering
//! gets its row as handed out (or as waiting, if this fetch leaves it), not both.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::rows::{self, LEASE_COLUMNS, LeaseRow, NewLease, lease_columns};
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
    let mut fresh = match_new_messages(conn, &sub, now)?;

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
        let (mut candidates, mut groups) = candidates(conn, &sub, now, after, page)?;
        fresh.extend_page(&mut candidates, &mut groups, after, page);
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
        let mut writes = LeaseWrites::default();
        let mut over_budget = false;
        for out in plan {
            let offset = out.offset;
            let first_write = fresh.contains(offset);
            match hand_out(conn, sub.id, out, first_write, &mut budget, &mut writes)? {
                HandedOut::Message(h, was_released) => {
                    if first_write {
                        fresh.written(offset);
                    }
                    released |= was_released;
                    handed.push(*h);
                }
                HandedOut::Missing => {}
                HandedOut::OverBudget => {
                    over_budget = true;
                    break;
                }
            }
        }
        // Written before the next page reads what is waiting.
        writes.write(conn, sub.id, now)?;
        if over_budget {
            break 'pages;
        }
        match fetch::next_page(&candidates, page, budget.count(), take.max) {
            Some(last) => after = last,
            None => break,
        }
    }
    fresh.store_untaken(conn, sub.id, now)?;
    Ok((handed, lapsed > 0 || released))
}

/// Messages this fetch matched for a subscription without ordering, whose leases are not
/// written yet: each is written once, as handed out or — if this fetch does not take it — as
/// waiting when the fetch ends, instead of being written waiting and at once rewritten as
/// handed out. Their offsets are beyond every lease row of the subscription (the cursor only
/// moves forward), so they follow its waiting rows in offset order.
#[derive(Default)]
struct Fresh {
    /// In offset order.
    matched: Vec<FreshMessage>,
}

struct FreshMessage {
    offset: i64,
    received_at: DateTime<Utc>,
    /// Handed out by this fetch, its lease row inserted.
    written: bool,
}

impl Fresh {
    /// Completes a `page` of stored candidates beyond `after` with fresh ones, when the
    /// stored ones ran out before the page was full.
    fn extend_page(
        &self,
        candidates: &mut Vec<Candidate>,
        groups: &mut Vec<Option<String>>,
        after: i64,
        page: i64,
    ) {
        let room = usize::try_from(page)
            .unwrap_or(0)
            .saturating_sub(candidates.len());
        let beyond = self
            .matched
            .iter()
            .filter(|m| !m.written && m.offset > after)
            .take(room);
        for m in beyond {
            candidates.push(Candidate {
                offset: m.offset,
                lease: Lease::new(m.received_at),
                affinity: None,
                group_busy: false,
            });
            groups.push(None);
        }
    }

    fn position(&self, offset: i64) -> Option<usize> {
        self.matched
            .binary_search_by_key(&offset, |m| m.offset)
            .ok()
    }

    /// Whether `offset` is a fresh message whose lease row is still to be inserted.
    fn contains(&self, offset: i64) -> bool {
        self.position(offset)
            .and_then(|i| self.matched.get(i))
            .is_some_and(|m| !m.written)
    }

    /// `offset` was handed out and its lease row inserted.
    fn written(&mut self, offset: i64) {
        if let Some(m) = self.position(offset).and_then(|i| self.matched.get_mut(i)) {
            m.written = true;
        }
    }

    /// Writes the leases of the fresh messages the fetch did not hand out, as waiting.
    fn store_untaken(
        self,
        conn: &Connection,
        subscription: i64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let untaken: Vec<NewLease<'_>> = self
            .matched
            .into_iter()
            .filter(|m| !m.written)
            .map(|m| (m.offset, None, Lease::new(m.received_at)))
            .collect();
        rows::insert_leases(conn, subscription, &untaken, now)
    }
}

/// The leases one page of a fetch hands out, written together when the page is done: one
/// statement per chunk of them rather than one per message (`multi_row`).
#[derive(Default)]
struct LeaseWrites {
    /// Fresh messages' leases, their rows still to be inserted.
    inserted: Vec<NewLease<'static>>,
    /// Leases whose rows exist.
    saved: Vec<(i64, Lease)>,
}

impl LeaseWrites {
    fn write(
        self,
        conn: &Connection,
        subscription: i64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        rows::insert_leases(conn, subscription, &self.inserted, now)?;
        let saved: Vec<(i64, &Lease)> = self.saved.iter().map(|(o, l)| (*o, l)).collect();
        rows::save_leases(conn, subscription, &saved, now)
    }
}

/// A page of group heads waiting and due (`?1` subscription, `?2` now, `?3` page size, `?4`
/// after this offset), each with its group's member and whether another of its messages is
/// leased.
pub(super) const GROUP_HEAD_CANDIDATES: &str = concat!(
    "SELECT ",
    lease_columns!("d."),
    ", a.consumer, EXISTS (SELECT 1 FROM deliveries e \
     WHERE e.subscription_id = ?1 AND e.group_key = h.group_key AND e.state = 'acquired') \
     FROM group_heads h \
     JOIN deliveries d ON d.subscription_id = h.subscription_id AND d.offset = h.head \
     LEFT JOIN group_affinity a \
     ON a.subscription_id = h.subscription_id AND a.group_key = h.group_key \
     WHERE h.subscription_id = ?1 AND h.head > ?4 AND d.state = 'available' AND d.due <= ?2 \
     ORDER BY h.head LIMIT ?3"
);

/// A page of waiting messages due (parameters as `GROUP_HEAD_CANDIDATES`), in offset order.
pub(super) const WAITING_CANDIDATES: &str = concat!(
    "SELECT ",
    lease_columns!("d."),
    ", NULL, 0 FROM deliveries d \
     WHERE d.subscription_id = ?1 AND d.state = 'available' AND d.due <= ?2 \
     AND d.offset > ?4 ORDER BY d.offset LIMIT ?3"
);

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
        GROUP_HEAD_CANDIDATES
    } else {
        WAITING_CANDIDATES
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

/// Takes one hand-out of the plan if the fetch's `budget` admits its message: its lease goes
/// to the page's `writes` (to be inserted when `first_write`, a fresh message's), the group
/// it binds to the member is written at once.
fn hand_out(
    conn: &Connection,
    subscription: i64,
    out: HandOut,
    first_write: bool,
    budget: &mut Budget,
    writes: &mut LeaseWrites,
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
    if first_write {
        writes.inserted.push((offset, None, out.lease));
    } else {
        writes.saved.push((offset, out.lease));
    }
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

/// Matches inbox messages beyond the subscription's cursor against its filter, then moves the
/// cursor past them. ordering = group: each match gets its lease row (and its group a head)
/// here; otherwise the matches are answered `Fresh`, their rows written by the fetch.
fn match_new_messages(
    conn: &Connection,
    sub: &Subscription,
    now: DateTime<Utc>,
) -> Result<Fresh, StoreError> {
    let filter = Filter::parse(&sub.filter)
        .map_err(|e| StoreError::Corrupt(format!("subscription {} filter: {e}", sub.id)))?;
    let grouped = sub.rules.ordering == Ordering::Group;
    let cursor: i64 = conn
        .prepare_cached("SELECT cursor FROM subscriptions WHERE id = ?1")?
        .query_row([sub.id], |r| r.get(0))?;
    // The ordering group is the sender's: (partner, group id), as one opaque key — built only
    // for a subscription that orders by it.
    let rows: Vec<(i64, String, Option<String>, i64)> = conn
        .prepare_cached(
            "SELECT offset, topic, CASE WHEN ?3 THEN json_array(partner, group_id) END, \
             received_at FROM inbox WHERE offset > ?1 ORDER BY offset LIMIT ?2",
        )?
        .query_map(params![cursor, MATCH_BATCH, grouped], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let Some(last) = rows.last().map(|r| r.0) else {
        return Ok(Fresh::default());
    };
    let mut matched = Vec::new();
    let mut grouped_leases: Vec<NewLease<'_>> = Vec::new();
    let mut fresh = Fresh::default();
    for (offset, topic, group_key, received_at) in &rows {
        if !filter.matches(topic) {
            continue;
        }
        let received_at = from_millis(*received_at);
        if let Some(group_key) = group_key {
            grouped_leases.push((*offset, Some(group_key.as_str()), Lease::new(received_at)));
            matched.push((*offset, group_key.as_str()));
        } else {
            fresh.matched.push(FreshMessage {
                offset: *offset,
                received_at,
                written: false,
            });
        }
    }
    rows::insert_leases(conn, sub.id, &grouped_leases, now)?;
    // A group with nothing pending gets its first new message as head.
    for (group, first) in group::first_of_each(matched) {
        let head = group::head_with(rows::head(conn, sub.id, group)?, first);
        rows::set_head(conn, sub.id, group, head)?;
    }
    conn.prepare_cached("UPDATE subscriptions SET cursor = ?2 WHERE id = ?1")?
        .execute(params![sub.id, last])?;
    Ok(fresh)
}
