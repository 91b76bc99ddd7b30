//! The outbound changes that shape groups, on the writer's connection: a submission (its
//! idempotency key, then `send_group::plan_submit` over its group's row: the group and
//! number, and the envelope written once) and closing a group after the fact (`send_group::close_group`).

use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};

use super::rows::{EARLIER_SUBMISSION, encode_schedule, state_of};
use super::write::{Changed, insert_event};
use crate::rmp::send_group::{self, Close, GroupRow, Newest, Planned};
use crate::store::StoreError;
use crate::store::outbound::{
    IdempotencyKey, KeyedSubmission, SENT_AGAIN_EVENT, Submission, SubmitError, Submitted,
};
use crate::store::sqlite::{Change, Wakes};
use crate::store::stored_outbound::mark_last;
use crate::store::time::millis;
use crate::wsr::{GroupId, SoapVersion};

type Conn = rusqlite::Connection;

/// The message stored under `idem`'s key, in the change's transaction.
fn earlier(
    conn: &Conn,
    idem: &IdempotencyKey,
) -> Result<Option<Result<Submitted, SubmitError>>, StoreError> {
    let earlier = conn
        .prepare_cached(EARLIER_SUBMISSION)?
        .query_row(params![idem.principal, idem.key], |r| {
            Ok(KeyedSubmission {
                id: r.get(0)?,
                group_id: r.get(1)?,
                number: r.get::<_, Option<i64>>(2)?.map(|n| n as u64),
                fingerprint: r.get(3)?,
            })
        })
        .optional()?;
    Ok(earlier.map(|e| idem.replay(e)))
}

/// The group a submission continues: another principal's answers as one that does not
/// exist.
fn read_group(
    conn: &Conn,
    group_id: &GroupId,
    s: &Submission,
) -> Result<Option<GroupRow>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT destination, ordered, sequenced, next_number, last_number, \
             EXISTS (SELECT 1 FROM out_messages o WHERE o.group_id = ?1 \
               AND o.state IN ('faulted', 'failed')) \
             FROM out_groups WHERE group_id = ?1 AND (?2 OR principal = ?3)",
        )?
        .query_row(params![group_id.as_str(), s.any_group, s.principal], |r| {
            Ok(GroupRow {
                destination: r.get(0)?,
                ordered: r.get::<_, i64>(1)? != 0,
                sequenced: r.get::<_, i64>(2)? != 0,
                next_number: r.get::<_, i64>(3)?.max(0) as u64,
                last_number: r.get::<_, Option<i64>>(4)?.map(|n| n as u64),
                has_failed: r.get::<_, i64>(5)? != 0,
            })
        })
        .optional()?)
}

/// The plan's group write: a new group, or the continued one's numbering.
fn write_group(
    conn: &Conn,
    plan: &Planned,
    s: &Submission,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let numbered = &plan.numbered;
    if plan.new_group {
        conn.prepare_cached(
            "INSERT INTO out_groups (group_id, destination, ordered, sequenced, \
             next_number, last_number, created_at, principal) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            plan.group_id.as_str(),
            s.destination,
            i64::from(s.message_order),
            i64::from(s.sequenced),
            numbered.next_number as i64,
            numbered.last_number.map(|n| n as i64),
            millis(now),
            s.principal,
        ])?;
    } else {
        conn.prepare_cached(
            "UPDATE out_groups SET next_number = ?1, last_number = ?2 WHERE group_id = ?3",
        )?
        .execute(params![
            numbered.next_number as i64,
            numbered.last_number.map(|n| n as i64),
            plan.group_id.as_str()
        ])?;
    }
    Ok(())
}

pub(super) fn submit(
    conn: &Conn,
    s: &Submission,
    now: DateTime<Utc>,
) -> Changed<Submitted, SubmitError> {
    if let Some(idem) = &s.idempotency {
        // Inside the transaction: two tries of one submit may race.
        match earlier(conn, idem)? {
            Some(Ok(stored)) => return Ok(Change::Keep(stored, Wakes::NONE)),
            Some(Err(refusal)) => return Ok(Change::Refuse(refusal)),
            None => {}
        }
    }
    let existing = match &s.group_id {
        None => None,
        Some(group_id) => read_group(conn, group_id, s)?,
    };
    let plan = match send_group::plan_submit(&s.outgoing(), existing.as_ref()) {
        Ok(plan) => plan,
        Err(why) => return Ok(Change::Refuse(SubmitError::Conflict(why))),
    };
    write_group(conn, &plan, s, now)?;
    let (group_id, number) = (plan.group_id, plan.numbered.number);
    let idem = s.idempotency.as_ref();
    conn.prepare_cached(
        "INSERT INTO out_messages (id, group_id, number, destination, soap12, reply_pattern, \
         envelope, expiry, schedule, state, attempts, next_attempt, notify_url, created_at, \
         updated_at, idem_principal, idem_key, idem_fingerprint, principal, partner) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'queued', 0, ?10, ?11, ?10, ?10, ?12, \
         ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        s.id,
        group_id.as_str(),
        number.map(|n| n as i64),
        s.destination,
        i64::from(s.version == SoapVersion::Soap12),
        s.reply.value(),
        plan.envelope,
        millis(s.expiry),
        encode_schedule(&s.schedule),
        millis(now),
        s.notify_url,
        idem.map(|i| &i.principal),
        idem.map(|i| &i.key),
        idem.map(|i| &i.fingerprint),
        s.principal,
        s.partner,
    ])?;
    match &s.sent_again {
        None => insert_event(conn, &s.id, "queued", None, now)?,
        Some(again) => {
            let (queued, old) = again.details(&s.id);
            insert_event(conn, &s.id, "queued", Some(&queued), now)?;
            insert_event(conn, &again.from, SENT_AGAIN_EVENT, Some(&old), now)?;
        }
    }
    let submitted = Submitted {
        id: s.id.clone(),
        group_id,
        number,
        replayed: false,
    };
    Ok(Change::Keep(
        submitted,
        Wakes {
            outbound: true,
            ..Wakes::NONE
        },
    ))
}

pub(super) fn close_group(
    conn: &Conn,
    group_id: &GroupId,
    principal: Option<&str>,
) -> Changed<Option<u64>, SubmitError> {
    let newest = conn
        .prepare_cached(
            "SELECT m.id, m.number, m.attempts, m.state, m.fault, m.reason, m.envelope, \
             g.last_number FROM out_messages m JOIN out_groups g USING (group_id) \
             WHERE m.group_id = ?1 AND (?2 IS NULL OR g.principal = ?2) \
             ORDER BY m.number DESC LIMIT 1",
        )?
        .query_row(params![group_id.as_str(), principal], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, Option<String>>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, Option<i64>>(7)?,
            ))
        })
        .optional()?;
    let Some((id, number, attempts, state, fault, reason, envelope, last_number)) = newest else {
        return Ok(Change::Refuse(SubmitError::Conflict(format!(
            "no outbound group {group_id}"
        ))));
    };
    let newest = Newest {
        number: number.map(|n| n as u64),
        attempts: attempts.try_into().unwrap_or(u32::MAX),
        state: state_of(&state, fault.as_deref(), reason)?,
        last_number: last_number.map(|n| n as u64),
    };
    let number = match send_group::close_group(group_id.as_str(), &newest) {
        Ok(Close::Already(last)) => return Ok(Change::Keep(Some(last), Wakes::NONE)),
        Ok(Close::Mark(number)) => number,
        Err(why) => return Ok(Change::Refuse(SubmitError::Conflict(why))),
    };
    let rewritten = mark_last(&envelope)
        .ok_or_else(|| StoreError::Corrupt("stored envelope unreadable".into()))?;
    // The guard repeats the decision's premise: the envelope never changes once sent.
    let marked = conn
        .prepare_cached(
            "UPDATE out_messages SET envelope = ?1 WHERE id = ?2 AND attempts = 0 \
             AND state = 'queued'",
        )?
        .execute(params![rewritten, id])?;
    if marked != 1 {
        return Ok(Change::Refuse(SubmitError::Conflict(format!(
            "message {number} of {group_id} is being sent or has failed; submit a last \
             message with group.last = true"
        ))));
    }
    conn.prepare_cached("UPDATE out_groups SET last_number = ?1 WHERE group_id = ?2")?
        .execute(params![number as i64, group_id.as_str()])?;
    Ok(Change::Keep(Some(number), Wakes::NONE))
}
