//! The sending RMP's decisions for one outbound message (DESIGN §6): when to (re)send, and how
//! each event changes its state. Pure: the time is a parameter, the store applies the result.
//!
//! States: queued → sent → acked | faulted(code) | failed(reason). The three final states are
//! absorbing. Resending stops on an ack, on a fault (except `MessageProcessingFailure`, which is
//! retried), when the attempts are used up, or at ExpiryTime — nothing is sent after it.
//!
//! A message that went out but got no verdict may have been delivered (the ack may be what
//! was lost), so it is not reported failed at ExpiryTime: it is *in doubt*, and the sender asks
//! the destination by PollRequest. An ack makes it acked. An answer that names it neither way
//! proves it was not delivered only if the destination is known to keep delivered IDs past
//! expiry (as ours does, `delivered_id_retention_seconds`; WS-R lets a receiver forget them at
//! expiry), and only if asked once the destination can no longer accept the message but still
//! keeps the IDs; only then is it failed. Otherwise, or without any answer for the resolve
//! period, it fails as "delivery unknown".

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::rmp::replies::Verdicts;
use crate::wsr::datetime::saturating_add_std;
use crate::wsr::{FaultCode, MessageKey, Reply};

/// How long after a message's ExpiryTime its destination might still accept it: the clock
/// skew a receiver may allow (ours: `clock_skew_seconds`, default 0) plus time in flight. A
/// poll sent later gets a final answer.
pub const EXPIRY_GRACE: Duration = Duration::from_secs(5);

/// The default of how long after ExpiryTime an in-doubt message is polled for before it fails
/// as "delivery unknown" (config `resolve_in_doubt_seconds`). Below the receivers' retention of
/// delivered IDs (ours: 1 h by default).
pub const RESOLVE_FOR: Duration = Duration::from_secs(30 * 60);

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    saturating_add_std(t, d)
}

/// The longest wait between two attempts (submits asking for more are refused).
pub const LONGEST_WAIT: Duration = Duration::from_secs(86_400);

/// When to try again after each attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetrySchedule {
    /// `interval` after the first attempt, multiplied by `backoff` after each further one.
    Interval {
        max_attempts: u32,
        interval: Duration,
        backoff: u32,
    },
    /// An explicit list of waits; one attempt more than there are waits.
    Waits(Vec<Duration>),
}

impl RetrySchedule {
    pub fn max_attempts(&self) -> u32 {
        match self {
            RetrySchedule::Interval { max_attempts, .. } => *max_attempts,
            RetrySchedule::Waits(waits) => u32::try_from(waits.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
        }
    }

    /// The wait after attempt number `attempt` (1-based); `None` when no attempt may follow.
    pub fn wait_after(&self, attempt: u32) -> Option<Duration> {
        if attempt >= self.max_attempts() {
            return None;
        }
        match self {
            RetrySchedule::Interval {
                interval, backoff, ..
            } => {
                let factor = backoff.max(&1).saturating_pow(attempt.saturating_sub(1));
                Some(interval.saturating_mul(factor).min(LONGEST_WAIT))
            }
            RetrySchedule::Waits(waits) => waits
                .get((attempt as usize).saturating_sub(1))
                .map(|w| (*w).min(LONGEST_WAIT)),
        }
    }
}

/// Why an attempt (a send or a poll) came to nothing: what the message's `last_error` says and
/// the WARN line logs. A failed attempt is just that — the schedule resends as before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptFailure {
    /// No connection could be made (refused, no route, name not resolved, or an address the
    /// destination rules refuse): nothing of the attempt arrived.
    Unreached(String),
    /// No complete answer within the request timeout.
    TimedOut,
    /// A redirect: never followed, only the destination itself is sent to.
    Redirected(u16),
    /// An error status without a WS-R verdict in it.
    Status(u16),
    /// The answer was longer than the cap (`max_message_bytes`); the rest was not read.
    TooLarge { limit: usize },
    /// A 2xx answer to a Response-pattern message with no verdict on it (no ack, no fault):
    /// the partner took the request without answering as the pattern asks — a plain SOAP
    /// service, a proxy forwarding to the wrong path, a receiver that drops the header.
    NoVerdict(u16),
    /// A 2xx answer with a body that is not a readable SOAP envelope.
    Unreadable(String),
    /// Any other failure of the exchange (TLS, a reset connection, …).
    Transport(String),
}

impl AttemptFailure {
    /// Whether the attempt certainly never arrived (`Event::Unreached`).
    pub fn never_arrived(&self) -> bool {
        matches!(self, AttemptFailure::Unreached(_))
    }

    /// What an answer that did arrive says about the attempt: `said_something` when it held a
    /// WS-R verdict (acks, faults, a SOAP Fault with a WS-R code) — a verdict is an answer,
    /// whatever its status; `unreadable` when its body could not be read.
    pub fn of_answer(
        status: u16,
        said_something: bool,
        unreadable: Option<&str>,
    ) -> Option<AttemptFailure> {
        match status {
            300..=399 => Some(AttemptFailure::Redirected(status)),
            _ if said_something => None,
            200..=299 => unreadable.map(|why| AttemptFailure::Unreadable(why.to_owned())),
            _ => Some(AttemptFailure::Status(status)),
        }
    }
}

impl AttemptFailure {
    /// The `result` label of `wsr_outbound_attempts_total` for an attempt that failed so
    /// (a fixed word per kind: never the cause's text).
    pub fn result(&self) -> &'static str {
        match self {
            AttemptFailure::Unreached(_) => "unreachable",
            AttemptFailure::TimedOut => "timeout",
            AttemptFailure::Redirected(_) => "redirect",
            AttemptFailure::Status(_) => "error_status",
            AttemptFailure::TooLarge { .. } => "too_large",
            AttemptFailure::NoVerdict(_) => "no_verdict",
            AttemptFailure::Unreadable(_) => "unreadable",
            AttemptFailure::Transport(_) => "transport",
        }
    }
}

/// What an answer (to a send or a poll) said of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptVerdict {
    Ack,
    Fault(FaultCode),
    /// Nothing of this message: under the Response pattern a failed attempt
    /// (`AttemptFailure::NoVerdict`), under Callback and Poll what a send answer usually says,
    /// and in a poll answer "not held" (`Event::NotHeld`).
    Nothing,
}

impl AttemptVerdict {
    /// What `replies` (and a SOAP Fault's WS-R `fault`, which answers the message a send
    /// carried) say of message `key`: its first verdict, as applying them one by one would.
    pub fn on(replies: &[Reply], fault: Option<FaultCode>, key: &MessageKey) -> AttemptVerdict {
        AttemptVerdict::said(&Verdicts::new(replies), fault, key)
    }

    /// `on`, with the answer's statements indexed once (a poll answer speaks of many).
    pub fn said(verdicts: &Verdicts, fault: Option<FaultCode>, key: &MessageKey) -> AttemptVerdict {
        if let Some(verdict) = verdicts.about(key).first() {
            return match verdict {
                Some(code) => AttemptVerdict::Fault(*code),
                None => AttemptVerdict::Ack,
            };
        }
        match fault {
            Some(code) => AttemptVerdict::Fault(code),
            None => AttemptVerdict::Nothing,
        }
    }

    /// As stored and shown: `ack`, `fault`, `none`.
    pub fn name(&self) -> &'static str {
        match self {
            AttemptVerdict::Ack => "ack",
            AttemptVerdict::Fault(_) => "fault",
            AttemptVerdict::Nothing => "none",
        }
    }

    pub fn fault(&self) -> Option<FaultCode> {
        match self {
            AttemptVerdict::Fault(code) => Some(*code),
            _ => None,
        }
    }
}

/// Whether an exchange was a send of the message or a poll asking about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    Send,
    Poll,
}

impl AttemptKind {
    pub fn name(&self) -> &'static str {
        match self {
            AttemptKind::Send => "send",
            AttemptKind::Poll => "poll",
        }
    }

    pub fn parse(name: &str) -> Option<AttemptKind> {
        match name {
            "send" => Some(AttemptKind::Send),
            "poll" => Some(AttemptKind::Poll),
            _ => None,
        }
    }
}

/// One line of a message's story: a send or a poll, when, the partner's HTTP status (none
/// when no answer came), what the answer said of the message, and — when it failed — why
/// (`AttemptFailure` as text, also kept as the message's `last_error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptNote {
    pub kind: AttemptKind,
    pub at: DateTime<Utc>,
    pub status: Option<u16>,
    pub verdict: AttemptVerdict,
    pub failure: Option<String>,
}

impl AttemptNote {
    /// An exchange that was answered (`status`), saying `verdict` of the message.
    pub fn answered(
        kind: AttemptKind,
        at: DateTime<Utc>,
        status: Option<u16>,
        verdict: AttemptVerdict,
    ) -> AttemptNote {
        AttemptNote {
            kind,
            at,
            status,
            verdict,
            failure: None,
        }
    }

    /// An exchange that came to nothing (`failure`), with the status of the answer if one
    /// came.
    pub fn failed(
        kind: AttemptKind,
        at: DateTime<Utc>,
        status: Option<u16>,
        failure: &AttemptFailure,
    ) -> AttemptNote {
        let cause = match kind {
            AttemptKind::Send => failure.to_string(),
            AttemptKind::Poll => format!("poll: {failure}"),
        };
        AttemptNote {
            kind,
            at,
            status,
            verdict: AttemptVerdict::Nothing,
            failure: Some(cause),
        }
    }
}

/// How much of a message's attempts is kept: the first `ATTEMPTS_KEPT_FIRST` (how it began)
/// and the latest `ATTEMPTS_KEPT_LAST` (how it goes), with the count of all; the ones between
/// are dropped, so a message in doubt polled for hours stays a few rows.
pub const ATTEMPTS_KEPT_FIRST: u64 = 5;
pub const ATTEMPTS_KEPT_LAST: u64 = 20;

/// The attempt numbers (1-based, per message) to drop once attempt `latest` is stored.
pub fn attempts_dropped(latest: u64) -> Option<std::ops::RangeInclusive<u64>> {
    let keep_from = latest.saturating_sub(ATTEMPTS_KEPT_LAST) + 1;
    (keep_from > ATTEMPTS_KEPT_FIRST + 1).then(|| (ATTEMPTS_KEPT_FIRST + 1)..=(keep_from - 1))
}

impl std::fmt::Display for AttemptFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttemptFailure::Unreached(why) => write!(f, "unreachable: {why}"),
            AttemptFailure::TimedOut => f.write_str("no answer within the request timeout"),
            AttemptFailure::Redirected(status) => {
                write!(f, "HTTP {status}: a redirect, not followed")
            }
            AttemptFailure::Status(status) => write!(f, "HTTP {status} without a WS-R answer"),
            AttemptFailure::NoVerdict(status) => write!(
                f,
                "answered HTTP {status} without an ack or fault for this message (Response pattern)"
            ),
            AttemptFailure::TooLarge { limit } => write!(
                f,
                "answer longer than {limit} bytes (max_message_bytes); not read further"
            ),
            AttemptFailure::Unreadable(why) => write!(f, "unreadable answer: {why}"),
            AttemptFailure::Transport(why) => write!(f, "exchange failed: {why}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutState {
    Queued,
    Sent,
    Acked,
    Faulted(FaultCode),
    Failed(String),
}

impl OutState {
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            OutState::Acked | OutState::Faulted(_) | OutState::Failed(_)
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            OutState::Queued => "queued",
            OutState::Sent => "sent",
            OutState::Acked => "acked",
            OutState::Faulted(_) => "faulted",
            OutState::Failed(_) => "failed",
        }
    }
}

/// What the sender knows about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    pub state: OutState,
    pub attempts: u32,
    /// Attempts known never to have arrived (connection refused); when all were, the
    /// message cannot have been delivered.
    pub unreached: u32,
    pub expiry: DateTime<Utc>,
    pub schedule: RetrySchedule,
    /// When the next attempt is due (while not final).
    pub next_attempt: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The envelope went out (whatever became of the HTTP exchange).
    Sent,
    /// The last attempt's connection was refused: it cannot have arrived.
    Unreached,
    Acked,
    Faulted(FaultCode),
    /// A poll answer, for a poll sent at `asked_at`, named the message neither acked nor
    /// faulted: the destination does not hold it — which proves something only if it keeps
    /// delivered IDs for `kept_for` after their expiry.
    NotHeld {
        asked_at: DateTime<Utc>,
        kept_for: Duration,
    },
}

impl Outbound {
    pub fn new(expiry: DateTime<Utc>, schedule: RetrySchedule, now: DateTime<Utc>) -> Outbound {
        Outbound {
            state: OutState::Queued,
            attempts: 0,
            unreached: 0,
            expiry,
            schedule,
            next_attempt: Some(now),
        }
    }

    /// Whether an attempt may go out at `now`: not final, due, and not expired. An expired
    /// message that cannot have been delivered fails here (the stop rules); one that may have
    /// been is in doubt until a poll answer settles it or `resolve_for` has passed.
    pub fn due(&mut self, now: DateTime<Utc>, resolve_for: Duration) -> bool {
        if self.state.is_final() || self.next_attempt.is_none_or(|t| t > now) {
            return false;
        }
        if now >= self.expiry {
            if self.attempts == 0 {
                self.fail("expired before it was sent");
            } else if self.unreached >= self.attempts {
                let why = self.unacknowledged();
                self.fail(&format!("{why}; no attempt reached the destination"));
            } else if now >= after(self.expiry, resolve_for) {
                let why = self.unacknowledged();
                self.fail(&format!(
                    "{why}; delivery unknown: the destination answered no poll within {} s",
                    resolve_for.as_secs()
                ));
            } else {
                // In doubt: it went out and may have been delivered. Polls settle it.
                self.next_attempt = Some(after(self.expiry, resolve_for));
            }
            return false;
        }
        // Out of attempts: nothing more is sent, but a late ack may still come until the
        // message expires (by callback, or a poll answer).
        self.attempts < self.schedule.max_attempts()
    }

    /// Applies an event at `now`. Final states never change: a late ack cannot revive a
    /// failed message, and nothing is both acked and failed.
    pub fn apply(&mut self, event: Event, now: DateTime<Utc>) {
        if self.state.is_final() {
            return;
        }
        match event {
            Event::Sent => {
                self.attempts = self.attempts.saturating_add(1);
                self.state = OutState::Sent;
                self.schedule_next(now);
            }
            // An ack wins over any scheduled resend.
            Event::Acked => {
                self.state = OutState::Acked;
                self.next_attempt = None;
            }
            Event::Faulted(code) if code.is_transient() => {
                // "Try later": the schedule already holds the next attempt.
                if self.next_attempt.is_none() {
                    self.schedule_next(now);
                }
            }
            Event::Faulted(code) => {
                self.state = OutState::Faulted(code);
                self.next_attempt = None;
            }
            Event::Unreached => {
                self.unreached = self.unreached.saturating_add(1).min(self.attempts);
            }
            // Conclusive only when asked after the destination could last accept it: then it
            // was not delivered, and never will be. Earlier it may still arrive.
            Event::NotHeld { asked_at, kept_for } => {
                let conclusive = asked_at >= after(self.expiry, EXPIRY_GRACE)
                    && asked_at < after(self.expiry, kept_for);
                if self.attempts > self.unreached && conclusive {
                    let why = self.unacknowledged();
                    self.fail(&format!(
                        "{why}; the destination confirms it was not delivered"
                    ));
                }
            }
        }
    }

    /// Whether only a poll can tell what became of the message: it went out, no verdict
    /// came, and nothing more will be sent (attempts used up, or ExpiryTime passed).
    pub fn in_doubt(&self) -> bool {
        !self.state.is_final()
            && self.attempts > self.unreached
            && self.next_attempt.is_none_or(|t| t >= self.expiry)
    }

    fn unacknowledged(&self) -> String {
        if self.attempts >= self.schedule.max_attempts() {
            format!("no acknowledgment after {} attempts", self.attempts)
        } else {
            "expired before it was acknowledged".to_owned()
        }
    }

    fn schedule_next(&mut self, now: DateTime<Utc>) {
        self.next_attempt = match self.schedule.wait_after(self.attempts) {
            Some(wait) => Some(after(now, wait)),
            // The last attempt is out: an ack can still come until the message expires; then
            // `due` fails it.
            None => Some(self.expiry),
        };
    }

    pub fn fail(&mut self, reason: &str) {
        if !self.state.is_final() {
            self.state = OutState::Failed(reason.to_owned());
            self.next_attempt = None;
        }
    }

    /// An operator's resend (the console's and the CLI's): one attempt now, with the same
    /// identity, even when the schedule's attempts are used up — typically for a message in
    /// doubt, whose resend the destination either acks as a duplicate or delivers. Refused
    /// once final, and from its ExpiryTime on, when the destination would refuse it (then
    /// only polls, or an operator's fail, settle it).
    pub fn resend_now(&mut self, now: DateTime<Utc>) -> Result<(), OperatorRefusal> {
        if self.state.is_final() {
            return Err(OperatorRefusal::Final(self.state.name()));
        }
        if now >= self.expiry {
            return Err(OperatorRefusal::Expired);
        }
        if self.attempts >= self.schedule.max_attempts() {
            self.schedule = self.schedule.with_one_more();
        }
        self.next_attempt = Some(now);
        Ok(())
    }

    /// An operator's fail: the message ends `failed` with who said so and why, and (as any
    /// failure) fails the rest of its ordered group. Refused once final.
    pub fn fail_by_operator(&mut self, operator: &str, why: &str) -> Result<(), OperatorRefusal> {
        if self.state.is_final() {
            return Err(OperatorRefusal::Final(self.state.name()));
        }
        let why = why.trim();
        self.fail(&if why.is_empty() {
            format!("failed by operator {operator}")
        } else {
            format!("failed by operator {operator}: {why}")
        });
        Ok(())
    }
}

impl OutState {
    /// Whether an operator may send the message again as a new one: only once it ended
    /// without reaching its destination's acceptance — failed, or faulted (an acked message
    /// arrived; one still on its way may yet arrive, and is resent, not sent again).
    pub fn may_send_again(&self) -> Result<(), OperatorRefusal> {
        match self {
            OutState::Failed(_) | OutState::Faulted(_) => Ok(()),
            other => Err(OperatorRefusal::NotEnded(other.name())),
        }
    }
}

/// Why an operator's resend, fail or send again does not apply to a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperatorRefusal {
    #[error(
        "the message is {0}: only a failed or faulted message is sent again (resend one still on its way)"
    )]
    NotEnded(&'static str),
    #[error("the message is already {0}; a final state never changes")]
    Final(&'static str),
    #[error(
        "the message has expired: the destination would refuse a resend; polls settle it, or fail it"
    )]
    Expired,
}

impl RetrySchedule {
    /// The same schedule with room for one attempt more (an operator's resend).
    fn with_one_more(&self) -> RetrySchedule {
        match self {
            RetrySchedule::Interval {
                max_attempts,
                interval,
                backoff,
            } => RetrySchedule::Interval {
                max_attempts: max_attempts.saturating_add(1),
                interval: *interval,
                backoff: *backoff,
            },
            RetrySchedule::Waits(waits) => {
                let mut waits = waits.clone();
                waits.push(waits.last().copied().unwrap_or(Duration::ZERO));
                RetrySchedule::Waits(waits)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("date")
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn an_answer_speaks_of_a_message_only_by_its_own_ack_or_a_fault() {
        let g = crate::wsr::GroupId::parse("mid:g@test").expect("group");
        let other = crate::wsr::GroupId::parse("mid:other@test").expect("group");
        let key = |number| MessageKey {
            group_id: g.clone(),
            number,
        };
        let single = |group: &crate::wsr::GroupId| Reply::NonSequence {
            group_id: group.clone(),
            fault: None,
        };
        let on = AttemptVerdict::on;
        assert_eq!(on(&[single(&g)], None, &key(None)), AttemptVerdict::Ack);
        assert_eq!(
            on(&[single(&other)], None, &key(None)),
            AttemptVerdict::Nothing,
            "another message's ack"
        );
        assert_eq!(on(&[], None, &key(None)), AttemptVerdict::Nothing);
        assert_eq!(
            on(&[], Some(FaultCode::InvalidRequest), &key(None)),
            AttemptVerdict::Fault(FaultCode::InvalidRequest),
            "a SOAP Fault answers the message sent"
        );
        let ranges = |from, to, fault| Reply::Sequence {
            group_id: g.clone(),
            ranges: vec![crate::wsr::ReplyRange {
                range: crate::wsr::SeqRange::new(from, to).expect("range"),
                fault,
            }],
        };
        assert_eq!(
            on(&[ranges(0, 3, None)], None, &key(Some(2))),
            AttemptVerdict::Ack
        );
        let dup = Some(FaultCode::InvalidMessageId);
        assert_eq!(
            on(&[ranges(2, 2, dup)], None, &key(Some(2))),
            AttemptVerdict::Fault(FaultCode::InvalidMessageId)
        );
        assert_eq!(
            on(&[ranges(0, 1, None)], None, &key(Some(2))),
            AttemptVerdict::Nothing,
            "not its number"
        );
        assert_eq!(
            on(&[ranges(0, 3, None)], None, &key(None)),
            AttemptVerdict::Nothing,
            "a singleton is no range"
        );
    }

    /// The first five and the latest twenty are kept; nothing is dropped before there are
    /// more than twenty-five.
    #[test]
    fn a_long_story_keeps_its_beginning_and_its_end() {
        assert_eq!(attempts_dropped(1), None);
        assert_eq!(attempts_dropped(25), None);
        assert_eq!(attempts_dropped(26), Some(6..=6));
        assert_eq!(attempts_dropped(1000), Some(6..=980));
        let kept: Vec<u64> = (1..=1000u64)
            .filter(|n| !attempts_dropped(1000).is_some_and(|r| r.contains(n)))
            .collect();
        assert_eq!(kept.len() as u64, ATTEMPTS_KEPT_FIRST + ATTEMPTS_KEPT_LAST);
        assert_eq!(kept[..5], [1, 2, 3, 4, 5]);
        assert_eq!(kept[5], 981);
    }

    fn secs(s: i64) -> chrono::Duration {
        chrono::Duration::seconds(s)
    }

    #[test]
    fn schedules() {
        let backoff = RetrySchedule::Interval {
            max_attempts: 4,
            interval: Duration::from_secs(2),
            backoff: 3,
        };
        let waits: Vec<_> = (1..=4).map(|a| backoff.wait_after(a)).collect();
        assert_eq!(
            waits,
            vec![
                Some(Duration::from_secs(2)),
                Some(Duration::from_secs(6)),
                Some(Duration::from_secs(18)),
                None
            ]
        );
        let list = RetrySchedule::Waits(vec![Duration::from_secs(1), Duration::from_secs(5)]);
        assert_eq!(list.max_attempts(), 3);
        assert_eq!(list.wait_after(2), Some(Duration::from_secs(5)));
        assert_eq!(list.wait_after(3), None);
    }

    #[test]
    fn an_operator_resends_a_message_in_doubt_until_it_expires_and_fails_what_is_not_final() {
        let schedule = RetrySchedule::Waits(vec![Duration::from_secs(10)]);
        let mut m = Outbound::new(t0() + secs(3600), schedule, t0());
        m.apply(Event::Sent, t0());
        m.apply(Event::Sent, t0() + secs(10));
        assert!(m.in_doubt(), "both attempts out, no verdict");
        assert!(!m.due(t0() + secs(20), RESOLVE_FOR));
        m.resend_now(t0() + secs(20))
            .expect("before its ExpiryTime");
        assert!(!m.in_doubt());
        assert!(
            m.due(t0() + secs(20), RESOLVE_FOR),
            "one more attempt, at once"
        );
        m.apply(Event::Sent, t0() + secs(20));
        assert_eq!(m.attempts, 3);
        assert!(m.in_doubt(), "and no fourth unless asked again");
        assert_eq!(
            m.resend_now(t0() + secs(3600)),
            Err(OperatorRefusal::Expired)
        );
        m.fail_by_operator("ops", " lost at acme ")
            .expect("not final yet");
        assert_eq!(
            m.state,
            OutState::Failed("failed by operator ops: lost at acme".into())
        );
        assert_eq!(m.next_attempt, None);
        assert_eq!(
            m.fail_by_operator("ops", ""),
            Err(OperatorRefusal::Final("failed"))
        );
        assert_eq!(
            m.resend_now(t0() + secs(30)),
            Err(OperatorRefusal::Final("failed"))
        );
    }

    #[test]
    fn resends_on_schedule_until_exhausted() {
        let schedule = RetrySchedule::Interval {
            max_attempts: 3,
            interval: Duration::from_secs(10),
            backoff: 2,
        };
        let mut m = Outbound::new(t0() + secs(3600), schedule, t0());
        assert!(m.due(t0(), RESOLVE_FOR));
        m.apply(Event::Sent, t0());
        assert!(!m.due(t0() + secs(9), RESOLVE_FOR));
        assert!(m.due(t0() + secs(10), RESOLVE_FOR));
        m.apply(Event::Sent, t0() + secs(10));
        assert!(!m.due(t0() + secs(29), RESOLVE_FOR));
        assert!(m.due(t0() + secs(30), RESOLVE_FOR));
        m.apply(Event::Sent, t0() + secs(30));
        // The third and last attempt: no fourth. A late ack could still come until ExpiryTime;
        // after it, the message is in doubt until a poll answer proves it was not delivered.
        assert!(!m.due(t0() + secs(600), RESOLVE_FOR));
        assert_eq!(m.state, OutState::Sent);
        assert!(m.in_doubt());
        assert!(!m.due(t0() + secs(3600), RESOLVE_FOR));
        assert_eq!(m.state, OutState::Sent, "in doubt, not failed");
        m.apply(
            Event::NotHeld {
                asked_at: t0() + secs(3605),
                kept_for: HOUR,
            },
            t0() + secs(3606),
        );
        assert_eq!(
            m.state,
            OutState::Failed(
                "no acknowledgment after 3 attempts; the destination confirms it was not \
                 delivered"
                    .into()
            )
        );
    }

    /// Chaos-harness finding: a message whose acks were all lost was reported failed at its
    /// ExpiryTime although the partner had delivered it (and its application processed it);
    /// in an ordered group the later messages were failed with it. Now it stays in doubt
    /// until the destination answers a poll.
    #[test]
    fn an_unacknowledged_message_is_failed_only_on_proof_it_was_not_delivered() {
        let schedule = RetrySchedule::Waits(vec![Duration::from_secs(5)]);
        let expiry = t0() + secs(60);
        let mut m = Outbound::new(expiry, schedule.clone(), t0());
        assert!(m.due(t0(), RESOLVE_FOR));
        m.apply(Event::Sent, t0());
        assert!(!m.in_doubt(), "a resend is still to come");
        m.apply(Event::Sent, t0() + secs(5));
        assert!(m.in_doubt(), "attempts used up");
        // "Not held" before the destination could last accept it proves nothing.
        let not_held = |asked_at, kept_for| Event::NotHeld { asked_at, kept_for };
        m.apply(not_held(expiry, HOUR), expiry);
        assert_eq!(m.state, OutState::Sent);
        // Nor from a destination that may forget delivered IDs at expiry, or already has.
        let later = expiry + secs(10);
        m.apply(not_held(later, Duration::ZERO), later);
        assert_eq!(m.state, OutState::Sent);
        let long_after = expiry + secs(7200);
        m.apply(not_held(long_after, HOUR), long_after);
        assert_eq!(m.state, OutState::Sent);
        assert!(!m.due(expiry + secs(1), RESOLVE_FOR));
        assert_eq!(m.state, OutState::Sent);
        // A poll answer's ack settles it the other way.
        let mut acked = m.clone();
        acked.apply(Event::Acked, expiry + secs(10));
        assert_eq!(acked.state, OutState::Acked);
        // No answer at all: after RESOLVE_FOR it fails, saying that nobody knows.
        let resolve = chrono::Duration::from_std(RESOLVE_FOR).expect("duration");
        assert!(!m.due(expiry + resolve - secs(1), RESOLVE_FOR));
        assert_eq!(m.state, OutState::Sent);
        assert!(!m.due(expiry + resolve, RESOLVE_FOR));
        assert!(matches!(m.state, OutState::Failed(ref r) if r.contains("delivery unknown")));
        // Never sent: nothing to doubt.
        let mut unsent = Outbound::new(expiry, schedule, t0());
        assert!(!unsent.due(expiry, RESOLVE_FOR));
        assert_eq!(
            unsent.state,
            OutState::Failed("expired before it was sent".into())
        );
    }

    #[test]
    fn nothing_is_sent_after_expiry() {
        let schedule = RetrySchedule::Waits(vec![Duration::from_secs(100)]);
        let mut m = Outbound::new(t0() + secs(50), schedule, t0());
        assert!(m.due(t0(), RESOLVE_FOR));
        m.apply(Event::Sent, t0());
        assert!(
            !m.due(t0() + secs(100), RESOLVE_FOR),
            "the resend would come after ExpiryTime"
        );
        assert!(m.in_doubt());
        m.apply(
            Event::NotHeld {
                asked_at: t0() + secs(100),
                kept_for: HOUR,
            },
            t0() + secs(100),
        );
        assert!(matches!(m.state, OutState::Failed(ref r) if r.contains("expired")));
    }

    /// A partner that refused every connection cannot have the message: it fails at its
    /// ExpiryTime without waiting for polls. One attempt that got through is enough doubt.
    #[test]
    fn attempts_that_never_connected_leave_no_doubt() {
        let schedule = RetrySchedule::Waits(vec![Duration::from_secs(5); 3]);
        let expiry = t0() + secs(60);
        let mut refused = Outbound::new(expiry, schedule.clone(), t0());
        for i in 0..2 {
            assert!(refused.due(t0() + secs(5 * i), RESOLVE_FOR));
            refused.apply(Event::Sent, t0() + secs(5 * i));
            refused.apply(Event::Unreached, t0() + secs(5 * i));
        }
        assert!(!refused.in_doubt());
        assert!(!refused.due(expiry, RESOLVE_FOR));
        assert!(
            matches!(refused.state, OutState::Failed(ref r) if r.contains("no attempt reached")),
            "{:?}",
            refused.state
        );
        let mut once_through = Outbound::new(expiry, schedule, t0());
        once_through.apply(Event::Sent, t0());
        once_through.apply(Event::Sent, t0() + secs(5));
        once_through.apply(Event::Unreached, t0() + secs(5));
        assert!(!once_through.due(expiry, RESOLVE_FOR));
        assert_eq!(once_through.state, OutState::Sent, "in doubt");
    }

    #[test]
    fn transient_fault_retries_other_faults_stop() {
        let schedule = RetrySchedule::Waits(vec![Duration::from_secs(5); 5]);
        let mut m = Outbound::new(t0() + secs(3600), schedule.clone(), t0());
        m.apply(Event::Sent, t0());
        m.apply(Event::Faulted(FaultCode::MessageProcessingFailure), t0());
        assert_eq!(m.state, OutState::Sent);
        assert!(m.due(t0() + secs(5), RESOLVE_FOR));
        m.apply(Event::Faulted(FaultCode::InvalidExpiryTime), t0() + secs(5));
        assert_eq!(m.state, OutState::Faulted(FaultCode::InvalidExpiryTime));
        assert!(!m.due(t0() + secs(100), RESOLVE_FOR));
    }

    #[test]
    fn a_late_ack_wins_over_a_scheduled_resend() {
        let mut m = Outbound::new(
            t0() + secs(3600),
            RetrySchedule::Waits(vec![Duration::from_secs(5); 3]),
            t0(),
        );
        m.apply(Event::Sent, t0());
        m.apply(Event::Acked, t0() + secs(4));
        assert_eq!(m.state, OutState::Acked);
        assert!(
            !m.due(t0() + secs(5), RESOLVE_FOR),
            "the resend is cancelled"
        );
    }

    #[test]
    fn answers_without_a_verdict_are_failed_attempts() {
        use AttemptFailure as F;
        assert_eq!(F::of_answer(200, true, None), None);
        assert_eq!(F::of_answer(202, false, None), None, "nothing to say yet");
        assert_eq!(
            F::of_answer(500, true, None),
            None,
            "a SOAP Fault is a verdict"
        );
        assert_eq!(F::of_answer(503, false, None), Some(F::Status(503)));
        assert_eq!(F::of_answer(307, true, None), Some(F::Redirected(307)));
        assert_eq!(
            F::of_answer(200, false, Some("not XML")),
            Some(F::Unreadable("not XML".into()))
        );
        assert!(F::Unreached("refused".into()).never_arrived());
        assert!(!F::TimedOut.never_arrived(), "it may have arrived");
        assert!(
            F::TooLarge { limit: 10 }
                .to_string()
                .contains("max_message_bytes")
        );
        assert!(F::Redirected(307).to_string().contains("307"));
    }

    fn event() -> impl Strategy<Value = (u8, i64)> {
        (0u8..5, 0i64..200)
    }

    proptest! {
        /// Any sequence of events and clock readings: final states stay final, an acked
        /// message is never failed, attempts never exceed the schedule, nothing goes out after
        /// ExpiryTime.
        #[test]
        fn final_states_are_absorbing(events in proptest::collection::vec(event(), 0..40)) {
            let expiry = t0() + secs(500);
            let mut m = Outbound::new(expiry, RetrySchedule::Waits(vec![Duration::from_secs(7); 4]), t0());
            let mut now = t0();
            let mut final_state: Option<OutState> = None;
            for (kind, step) in events {
                now += secs(step);
                match kind {
                    0 | 1 => {
                        if m.due(now, RESOLVE_FOR) {
                            prop_assert!(now < expiry);
                            m.apply(Event::Sent, now);
                        }
                    }
                    2 => m.apply(Event::Acked, now),
                    3 => m.apply(Event::Faulted(FaultCode::MessageProcessingFailure), now),
                    _ => m.apply(Event::Faulted(FaultCode::GroupAborted), now),
                }
                prop_assert!(m.attempts <= m.schedule.max_attempts());
                if let Some(f) = &final_state {
                    prop_assert_eq!(&m.state, f, "a final state changed");
                } else if m.state.is_final() {
                    final_state = Some(m.state.clone());
                }
            }
        }
    }
}
