//! The outbound changes that shape groups, one transaction each: a submission (its
//! idempotency key, then `send_group::plan_submit` over its locked group row: the group and
//! number, and the envelope written once) and closing a group after the fact (`send_group::close_group`).
//! Both hold the group's row lock while they decide, so that gateways number one group in
//! one order and never close it under a submit.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgConnection;

use super::rows::{EARLIER_SUBMISSION, keyed};
use super::write::Events;
use super::{Doing, Failure};
use crate::rmp::send_group::{self, Close, GroupRow, Newest, Planned};
use crate::store::StoreError;
use crate::store::outbound::{
    IdempotencyKey, SENT_AGAIN_EVENT, Submission, SubmitError, Submitted,
};
use crate::store::postgres::{Announcement, PostgresStore};
use crate::store::stored_outbound::{encode_schedule, mark_last, state_of};
use crate::store::time::millis;
use crate::store::wakes::Wakes;
use crate::wsr::{GroupId, SoapVersion};

/// A try's answer: stored, or refused (its transaction rolled back).
type Answer<T> = Result<Result<T, SubmitError>, Failure>;

/// The message stored under `idem`'s key, in the submit's transaction.
async fn earlier(
    c: &mut PgConnection,
    idem: &IdempotencyKey,
) -> Result<Option<Result<Submitted, SubmitError>>, Failure> {
    let row = sqlx::query(EARLIER_SUBMISSION)
        .bind(&idem.principal)
        .bind(&idem.key)
        .fetch_optional(&mut *c)
        .await
        .doing("looking up an idempotency key")?;
    Ok(match row {
        Some(row) => Some(idem.replay(keyed(&row)?)),
        None => None,
    })
}

/// The group a submission continues, locked: another principal's answers as one that does
/// not exist.
async fn lock_group(
    c: &mut PgConnection,
    group_id: &GroupId,
    s: &Submission,
) -> Result<Option<GroupRow>, Failure> {
    let row = sqlx::query(
        "SELECT destination, ordered, sequenced, next_number, last_number FROM out_groups \
         WHERE group_id = $1 AND ($2 OR principal = $3) FOR UPDATE",
    )
    .bind(group_id.as_str())
    .bind(s.any_group)
    .bind(&s.principal)
    .fetch_optional(&mut *c)
    .await
    .doing("locking an outbound group")?;
    let Some(row) = row else {
        return Ok(None);
    };
    // A separate statement, so that it sees what committed while this one waited for the
    // lock (a failure of the group commits under the same lock).
    let has_failed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM out_messages WHERE group_id = $1 \
         AND state IN ('faulted', 'failed'))",
    )
    .bind(group_id.as_str())
    .fetch_one(&mut *c)
    .await
    .doing("reading whether an outbound group failed")?;
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("outbound group row: {e}"));
    Ok(Some(GroupRow {
        destination: row.try_get(0).map_err(column)?,
        ordered: row.try_get(1).map_err(column)?,
        sequenced: row.try_get(2).map_err(column)?,
        next_number: row.try_get::<i64, _>(3).map_err(column)?.max(0) as u64,
        last_number: row
            .try_get::<Option<i64>, _>(4)
            .map_err(column)?
            .map(|n| n as u64),
        has_failed,
    }))
}

/// The plan's group write: a new group (false when it exists already), or the continued
/// one's numbering, under the lock `lock_group` took.
async fn write_group(
    c: &mut PgConnection,
    plan: &Planned,
    s: &Submission,
    now: DateTime<Utc>,
) -> Result<bool, Failure> {
    let numbered = &plan.numbered;
    if !plan.new_group {
        sqlx::query("UPDATE out_groups SET next_number = $1, last_number = $2 WHERE group_id = $3")
            .bind(numbered.next_number as i64)
            .bind(numbered.last_number.map(|n| n as i64))
            .bind(plan.group_id.as_str())
            .execute(&mut *c)
            .await
            .doing("numbering an outbound group")?;
        return Ok(true);
    }
    let created = sqlx::query(
        "INSERT INTO out_groups (group_id, destination, ordered, sequenced, \
         next_number, last_number, created_at, principal) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (group_id) DO NOTHING",
    )
    .bind(plan.group_id.as_str())
    .bind(&s.destination)
    .bind(s.message_order)
    .bind(s.sequenced)
    .bind(numbered.next_number as i64)
    .bind(numbered.last_number.map(|n| n as i64))
    .bind(millis(now))
    .bind(&s.principal)
    .execute(&mut *c)
    .await
    .doing("creating an outbound group")?;
    Ok(created.rows_affected() == 1)
}

pub(super) async fn submit(
    store: &PostgresStore,
    s: &Submission,
    now: DateTime<Utc>,
) -> Answer<Submitted> {
    let mut tx = store.begin().await?;
    if let Some(idem) = &s.idempotency {
        // Inside the transaction: two tries of one submit may race.
        if let Some(answer) = earlier(&mut tx, idem).await? {
            return Ok(answer);
        }
    }
    let existing = match &s.group_id {
        None => None,
        Some(group_id) => lock_group(&mut tx, group_id, s).await?,
    };
    let plan = match send_group::plan_submit(&s.outgoing(), existing.as_ref()) {
        Ok(plan) => plan,
        Err(why) => return Ok(Err(SubmitError::Conflict(why))),
    };
    if !write_group(&mut tx, &plan, s, now).await? {
        // Only a message id submitted twice names a new group that exists.
        return Ok(Err(SubmitError::Conflict(format!(
            "outbound group {} exists already",
            plan.group_id
        ))));
    }
    let (group_id, number) = (plan.group_id, plan.numbered.number);
    let idem = s.idempotency.as_ref();
    // A key another gateway stored since the lookup above waits here for that gateway's
    // commit, then inserts nothing: the next try answers its message.
    let inserted = sqlx::query(
        "INSERT INTO out_messages (id, group_id, number, destination, soap12, reply_pattern, \
         envelope, expiry, schedule, state, attempts, next_attempt, notify_url, created_at, \
         updated_at, idem_principal, idem_key, idem_fingerprint, principal, partner) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'queued', 0, $10, $11, $10, $10, $12, \
         $13, $14, $15, $16) \
         ON CONFLICT (idem_principal, idem_key) WHERE idem_key IS NOT NULL DO NOTHING",
    )
    .bind(&s.id)
    .bind(group_id.as_str())
    .bind(number.map(|n| n as i64))
    .bind(&s.destination)
    .bind(s.version == SoapVersion::Soap12)
    .bind(s.reply.value())
    .bind(plan.envelope)
    .bind(millis(s.expiry))
    .bind(encode_schedule(&s.schedule))
    .bind(millis(now))
    .bind(&s.notify_url)
    .bind(idem.map(|i| &i.principal))
    .bind(idem.map(|i| &i.key))
    .bind(idem.map(|i| &i.fingerprint))
    .bind(&s.principal)
    .bind(&s.partner)
    .execute(&mut *tx)
    .await
    .doing("storing an outbound message")?;
    if inserted.rows_affected() != 1 {
        return Err(Failure::KeyTaken);
    }
    let mut events = Events::default();
    match &s.sent_again {
        None => events.push(&s.id, "queued", None, now),
        Some(again) => {
            let (queued, old) = again.details(&s.id);
            events.push(&s.id, "queued", Some(&queued), now);
            events.push(&again.from, SENT_AGAIN_EVENT, Some(&old), now);
        }
    }
    events.write(&mut tx).await?;
    store
        .commit(
            tx,
            Announcement::wakes(Wakes {
                outbound: true,
                ..Wakes::NONE
            }),
        )
        .await?;
    Ok(Ok(Submitted {
        id: s.id.clone(),
        group_id,
        number,
        replayed: false,
    }))
}

pub(super) async fn close_group(
    store: &PostgresStore,
    group_id: &GroupId,
    principal: Option<&str>,
) -> Answer<Option<u64>> {
    let mut tx = store.begin().await?;
    let no_group = || {
        Ok(Err(SubmitError::Conflict(format!(
            "no outbound group {group_id}"
        ))))
    };
    let last_number: Option<Option<i64>> = sqlx::query_scalar(
        "SELECT last_number FROM out_groups \
         WHERE group_id = $1 AND ($2::text IS NULL OR principal = $2) FOR UPDATE",
    )
    .bind(group_id.as_str())
    .bind(principal)
    .fetch_optional(&mut *tx)
    .await
    .doing("locking an outbound group")?;
    let Some(last_number) = last_number else {
        return no_group();
    };
    // NULLS LAST: a singleton's message has no number, and it is not newer than any.
    let newest = sqlx::query(
        "SELECT id, number, attempts, state, fault, reason, envelope FROM out_messages \
         WHERE group_id = $1 ORDER BY number DESC NULLS LAST LIMIT 1 FOR UPDATE",
    )
    .bind(group_id.as_str())
    .fetch_optional(&mut *tx)
    .await
    .doing("reading an outbound group's newest message")?;
    let Some(row) = newest else {
        return no_group();
    };
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("newest message row: {e}"));
    let id: String = row.try_get(0).map_err(column)?;
    let state: String = row.try_get(3).map_err(column)?;
    let fault: Option<String> = row.try_get(4).map_err(column)?;
    let envelope: String = row.try_get(6).map_err(column)?;
    let newest = Newest {
        number: row
            .try_get::<Option<i64>, _>(1)
            .map_err(column)?
            .map(|n| n as u64),
        attempts: row
            .try_get::<i32, _>(2)
            .map_err(column)?
            .try_into()
            .unwrap_or(u32::MAX),
        state: state_of(&state, fault.as_deref(), row.try_get(5).map_err(column)?)?,
        last_number: last_number.map(|n| n as u64),
    };
    let number = match send_group::close_group(group_id.as_str(), &newest) {
        Ok(Close::Already(last)) => return Ok(Ok(Some(last))),
        Ok(Close::Mark(number)) => number,
        Err(why) => return Ok(Err(SubmitError::Conflict(why))),
    };
    let rewritten = mark_last(&envelope)
        .ok_or_else(|| StoreError::Corrupt("stored envelope unreadable".into()))?;
    // The guard repeats the decision's premise: the envelope never changes once sent.
    let marked = sqlx::query(
        "UPDATE out_messages SET envelope = $1 WHERE id = $2 AND attempts = 0 \
         AND state = 'queued'",
    )
    .bind(rewritten)
    .bind(&id)
    .execute(&mut *tx)
    .await
    .doing("marking an outbound message last")?;
    if marked.rows_affected() != 1 {
        return Ok(Err(SubmitError::Conflict(format!(
            "message {number} of {group_id} is being sent or has failed; submit a last \
             message with group.last = true"
        ))));
    }
    sqlx::query("UPDATE out_groups SET last_number = $1 WHERE group_id = $2")
        .bind(number as i64)
        .bind(group_id.as_str())
        .execute(&mut *tx)
        .await
        .doing("closing an outbound group")?;
    store.commit(tx, Announcement::default()).await?;
    Ok(Ok(Some(number)))
}
