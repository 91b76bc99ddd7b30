//! Stored state of the sending RMP: submitted messages with their envelopes (sent unchanged on
//! every attempt), their groups and numbering, retry state and the event log.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::StoreError;
use super::sqlite::SqliteStore;
use super::sqlite::group_json::{from_millis, millis};
use crate::rmp::replies::Verdicts;
use crate::rmp::sender::{OutState, Outbound, RetrySchedule};
use crate::wsr::{
    FaultCode, GroupId, Headers, MessageId, MessageKey, Reply, ReplyPattern, Request, SequenceNum,
    SoapVersion, write_envelope,
};

/// Where acks and faults came from: only messages sent to that destination (its HTTP
/// answers and poll answers), or sent with the Callback pattern (our `/wsr/_callback`) to one
/// of the partners the caller may speak for, can be acknowledged by them — and only once they
/// were actually sent.
#[derive(Debug, Clone, Copy)]
pub enum ReplySource<'a> {
    Destination(&'a str),
    /// `partners`: whose messages the caller may settle (D14) — `[P]` for an authenticated
    /// partner P; for an anonymous caller "" (URL destinations) and the partners that cannot
    /// authenticate. Replies naming anyone else's messages change nothing.
    Callback {
        partners: &'a [String],
    },
}

impl ReplySource<'_> {
    fn destination(&self) -> Option<&str> {
        match self {
            ReplySource::Destination(d) => Some(d),
            ReplySource::Callback { .. } => None,
        }
    }

    fn is_callback(&self) -> bool {
        matches!(self, ReplySource::Callback { .. })
    }

    /// The partners whose messages may be settled, as a JSON list (`None`: any).
    fn partners(&self) -> Option<String> {
        match self {
            ReplySource::Destination(_) => None,
            ReplySource::Callback { partners } => Some(serde_json::json!(partners).to_string()),
        }
    }
}

/// A message an application hands to the gateway to send.
#[derive(Debug, Clone)]
pub struct Submission {
    pub id: String,
    pub destination: String,
    /// The configured partner `destination` names ("" for a URL destination): only its
    /// callbacks may settle the message.
    pub partner: String,
    /// Existing group to continue, or a new one (`None`).
    pub group_id: Option<GroupId>,
    /// Whether the message belongs to a sequenced group (else a singleton).
    pub sequenced: bool,
    pub last: bool,
    pub ack_requested: bool,
    pub duplicate_elimination: bool,
    pub message_order: bool,
    pub reply: ReplyPattern,
    pub version: SoapVersion,
    pub body: String,
    pub expiry: DateTime<Utc>,
    pub schedule: RetrySchedule,
    pub notify_url: Option<String>,
    /// The application's `Idempotency-Key`, if it sent one.
    pub idempotency: Option<IdempotencyKey>,
    /// Who submits it: the message and a new group are theirs.
    pub principal: String,
    /// Whether it may continue any principal's group (operators), or only its own.
    pub any_group: bool,
}

/// An application's `Idempotency-Key`: unique per principal, stored with the fingerprint of
/// the request it came with, so that a retry of the same request is told apart from a reuse
/// of the key for a different one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    pub principal: String,
    pub key: String,
    pub fingerprint: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub id: String,
    pub group_id: GroupId,
    pub number: Option<u64>,
    /// The key was seen before with the same request: this is the message stored then, and
    /// nothing new was stored.
    pub replayed: bool,
}

/// Why a submission was refused; nothing of it was stored.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{0}")]
    Conflict(String),
    /// The principal used the `Idempotency-Key` before for a different request.
    #[error("{0}")]
    KeyReused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One stored outbound message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutMessage {
    pub id: String,
    pub group_id: GroupId,
    pub number: Option<u64>,
    pub destination: String,
    /// The configured partner it goes to ("" for a URL destination).
    pub partner: String,
    pub version: SoapVersion,
    pub reply: String,
    pub envelope: String,
    pub outbound: Outbound,
    pub notify_url: Option<String>,
    pub ordered: bool,
    /// The `Idempotency-Key` it was submitted with.
    pub idempotency_key: Option<String>,
    /// Why its latest failed attempt failed, if one did.
    pub last_error: Option<LastError>,
    /// Who submitted it (`None`: stored before principals were, visible to operators only).
    pub principal: Option<String>,
}

/// The cause of a message's latest failed attempt (`AttemptFailure`, as text) and its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    pub cause: String,
    pub at: DateTime<Utc>,
}

impl OutMessage {
    /// Its WS-R identity, as acks and faults name it.
    pub fn key(&self) -> MessageKey {
        MessageKey {
            group_id: self.group_id.clone(),
            number: self.number,
        }
    }
}

/// One state change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutEvent {
    pub seq: i64,
    pub message_id: String,
    pub state: String,
    pub detail: Option<String>,
    pub at: DateTime<Utc>,
}

#[derive(Serialize, Deserialize)]
enum StoredSchedule {
    Interval {
        max_attempts: u32,
        interval_ms: u64,
        backoff: u32,
    },
    Waits(Vec<u64>),
}

fn encode_schedule(s: &RetrySchedule) -> String {
    let stored = match s {
        RetrySchedule::Interval {
            max_attempts,
            interval,
            backoff,
        } => StoredSchedule::Interval {
            max_attempts: *max_attempts,
            interval_ms: interval.as_millis().try_into().unwrap_or(u64::MAX),
            backoff: *backoff,
        },
        RetrySchedule::Waits(w) => StoredSchedule::Waits(
            w.iter()
                .map(|d| d.as_millis().try_into().unwrap_or(u64::MAX))
                .collect(),
        ),
    };
    serde_json::to_string(&stored).unwrap_or_default()
}

fn decode_schedule(s: &str) -> Result<RetrySchedule, StoreError> {
    let stored: StoredSchedule =
        serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("schedule: {e}")))?;
    Ok(match stored {
        StoredSchedule::Interval {
            max_attempts,
            interval_ms,
            backoff,
        } => RetrySchedule::Interval {
            max_attempts,
            interval: Duration::from_millis(interval_ms),
            backoff,
        },
        StoredSchedule::Waits(w) => {
            RetrySchedule::Waits(w.into_iter().map(Duration::from_millis).collect())
        }
    })
}

/// A static query over messages joined with their group, in the column order `row_to_message`
/// reads (static, so sqlx knows no value is spliced into the SQL).
macro_rules! select_messages {
    ($tail:literal) => {
        concat!(
            "SELECT m.id, m.group_id, m.number, m.destination, m.soap12, m.reply_pattern, ",
            "m.envelope, m.expiry, m.schedule, m.state, m.fault, m.reason, m.attempts, ",
            "m.next_attempt, m.notify_url, g.ordered, m.idem_key, m.unreached, m.last_error, ",
            "m.last_error_at, m.principal, m.partner ",
            "FROM out_messages m JOIN out_groups g USING (group_id) ",
            $tail
        )
    };
}

fn row_to_message(r: &sqlx::sqlite::SqliteRow) -> Result<OutMessage, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(what);
    let group: String = r.get(1);
    let state = match r.get::<&str, _>(9) {
        "queued" => OutState::Queued,
        "sent" => OutState::Sent,
        "acked" => OutState::Acked,
        "faulted" => {
            let code: Option<String> = r.get(10);
            OutState::Faulted(
                code.as_deref()
                    .and_then(FaultCode::from_local_name)
                    .ok_or_else(|| corrupt("faulted without a known fault".into()))?,
            )
        }
        "failed" => OutState::Failed(r.get::<Option<String>, _>(11).unwrap_or_default()),
        other => return Err(corrupt(format!("unknown outbound state {other}"))),
    };
    Ok(OutMessage {
        id: r.get(0),
        group_id: GroupId::parse(&group).map_err(corrupt)?,
        number: r.get::<Option<i64>, _>(2).map(|n| n as u64),
        destination: r.get(3),
        partner: r.get(21),
        version: if r.get::<i64, _>(4) != 0 {
            SoapVersion::Soap12
        } else {
            SoapVersion::Soap11
        },
        reply: r.get(5),
        envelope: r.get(6),
        outbound: Outbound {
            state,
            attempts: r.get::<i64, _>(12).try_into().unwrap_or(u32::MAX),
            unreached: r.get::<i64, _>(17).try_into().unwrap_or(0),
            expiry: from_millis(r.get(7)),
            schedule: decode_schedule(r.get::<&str, _>(8))?,
            next_attempt: r.get::<Option<i64>, _>(13).map(from_millis),
        },
        notify_url: r.get(14),
        ordered: r.get::<i64, _>(15) != 0,
        idempotency_key: r.get(16),
        last_error: match (r.get::<Option<String>, _>(18), r.get::<Option<i64>, _>(19)) {
            (Some(cause), Some(at)) => Some(LastError {
                cause,
                at: from_millis(at),
            }),
            _ => None,
        },
        principal: r.get(20),
    })
}

/// The message stored earlier under `idem`'s key, if any: `KeyReused` when it was stored for
/// a different request.
async fn earlier_submission(
    conn: &mut sqlx::SqliteConnection,
    idem: &IdempotencyKey,
) -> Result<Option<Submitted>, SubmitError> {
    let earlier = sqlx::query(
        "SELECT id, group_id, number, idem_fingerprint FROM out_messages \
         WHERE idem_principal = ? AND idem_key = ?",
    )
    .bind(&idem.principal)
    .bind(&idem.key)
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    let Some(row) = earlier else {
        return Ok(None);
    };
    let id: String = row.get(0);
    if row.get::<Option<&str>, _>(3) != Some(idem.fingerprint.as_str()) {
        return Err(SubmitError::KeyReused(format!(
            "Idempotency-Key {:?} was used for a different request (message {id}); use a new \
             key for a new message",
            idem.key
        )));
    }
    let group: String = row.get(1);
    Ok(Some(Submitted {
        id,
        group_id: GroupId::parse(&group).map_err(StoreError::Corrupt)?,
        number: row.get::<Option<i64>, _>(2).map(|n| n as u64),
        replayed: true,
    }))
}

impl SqliteStore {
    /// The answer to a retried submit, looked up before the request is checked against the
    /// configuration: a retry must get its message back even if a partner or agreement it
    /// named has changed since.
    pub async fn earlier_submission(
        &self,
        idem: &IdempotencyKey,
    ) -> Result<Option<Submitted>, SubmitError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::from)?;
        earlier_submission(&mut conn, idem).await
    }

    /// Stores a submission: numbers are assigned in submit order per group, the envelope is
    /// written once. Everything or nothing is stored.
    ///
    /// A submission with an idempotency key its principal used before stores nothing: the same
    /// request answers the message stored the first time (`replayed`), whatever became of it
    /// or its group since; a different request is refused (`KeyReused`). Looked up first, in
    /// the same write transaction, so that a replay neither creates a group nor takes a number.
    pub async fn submit(
        &self,
        s: Submission,
        now: DateTime<Utc>,
    ) -> Result<Submitted, SubmitError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::from)?;
        if let Some(idem) = &s.idempotency {
            // Again inside the transaction: two tries of one submit may race.
            if let Some(earlier) = earlier_submission(&mut tx, idem).await? {
                return Ok(earlier);
            }
        }
        let (group_id, number) = match &s.group_id {
            None => {
                let group_id = GroupId::parse(&format!("mid:{}@wsr-gateway", s.id))
                    .map_err(StoreError::Corrupt)?;
                sqlx::query(
                    "INSERT INTO out_groups (group_id, destination, ordered, sequenced, \
                     next_number, last_number, created_at, principal) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(group_id.as_str())
                .bind(&s.destination)
                .bind(i64::from(s.message_order))
                .bind(i64::from(s.sequenced))
                .bind(i64::from(s.sequenced))
                .bind(s.last.then_some(0i64))
                .bind(millis(now))
                .bind(&s.principal)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                (group_id, s.sequenced.then_some(0))
            }
            Some(group_id) => {
                // Another principal's group answers as one that does not exist.
                let row = sqlx::query(
                    "SELECT destination, ordered, sequenced, next_number, last_number \
                     FROM out_groups WHERE group_id = ?1 AND (?2 OR principal = ?3)",
                )
                .bind(group_id.as_str())
                .bind(s.any_group)
                .bind(&s.principal)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?
                .ok_or_else(|| SubmitError::Conflict(format!("no outbound group {group_id}")))?;
                let destination: String = row.get(0);
                if destination != s.destination {
                    return Err(SubmitError::Conflict(format!(
                        "group {group_id} goes to {destination}, not {}",
                        s.destination
                    )));
                }
                if row.get::<i64, _>(2) == 0 {
                    return Err(SubmitError::Conflict(format!(
                        "group {group_id} is a singleton"
                    )));
                }
                if (row.get::<i64, _>(1) != 0) != s.message_order {
                    return Err(SubmitError::Conflict(format!(
                        "group {group_id} was created {}ordered",
                        if s.message_order { "un" } else { "" }
                    )));
                }
                if row.get::<Option<i64>, _>(4).is_some() {
                    return Err(SubmitError::Conflict(format!(
                        "group {group_id} is closed: its last message was submitted"
                    )));
                }
                let failed: Option<i64> = sqlx::query_scalar(
                    "SELECT 1 FROM out_messages WHERE group_id = ? \
                     AND state IN ('faulted', 'failed') LIMIT 1",
                )
                .bind(group_id.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                if failed.is_some() && row.get::<i64, _>(1) != 0 {
                    return Err(SubmitError::Conflict(format!(
                        "ordered group {group_id} has a failed message: nothing after it can be \
                         delivered; start a new group"
                    )));
                }
                let number = row.get::<i64, _>(3) as u64;
                sqlx::query(
                    "UPDATE out_groups SET next_number = ?, last_number = ? WHERE group_id = ?",
                )
                .bind(number.saturating_add(1) as i64)
                .bind(s.last.then_some(number as i64))
                .bind(group_id.as_str())
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                (group_id.clone(), Some(number))
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
        sqlx::query(
            "INSERT INTO out_messages (id, group_id, number, destination, soap12, reply_pattern, \
             envelope, expiry, schedule, state, attempts, next_attempt, notify_url, created_at, \
             updated_at, idem_principal, idem_key, idem_fingerprint, principal, partner) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(group_id.as_str())
        .bind(number.map(|n| n as i64))
        .bind(&s.destination)
        .bind(i64::from(s.version == SoapVersion::Soap12))
        .bind(s.reply.value())
        .bind(&envelope)
        .bind(millis(s.expiry))
        .bind(encode_schedule(&s.schedule))
        .bind(millis(now))
        .bind(&s.notify_url)
        .bind(millis(now))
        .bind(millis(now))
        .bind(s.idempotency.as_ref().map(|i| &i.principal))
        .bind(s.idempotency.as_ref().map(|i| &i.key))
        .bind(s.idempotency.as_ref().map(|i| &i.fingerprint))
        .bind(&s.principal)
        .bind(&s.partner)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        insert_event(&mut tx, &s.id, "queued", None, now).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.shared.outbound_due.notify_one();
        Ok(Submitted {
            id: s.id,
            group_id,
            number,
            replayed: false,
        })
    }

    pub fn outbound_due(&self) -> &tokio::sync::Notify {
        &self.shared.outbound_due
    }

    pub async fn out_message(&self, id: &str) -> Result<Option<OutMessage>, StoreError> {
        let row = sqlx::query(select_messages!("WHERE m.id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(row_to_message).transpose()
    }

    /// Messages, optionally of one state and/or group, by id after `after`.
    pub async fn out_messages(
        &self,
        state: Option<&str>,
        group: Option<&str>,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<OutMessage>, StoreError> {
        self.out_messages_of(None, state, group, after, limit).await
    }

    /// `out_messages`, with `principal` only those it submitted.
    pub async fn out_messages_of(
        &self,
        principal: Option<&str>,
        state: Option<&str>,
        group: Option<&str>,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<OutMessage>, StoreError> {
        let rows = sqlx::query(select_messages!(
            "WHERE (?1 IS NULL OR m.state = ?1) AND (?2 IS NULL OR m.group_id = ?2) \
             AND (?5 IS NULL OR m.principal = ?5) AND m.id > ?3 ORDER BY m.id LIMIT ?4"
        ))
        .bind(state)
        .bind(group)
        .bind(after.unwrap_or(""))
        .bind(limit)
        .bind(principal)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_message).collect()
    }

    /// Messages whose next attempt is due at `now`, longest due first (then by group and
    /// number): first come, first served, so that messages resent over and over cannot starve
    /// newer ones (ordering by group id did: ids grow with time, and new groups waited behind
    /// every resend of older ones). For ordered groups only those within the window of the
    /// lowest number not yet acknowledged: `windows[destination]` where the destination has
    /// its own, else `window`.
    pub async fn due_outbound(
        &self,
        now: DateTime<Utc>,
        window: u64,
        windows: &BTreeMap<String, u64>,
        limit: i64,
    ) -> Result<Vec<OutMessage>, StoreError> {
        let clamp = |w: u64| i64::try_from(w).unwrap_or(i64::MAX);
        // One JSON object bound to one parameter, whatever the number of destinations.
        let windows = serde_json::Value::Object(
            windows
                .iter()
                .map(|(d, w)| (d.clone(), clamp(*w).into()))
                .collect(),
        )
        .to_string();
        let rows = sqlx::query(select_messages!(
            "WHERE m.next_attempt <= ?1 AND (g.ordered = 0 OR m.expiry <= ?1 OR m.number < \
               COALESCE((SELECT w.value FROM json_each(?4) w WHERE w.key = m.destination), ?2) \
               + (SELECT MIN(o.number) FROM out_messages o \
               WHERE o.group_id = m.group_id AND o.state NOT IN ('acked'))) \
             ORDER BY m.next_attempt, m.group_id, m.number LIMIT ?3"
        ))
        .bind(millis(now))
        .bind(clamp(window))
        .bind(limit)
        .bind(windows)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_message).collect()
    }

    /// Messages only a poll can settle, by destination: Poll-pattern messages waiting for
    /// their ack, and messages of any pattern in doubt — sent, no verdict, and no resend to
    /// come before ExpiryTime (`Outbound::in_doubt`: `next_attempt` at or after `expiry`).
    /// A page of them by id, after `after`: a pass goes through all, so that no destination
    /// or message is starved by others.
    pub async fn awaiting_poll(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Vec<OutMessage>, StoreError> {
        let rows = sqlx::query(select_messages!(
            "WHERE m.state = 'sent' AND (m.reply_pattern = 'Poll' OR m.next_attempt IS NULL \
             OR m.next_attempt >= m.expiry) AND m.id > ? ORDER BY m.id LIMIT ?"
        ))
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_message).collect()
    }

    /// The earliest next attempt of any outbound message.
    pub async fn next_outbound_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        // The condition lets SQLite answer from the partial index, not a table scan.
        let ms: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(next_attempt) FROM out_messages WHERE next_attempt IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(ms.map(from_millis))
    }

    /// Claims the next attempt of a message: counts it and returns the envelope to send, but
    /// only if the message is still not final and nobody counted this attempt before (an ack,
    /// a failure of its ordered group, or a close may have come since it was read). Counted
    /// before the POST, so a crash can only cause a resend with the same identity.
    pub async fn claim_attempt(
        &self,
        id: &str,
        before: &Outbound,
        after: &Outbound,
        now: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let claimed = sqlx::query(
            "UPDATE out_messages SET state = 'sent', attempts = ?, next_attempt = ?, \
             updated_at = ? WHERE id = ? AND state IN ('queued', 'sent') AND attempts = ?",
        )
        .bind(i64::from(after.attempts))
        .bind(after.next_attempt.map(millis))
        .bind(millis(now))
        .bind(id)
        .bind(i64::from(before.attempts))
        .execute(&mut *tx)
        .await?;
        if claimed.rows_affected() != 1 {
            return Ok(None);
        }
        if before.state == OutState::Queued {
            insert_event(&mut tx, id, "sent", None, now).await?;
        }
        let envelope: String = sqlx::query_scalar("SELECT envelope FROM out_messages WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(envelope))
    }

    /// Saves how many attempts never arrived (`Event::Unreached`), while the attempt that
    /// `after` counted is still the latest and the message not final.
    pub async fn save_unreached(&self, id: &str, after: &Outbound) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE out_messages SET unreached = ? \
             WHERE id = ? AND attempts = ? AND state IN ('queued', 'sent')",
        )
        .bind(i64::from(after.unreached))
        .bind(id)
        .bind(i64::from(after.attempts))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records why an attempt for each of `ids` failed (a send: one message; a poll: every
    /// message it asked about), on those not final yet.
    pub async fn record_failure(
        &self,
        ids: &[String],
        cause: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            sqlx::query(
                "UPDATE out_messages SET last_error = ?, last_error_at = ? \
                 WHERE id = ? AND state IN ('queued', 'sent')",
            )
            .bind(cause)
            .bind(millis(at))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Saves a message's new state and logs the change. A message of an ordered group that
    /// ends faulted or failed fails every later message of the group not yet final (S-t4).
    pub async fn save_outbound(
        &self,
        id: &str,
        before: &OutState,
        after: &Outbound,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let finished = save_in(&mut tx, id, before, after, now).await?;
        tx.commit().await?;
        Ok(finished)
    }

    /// Applies a poll answer's silence: each of `ids` it named neither acked nor faulted is
    /// not held by the destination (conclusive only for messages past ExpiryTime, see
    /// `Event::NotHeld`). Returns the messages that reached a final state.
    pub async fn not_held(
        &self,
        ids: &[String],
        asked_at: DateTime<Utc>,
        kept_for: Duration,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let mut finished = Vec::new();
        for id in ids {
            let Some(m) = self.out_message(id).await? else {
                continue;
            };
            let mut after = m.outbound.clone();
            after.apply(
                crate::rmp::sender::Event::NotHeld { asked_at, kept_for },
                now,
            );
            if after != m.outbound {
                finished.extend(
                    self.save_outbound(id, &m.outbound.state, &after, now)
                        .await?,
                );
            }
        }
        Ok(finished)
    }

    /// Applies acks and faults received from a partner (HTTP response, callback, poll
    /// answer). Returns the messages that reached a final state.
    ///
    /// Linear in the answer: its statements are indexed per group (`Verdicts`), the messages
    /// they name are read in two queries (ranges, singletons) whatever their number, and
    /// every change is saved in one transaction.
    pub async fn apply_replies(
        &self,
        replies: &[Reply],
        source: ReplySource<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let verdicts = Verdicts::new(replies);
        if verdicts.is_empty() {
            return Ok(Vec::new());
        }
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
        let mut rows = Vec::new();
        if !ranges.is_empty() {
            // Driven by the named ranges through the (group_id, number) index, never by a
            // scan of the sent messages (`+m.state` keeps the planner off the state index).
            rows.extend(
                sqlx::query(select_messages!(
                    "WHERE m.rowid IN (SELECT o.rowid FROM json_each(?1) AS j \
                     CROSS JOIN out_messages AS o WHERE o.group_id = j.value->>0 \
                     AND o.number BETWEEN j.value->>1 AND j.value->>2) AND +m.state = 'sent' \
                     AND (?2 IS NULL OR m.destination = ?2) AND (?3 = 0 OR m.reply_pattern = 'Callback') \
                     AND (?4 IS NULL OR m.partner IN (SELECT value FROM json_each(?4)))"
                ))
                .bind(serde_json::Value::Array(ranges).to_string())
                .bind(source.destination())
                .bind(i64::from(source.is_callback()))
                .bind(source.partners())
                .fetch_all(&self.pool)
                .await?,
            );
        }
        if !singletons.is_empty() {
            rows.extend(
                sqlx::query(select_messages!(
                    "WHERE m.group_id IN (SELECT value FROM json_each(?1)) AND m.number IS NULL \
                     AND +m.state = 'sent' AND (?2 IS NULL OR m.destination = ?2) \
                     AND (?3 = 0 OR m.reply_pattern = 'Callback') \
                     AND (?4 IS NULL OR m.partner IN (SELECT value FROM json_each(?4)))"
                ))
                .bind(serde_json::json!(singletons).to_string())
                .bind(source.destination())
                .bind(i64::from(source.is_callback()))
                .bind(source.partners())
                .fetch_all(&self.pool)
                .await?,
            );
        }
        let mut changes = Vec::new();
        for row in &rows {
            let m = row_to_message(row)?;
            let mut after = m.outbound.clone();
            for fault in verdicts.about(&m.key()) {
                after.apply(
                    match fault {
                        None => crate::rmp::sender::Event::Acked,
                        Some(code) => crate::rmp::sender::Event::Faulted(code),
                    },
                    now,
                );
            }
            if after != m.outbound {
                changes.push((m.id, m.outbound.state, after));
            }
        }
        let mut finished = Vec::new();
        if !changes.is_empty() {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            for (id, before, after) in &changes {
                finished.extend(save_in(&mut tx, id, before, after, now).await?);
            }
            tx.commit().await?;
        }
        if !finished.is_empty() {
            // An ack may open an ordered group's window.
            self.shared.outbound_due.notify_one();
        }
        Ok(finished)
    }

    /// State changes after `after`, oldest first.
    pub async fn out_events(&self, after: i64, limit: i64) -> Result<Vec<OutEvent>, StoreError> {
        self.out_events_of(None, after, limit).await
    }

    /// `out_events`, with `principal` only those of the messages it submitted.
    pub async fn out_events_of(
        &self,
        principal: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<OutEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT e.seq, e.message_id, e.state, e.detail, e.at FROM out_events e \
             WHERE e.seq > ?1 AND (?2 IS NULL OR EXISTS (SELECT 1 FROM out_messages m \
               WHERE m.id = e.message_id AND m.principal = ?2)) \
             ORDER BY e.seq LIMIT ?3",
        )
        .bind(after)
        .bind(principal)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| OutEvent {
                seq: r.get(0),
                message_id: r.get(1),
                state: r.get(2),
                detail: r.get(3),
                at: from_millis(r.get(4)),
            })
            .collect())
    }

    /// Marks the group's most recent message `last`, if it has not been sent yet (its
    /// envelope is rewritten once, before any attempt). Otherwise the group cannot be closed
    /// after the fact: submit the last message with `last` instead.
    /// With `principal`, only a group that principal started; another's answers as one that
    /// does not exist.
    pub async fn close_group(
        &self,
        group_id: &GroupId,
        principal: Option<&str>,
    ) -> Result<Option<u64>, SubmitError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::from)?;
        let row = sqlx::query(
            "SELECT m.id, m.number, m.attempts, m.envelope, g.last_number FROM out_messages m \
             JOIN out_groups g USING (group_id) WHERE m.group_id = ?1 \
             AND (?2 IS NULL OR g.principal = ?2) ORDER BY m.number DESC LIMIT 1",
        )
        .bind(group_id.as_str())
        .bind(principal)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?
        .ok_or_else(|| SubmitError::Conflict(format!("no outbound group {group_id}")))?;
        if let Some(last) = row.get::<Option<i64>, _>(4) {
            return Ok(Some(last as u64));
        }
        let number = row
            .get::<Option<i64>, _>(1)
            .ok_or_else(|| SubmitError::Conflict("a singleton has no group to close".into()))?;
        if row.get::<i64, _>(2) > 0 {
            return Err(SubmitError::Conflict(format!(
                "message {number} of {group_id} was already sent without last=\"true\"; \
                 submit a last message with group.last = true"
            )));
        }
        let envelope: String = row.get(3);
        let rewritten = mark_last(&envelope)
            .ok_or_else(|| StoreError::Corrupt("stored envelope unreadable".into()))?;
        // Only while no attempt has claimed it: the envelope never changes once sent.
        let rewritten = sqlx::query(
            "UPDATE out_messages SET envelope = ? WHERE id = ? AND attempts = 0 AND state = 'queued'",
        )
        .bind(rewritten)
        .bind(row.get::<String, _>(0))
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        if rewritten.rows_affected() != 1 {
            return Err(SubmitError::Conflict(format!(
                "message {number} of {group_id} is being sent or has failed; submit a last \
                 message with group.last = true"
            )));
        }
        sqlx::query("UPDATE out_groups SET last_number = ? WHERE group_id = ?")
            .bind(number)
            .bind(group_id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Some(number as u64))
    }
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

async fn insert_event(
    tx: &mut sqlx::SqliteConnection,
    id: &str,
    state: &str,
    detail: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO out_events (message_id, state, detail, at) VALUES (?, ?, ?, ?)")
        .bind(id)
        .bind(state)
        .bind(detail)
        .bind(millis(now))
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// `save_outbound` inside the caller's transaction.
async fn save_in(
    conn: &mut sqlx::SqliteConnection,
    id: &str,
    before: &OutState,
    after: &Outbound,
    now: DateTime<Utc>,
) -> Result<Vec<String>, StoreError> {
    // Final states are absorbing in the store too: never overwrite one.
    let changed = sqlx::query(
        "UPDATE out_messages SET state = ?, fault = ?, reason = ?, \
         attempts = MAX(attempts, ?), next_attempt = ?, updated_at = ? \
         WHERE id = ? AND state IN ('queued', 'sent')",
    )
    .bind(after.state.name())
    .bind(match &after.state {
        OutState::Faulted(code) => Some(code.local_name()),
        _ => None,
    })
    .bind(match &after.state {
        OutState::Failed(reason) => Some(reason.as_str()),
        _ => None,
    })
    .bind(i64::from(after.attempts))
    .bind(after.next_attempt.map(millis))
    .bind(millis(now))
    .bind(id)
    .execute(&mut *conn)
    .await?;
    let mut finished = Vec::new();
    if changed.rows_affected() == 1 && after.state != *before {
        let detail = match &after.state {
            OutState::Faulted(code) => Some(code.local_name().to_owned()),
            OutState::Failed(reason) => Some(reason.clone()),
            _ => None,
        };
        insert_event(conn, id, after.state.name(), detail.as_deref(), now).await?;
        if after.state.is_final() {
            finished.push(id.to_owned());
        }
        if matches!(after.state, OutState::Faulted(_) | OutState::Failed(_)) {
            finished.extend(fail_rest_of_ordered_group(conn, id, now).await?);
        }
    }
    Ok(finished)
}

async fn fail_rest_of_ordered_group(
    tx: &mut sqlx::SqliteConnection,
    id: &str,
    now: DateTime<Utc>,
) -> Result<Vec<String>, StoreError> {
    let rows = sqlx::query(
        "SELECT o.id FROM out_messages m JOIN out_groups g USING (group_id) \
         JOIN out_messages o ON o.group_id = m.group_id \
         WHERE m.id = ? AND g.ordered = 1 AND o.number > m.number \
         AND o.state IN ('queued', 'sent')",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    let reason = format!("an earlier message of its ordered group ({id}) failed");
    let mut failed = Vec::new();
    for r in rows {
        let other: String = r.get(0);
        sqlx::query(
            "UPDATE out_messages SET state = 'failed', reason = ?, next_attempt = NULL, \
             updated_at = ? WHERE id = ?",
        )
        .bind(&reason)
        .bind(millis(now))
        .bind(&other)
        .execute(&mut *tx)
        .await?;
        insert_event(tx, &other, "failed", Some(&reason), now).await?;
        failed.push(other);
    }
    Ok(failed)
}
