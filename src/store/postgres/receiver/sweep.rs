//! The sweep of group deadlines (PostgreSQL): due groups taken one by one under their lock,
//! the pure rules' `plan_sweep` applied, expired callbacks and faults dropped, all in one
//! transaction. It decides nothing itself and must never import the trait implementation.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::callbacks::owe_callback;
use crate::rmp::group::GroupState;
use crate::rmp::receive_plan::{SweepPlan, plan_abort, plan_sweep};
use crate::store::postgres::PostgresStore;
use crate::store::postgres::failure::Failure;
use crate::store::postgres::group_state::{decode, encode};
use crate::store::postgres::notify::Announcement;
use crate::store::postgres::usage::{change_usage, freed_by};
use crate::store::received::SweepReport;
use crate::store::source_usage::UsageChanges;
use crate::store::time::millis;

/// Most groups one sweep pass handles; the rest are due again at once.
const SWEEP_BATCH: i64 = 500;

/// Takes the group's lock (the one the writer's batches take, `writer/reads.rs`) without waiting:
/// `false` when another transaction holds the group.
async fn try_lock_group(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &str,
) -> Result<bool, Failure> {
    Ok(sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))",
    )
    .bind(partner)
    .bind(group_id)
    .fetch_one(conn)
    .await?)
}

/// Writes a group's state (a new row when `id` is `None`).
async fn write_group(
    conn: &mut PgConnection,
    id: Option<i64>,
    partner: &str,
    source: &str,
    state: &GroupState,
    deadline: Option<i64>,
    now: i64,
) -> Result<(), Failure> {
    let mut encoded = Vec::new();
    encode(state, &mut encoded);
    match id {
        Some(id) => {
            sqlx::query(
                "UPDATE groups SET status = $2, next_deadline = $3, updated_at = $4, \
                 state_bin = $5 WHERE id = $1",
            )
            .bind(id)
            .bind(state.status.as_str())
            .bind(deadline)
            .bind(now)
            .bind(&encoded)
            .execute(conn)
            .await?;
        }
        None => {
            sqlx::query(
                "INSERT INTO groups (partner, group_id, channel, status, next_deadline, \
                 updated_at, source, state_bin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(partner)
            .bind(state.group_id.as_str())
            .bind(&state.params.channel)
            .bind(state.status.as_str())
            .bind(deadline)
            .bind(now)
            .bind(source)
            .bind(&encoded)
            .execute(conn)
            .await?;
        }
    }
    Ok(())
}

async fn delete_buffered(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &str,
    numbers: &[u64],
    freed: &mut UsageChanges,
) -> Result<(), Failure> {
    if numbers.is_empty() {
        return Ok(());
    }
    let numbers: Vec<i64> = numbers.iter().map(|n| *n as i64).collect();
    let gone = sqlx::query_as(
        "DELETE FROM buffered WHERE partner = $1 AND group_id = $2 AND number = ANY($3) \
         RETURNING source, octet_length(payload)::bigint",
    )
    .bind(partner)
    .bind(group_id)
    .bind(&numbers)
    .fetch_all(conn)
    .await?;
    freed_by(gone, freed);
    Ok(())
}

/// One sweep pass in one transaction. Groups another gateway is deciding about right now
/// are left for the next pass (their deadline stays due).
pub(super) async fn sweep_once(
    store: &PostgresStore,
    now: DateTime<Utc>,
) -> Result<SweepReport, Failure> {
    let now_ms = millis(now);
    let policy = &store.shared.policy;
    let mut tx = store.begin().await?;
    let due: Vec<DueGroup> = sqlx::query_as(
        "SELECT id, partner, group_id FROM groups WHERE next_deadline <= $1 \
         ORDER BY next_deadline LIMIT $2",
    )
    .bind(now_ms)
    .bind(SWEEP_BATCH)
    .fetch_all(&mut *tx)
    .await?;
    let mut report = SweepReport::default();
    let mut announcement = Announcement::default();
    let mut freed = UsageChanges::default();
    for group in due {
        let Some(state) = lock_due_group(&mut tx, &group, now_ms).await? else {
            continue;
        };
        let plan = plan_sweep(state, now, policy);
        apply_plan(
            &mut tx,
            &group,
            plan,
            now_ms,
            &mut report,
            &mut announcement,
            &mut freed,
        )
        .await?;
    }
    sqlx::query("DELETE FROM pending_callbacks WHERE expiry < $1")
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM message_faults WHERE expiry < $1")
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM minute_counts WHERE minute < $1")
        .bind(now_ms - crate::store::overview::MINUTE_COUNTS_KEPT_MS)
        .execute(&mut *tx)
        .await?;
    commit_freeing(store, tx, announcement, &freed).await?;
    Ok(report)
}

/// An operator's abort of `partner`'s group `group_id` (`plan_abort`), in one transaction
/// under the group's lock — waited for: the writer holds it only for a batch. `false`: no
/// such group, or nothing to abort (ended, a singleton).
pub(super) async fn abort_once(
    store: &PostgresStore,
    partner: &str,
    group_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, Failure> {
    let now_ms = millis(now);
    let mut tx = store.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))")
        .bind(partner)
        .bind(group_id)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query("SELECT id, state_bin FROM groups WHERE partner = $1 AND group_id = $2")
        .bind(partner)
        .bind(group_id)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else { return Ok(false) };
    let id: i64 = row.try_get(0)?;
    let state = decode(row.try_get::<&[u8], _>(1)?).map_err(Failure::from)?;
    let Some(plan) = plan_abort(state, now, &store.shared.policy) else {
        return Ok(false);
    };
    let mut report = SweepReport::default();
    let mut announcement = Announcement::default();
    let mut freed = UsageChanges::default();
    let due = (id, partner.to_owned(), group_id.to_owned());
    apply_plan(
        &mut tx,
        &due,
        plan,
        now_ms,
        &mut report,
        &mut announcement,
        &mut freed,
    )
    .await?;
    commit_freeing(store, tx, announcement, &freed).await?;
    Ok(true)
}

/// Commits a sweep or an abort: the bytes it freed per source last (`change_usage` takes the
/// usage rows after every other lock), then the quota view told.
async fn commit_freeing(
    store: &PostgresStore,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    announcement: Announcement,
    freed: &UsageChanges,
) -> Result<(), Failure> {
    change_usage(&mut tx, freed).await?;
    store.commit(tx, announcement).await?;
    if !freed.is_empty() {
        store.shared.stored_bytes_freed();
    }
    Ok(())
}

/// A group whose deadline is due: its row id, partner and group id.
type DueGroup = (i64, String, String);

/// The state of a due group, locked for the rest of the transaction; `None` when another
/// transaction holds it, when a receive moved its deadline meanwhile, or when its state is
/// unreadable (it is then taken out of the sweep).
async fn lock_due_group(
    tx: &mut PgConnection,
    (id, partner, group_id): &DueGroup,
    now_ms: i64,
) -> Result<Option<GroupState>, Failure> {
    if !try_lock_group(&mut *tx, partner, group_id).await? {
        return Ok(None);
    }
    // Read again under the lock: a receive may have moved it since.
    let row = sqlx::query("SELECT state_bin FROM groups WHERE id = $1 AND next_deadline <= $2")
        .bind(id)
        .bind(now_ms)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else { return Ok(None) };
    match decode(row.try_get::<&[u8], _>(0)?) {
        Ok(state) => Ok(Some(state)),
        Err(why) => {
            // One unreadable row must not stop every other group's deadlines: take it
            // out of the sweep (kept for an operator to inspect) and go on.
            tracing::error!(%partner, %group_id, reason = %why, "unreadable group state; no longer swept");
            sqlx::query("UPDATE groups SET next_deadline = NULL WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Ok(None)
        }
    }
}

/// Writes what `plan_sweep` decided about one due group.
async fn apply_plan(
    tx: &mut PgConnection,
    (id, partner, group_id): &DueGroup,
    plan: SweepPlan,
    now_ms: i64,
    report: &mut SweepReport,
    announcement: &mut Announcement,
    freed: &mut UsageChanges,
) -> Result<(), Failure> {
    match plan {
        SweepPlan::Rearm(write) => {
            let deadline = write.deadline.map(millis);
            write_group(
                &mut *tx,
                Some(*id),
                partner,
                "",
                &write.state,
                deadline,
                now_ms,
            )
            .await?;
        }
        SweepPlan::Changed {
            group,
            discard,
            callbacks,
        } => {
            delete_buffered(&mut *tx, partner, group_id, &discard, freed).await?;
            // Senders of discarded messages learn by callback in SOAP 1.1, the version
            // every peer accepts; their own version is not kept for buffered messages.
            for c in &callbacks {
                owe_callback(&mut *tx, partner, group_id, c, false, now_ms).await?;
                announcement.wakes.callbacks = true;
            }
            let deadline = group.deadline.map(millis);
            write_group(
                &mut *tx,
                Some(*id),
                partner,
                "",
                &group.state,
                deadline,
                now_ms,
            )
            .await?;
            report.changed += 1;
            report.discarded += discard.len();
        }
        SweepPlan::Purge => {
            sqlx::query("DELETE FROM groups WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let gone = sqlx::query_as(
                "DELETE FROM buffered WHERE partner = $1 AND group_id = $2 \
                 RETURNING source, octet_length(payload)::bigint",
            )
            .bind(partner)
            .bind(group_id)
            .fetch_all(&mut *tx)
            .await?;
            freed_by(gone, freed);
            report.purged += 1;
        }
    }
    Ok(())
}
