//! The outbound store trait (DESIGN §7): stored state of the sending RMP — submitted messages
//! with their envelopes (sent unchanged on every attempt), their groups and numbering, retry
//! state and the event log — and the rows it speaks in. The rules (numbering, the send window,
//! what a reply or a failure does to a group) are in `rmp::send_group` and `rmp::sender`; a
//! backend reads the rows they decide over and writes what they decide.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{StoreError, StoreFuture};
use crate::rmp::send_group::{Joining, Outgoing};
use crate::rmp::sender::{
    AttemptKind, AttemptNote, AttemptVerdict, OutState, Outbound, RetrySchedule,
};
use crate::wsr::{GroupId, MessageKey, Reply, ReplyPattern, SoapVersion};

pub use crate::rmp::send_group::ReplySource;

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
    /// An operator's "send again" of an ended message: the new message's history says where it
    /// came from, and the old one's that it was sent again as this one (`SENT_AGAIN_EVENT`).
    pub sent_again: Option<SentAgain>,
}

/// Which ended message a submission sends again, on whose word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentAgain {
    pub from: String,
    pub operator: String,
}

/// The `out_events` state of an ended message an operator sent again: an event of its own,
/// not a state of the message (its state stays failed or faulted).
pub const SENT_AGAIN_EVENT: &str = "sent_again";

impl SentAgain {
    /// The two events a send again logs: the new message's `queued` detail, and the old
    /// message's `sent_again` detail.
    pub fn details(&self, new_id: &str) -> (String, String) {
        (
            format!(
                "sent again from {} by operator {}",
                self.from, self.operator
            ),
            format!("sent again as {new_id} by operator {}", self.operator),
        )
    }
}

impl Submission {
    /// The message as the sending RMP's submit plan sees it (`send_group::plan_submit`).
    pub fn outgoing(&self) -> Outgoing<'_> {
        Outgoing {
            id: &self.id,
            group_id: self.group_id.as_ref(),
            joining: Joining {
                destination: &self.destination,
                sequenced: self.sequenced,
                ordered: self.message_order,
                last: self.last,
            },
            ack_requested: self.ack_requested,
            duplicate_elimination: self.duplicate_elimination,
            reply: &self.reply,
            version: self.version,
            body: &self.body,
            expiry: self.expiry,
        }
    }
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

/// What is stored of the message an idempotency key was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedSubmission {
    pub id: String,
    pub group_id: String,
    pub number: Option<u64>,
    pub fingerprint: Option<String>,
}

impl IdempotencyKey {
    /// A submit under this key again: the stored message when the request is the same one,
    /// refused as `KeyReused` when it is another.
    pub fn replay(&self, earlier: KeyedSubmission) -> Result<Submitted, SubmitError> {
        if earlier.fingerprint.as_deref() != Some(self.fingerprint.as_str()) {
            return Err(SubmitError::key_reused(&self.key, &earlier.id));
        }
        Ok(Submitted {
            group_id: GroupId::parse(&earlier.group_id).map_err(StoreError::Corrupt)?,
            id: earlier.id,
            number: earlier.number,
            replayed: true,
        })
    }
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

impl SubmitError {
    /// The refusal of a key used before for another request (`earlier` is that message).
    pub fn key_reused(key: &str, earlier: &str) -> SubmitError {
        SubmitError::KeyReused(format!(
            "Idempotency-Key {key:?} was used for a different request (message {earlier}); use \
             a new key for a new message"
        ))
    }
}

/// One stored outbound message.
/// Which outbound messages a list keeps; `None` keeps any.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutFilter<'a> {
    /// Only those this principal submitted.
    pub principal: Option<&'a str>,
    /// Only those in this state (`queued`, `sent`, `acked`, `faulted`, `failed`).
    pub state: Option<&'a str>,
    pub group: Option<&'a str>,
    /// Only those to this configured partner ("" for URL destinations).
    pub partner: Option<&'a str>,
    /// Only those in doubt (`Outbound::in_doubt`): sent, no verdict, nothing more to send.
    pub in_doubt: bool,
    /// Newest first (`after` then means "older than"); else oldest first.
    pub newest_first: bool,
}

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
    /// The partner's business response to it, if one was kept (`OutboundStore::keep_response`).
    pub response: Option<ResponseInfo>,
    /// When it was submitted.
    pub submitted_at: DateTime<Utc>,
    /// When it last changed (for a final message: when it became final).
    pub updated_at: DateTime<Utc>,
    /// When a poll last asked about it.
    pub last_poll_at: Option<DateTime<Utc>>,
}

/// What is known of a kept business response without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseInfo {
    /// Its `Content-Type` as received (the HTTP answer's, a multipart/related one included).
    pub content_type: String,
    /// Its length in bytes.
    pub size: u64,
    /// Whether its Body is an application SOAP Fault.
    pub soap_fault: bool,
    pub received_at: DateTime<Utc>,
}

/// The `out_events` state of a kept business response: an event of its own, not a state of
/// the message (`OutboundStore::keep_response`).
pub const RESPONSE_EVENT: &str = "response";

impl ResponseInfo {
    /// The detail of its `response` event.
    pub fn event_detail(&self) -> String {
        let fault = if self.soap_fault {
            ", a SOAP Fault"
        } else {
            ""
        };
        format!("{} bytes of {}{fault}", self.size, self.content_type)
    }
}

/// A partner's business response to one of our messages (Notify with a response, D16): the
/// answer as received, at most `max_message_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptResponse {
    pub info: ResponseInfo,
    pub body: Vec<u8>,
}

/// A kept business response as both backends read it back (`RESPONSE_ROW_SQL`).
pub(in crate::store) type ResponseRow = (String, i64, bool, i64, Vec<u8>);

/// The `out_responses` row of message `$1`, in `ResponseRow`'s order.
pub(in crate::store) const RESPONSE_ROW_SQL: &str = "SELECT content_type, size, soap_fault, \
     received_at, body FROM out_responses WHERE message_id = $1";

impl KeptResponse {
    pub(in crate::store) fn from_row(row: ResponseRow) -> KeptResponse {
        let (content_type, size, soap_fault, received_at, body) = row;
        KeptResponse {
            info: ResponseInfo {
                content_type,
                size: size.try_into().unwrap_or(0),
                soap_fault,
                received_at: crate::store::time::from_millis(received_at),
            },
            body,
        }
    }
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

/// A partner's health as the sender's exchanges with it left it (`record_attempts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartnerHealth {
    /// The configured partner ("" for URL destinations).
    pub partner: String,
    /// When an attempt or poll to it last got an answer (whatever it said).
    pub last_success_at: Option<DateTime<Utc>>,
    /// Its latest failure, kept after a later success.
    pub last_error: Option<LastError>,
    /// Exchanges that failed since the last answer.
    pub failures_in_row: u64,
}

impl PartnerHealth {
    /// What one exchange (`notes`, all of one send or one poll) does to the row: the time of
    /// its answer, or its failure (the latest note's).
    pub(in crate::store) fn change(notes: &[(String, AttemptNote)]) -> Option<HealthChange<'_>> {
        let (_, latest) = notes.iter().max_by_key(|(_, n)| n.at)?;
        Some(HealthChange {
            at: crate::store::time::millis(latest.at),
            failure: latest.failure.as_deref(),
        })
    }

    pub(in crate::store) fn from_row(row: HealthRow) -> PartnerHealth {
        let (partner, success, error, error_at, in_row) = row;
        PartnerHealth {
            partner,
            last_success_at: success.map(crate::store::time::from_millis),
            last_error: match (error, error_at) {
                (Some(cause), Some(at)) => Some(LastError {
                    cause,
                    at: crate::store::time::from_millis(at),
                }),
                _ => None,
            },
            failures_in_row: u64::try_from(in_row).unwrap_or(0),
        }
    }
}

/// One exchange's effect on its partner's health row.
pub(in crate::store) struct HealthChange<'a> {
    pub at: i64,
    pub failure: Option<&'a str>,
}

/// A `partner_health` row as both backends read it (`HEALTH_ROWS_SQL`).
pub(in crate::store) type HealthRow = (String, Option<i64>, Option<String>, Option<i64>, i64);

pub(in crate::store) const HEALTH_ROWS_SQL: &str = "SELECT partner, last_success_at, last_error, \
     last_error_at, CAST(failures_in_row AS BIGINT) FROM partner_health ORDER BY partner";

/// The change of one exchange to its partner's row (`$1` partner, `$2` its time, `$3` its
/// failure or NULL), one statement for both backends (SQLite reads `$n` as `?n`).
pub(in crate::store) const HEALTH_UPSERT_SQL: &str = "INSERT INTO partner_health \
     (partner, last_success_at, last_error, last_error_at, failures_in_row) \
     SELECT $1, CASE WHEN f IS NULL THEN t END, f, CASE WHEN f IS NULL THEN NULL ELSE t END, \
            CASE WHEN f IS NULL THEN 0 ELSE 1 END \
     FROM (SELECT CAST($2 AS BIGINT) AS t, CAST($3 AS TEXT) AS f) AS exchange WHERE true \
     ON CONFLICT (partner) DO UPDATE SET \
       last_success_at = COALESCE(excluded.last_success_at, partner_health.last_success_at), \
       last_error = COALESCE(excluded.last_error, partner_health.last_error), \
       last_error_at = COALESCE(excluded.last_error_at, partner_health.last_error_at), \
       failures_in_row = CASE WHEN excluded.last_error IS NULL THEN 0 \
                              ELSE partner_health.failures_in_row + 1 END";

/// A message's kept attempts (`OutboundStore::out_attempts`): the first few and the latest,
/// each with its number; `total` counts every one, the dropped included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptHistory {
    pub total: u64,
    pub kept: Vec<(u64, AttemptNote)>,
}

/// An `out_attempts` row as both backends read it: `n, kind, at, status, verdict, fault,
/// cause`.
pub(in crate::store) type AttemptRow = (
    i64,
    String,
    i64,
    Option<i32>,
    String,
    Option<String>,
    Option<String>,
);

/// The kept attempts of message `$1`, in `AttemptRow`'s order.
pub(in crate::store) const ATTEMPT_ROWS_SQL: &str = "SELECT n, kind, at, status, verdict, \
     fault, cause FROM out_attempts WHERE message_id = $1 ORDER BY n";

impl AttemptHistory {
    pub(in crate::store) fn from_rows(rows: Vec<AttemptRow>) -> Result<AttemptHistory, StoreError> {
        let mut history = AttemptHistory::default();
        for (n, kind, at, status, verdict, fault, cause) in rows {
            let corrupt = |what: &str| StoreError::Corrupt(format!("out_attempts row {n}: {what}"));
            let kind = AttemptKind::parse(&kind).ok_or_else(|| corrupt("unknown kind"))?;
            let verdict = match (verdict.as_str(), fault) {
                ("ack", _) => AttemptVerdict::Ack,
                ("none", _) => AttemptVerdict::Nothing,
                ("fault", Some(code)) => AttemptVerdict::Fault(
                    crate::wsr::FaultCode::from_local_name(&code)
                        .ok_or_else(|| corrupt("unknown fault code"))?,
                ),
                _ => return Err(corrupt("unknown verdict")),
            };
            let n = u64::try_from(n).map_err(|_| corrupt("negative number"))?;
            history.total = history.total.max(n);
            history.kept.push((
                n,
                AttemptNote {
                    kind,
                    at: crate::store::time::from_millis(at),
                    status: status.and_then(|s| u16::try_from(s).ok()),
                    verdict,
                    failure: cause,
                },
            ));
        }
        Ok(history)
    }
}

/// `OutboundStore::out_attempts` and `partner_health` on either backend's pool (one SQL
/// text each, `$n` placeholders).
macro_rules! history_reads {
    () => {
        fn out_attempts<'a>(
            &'a self,
            id: &'a str,
        ) -> $crate::store::StoreFuture<
            'a,
            Result<$crate::store::outbound::AttemptHistory, $crate::store::StoreError>,
        > {
            Box::pin(self.durable(async move {
                let rows: Vec<$crate::store::outbound::AttemptRow> =
                    sqlx::query_as($crate::store::outbound::ATTEMPT_ROWS_SQL)
                        .bind(id)
                        .fetch_all(&self.pool)
                        .await?;
                $crate::store::outbound::AttemptHistory::from_rows(rows)
            }))
        }

        fn partner_health(
            &self,
        ) -> $crate::store::StoreFuture<
            '_,
            Result<Vec<$crate::store::outbound::PartnerHealth>, $crate::store::StoreError>,
        > {
            Box::pin(self.durable(async move {
                let rows: Vec<$crate::store::outbound::HealthRow> =
                    sqlx::query_as($crate::store::outbound::HEALTH_ROWS_SQL)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map($crate::store::outbound::PartnerHealth::from_row)
                    .collect())
            }))
        }
    };
}
pub(in crate::store) use history_reads;

/// One state change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutEvent {
    pub seq: i64,
    pub message_id: String,
    pub state: String,
    pub detail: Option<String>,
    pub at: DateTime<Utc>,
}

/// The messages a send pass may send now (`OutboundStore::due_outbound`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Due {
    /// Due and within their send window, longest due first.
    pub messages: Vec<OutMessage>,
    /// The earliest ExpiryTime of a due message its window holds back: then the stop rules
    /// settle it, whether or not an ack opened the window (which wakes `outbound_due`) first.
    pub held_until: Option<DateTime<Utc>>,
}

/// The sending side's storage (DESIGN §6, §7): what the sender and the messages API read and
/// write. Every write is one transaction; a decision reads its rows inside it.
pub trait OutboundStore: Send + Sync {
    /// The answer to a retried submit, looked up before the request is checked against the
    /// configuration: a retry must get its message back even if a partner or agreement it
    /// named has changed since. `KeyReused` when the key came with a different request.
    fn earlier_submission<'a>(
        &'a self,
        idem: &'a IdempotencyKey,
    ) -> StoreFuture<'a, Result<Option<Submitted>, SubmitError>>;

    /// Stores a submission: numbers are assigned in submit order per group
    /// (`send_group::join_group`), the envelope is written once. Everything or nothing is
    /// stored.
    ///
    /// A submission with an idempotency key its principal used before stores nothing: the same
    /// request answers the message stored the first time (`replayed`), whatever became of it
    /// or its group since; a different request is refused (`KeyReused`). Looked up first, in
    /// the same write transaction, so that a replay neither creates a group nor takes a number.
    fn submit<'a>(
        &'a self,
        s: Submission,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Submitted, SubmitError>>;

    /// Woken by the commit that made an outbound message due (a submit, an ack that may open
    /// an ordered group's window, a schedule moved earlier).
    fn outbound_due(&self) -> &tokio::sync::Notify;

    fn out_message<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<OutMessage>, StoreError>>;

    /// Messages, optionally of one state and/or group, by id after `after`.
    fn out_messages<'a>(
        &'a self,
        state: Option<&'a str>,
        group: Option<&'a str>,
        after: Option<&'a str>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>> {
        Box::pin(async move {
            let filter = OutFilter {
                state,
                group,
                ..OutFilter::default()
            };
            self.out_messages_of(&filter, after, limit).await
        })
    }

    /// The messages `filter` keeps, by id after `after`.
    fn out_messages_of<'a>(
        &'a self,
        filter: &'a OutFilter<'a>,
        after: Option<&'a str>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>>;

    /// At most `limit` messages whose next attempt is due at `now`, longest due first (then by
    /// group and number): first come, first served, so that messages resent over and over
    /// cannot starve newer ones. For ordered groups only those within the send window
    /// (`send_group::in_window`) of `windows[destination]` where the destination has its own,
    /// else `window`.
    fn due_outbound<'a>(
        &'a self,
        now: DateTime<Utc>,
        window: u64,
        windows: &'a BTreeMap<String, u64>,
        limit: i64,
    ) -> StoreFuture<'a, Result<Due, StoreError>>;

    /// Messages only a poll can settle (`send_group::awaits_poll`): Poll-pattern messages
    /// waiting for their ack, and messages of any pattern in doubt (`Outbound::in_doubt`). A
    /// page of them by id, after `after`: a pass goes through all, so that none is starved.
    /// Their `envelope` is not read (it is empty): a poll never sends it.
    fn awaiting_poll<'a>(
        &'a self,
        after: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutMessage>, StoreError>>;

    /// The earliest next attempt of any outbound message later than `after`.
    fn next_outbound_due(
        &self,
        after: DateTime<Utc>,
    ) -> StoreFuture<'_, Result<Option<DateTime<Utc>>, StoreError>>;

    /// Claims the next attempt of a message: counts it (`after`) and returns the envelope to
    /// send, but only if the message is still not final and nobody counted this attempt
    /// since `before` was read (an ack, a failure of its ordered group, or a close may have
    /// come). Counted before the POST, so a crash can only cause a resend with the same
    /// identity.
    fn claim_attempt<'a>(
        &'a self,
        id: &'a str,
        before: &'a Outbound,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Option<String>, StoreError>>;

    /// Saves how many attempts never arrived (`Event::Unreached`), while the attempt that
    /// `after` counted is still the latest and the message not final.
    fn save_unreached<'a>(
        &'a self,
        id: &'a str,
        after: &'a Outbound,
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// Adds a line to the story of each message (`AttemptNote`: a send to one message; a poll
    /// to every message it asked about, each with what the answer said of it), keeping the
    /// first and latest few of each message's (`rmp::sender::attempts_dropped`) and the
    /// count. A failed one is also kept as `last_error` of those not final yet; a poll as
    /// their `last_poll_at`. The exchange was with `partner` ("" a URL destination): its
    /// health (`PartnerHealth`) follows — answered, or failed once more in a row.
    fn record_attempts<'a>(
        &'a self,
        partner: &'a str,
        notes: &'a [(String, AttemptNote)],
    ) -> StoreFuture<'a, Result<(), StoreError>>;

    /// Every partner's health, as the attempts to it left it, by partner.
    fn partner_health(&self) -> StoreFuture<'_, Result<Vec<PartnerHealth>, StoreError>>;

    /// Message `id`'s attempts and polls that are kept, oldest first, and how many there were.
    fn out_attempts<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<AttemptHistory, StoreError>>;

    /// Saves a message's new state and logs the change; final states are never overwritten.
    /// A message of an ordered group that ends faulted or failed fails every later message of
    /// the group not yet final (`send_group::failed_with`). Returns the messages that reached
    /// a final state.
    ///
    /// A decision made on a view that no longer holds is not saved: when the stored state is
    /// not `before`, or more attempts are stored than `after` counts (another gateway of the
    /// database claimed one meanwhile), nothing changes and the next pass decides again.
    fn save_outbound<'a>(
        &'a self,
        id: &'a str,
        before: &'a OutState,
        after: &'a Outbound,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>>;

    /// Applies a poll answer's silence: each of `ids` it named neither acked nor faulted is
    /// not held by the destination (conclusive only for messages past ExpiryTime, see
    /// `Event::NotHeld`). Returns the messages that reached a final state.
    fn not_held<'a>(
        &'a self,
        ids: &'a [String],
        asked_at: DateTime<Utc>,
        kept_for: Duration,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>>;

    /// Applies acks and faults received from a partner (HTTP response, callback, poll
    /// answer) to the sent messages they name that `source` may settle. Returns the messages
    /// that reached a final state.
    fn apply_replies<'a>(
        &'a self,
        replies: &'a [Reply],
        source: ReplySource<'a>,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Result<Vec<String>, StoreError>>;

    /// Keeps a partner's business response with message `id`, and logs it as a `response`
    /// event; the first one received stays (a resend's answer replays it). Answers whether it
    /// was kept now (false: one was kept before, or there is no such message).
    fn keep_response<'a>(
        &'a self,
        id: &'a str,
        response: &'a KeptResponse,
    ) -> StoreFuture<'a, Result<bool, StoreError>>;

    /// The business response kept with message `id`, bytes included.
    fn out_response<'a>(
        &'a self,
        id: &'a str,
    ) -> StoreFuture<'a, Result<Option<KeptResponse>, StoreError>>;

    /// State changes after `after`, oldest first.
    fn out_events(
        &self,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'_, Result<Vec<OutEvent>, StoreError>> {
        self.out_events_of(None, after, limit)
    }

    /// `out_events`, with `principal` only those of the messages it submitted.
    fn out_events_of<'a>(
        &'a self,
        principal: Option<&'a str>,
        after: i64,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>>;

    /// One message's state changes, oldest first, at most `limit` (its history, as the
    /// console shows it; `out_events` would scan every message's).
    fn out_message_events<'a>(
        &'a self,
        message_id: &'a str,
        limit: i64,
    ) -> StoreFuture<'a, Result<Vec<OutEvent>, StoreError>>;

    /// Marks the group's most recent message `last`, if it has not been sent yet
    /// (`send_group::close_group`). With `principal`, only a group that principal started;
    /// another's answers as one that does not exist.
    fn close_group<'a>(
        &'a self,
        group_id: &'a GroupId,
        principal: Option<&'a str>,
    ) -> StoreFuture<'a, Result<Option<u64>, SubmitError>>;
}

/// `Store` holds its backend as `dyn Backend`: the trait must stay dyn-compatible.
const _: Option<&dyn OutboundStore> = None;
