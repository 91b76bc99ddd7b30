//! Outbound changes to messages, one transaction each: claims, failures, saved states, poll
//! silence and replies. Each reads the rows its decision needs under `FOR UPDATE` in its own
//! transaction, lets `rmp::send_group` / `rmp::sender` decide, and writes what they decided.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::{Postgres, Row, Transaction};

use super::rows::{message, select_messages};
use super::{Doing, Failure};
use crate::rmp::replies::Verdicts;
use crate::rmp::send_group::{self, Member, ReplySource, Settled};
use crate::rmp::sender::{
    ATTEMPTS_KEPT_FIRST, ATTEMPTS_KEPT_LAST, AttemptNote, Event, OutState, Outbound,
};
use crate::store::StoreError;
use crate::store::outbound::{HEALTH_UPSERT_SQL, OutMessage, PartnerHealth};
use crate::store::postgres::{Announcement, PostgresStore};
use crate::store::stored_outbound::{encode_schedule, fault_of, reason_of, state_of};
use crate::store::time::millis;
use crate::store::wakes::Wakes;

/// State changes to log, written last of all (`write`): the sequence row their numbers come
/// from stays locked until the commit, so it is the last lock a transaction takes.
#[derive(Default)]
pub(super) struct Events {
    ids: Vec<String>,
    states: Vec<&'static str>,
    details: Vec<Option<String>>,
    at: Vec<i64>,
}

impl Events {
    pub(super) fn push(
        &mut self,
        id: &str,
        state: &'static str,
        detail: Option<&str>,
        now: DateTime<Utc>,
    ) {
        self.ids.push(id.to_owned());
        self.states.push(state);
        self.details.push(detail.map(str::to_owned));
        self.at.push(millis(now));
    }

    /// Numbers the events in the order pushed, from the `out_events` sequence: its row lock,
    /// held to the commit, makes numbers visible in commit order, so that a reader paging by
    /// `seq` never skips one committed late.
    pub(super) async fn write(self, c: &mut PgConnection) -> Result<(), Failure> {
        if self.ids.is_empty() {
            return Ok(());
        }
        let n = self.ids.len() as i64;
        let last: i64 = sqlx::query_scalar(
            "UPDATE sequences SET last = last + $1 WHERE name = 'out_events' RETURNING last",
        )
        .bind(n)
        .fetch_one(&mut *c)
        .await
        .doing("numbering outbound events")?;
        let seqs: Vec<i64> = (last - n + 1..=last).collect();
        sqlx::query(
            "INSERT INTO out_events (seq, message_id, state, detail, at) \
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[])",
        )
        .bind(seqs)
        .bind(self.ids)
        .bind(self.states)
        .bind(self.details)
        .bind(self.at)
        .execute(&mut *c)
        .await
        .doing("logging outbound events")?;
        Ok(())
    }
}

/// What saves did: the events they log, the messages that reached a final state, and
/// whether the commit wakes the sender.
#[derive(Default)]
struct Saved {
    events: Events,
    finished: Vec<String>,
    wakes_sender: bool,
}

impl Saved {
    /// Logs the events, commits and answers the messages that reached a final state.
    async fn commit(
        self,
        store: &PostgresStore,
        mut tx: Transaction<'static, Postgres>,
    ) -> Result<Vec<String>, Failure> {
        self.events.write(&mut tx).await?;
        let announcement = if self.wakes_sender {
            Announcement::wakes(Wakes {
                outbound: true,
                ..Wakes::NONE
            })
        } else {
            Announcement::default()
        };
        store.commit(tx, announcement).await?;
        Ok(self.finished)
    }
}

pub(super) async fn claim_attempt(
    store: &PostgresStore,
    id: &str,
    before: &Outbound,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Result<Option<String>, Failure> {
    let mut tx = store.begin().await?;
    // The fence: only the gateway whose `before` is still what is stored counts the attempt.
    let envelope: Option<String> = sqlx::query_scalar(
        "UPDATE out_messages SET state = 'sent', attempts = $1, next_attempt = $2, \
         updated_at = $3 WHERE id = $4 AND state IN ('queued', 'sent') AND state = $5 \
         AND attempts = $6 RETURNING envelope",
    )
    .bind(i64::from(after.attempts))
    .bind(after.next_attempt.map(millis))
    .bind(millis(now))
    .bind(id)
    .bind(before.state.name())
    .bind(i64::from(before.attempts))
    .fetch_optional(&mut *tx)
    .await
    .doing("claiming an outbound attempt")?;
    let Some(envelope) = envelope else {
        return Ok(None);
    };
    let mut events = Events::default();
    if before.state == OutState::Queued {
        events.push(id, "sent", None, now);
    }
    events.write(&mut tx).await?;
    store.commit(tx, Announcement::default()).await?;
    Ok(Some(envelope))
}

pub(super) async fn save_unreached(
    store: &PostgresStore,
    id: &str,
    after: &Outbound,
) -> Result<(), Failure> {
    let mut tx = store.begin().await?;
    sqlx::query(
        "UPDATE out_messages SET unreached = $1 \
         WHERE id = $2 AND attempts = $3 AND state IN ('queued', 'sent')",
    )
    .bind(i64::from(after.unreached))
    .bind(id)
    .bind(i64::from(after.attempts))
    .execute(&mut *tx)
    .await
    .doing("saving unreached attempts")?;
    store.commit(tx, Announcement::default()).await?;
    Ok(())
}

/// `OutboundStore::record_attempts`: the messages' rows locked in id order (as every outbound
/// change takes them), so that two gateways never give one message's attempts one number.
pub(super) async fn record_attempts(
    store: &PostgresStore,
    partner: &str,
    notes: &[(String, AttemptNote)],
) -> Result<(), Failure> {
    let health = PartnerHealth::change(notes);
    let mut notes: Vec<&(String, AttemptNote)> = notes.iter().collect();
    notes.sort_by(|a, b| a.0.cmp(&b.0));
    // One line per message and call: a second would take the same number.
    notes.dedup_by(|a, b| a.0 == b.0);
    let ids: Vec<&str> = notes.iter().map(|(id, _)| id.as_str()).collect();
    let kinds: Vec<&str> = notes.iter().map(|(_, n)| n.kind.name()).collect();
    let at: Vec<i64> = notes.iter().map(|(_, n)| millis(n.at)).collect();
    let status: Vec<Option<i32>> = notes.iter().map(|(_, n)| n.status.map(i32::from)).collect();
    let verdicts: Vec<&str> = notes.iter().map(|(_, n)| n.verdict.name()).collect();
    let faults: Vec<Option<&str>> = notes
        .iter()
        .map(|(_, n)| n.verdict.fault().map(|c| c.local_name()))
        .collect();
    let causes: Vec<Option<&str>> = notes.iter().map(|(_, n)| n.failure.as_deref()).collect();
    let mut tx = store.begin().await?;
    sqlx::query("SELECT id FROM out_messages WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .doing("locking the messages an attempt was about")?;
    sqlx::query(
        "INSERT INTO out_attempts (message_id, n, kind, at, status, verdict, fault, cause) \
         SELECT t.id, COALESCE((SELECT MAX(a.n) FROM out_attempts a \
                                WHERE a.message_id = t.id), 0) + 1, \
                t.kind, t.at, t.status, t.verdict, t.fault, t.cause \
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::text[], $6::text[], \
                     $7::text[]) AS t(id, kind, at, status, verdict, fault, cause) \
         JOIN out_messages m ON m.id = t.id",
    )
    .bind(&ids)
    .bind(&kinds)
    .bind(&at)
    .bind(&status)
    .bind(&verdicts)
    .bind(&faults)
    .bind(&causes)
    .execute(&mut *tx)
    .await
    .doing("recording outbound attempts")?;
    // What `attempts_dropped` drops: all but the first few and the latest.
    sqlx::query(
        "DELETE FROM out_attempts a USING (SELECT message_id, MAX(n) AS latest FROM out_attempts \
                                           WHERE message_id = ANY($1) GROUP BY message_id) l \
         WHERE a.message_id = l.message_id AND a.n > $2 AND a.n <= l.latest - $3",
    )
    .bind(&ids)
    .bind(ATTEMPTS_KEPT_FIRST as i64)
    .bind(ATTEMPTS_KEPT_LAST as i64)
    .execute(&mut *tx)
    .await
    .doing("dropping the middle of long attempt histories")?;
    sqlx::query(
        "UPDATE out_messages m SET \
           last_error = CASE WHEN t.cause IS NOT NULL AND m.state IN ('queued', 'sent') \
                             THEN t.cause ELSE m.last_error END, \
           last_error_at = CASE WHEN t.cause IS NOT NULL AND m.state IN ('queued', 'sent') \
                                THEN t.at ELSE m.last_error_at END, \
           last_poll_at = CASE WHEN t.kind = 'poll' THEN t.at ELSE m.last_poll_at END \
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS t(id, kind, at, cause) \
         WHERE m.id = t.id",
    )
    .bind(&ids)
    .bind(&kinds)
    .bind(&at)
    .bind(&causes)
    .execute(&mut *tx)
    .await
    .doing("keeping an attempt's failure as last_error")?;
    // Last: the partner's row is the one every exchange with it takes.
    if let Some(change) = health {
        sqlx::query(HEALTH_UPSERT_SQL)
            .bind(partner)
            .bind(change.at)
            .bind(change.failure)
            .execute(&mut *tx)
            .await
            .doing("keeping the partner's health")?;
    }
    store.commit(tx, Announcement::default()).await?;
    Ok(())
}

pub(super) async fn save_outbound(
    store: &PostgresStore,
    id: &str,
    before: &OutState,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Result<Vec<String>, Failure> {
    let mut tx = store.begin().await?;
    let mut saved = Saved::default();
    save(&mut tx, &mut saved, id, before, after, now).await?;
    saved.commit(store, tx).await
}

/// Whether a state fails the rest of an ordered group (`send_group::failed_with`).
fn fails(state: &OutState) -> bool {
    matches!(state, OutState::Faulted(_) | OutState::Failed(_))
}

/// Locks the ordered groups among `groups`, by group id, before any of their messages: a
/// failure in one may fail the rest of it, which must not race a submit to it (that reads
/// whether the group has failed under the same lock).
async fn lock_ordered_groups(c: &mut PgConnection, groups: &[String]) -> Result<(), Failure> {
    sqlx::query(
        "SELECT group_id FROM out_groups WHERE group_id = ANY($1) AND ordered \
         ORDER BY group_id FOR UPDATE",
    )
    .bind(groups)
    .execute(&mut *c)
    .await
    .doing("locking ordered outbound groups")?;
    Ok(())
}

/// `lock_ordered_groups` for the groups of the messages `ids` (a query of its own: one
/// condition over both would scan every group).
async fn lock_groups_of(c: &mut PgConnection, ids: &[String]) -> Result<(), Failure> {
    sqlx::query(
        "SELECT g.group_id FROM out_groups g WHERE g.ordered AND g.group_id IN \
         (SELECT m.group_id FROM out_messages m WHERE m.id = ANY($1)) \
         ORDER BY g.group_id FOR UPDATE OF g",
    )
    .bind(ids)
    .execute(&mut *c)
    .await
    .doing("locking the ordered groups of outbound messages")?;
    Ok(())
}

/// Saves a message's new state; the store keeps final states final. A fault or failure
/// fails what `send_group::failed_with` says of the rest of its group.
///
/// Fenced like a claim: the decision was made on `before` and `after.attempts`, read maybe
/// before another gateway claimed an attempt of the message. If the stored state is no longer
/// `before`, or more attempts are stored, the decision is stale — "expired before it was sent"
/// about a message another gateway has just sent — and is not saved; the next pass decides
/// again on what is stored.
async fn save(
    c: &mut PgConnection,
    saved: &mut Saved,
    id: &str,
    before: &OutState,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Result<(), Failure> {
    // The group before the message's row, as everywhere (a no-op where the caller has it).
    if fails(&after.state) {
        lock_groups_of(c, &[id.to_owned()]).await?;
    }
    let row = sqlx::query(
        "UPDATE out_messages m SET state = $1, fault = $2, reason = $3, \
         attempts = $4, next_attempt = $5, updated_at = $6, schedule = $9 \
         FROM out_groups g WHERE g.group_id = m.group_id AND m.id = $7 \
         AND m.state IN ('queued', 'sent') AND m.state = $8 AND m.attempts <= $4 \
         RETURNING m.group_id, m.number, g.ordered",
    )
    .bind(after.state.name())
    .bind(fault_of(&after.state))
    .bind(reason_of(&after.state))
    .bind(i64::from(after.attempts))
    .bind(after.next_attempt.map(millis))
    .bind(millis(now))
    .bind(id)
    .bind(before.name())
    // An operator's resend may have given it an attempt more.
    .bind(encode_schedule(&after.schedule))
    .fetch_optional(&mut *c)
    .await
    .doing("saving an outbound state")?;
    let Some(row) = row else {
        return Ok(());
    };
    // Due now (a schedule moved earlier), or an ack that may open an ordered group's window.
    if after.next_attempt.is_some_and(|t| t <= now) || after.state == OutState::Acked {
        saved.wakes_sender = true;
    }
    if after.state == *before {
        return Ok(());
    }
    let detail = fault_of(&after.state).or_else(|| reason_of(&after.state));
    saved.events.push(id, after.state.name(), detail, now);
    if after.state.is_final() {
        saved.finished.push(id.to_owned());
    }
    let column = |e: sqlx::Error| StoreError::Corrupt(format!("saved outbound message: {e}"));
    let group_id: String = row.try_get(0).map_err(column)?;
    let number: Option<i64> = row.try_get(1).map_err(column)?;
    let ordered: bool = row.try_get(2).map_err(column)?;
    let failed = Member {
        id: id.to_owned(),
        number: number.map(|n| n as u64),
        state: after.state.clone(),
    };
    fail_rest(c, saved, &group_id, ordered, &failed, now).await
}

async fn fail_rest(
    c: &mut PgConnection,
    saved: &mut Saved,
    group_id: &str,
    ordered: bool,
    failed: &Member,
    now: DateTime<Utc>,
) -> Result<(), Failure> {
    // The rule needs the later messages of an ordered group only.
    let mut later = Vec::new();
    if let (true, true, Some(number)) = (ordered, fails(&failed.state), failed.number) {
        let rows = sqlx::query(
            "SELECT id, number, state, fault, reason FROM out_messages \
             WHERE group_id = $1 AND number > $2 ORDER BY id FOR UPDATE",
        )
        .bind(group_id)
        .bind(number as i64)
        .fetch_all(&mut *c)
        .await
        .doing("reading the rest of an ordered group")?;
        for r in &rows {
            let column = |e: sqlx::Error| StoreError::Corrupt(format!("group member row: {e}"));
            let state: String = r.try_get(2).map_err(column)?;
            let fault: Option<String> = r.try_get(3).map_err(column)?;
            later.push(Member {
                id: r.try_get(0).map_err(column)?,
                number: r
                    .try_get::<Option<i64>, _>(1)
                    .map_err(column)?
                    .map(|n| n as u64),
                state: state_of(&state, fault.as_deref(), r.try_get(4).map_err(column)?)?,
            });
        }
        // Locked by id, decided and logged in group order.
        later.sort_by_key(|m| m.number);
    }
    let (rest, reason) = send_group::failed_with(ordered, failed, &later);
    let Some(reason) = reason else {
        return Ok(());
    };
    if rest.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE out_messages SET state = 'failed', reason = $1, next_attempt = NULL, \
         updated_at = $2 WHERE id = ANY($3)",
    )
    .bind(&reason)
    .bind(millis(now))
    .bind(&rest)
    .execute(&mut *c)
    .await
    .doing("failing the rest of an ordered group")?;
    for other in rest {
        saved.events.push(&other, "failed", Some(&reason), now);
        saved.finished.push(other);
    }
    Ok(())
}

/// The messages `ids`, locked (by id) for the rest of the transaction.
async fn lock_messages(c: &mut PgConnection, ids: &[String]) -> Result<Vec<OutMessage>, Failure> {
    let rows = sqlx::query(select_messages!(
        "WHERE m.id = ANY($1) ORDER BY m.id FOR UPDATE OF m"
    ))
    .bind(ids)
    .fetch_all(&mut *c)
    .await
    .doing("reading outbound messages")?;
    Ok(rows
        .iter()
        .map(message)
        .collect::<Result<Vec<_>, StoreError>>()?)
}

pub(super) async fn not_held(
    store: &PostgresStore,
    ids: &[String],
    asked_at: DateTime<Utc>,
    kept_for: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<Vec<String>, Failure> {
    let mut tx = store.begin().await?;
    lock_groups_of(&mut tx, ids).await?;
    let mut messages: HashMap<String, OutMessage> = lock_messages(&mut tx, ids)
        .await?
        .into_iter()
        .map(|m| (m.id.clone(), m))
        .collect();
    let mut saved = Saved::default();
    // In the order asked; a repeat finds nothing left to do, as it would find it saved.
    for id in ids {
        let Some(m) = messages.remove(id) else {
            continue;
        };
        let mut after = m.outbound.clone();
        after.apply(Event::NotHeld { asked_at, kept_for }, now);
        if after != m.outbound {
            save(&mut tx, &mut saved, id, &m.outbound.state, &after, now).await?;
        }
    }
    saved.commit(store, tx).await
}

/// Linear in the answer: its statements are indexed per group (`Verdicts`), the open messages
/// they name are read in one query driven by the named ranges and singletons through the
/// (group_id, number) index whatever their number, and every change is saved in the same
/// transaction.
pub(super) async fn apply_replies(
    store: &PostgresStore,
    verdicts: &Verdicts,
    source: ReplySource<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<String>, Failure> {
    let clamp = |n: u64| n.min(i64::MAX as u64) as i64;
    let mut groups = Vec::new();
    let (mut range_groups, mut froms, mut tos) = (Vec::new(), Vec::new(), Vec::new());
    let mut singletons = Vec::new();
    for (group_id, singleton, named) in verdicts.named() {
        groups.push(group_id.as_str().to_owned());
        if singleton {
            singletons.push(group_id.as_str().to_owned());
        }
        for &(from, to) in named.pairs() {
            range_groups.push(group_id.as_str().to_owned());
            froms.push(clamp(from));
            tos.push(clamp(to));
        }
    }
    let mut tx = store.begin().await?;
    lock_ordered_groups(&mut tx, &groups).await?;
    let rows = sqlx::query(select_messages!(
        "WHERE m.id IN (SELECT o.id FROM unnest($1::text[], $2::bigint[], $3::bigint[]) \
           AS r(group_id, lo, hi) JOIN out_messages o ON o.group_id = r.group_id \
           AND o.number BETWEEN r.lo AND r.hi \
         UNION ALL SELECT o.id FROM out_messages o WHERE o.group_id = ANY($4) \
           AND o.number IS NULL) \
         AND m.state = 'sent' ORDER BY m.id FOR UPDATE OF m"
    ))
    .bind(&range_groups)
    .bind(&froms)
    .bind(&tos)
    .bind(&singletons)
    .fetch_all(&mut *tx)
    .await
    .doing("reading the messages replies name")?;
    let named = rows
        .iter()
        .map(message)
        .collect::<Result<Vec<_>, StoreError>>()?;
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
            save(&mut tx, &mut saved, &m.id, &m.outbound.state, &after, now).await?;
        }
    }
    saved.commit(store, tx).await
}
