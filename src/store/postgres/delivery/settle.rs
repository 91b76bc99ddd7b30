//! Settles, extends and dead-letter changes inside one transaction: the subscriptions a
//! request names are locked, their leases read under the locks, `delivery::settle` / `lease`
//! decide, the leases are written back.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::Fail;
use super::rows::{self, LeaseRow, select_lease};
use crate::delivery::group;
use crate::delivery::lease::Lease;
use crate::delivery::receipt::Receipt;
use crate::delivery::settle;
use crate::delivery::subscription::Ordering;
use crate::store::delivery::{DeadLetterChange, DeliveryError, Settlement, Subscription};
use crate::store::overview::{COUNT_MINUTE_SQL, minute_of};

fn not_found() -> DeliveryError {
    DeliveryError::NotFound("no such delivery".into())
}

/// The body of `settle_many`: settlements apply in order (the same receipt twice counts
/// once); each answers alone; with whether others may now take something.
pub(super) async fn settle_many(
    conn: &mut PgConnection,
    settlements: &[Settlement],
    now: DateTime<Utc>,
    gateway: &str,
) -> Result<(Vec<Result<(), DeliveryError>>, bool), Fail> {
    // Every subscription the batch names, locked in id order: two batches naming the same
    // ones in another order wait for each other instead of deadlocking.
    let named: BTreeSet<i64> = settlements
        .iter()
        .filter_map(|(receipt, _, _)| receipt.subscription.parse::<i64>().ok())
        .collect();
    let mut subs: HashMap<i64, Option<Subscription>> = HashMap::new();
    for sub_id in named {
        let sub = if rows::lock_subscription(conn, sub_id).await? {
            rows::subscription_by_id(&mut *conn, sub_id).await?
        } else {
            None
        };
        subs.insert(sub_id, sub);
    }
    let mut leases: HashMap<(i64, i64), Lease> = HashMap::new();
    let mut changed: Vec<(i64, i64)> = Vec::new();
    let mut results = Vec::with_capacity(settlements.len());
    let mut wakes = false;
    for (receipt, outcome, by) in settlements {
        let Ok(sub_id) = receipt.subscription.parse::<i64>() else {
            results.push(Err(not_found()));
            continue;
        };
        let Some(Some(sub)) = subs.get(&sub_id) else {
            results.push(Err(not_found()));
            continue;
        };
        let key = (sub_id, receipt.offset);
        let lease = match leases.entry(key) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => match rows::lease_at(conn, sub_id, receipt.offset).await? {
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
        rows::save_leases(conn, sub_id, &leases, now).await?;
    }
    if delivered > 0 {
        // The overview's "delivered" per minute (`overview::read_rates!`): this gateway's row,
        // so that gateways settling at once never wait for one another's.
        sqlx::query(COUNT_MINUTE_SQL)
            .bind(minute_of(crate::store::time::millis(now)))
            .bind("delivered")
            .bind(gateway)
            .bind(delivered as i64)
            .execute(&mut *conn)
            .await?;
    }
    Ok((results, wakes))
}

/// The body of `extend`: the confirmed new deadline.
pub(super) async fn extend(
    conn: &mut PgConnection,
    receipt: &Receipt,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, Fail> {
    let sub_id: i64 = receipt.subscription.parse().map_err(|_| not_found())?;
    if !rows::lock_subscription(conn, sub_id).await? {
        return Err(not_found().into());
    }
    let sub = rows::subscription_by_id(&mut *conn, sub_id)
        .await?
        .ok_or_else(not_found)?;
    let mut lease = rows::lease_at(conn, sub_id, receipt.offset)
        .await?
        .ok_or_else(not_found)?
        .lease()?;
    let deadline = lease
        .extend(receipt.attempt, &receipt.consumer, now, &sub.rules.policy())
        .map_err(DeliveryError::Stale)?;
    rows::save_leases(conn, sub_id, &[(receipt.offset, &lease)], now).await?;
    Ok(deadline)
}

/// The body of `change_dead_letters`: how many changed.
pub(super) async fn change_dead_letters(
    conn: &mut PgConnection,
    subscription_id: i64,
    offsets: Option<&[i64]>,
    change: DeadLetterChange,
    now: DateTime<Utc>,
) -> Result<u64, Fail> {
    rows::lock_subscription(conn, subscription_id).await?;
    let dead: Vec<LeaseRow> = match offsets {
        None => {
            sqlx::query_as(select_lease!(
                "WHERE subscription_id = $1 AND state = 'dead' ORDER BY \"offset\""
            ))
            .bind(subscription_id)
            .fetch_all(&mut *conn)
            .await?
        }
        Some(offsets) => {
            let mut found = Vec::with_capacity(offsets.len());
            for offset in offsets {
                found.extend(rows::lease_at(conn, subscription_id, *offset).await?);
            }
            found
        }
    };
    let grouped = rows::subscription_by_id(&mut *conn, subscription_id)
        .await?
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
        rows::save_leases(conn, subscription_id, &[(row.offset, &lease)], now).await?;
        changed += 1;
        // A replayed message of a group may come before the group's head.
        if let (DeadLetterChange::Replay, true, Some(group_key)) = (change, grouped, &row.group) {
            let head = group::head_with(
                rows::head(conn, subscription_id, group_key).await?,
                row.offset,
            );
            rows::set_head(conn, subscription_id, group_key, head).await?;
        }
    }
    Ok(changed)
}
