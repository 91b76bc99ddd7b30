//! Settles, extends and dead-letter changes inside one change: the leases a request names are
//! read in the transaction, `delivery::settle` / `lease` decide, the leases are written back.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{self, LeaseRow, lease_columns, select_lease};
use crate::delivery::group;
use crate::delivery::lease::Lease;
use crate::delivery::receipt::Receipt;
use crate::delivery::settle;
use crate::delivery::subscription::Ordering;
use crate::store::StoreError;
use crate::store::delivery::{DeadLetterChange, DeliveryError, Settlement, Subscription};
use crate::store::overview::{COUNT_MINUTE_SQL, minute_of};

fn not_found() -> DeliveryError {
    DeliveryError::NotFound("no such delivery".into())
}

/// The lease row at (subscription, offset).
fn lease_at(conn: &Connection, sub_id: i64, offset: i64) -> Result<Option<LeaseRow>, StoreError> {
    Ok(conn
        .prepare_cached(select_lease!("WHERE subscription_id = ?1 AND offset = ?2"))?
        .query_row(params![sub_id, offset], |r| LeaseRow::read(r, 0))
        .optional()?)
}

/// The lease rows the `settlements` name, read with one statement per subscription rather
/// than one per receipt: a consumer settles its fetch's batch at once.
fn named_leases(
    conn: &Connection,
    settlements: &[Settlement],
) -> Result<HashMap<(i64, i64), LeaseRow>, StoreError> {
    let mut offsets: HashMap<i64, Vec<i64>> = HashMap::new();
    for (receipt, ..) in settlements {
        if let Ok(sub_id) = receipt.subscription.parse::<i64>() {
            offsets.entry(sub_id).or_default().push(receipt.offset);
        }
    }
    // Driven by the offsets named, one key lookup each: `offset IN (…)` lets the planner walk
    // every lease of the subscription instead (it cannot tell how few the list holds).
    let mut read = conn.prepare_cached(concat!(
        "SELECT ",
        lease_columns!("d."),
        " FROM json_each(?2) AS j CROSS JOIN deliveries AS d \
         WHERE d.subscription_id = ?1 AND d.offset = j.value"
    ))?;
    let mut found = HashMap::new();
    for (sub_id, offsets) in offsets {
        let offsets = rows::json_offsets(offsets);
        let rows = read.query_map(params![sub_id, offsets], |r| LeaseRow::read(r, 0))?;
        for row in rows {
            let row = row?;
            found.insert((sub_id, row.offset), row);
        }
    }
    Ok(found)
}

/// The body of `settle_many`: settlements apply in order (the same receipt twice counts
/// once); each answers alone; with whether others may now take something.
pub(super) fn settle_many(
    conn: &Connection,
    settlements: &[Settlement],
    now: DateTime<Utc>,
) -> Result<(Vec<Result<(), DeliveryError>>, bool), StoreError> {
    let mut subs: HashMap<i64, Option<Subscription>> = HashMap::new();
    let mut named = named_leases(conn, settlements)?;
    let mut leases: HashMap<(i64, i64), Lease> = HashMap::new();
    let mut changed: Vec<(i64, i64)> = Vec::new();
    let mut results = Vec::with_capacity(settlements.len());
    let mut wakes = false;
    for (receipt, outcome, by) in settlements {
        let Ok(sub_id) = receipt.subscription.parse::<i64>() else {
            results.push(Err(not_found()));
            continue;
        };
        let sub = match subs.entry(sub_id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(rows::subscription_by_id(conn, sub_id)?),
        };
        let Some(sub) = sub.as_ref() else {
            results.push(Err(not_found()));
            continue;
        };
        let key = (sub_id, receipt.offset);
        let lease = match leases.entry(key) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => match named.remove(&key) {
                Some(row) => slot.insert(row.lease()?),
                None => {
                    results.push(Err(not_found()));
                    continue;
                }
            },
        };
        match settle::settle(
            &sub.rules,
            lease,
            receipt,
            outcome.clone(),
            now,
            by.as_deref(),
        ) {
            Ok(settled) => {
                wakes |= settled.wakes;
                changed.push(key);
                results.push(Ok(()));
            }
            Err(stale) => results.push(Err(DeliveryError::Stale(stale))),
        }
    }
    changed.sort_unstable();
    changed.dedup();
    let mut by_sub: HashMap<i64, Vec<(i64, &Lease)>> = HashMap::new();
    for key in &changed {
        if let Some(lease) = leases.get(key) {
            by_sub.entry(key.0).or_default().push((key.1, lease));
        }
    }
    let delivered = changed
        .iter()
        .filter(|key| leases.get(key).is_some_and(Lease::done))
        .count();
    for (sub_id, leases) in by_sub {
        rows::save_leases(conn, sub_id, &leases, now)?;
    }
    if delivered > 0 {
        // The overview's "delivered" per minute (`overview::read_rates!`); one gateway here.
        static COUNT: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| COUNT_MINUTE_SQL.replace('$', "?"));
        conn.prepare_cached(&COUNT)?.execute(params![
            minute_of(crate::store::time::millis(now)),
            "delivered",
            "",
            delivered as i64
        ])?;
    }
    Ok((results, wakes))
}

/// The body of `extend`: the confirmed new deadline.
pub(super) fn extend(
    conn: &Connection,
    receipt: &Receipt,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, DeliveryError> {
    let sub_id: i64 = receipt.subscription.parse().map_err(|_| not_found())?;
    let sub = rows::subscription_by_id(conn, sub_id)?.ok_or_else(not_found)?;
    let mut lease = lease_at(conn, sub_id, receipt.offset)?
        .ok_or_else(not_found)?
        .lease()?;
    let deadline = lease.extend(receipt.attempt, &receipt.consumer, now, &sub.rules.policy())?;
    rows::save_leases(conn, sub_id, &[(receipt.offset, &lease)], now)?;
    Ok(deadline)
}

/// The body of `change_dead_letters`: how many changed.
pub(super) fn change_dead_letters(
    conn: &Connection,
    subscription_id: i64,
    offsets: Option<&[i64]>,
    change: DeadLetterChange,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let dead: Vec<LeaseRow> = match offsets {
        None => rows::lease_rows(
            conn,
            select_lease!("WHERE subscription_id = ?1 AND state = 'dead' ORDER BY offset"),
            [subscription_id],
        )?,
        Some(offsets) => {
            let mut found = Vec::with_capacity(offsets.len());
            for offset in offsets {
                found.extend(lease_at(conn, subscription_id, *offset)?);
            }
            found
        }
    };
    let grouped = rows::subscription_by_id(conn, subscription_id)?
        .is_some_and(|s| s.rules.ordering == Ordering::Group);
    let mut changed = 0;
    for row in dead {
        let mut lease = row.lease()?;
        let applied = match change {
            DeadLetterChange::Replay => lease.replay(now),
            DeadLetterChange::Purge => lease.purge(),
        };
        if !applied {
            continue;
        }
        rows::save_leases(conn, subscription_id, &[(row.offset, &lease)], now)?;
        changed += 1;
        // A replayed message of a group may come before the group's head.
        if let (DeadLetterChange::Replay, true, Some(group_key)) = (change, grouped, &row.group) {
            let head = group::head_with(rows::head(conn, subscription_id, group_key)?, row.offset);
            rows::set_head(conn, subscription_id, group_key, head)?;
        }
    }
    Ok(changed)
}
