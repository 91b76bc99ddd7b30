//! What the writer does inside its transaction for each job: the receiver's decision applied
//! to the stored group, the inbox, the buffer and the callback queue; and the sweep of due
//! group deadlines.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use super::group_json::{decode, encode, millis};
use super::staged::{InboxRow, Staged};
use super::writer::Effects;
use crate::rmp::group::{Buffered, GroupState, Policy, Swept, slot, sweep};
use crate::rmp::receiver::{Action, Incoming, Verdict, receive, starts_counted_group};
use crate::store::{Received, ReceivedMessage, StoreError, SweepReport};
use crate::wsr::{FaultCode, GroupId, MessageKey, ReplyPattern};

/// Most groups one sweep pass handles; the rest are due again at once.
const SWEEP_BATCH: i64 = 500;
/// A fault notice is kept at least this long, even for a message that had already expired
/// (that is often why it was refused), so its sender can still learn of it.
const FAULT_NOTICE_RETENTION: chrono::Duration = chrono::Duration::hours(1);

/// When the sweeper must look at the group next. A deadline the sweep would not act on must
/// not stay due, or the sweeper would spin.
pub(super) fn group_deadline(
    state: &GroupState,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    state
        .next_deadline(policy)
        .filter(|d| *d > now || state_due(state, now, policy))
}

/// Writes the state of `partner`'s group at once (the sweep; messages stage theirs).
async fn save_group(
    conn: &mut SqliteConnection,
    partner: &str,
    state: &GroupState,
    policy: &Policy,
    now: DateTime<Utc>,
    effects: &mut Effects,
) -> Result<(), StoreError> {
    let deadline = group_deadline(state, policy, now);
    sqlx::query(
        "INSERT INTO groups (partner, group_id, channel, status, next_deadline, updated_at, \
         state) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (partner, group_id) DO UPDATE SET \
         status = excluded.status, next_deadline = excluded.next_deadline, \
         updated_at = excluded.updated_at, state = excluded.state",
    )
    .bind(partner)
    .bind(state.group_id.as_str())
    .bind(&state.params.channel)
    .bind(state.status.as_str())
    .bind(deadline.map(millis))
    .bind(millis(now))
    .bind(encode(state))
    .execute(&mut *conn)
    .await?;
    if let Some(d) = deadline.map(millis) {
        effects.earliest_deadline = Some(effects.earliest_deadline.map_or(d, |e| e.min(d)));
    }
    Ok(())
}

/// Whether a sweep at `now` would change or purge the group.
fn state_due(state: &GroupState, now: DateTime<Utc>, policy: &Policy) -> bool {
    let mut probe = state.clone();
    sweep(&mut probe, now, policy) != Swept::Unchanged
}

pub(super) async fn apply_receive(
    conn: &mut SqliteConnection,
    staged: &mut Staged,
    m: &ReceivedMessage,
    policy: &Policy,
    effects: &mut Effects,
) -> Result<Received, StoreError> {
    let request = &m.request;
    let key = request.key();
    let partner = m.partner.as_str();
    let stored = staged
        .load_group(conn, partner, key.group_id.as_str())
        .await?;
    // Counted only when the message would open a group: one indexed count, not per message.
    let open_groups_of_source = if stored.is_none() && starts_counted_group(request) {
        staged.open_groups_of(conn, &m.source).await?
    } else {
        0
    };
    let outcome = receive(
        stored.as_ref(),
        Incoming {
            request,
            channel: &m.channel,
            body_bytes: m.payload.len() as u64,
            open_groups_of_source,
        },
        m.now,
        policy,
    );
    let expiry = millis(request.expiry_time);
    let number = key.number.map(|n| n as i64);
    match outcome.action {
        Action::Deliver => {
            staged.append_inbox(InboxRow {
                partner: m.partner.clone(),
                channel: m.channel.clone(),
                topic: m.topic.clone(),
                group_id: key.group_id.as_str().to_owned(),
                number,
                payload: m.payload.clone(),
                namespaces: m.namespaces.clone(),
                received_at: millis(m.now),
                expiry,
            });
            effects.appended = true;
        }
        Action::Buffer => {
            sqlx::query(
                "INSERT INTO buffered (partner, group_id, number, channel, topic, payload, \
                 namespaces, received_at, expiry) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(partner)
            .bind(key.group_id.as_str())
            .bind(number)
            .bind(&m.channel)
            .bind(&m.topic)
            .bind(m.payload.as_str())
            .bind(&m.namespaces)
            .bind(millis(m.now))
            .bind(expiry)
            .execute(&mut *conn)
            .await?;
        }
        Action::Drop => {}
    }
    for (n, buffered) in &outcome.released {
        release_buffered(conn, staged, partner, &key.group_id, *n).await?;
        effects.appended = true;
        effects.delivered.push((
            partner.to_owned(),
            MessageKey {
                group_id: key.group_id.clone(),
                number: Some(*n),
            },
        ));
        if request.ack_requested {
            owe_callback(
                conn,
                partner,
                &key.group_id,
                Some(*n),
                None,
                buffered,
                m.soap12,
                m.now,
                effects,
            )
            .await?;
        }
    }
    discard_buffered(
        conn,
        partner,
        &key.group_id,
        &outcome.discarded,
        m.soap12,
        m.now,
        effects,
    )
    .await?;
    if let Some(state) = &outcome.state {
        let deadline = group_deadline(state, policy, m.now);
        staged.save_group(partner, state, &m.source, deadline, m.now, effects);
    }
    // A Poll-pattern sender learns of a fault when it polls: keep it in this same
    // transaction when the group state does not (D4, D11).
    if let (ReplyPattern::Poll, Verdict::Fault(code, _)) =
        (&request.reply_pattern, &outcome.verdict)
    {
        let in_state = outcome
            .state
            .as_ref()
            .is_some_and(|s| s.faults.contains_key(&slot(key.number)));
        if !code.is_transient() && !in_state {
            insert_message_fault(conn, partner, &key, *code, request.expiry_time, m.now).await?;
        }
    }
    // This message's own answer, when it travels by callback.
    if let ReplyPattern::Callback(_) = &request.reply_pattern {
        let fault = match &outcome.verdict {
            Verdict::Ack => Some(None),
            Verdict::Fault(code, _) if !code.is_transient() => Some(Some(*code)),
            _ => None,
        };
        if let Some(fault) = fault {
            let this = Buffered {
                expiry: request.expiry_time,
                bytes: 0,
                reply: request.reply_pattern.clone(),
            };
            owe_callback(
                conn,
                partner,
                &key.group_id,
                key.number,
                fault,
                &this,
                m.soap12,
                m.now,
                effects,
            )
            .await?;
        }
    }
    Ok(Received {
        verdict: outcome.verdict,
    })
}

/// Remembers the fault of `partner`'s message for its sender's polls, for at least an hour.
pub(super) async fn insert_message_fault(
    conn: &mut SqliteConnection,
    partner: &str,
    key: &MessageKey,
    code: FaultCode,
    expiry: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO message_faults (partner, group_id, singleton, number, fault, expiry) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (partner, group_id, singleton, number) DO NOTHING",
    )
    .bind(partner)
    .bind(key.group_id.as_str())
    .bind(i64::from(key.number.is_none()))
    .bind(slot(key.number) as i64)
    .bind(code.local_name())
    .bind(millis(expiry.max(now + FAULT_NOTICE_RETENTION)))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Moves a buffered message into the inbox (staged, so that it lands after what this batch
/// delivered before it), keeping its original arrival data.
async fn release_buffered(
    conn: &mut SqliteConnection,
    staged: &mut Staged,
    partner: &str,
    group_id: &GroupId,
    n: u64,
) -> Result<(), StoreError> {
    let row = sqlx::query(
        "DELETE FROM buffered WHERE partner = ? AND group_id = ? AND number = ? \
         RETURNING channel, topic, payload, namespaces, received_at, expiry",
    )
    .bind(partner)
    .bind(group_id.as_str())
    .bind(n as i64)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::Corrupt(format!("buffered message {group_id}#{n} is missing")))?;
    staged.append_inbox(InboxRow {
        partner: partner.to_owned(),
        channel: row.get(0),
        topic: row.get(1),
        group_id: group_id.as_str().to_owned(),
        number: Some(n as i64),
        payload: row.get::<String, _>(2).into(),
        namespaces: row.get(3),
        received_at: row.get(4),
        expiry: row.get(5),
    });
    Ok(())
}

/// Drops buffered messages of an aborted group and tells their senders, where a callback can.
async fn discard_buffered(
    conn: &mut SqliteConnection,
    partner: &str,
    group_id: &GroupId,
    discarded: &[(u64, Buffered)],
    soap12: bool,
    now: DateTime<Utc>,
    effects: &mut Effects,
) -> Result<(), StoreError> {
    for (n, buffered) in discarded {
        sqlx::query("DELETE FROM buffered WHERE partner = ? AND group_id = ? AND number = ?")
            .bind(partner)
            .bind(group_id.as_str())
            .bind(*n as i64)
            .execute(&mut *conn)
            .await?;
        let aborted = Some(FaultCode::GroupAborted);
        owe_callback(
            conn,
            partner,
            group_id,
            Some(*n),
            aborted,
            buffered,
            soap12,
            now,
            effects,
        )
        .await?;
    }
    Ok(())
}

/// Queues an ack (`fault` `None`) or fault for `partner`'s Callback-pattern message.
#[allow(clippy::too_many_arguments)]
async fn owe_callback(
    conn: &mut SqliteConnection,
    partner: &str,
    group_id: &GroupId,
    number: Option<u64>,
    fault: Option<FaultCode>,
    message: &Buffered,
    soap12: bool,
    now: DateTime<Utc>,
    effects: &mut Effects,
) -> Result<(), StoreError> {
    let ReplyPattern::Callback(to) = &message.reply else {
        return Ok(());
    };
    let keep_until = match fault {
        Some(_) => message.expiry.max(now + FAULT_NOTICE_RETENTION),
        None => message.expiry,
    };
    sqlx::query(
        "INSERT INTO pending_callbacks (partner, endpoint, soap12, group_id, number, fault, \
         expiry, next_attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(partner)
    .bind(&to.uri)
    .bind(i64::from(soap12))
    .bind(group_id.as_str())
    .bind(number.map(|n| n as i64))
    .bind(fault.map(|f| f.local_name()))
    .bind(millis(keep_until))
    .bind(millis(now))
    .execute(&mut *conn)
    .await?;
    effects.callbacks = true;
    Ok(())
}

pub(super) async fn apply_sweep(
    conn: &mut SqliteConnection,
    now: DateTime<Utc>,
    policy: &Policy,
    effects: &mut Effects,
) -> Result<SweepReport, StoreError> {
    let rows = sqlx::query(
        "SELECT partner, group_id, state FROM groups WHERE next_deadline <= ? \
         ORDER BY next_deadline LIMIT ?",
    )
    .bind(millis(now))
    .bind(SWEEP_BATCH)
    .fetch_all(&mut *conn)
    .await?;
    let mut report = SweepReport::default();
    for row in rows {
        let partner: String = row.get(0);
        let partner = partner.as_str();
        let mut state = match decode(row.get::<&str, _>(2)) {
            Ok(state) => state,
            Err(why) => {
                // One unreadable row must not stop every other group's deadlines: take it out
                // of the sweep (kept for an operator to inspect) and go on.
                let group_id: String = row.get(1);
                tracing::error!(%partner, %group_id, reason = %why, "unreadable group state; no longer swept");
                sqlx::query(
                    "UPDATE groups SET next_deadline = NULL WHERE partner = ? AND group_id = ?",
                )
                .bind(partner)
                .bind(&group_id)
                .execute(&mut *conn)
                .await?;
                continue;
            }
        };
        match sweep(&mut state, now, policy) {
            Swept::Unchanged => {
                // Due but nothing to do (a deadline computed before a change): re-arm it.
                save_group(conn, partner, &state, policy, now, &mut Effects::default()).await?;
            }
            Swept::Changed { discarded } => {
                // Senders of discarded messages learn by callback in SOAP 1.1, the version
                // every peer accepts; their own version is not kept for buffered messages.
                let group_id = &state.group_id;
                discard_buffered(conn, partner, group_id, &discarded, false, now, effects).await?;
                // The sweeper reads the next deadline itself after this pass.
                save_group(conn, partner, &state, policy, now, &mut Effects::default()).await?;
                report.changed += 1;
                report.discarded += discarded.len();
            }
            Swept::Purge => {
                sqlx::query("DELETE FROM groups WHERE partner = ? AND group_id = ?")
                    .bind(partner)
                    .bind(state.group_id.as_str())
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("DELETE FROM buffered WHERE partner = ? AND group_id = ?")
                    .bind(partner)
                    .bind(state.group_id.as_str())
                    .execute(&mut *conn)
                    .await?;
                report.purged += 1;
            }
        }
    }
    sqlx::query("DELETE FROM pending_callbacks WHERE expiry < ?")
        .bind(millis(now))
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM message_faults WHERE expiry < ?")
        .bind(millis(now))
        .execute(&mut *conn)
        .await?;
    Ok(report)
}
