//! Outbound changes on the writer's connection (`SqliteStore::change`): each reads the rows
//! its decision needs inside its own transaction, lets `rmp::send_group` / `rmp::sender`
//! decide, and writes what they decided with primitive statements.

use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};

use super::rows::{Columns, encode_schedule, fault_of, reason_of, select_messages, state_of};
use crate::rmp::replies::Verdicts;
use crate::rmp::send_group::{
    self, Close, GroupRow, Joining, Member, Newest, ReplySource, Settled,
};
use crate::rmp::sender::{Event, OutState, Outbound};
use crate::store::StoreError;
use crate::store::group_json::millis;
use crate::store::outbound::{IdempotencyKey, OutMessage, Submission, SubmitError, Submitted};
use crate::store::sqlite::{Change, Wakes};
use crate::wsr::{GroupId, Headers, MessageId, Request, SequenceNum, SoapVersion, write_envelope};

type Conn = rusqlite::Connection;

/// A change's answer, kept or refused.
pub(super) type Changed<T, R> = Result<Change<T, R>, StoreError>;

fn corrupt(what: String) -> StoreError {
    StoreError::Corrupt(what)
}

/// The message stored under `idem`'s key, in the change's transaction.
fn earlier(
    conn: &Conn,
    idem: &IdempotencyKey,
) -> Result<Option<Result<Submitted, SubmitError>>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT id, group_id, number, idem_fingerprint FROM out_messages \
             WHERE idem_principal = ?1 AND idem_key = ?2",
        )?
        .query_row(params![idem.principal, idem.key], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })
        .optional()?;
    let Some((id, group, number, fingerprint)) = row else {
        return Ok(None);
    };
    if fingerprint.as_deref() != Some(idem.fingerprint.as_str()) {
        return Ok(Some(Err(SubmitError::key_reused(&idem.key, &id))));
    }
    Ok(Some(Ok(Submitted {
        id,
        group_id: GroupId::parse(&group).map_err(corrupt)?,
        number: number.map(|n| n as u64),
        replayed: true,
    })))
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
    let joining = Joining {
        destination: &s.destination,
        sequenced: s.sequenced,
        ordered: s.message_order,
        last: s.last,
    };
    let (group_id, number) = match &s.group_id {
        None => {
            let group_id = GroupId::parse(&format!("mid:{}@wsr-gateway", s.id)).map_err(corrupt)?;
            let numbered = send_group::start_group(joining);
            conn.prepare_cached(
                "INSERT INTO out_groups (group_id, destination, ordered, sequenced, \
                 next_number, last_number, created_at, principal) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                group_id.as_str(),
                s.destination,
                i64::from(s.message_order),
                i64::from(s.sequenced),
                numbered.next_number as i64,
                numbered.last_number.map(|n| n as i64),
                millis(now),
                s.principal,
            ])?;
            (group_id, numbered.number)
        }
        Some(group_id) => {
            // Another principal's group answers as one that does not exist.
            let group = conn
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
                .optional()?;
            let Some(group) = group else {
                return Ok(Change::Refuse(SubmitError::Conflict(format!(
                    "no outbound group {group_id}"
                ))));
            };
            let numbered = match send_group::join_group(group_id.as_str(), &group, joining) {
                Ok(numbered) => numbered,
                Err(why) => return Ok(Change::Refuse(SubmitError::Conflict(why))),
            };
            conn.prepare_cached(
                "UPDATE out_groups SET next_number = ?1, last_number = ?2 WHERE group_id = ?3",
            )?
            .execute(params![
                numbered.next_number as i64,
                numbered.last_number.map(|n| n as i64),
                group_id.as_str()
            ])?;
            (group_id.clone(), numbered.number)
        }
    };
    let request = Request {
        message_id: MessageId {
            group_id: group_id.clone(),
            sequence: number.map(|n| SequenceNum {
                number: n,
                last: s.last,
                group_limit: None,
            }),
        },
        expiry_time: s.expiry,
        reply_pattern: s.reply.clone(),
        ack_requested: s.ack_requested,
        duplicate_elimination: s.duplicate_elimination,
        message_order: s.message_order,
    };
    let envelope = write_envelope(
        s.version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        &s.body,
    );
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
        envelope,
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
    insert_event(conn, &s.id, "queued", None, now)?;
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

pub(super) fn claim_attempt(
    conn: &Conn,
    id: &str,
    before: &Outbound,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Changed<Option<String>, std::convert::Infallible> {
    let claimed = conn
        .prepare_cached(
            "UPDATE out_messages SET state = 'sent', attempts = ?1, next_attempt = ?2, \
             updated_at = ?3 WHERE id = ?4 AND state IN ('queued', 'sent') AND attempts = ?5",
        )?
        .execute(params![
            i64::from(after.attempts),
            after.next_attempt.map(millis),
            millis(now),
            id,
            i64::from(before.attempts)
        ])?;
    if claimed != 1 {
        return Ok(Change::Keep(None, Wakes::NONE));
    }
    if before.state == OutState::Queued {
        insert_event(conn, id, "sent", None, now)?;
    }
    let envelope: String = conn
        .prepare_cached("SELECT envelope FROM out_messages WHERE id = ?1")?
        .query_row([id], |r| r.get(0))?;
    Ok(Change::Keep(Some(envelope), Wakes::NONE))
}

pub(super) fn save_unreached(conn: &Conn, id: &str, after: &Outbound) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE out_messages SET unreached = ?1 \
         WHERE id = ?2 AND attempts = ?3 AND state IN ('queued', 'sent')",
    )?
    .execute(params![
        i64::from(after.unreached),
        id,
        i64::from(after.attempts)
    ])?;
    Ok(())
}

pub(super) fn record_failure(
    conn: &Conn,
    ids: &[String],
    cause: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut update = conn.prepare_cached(
        "UPDATE out_messages SET last_error = ?1, last_error_at = ?2 \
         WHERE id = ?3 AND state IN ('queued', 'sent')",
    )?;
    for id in ids {
        update.execute(params![cause, millis(at), id])?;
    }
    Ok(())
}

/// What saves did: the messages that reached a final state, and whom the commit wakes.
#[derive(Default)]
pub(super) struct Saved {
    pub(super) finished: Vec<String>,
    pub(super) wakes: Wakes,
}

/// Saves a message's new state; the store keeps final states final. A fault or failure
/// fails what `send_group::failed_with` says of the rest of its group.
pub(super) fn save(
    conn: &Conn,
    saved: &mut Saved,
    id: &str,
    before: &OutState,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE out_messages SET state = ?1, fault = ?2, reason = ?3, \
             attempts = MAX(attempts, ?4), next_attempt = ?5, updated_at = ?6 \
             WHERE id = ?7 AND state IN ('queued', 'sent')",
        )?
        .execute(params![
            after.state.name(),
            fault_of(&after.state),
            reason_of(&after.state),
            i64::from(after.attempts),
            after.next_attempt.map(millis),
            millis(now),
            id
        ])?;
    if changed != 1 {
        return Ok(());
    }
    // Due now (a schedule moved earlier), or an ack that may open an ordered group's window.
    if after.next_attempt.is_some_and(|t| t <= now) || after.state == OutState::Acked {
        saved.wakes.outbound = true;
    }
    if after.state == *before {
        return Ok(());
    }
    let detail = fault_of(&after.state)
        .map(str::to_owned)
        .or_else(|| reason_of(&after.state).map(str::to_owned));
    insert_event(conn, id, after.state.name(), detail.as_deref(), now)?;
    if after.state.is_final() {
        saved.finished.push(id.to_owned());
    }
    fail_rest(conn, saved, id, &after.state, now)
}

fn fail_rest(
    conn: &Conn,
    saved: &mut Saved,
    id: &str,
    state: &OutState,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let (group_id, number, ordered): (String, Option<i64>, bool) = conn
        .prepare_cached(
            "SELECT m.group_id, m.number, g.ordered FROM out_messages m \
             JOIN out_groups g USING (group_id) WHERE m.id = ?1",
        )?
        .query_row([id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0))
        })?;
    let failed = Member {
        id: id.to_owned(),
        number: number.map(|n| n as u64),
        state: state.clone(),
    };
    // The rule needs the later messages of an ordered group only.
    let mut later = Vec::new();
    if let (true, Some(number)) = (ordered, number) {
        let mut read = conn.prepare_cached(
            "SELECT id, number, state, fault, reason FROM out_messages \
             WHERE group_id = ?1 AND number > ?2 ORDER BY number",
        )?;
        let rows = read.query_map(params![group_id, number], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })?;
        for row in rows {
            let (id, number, state, fault, reason) = row?;
            later.push(Member {
                id,
                number: number.map(|n| n as u64),
                state: state_of(&state, fault.as_deref(), reason)?,
            });
        }
    }
    let (rest, reason) = send_group::failed_with(ordered, &failed, &later);
    let Some(reason) = reason else {
        return Ok(());
    };
    let mut fail = conn.prepare_cached(
        "UPDATE out_messages SET state = 'failed', reason = ?1, next_attempt = NULL, \
         updated_at = ?2 WHERE id = ?3",
    )?;
    for other in rest {
        fail.execute(params![reason, millis(now), other])?;
        insert_event(conn, &other, "failed", Some(&reason), now)?;
        saved.finished.push(other);
    }
    Ok(())
}

fn read_message(conn: &Conn, id: &str) -> Result<Option<OutMessage>, StoreError> {
    conn.prepare_cached(select_messages!("WHERE m.id = ?1"))?
        .query_row([id], Columns::of_writer)
        .optional()?
        .map(Columns::message)
        .transpose()
}

pub(super) fn not_held(
    conn: &Conn,
    ids: &[String],
    asked_at: DateTime<Utc>,
    kept_for: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<Saved, StoreError> {
    let mut saved = Saved::default();
    for id in ids {
        let Some(m) = read_message(conn, id)? else {
            continue;
        };
        let mut after = m.outbound.clone();
        after.apply(Event::NotHeld { asked_at, kept_for }, now);
        if after != m.outbound {
            save(conn, &mut saved, id, &m.outbound.state, &after, now)?;
        }
    }
    Ok(saved)
}

/// The sender of replies, owned so that it can move into a change.
pub(super) enum Source {
    Destination(String),
    Callback(Vec<String>),
}

impl Source {
    pub(super) fn of(source: &ReplySource<'_>) -> Source {
        match source {
            ReplySource::Destination(d) => Source::Destination((*d).to_owned()),
            ReplySource::Callback { partners } => Source::Callback(partners.to_vec()),
        }
    }

    fn borrowed(&self) -> ReplySource<'_> {
        match self {
            Source::Destination(d) => ReplySource::Destination(d),
            Source::Callback(partners) => ReplySource::Callback { partners },
        }
    }
}

/// Linear in the answer: its statements are indexed per group (`Verdicts`), the open messages
/// they name are read in two queries (ranges, singletons) whatever their number, and every
/// change is saved in the same transaction.
pub(super) fn apply_replies(
    conn: &Conn,
    verdicts: &Verdicts,
    source: &Source,
    now: DateTime<Utc>,
) -> Result<Saved, StoreError> {
    let clamp = |n: u64| n.min(i64::MAX as u64) as i64;
    let mut ranges = Vec::new();
    let mut singletons = Vec::new();
    for (group_id, singleton, named) in verdicts.named() {
        if singleton {
            singletons.push(group_id.as_str());
        }
        for &(from, to) in named.pairs() {
            ranges.push(serde_json::json!([
                group_id.as_str(),
                clamp(from),
                clamp(to)
            ]));
        }
    }
    let mut named = Vec::new();
    if !ranges.is_empty() {
        // Driven by the named ranges through the (group_id, number) index, never by a scan
        // of the sent messages (`+m.state` keeps the planner off the state index).
        let mut read = conn.prepare_cached(select_messages!(
            "WHERE m.rowid IN (SELECT o.rowid FROM json_each(?1) AS j \
             CROSS JOIN out_messages AS o WHERE o.group_id = j.value->>0 \
             AND o.number BETWEEN j.value->>1 AND j.value->>2) AND +m.state = 'sent'"
        ))?;
        let rows = read.query_map([serde_json::Value::Array(ranges).to_string()], |r| {
            Columns::of_writer(r)
        })?;
        for row in rows {
            named.push(row?.message()?);
        }
    }
    if !singletons.is_empty() {
        let mut read = conn.prepare_cached(select_messages!(
            "WHERE m.group_id IN (SELECT value FROM json_each(?1)) AND m.number IS NULL \
             AND +m.state = 'sent'"
        ))?;
        let rows = read.query_map([serde_json::json!(singletons).to_string()], |r| {
            Columns::of_writer(r)
        })?;
        for row in rows {
            named.push(row?.message()?);
        }
    }
    let source = source.borrowed();
    let mut saved = Saved::default();
    for m in named {
        let settled = Settled {
            destination: &m.destination,
            partner: &m.partner,
            reply_pattern: &m.reply,
            state: &m.outbound.state,
        };
        if !source.may_settle(&settled) {
            continue;
        }
        let after = send_group::settle(&m.outbound, verdicts.about(&m.key()), now);
        if after != m.outbound {
            save(conn, &mut saved, &m.id, &m.outbound.state, &after, now)?;
        }
    }
    Ok(saved)
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

/// Our own stored envelope with `last="true"` on its SequenceNum, rewritten by the codec.
fn mark_last(envelope: &str) -> Option<String> {
    let env =
        crate::wsr::read_envelope(envelope.as_bytes(), &crate::wsr::Limits::default()).ok()?;
    let mut request = env.request?;
    request.message_id.sequence.as_mut()?.last = true;
    Some(write_envelope(
        env.version,
        Headers {
            request: Some(&request),
            ..Headers::default()
        },
        env.body.content,
    ))
}

fn insert_event(
    conn: &Conn,
    id: &str,
    state: &str,
    detail: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO out_events (message_id, state, detail, at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![id, state, detail, millis(now)])?;
    Ok(())
}
