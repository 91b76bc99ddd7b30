//! Outbound changes to messages on the writer's connection (`SqliteStore::change`): claims,
//! failures, saved states, poll silence and replies. Each reads the rows its decision needs
//! inside its own transaction, lets `rmp::send_group` / `rmp::sender` decide, and writes what
//! they decided with primitive statements.

use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};

use super::rows::{Columns, fault_of, reason_of, select_messages, state_of};
use crate::rmp::replies::Verdicts;
use crate::rmp::send_group::{self, Member, ReplySource, Settled};
use crate::rmp::sender::{AttemptKind, AttemptNote, Event, OutState, Outbound, attempts_dropped};
use crate::store::StoreError;
use crate::store::outbound::{HEALTH_UPSERT_SQL, OutMessage, PartnerHealth};
use crate::store::sqlite::{Change, Wakes};
use crate::store::stored_outbound::encode_schedule;
use crate::store::time::millis;

type Conn = rusqlite::Connection;

/// A change's answer, kept or refused.
pub(super) type Changed<T, R> = Result<Change<T, R>, StoreError>;

pub(super) fn claim_attempt(
    conn: &Conn,
    id: &str,
    before: &Outbound,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Result<(Option<String>, Wakes), StoreError> {
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
        return Ok((None, Wakes::NONE));
    }
    if before.state == OutState::Queued {
        insert_event(conn, id, "sent", None, now)?;
    }
    let envelope: String = conn
        .prepare_cached("SELECT envelope FROM out_messages WHERE id = ?1")?
        .query_row([id], |r| r.get(0))?;
    Ok((Some(envelope), Wakes::NONE))
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

/// `OutboundStore::record_attempts` in the writer's transaction.
pub(super) fn record_attempts(
    conn: &Conn,
    partner: &str,
    notes: &[(String, AttemptNote)],
) -> Result<(), StoreError> {
    if let Some(change) = PartnerHealth::change(notes) {
        static UPSERT: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| HEALTH_UPSERT_SQL.replace('$', "?"));
        conn.prepare_cached(&UPSERT)?
            .execute(params![partner, change.at, change.failure])?;
    }
    let mut latest =
        conn.prepare_cached("SELECT COALESCE(MAX(n), 0) FROM out_attempts WHERE message_id = ?1")?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO out_attempts (message_id, n, kind, at, status, verdict, fault, cause) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut drop = conn
        .prepare_cached("DELETE FROM out_attempts WHERE message_id = ?1 AND n BETWEEN ?2 AND ?3")?;
    let mut failed = conn.prepare_cached(
        "UPDATE out_messages SET last_error = ?1, last_error_at = ?2 \
         WHERE id = ?3 AND state IN ('queued', 'sent')",
    )?;
    let mut polled =
        conn.prepare_cached("UPDATE out_messages SET last_poll_at = ?1 WHERE id = ?2")?;
    for (id, note) in notes {
        let n = latest.query_row(params![id], |r| r.get::<_, i64>(0))? + 1;
        insert.execute(params![
            id,
            n,
            note.kind.name(),
            millis(note.at),
            note.status,
            note.verdict.name(),
            note.verdict.fault().map(|c| c.local_name()),
            note.failure,
        ])?;
        if let Some(dropped) = attempts_dropped(n.try_into().unwrap_or(0)) {
            let (from, to) = dropped.into_inner();
            drop.execute(params![id, from as i64, to as i64])?;
        }
        if let Some(cause) = &note.failure {
            failed.execute(params![cause, millis(note.at), id])?;
        }
        if note.kind == AttemptKind::Poll {
            polled.execute(params![millis(note.at), id])?;
        }
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
             attempts = ?4, next_attempt = ?5, updated_at = ?6, schedule = ?9 \
             WHERE id = ?7 AND state IN ('queued', 'sent') AND state = ?8 AND attempts <= ?4",
        )?
        .execute(params![
            after.state.name(),
            fault_of(&after.state),
            reason_of(&after.state),
            i64::from(after.attempts),
            after.next_attempt.map(millis),
            millis(now),
            id,
            before.name(),
            // An operator's resend may have given it an attempt more.
            encode_schedule(&after.schedule),
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

pub(super) fn insert_event(
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
