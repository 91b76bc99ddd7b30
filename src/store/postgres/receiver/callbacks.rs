//! Callback acks owed to partners (PostgreSQL): queued, claimed with a lease so that one
//! gateway POSTs each and another takes over when it dies, sent or rescheduled. It must never
//! import the trait implementation nor the sweep (which queues acks through it).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::rmp::receive_plan::OwedCallback;
use crate::rmp::replies::ReplyItem;
use crate::store::StoreError;
use crate::store::postgres::PostgresStore;
use crate::store::postgres::failure::{Failure, retrying};
use crate::store::postgres::notify::Announcement;
use crate::store::received::PendingCallback;
use crate::store::time::{from_millis, millis};
use crate::store::wakes::Wakes;
use crate::wsr::{FaultCode, GroupId, SeqRange};

/// How long a gateway holds the callback acks it took before another may take them: longer
/// than one POST may last (the callback client's timeouts), short enough that acks of a
/// gateway that died go out soon after.
const CALLBACK_LEASE_MS: i64 = 60_000;

/// The message(s) a queued callback answers: a singleton (`from` and `to` `None`), one number
/// (`from`), or a range (`from` to `to`).
struct CallbackRow<'a> {
    group_id: &'a str,
    from: Option<i64>,
    to: Option<i64>,
    fault: Option<FaultCode>,
}

#[allow(clippy::too_many_arguments, reason = "one column each")]
async fn insert_callback(
    conn: &mut PgConnection,
    partner: &str,
    endpoint: &str,
    soap12: bool,
    reply: &CallbackRow<'_>,
    keep_until: i64,
    now: i64,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, \
         number_to, fault, expiry, next_attempt) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(partner)
    .bind(endpoint)
    .bind(soap12)
    .bind(reply.group_id)
    .bind(reply.from)
    .bind(reply.to)
    .bind(reply.fault.map(|f| f.local_name()))
    .bind(keep_until)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn owe_callback(
    conn: &mut PgConnection,
    partner: &str,
    group_id: &str,
    c: &OwedCallback,
    soap12: bool,
    now: i64,
) -> Result<(), Failure> {
    let reply = CallbackRow {
        group_id,
        from: c.number.map(|n| n as i64),
        to: None,
        fault: c.fault,
    };
    insert_callback(
        conn,
        partner,
        &c.endpoint,
        soap12,
        &reply,
        millis(c.keep_until),
        now,
    )
    .await
}

/// A callback row as `due_callbacks` selects it.
fn pending_callback(r: &PgRow) -> Result<PendingCallback, Failure> {
    let group: String = r.try_get(3)?;
    let fault: Option<String> = r.try_get(5)?;
    let from: Option<i64> = r.try_get(4)?;
    let to: Option<i64> = r.try_get(8)?;
    Ok(PendingCallback {
        id: r.try_get(0)?,
        partner: r.try_get(9)?,
        endpoint: r.try_get(1)?,
        soap12: r.try_get(2)?,
        reply: ReplyItem {
            group_id: GroupId::parse(&group).map_err(StoreError::Corrupt)?,
            range: match from {
                None => None,
                Some(from) => {
                    let (from, to) = (from as u64, to.map_or(from as u64, |t| t as u64));
                    Some(SeqRange::new(from, to).ok_or_else(|| {
                        StoreError::Corrupt(format!("callback range {from}-{to}"))
                    })?)
                }
            },
            fault: match fault {
                None => None,
                Some(name) => Some(
                    FaultCode::from_local_name(&name)
                        .ok_or_else(|| StoreError::Corrupt(format!("unknown fault code {name}")))?,
                ),
            },
        },
        expiry: from_millis(r.try_get(6)?),
        attempts: r.try_get::<i32, _>(7)?.try_into().unwrap_or(u32::MAX),
    })
}

/// Claims the due acks for this gateway for `CALLBACK_LEASE_MS`: another gateway asking
/// meanwhile gets others (`SKIP LOCKED`, then the lease), and takes these over only once
/// the lease ran out without them being sent or rescheduled.
pub(super) async fn due(
    store: &PostgresStore,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<PendingCallback>, StoreError> {
    let now_ms = millis(now);
    let rows = sqlx::query(
        "UPDATE pending_callbacks SET lease_owner = $1, lease_until = $2 \
         WHERE id IN (SELECT id FROM pending_callbacks \
           WHERE next_attempt <= $3 AND (lease_until IS NULL OR lease_until <= $3) \
           ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED) \
         RETURNING id, endpoint, soap12, group_id, number, fault, expiry, attempts, \
         number_to, partner",
    )
    .bind(store.gateway())
    .bind(now_ms.saturating_add(CALLBACK_LEASE_MS))
    .bind(now_ms)
    .bind(limit)
    .fetch_all(&store.pool)
    .await?;
    let mut due = rows
        .iter()
        .map(pending_callback)
        .collect::<Result<Vec<_>, Failure>>()?;
    due.sort_by_key(|c| c.id);
    Ok(due)
}

/// Queues acks of `replies` for `partner` at `endpoint` (`ReceiverStore::owe_callbacks`).
pub(super) async fn owe(
    store: &PostgresStore,
    partner: &str,
    endpoint: &str,
    soap12: bool,
    replies: &[ReplyItem],
    expiry: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    retrying(|| async {
        let mut tx = store.begin().await?;
        for r in replies {
            let reply = CallbackRow {
                group_id: r.group_id.as_str(),
                from: r.range.map(|x| x.from() as i64),
                to: r.range.map(|x| x.to() as i64),
                fault: r.fault,
            };
            insert_callback(
                &mut tx,
                partner,
                endpoint,
                soap12,
                &reply,
                millis(expiry),
                millis(now),
            )
            .await?;
        }
        let wakes = Wakes {
            callbacks: true,
            ..Wakes::NONE
        };
        store.commit(tx, Announcement::wakes(wakes)).await?;
        Ok(())
    })
    .await
}

/// When the next ack is due (`ReceiverStore::next_callback_due`).
pub(super) async fn next_due(store: &PostgresStore) -> Result<Option<DateTime<Utc>>, StoreError> {
    // A leased ack is due again when its lease runs out (its gateway may have died).
    let ms: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(GREATEST(next_attempt, COALESCE(lease_until, next_attempt))) \
         FROM pending_callbacks",
    )
    .fetch_one(&store.pool)
    .await?;
    Ok(ms.map(from_millis))
}

/// Drops the acks that were sent (`ReceiverStore::callbacks_sent`).
pub(super) async fn sent(store: &PostgresStore, ids: &[i64]) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM pending_callbacks WHERE id = ANY($1)")
        .bind(ids)
        .execute(&store.pool)
        .await?;
    Ok(())
}

/// Reschedules the acks that could not be sent, releasing their lease, and drops those
/// past their expiry (`ReceiverStore::callbacks_failed`).
pub(super) async fn failed(
    store: &PostgresStore,
    ids: &[i64],
    next: DateTime<Utc>,
) -> Result<(), StoreError> {
    let next = millis(next);
    retrying(|| async {
        let mut tx = store.begin().await?;
        sqlx::query(
            "UPDATE pending_callbacks SET attempts = attempts + 1, next_attempt = $1, \
             lease_owner = NULL, lease_until = NULL WHERE id = ANY($2)",
        )
        .bind(next)
        .bind(ids)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM pending_callbacks WHERE expiry < $1")
            .bind(next)
            .execute(&mut *tx)
            .await?;
        store.commit(tx, Announcement::default()).await?;
        Ok(())
    })
    .await
}
