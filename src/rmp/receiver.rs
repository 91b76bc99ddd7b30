//! The receiving RMP's decision for one reliable message (DESIGN §4): receive → duplicate check
//! → expiry check → deliver (or buffer) → ack. Pure: the group's stored state and the time go
//! in; the new state, what to do with the message and what to answer come out. The store
//! applies the outcome in one transaction, and only after its commit is anything answered.

use chrono::{DateTime, Utc};

use super::group::{Buffered, GroupParams, GroupState, GroupStatus, Policy, Swept, slot, sweep};
use super::quota::SourceRoom;
use crate::wsr::datetime::saturating_sub;
use crate::wsr::{FaultCode, ReplyPattern, Request};

/// One message as the receiver sees it.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    pub request: &'a Request,
    pub channel: &'a str,
    /// Size of the payload, for the buffer limit.
    pub body_bytes: u64,
    /// How many open groups the message's source already has (for a new sequenced group's
    /// quota; the store counts them only when that is what the message would start).
    pub open_groups_of_source: u64,
    /// What its source may still have stored (checked by `receive_plan`, once the decision
    /// says the message would be stored).
    pub room: SourceRoom,
}

/// What to answer for this message, by its reply pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered now, or a duplicate of a delivered, unexpired message (D1, D2).
    Ack,
    /// Nothing to say yet (buffered, or acknowledgment not requested).
    NoAck,
    Fault(FaultCode, String),
}

/// What happens to the message itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Append to the inbox now.
    Deliver,
    /// Keep in the group's buffer until the gap before it fills.
    Buffer,
    /// Store nothing of this message.
    Drop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub action: Action,
    pub verdict: Verdict,
    /// The group state to persist; `None` leaves the stored state as it was.
    pub state: Option<GroupState>,
    /// Buffered numbers of the group delivered now, after this message, in order.
    pub released: Vec<(u64, Buffered)>,
    /// Buffered numbers discarded because the group was found aborted on arrival.
    pub discarded: Vec<(u64, Buffered)>,
}

impl Outcome {
    fn answer(verdict: Verdict) -> Outcome {
        Outcome {
            action: Action::Drop,
            verdict,
            state: None,
            released: Vec::new(),
            discarded: Vec::new(),
        }
    }

    fn fault(code: FaultCode, reason: impl Into<String>) -> Outcome {
        Outcome::answer(Verdict::Fault(code, reason.into()))
    }
}

fn ack_or_nothing(request: &Request) -> Verdict {
    if request.ack_requested {
        Verdict::Ack
    } else {
        Verdict::NoAck
    }
}

/// Where the answer to a decided message travels (D4, D5, D6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerRoute {
    /// In this HTTP response's `wsrm:Response`: an ack (`None`) or a fault.
    InResponse(Option<(FaultCode, String)>),
    /// Nothing to ack yet, but a Response-pattern answer may wait (up to the configured hold)
    /// for the buffered message to be delivered, and then carry its ack.
    MayHold,
    /// By callback or poll (queued or kept by the store with the verdict), or nothing to say:
    /// the HTTP answer is 202.
    Elsewhere,
    /// A transient fault queued nowhere: the sender should hear "try later" now, as a SOAP
    /// Fault.
    Synchronous(FaultCode, String),
}

/// Whether a message's answer may wait for its delivery (ordered, Response pattern, acked):
/// the caller must start watching for the delivery before submitting it.
pub fn may_hold(request: &Request) -> bool {
    request.message_order
        && request.ack_requested
        && request.reply_pattern == ReplyPattern::Response
}

/// How the verdict on `request` is answered.
pub fn answer_route(verdict: Verdict, request: &Request) -> AnswerRoute {
    let response = request.reply_pattern == ReplyPattern::Response;
    match verdict {
        Verdict::Ack if response => AnswerRoute::InResponse(None),
        Verdict::NoAck if may_hold(request) => AnswerRoute::MayHold,
        Verdict::Fault(code, reason) if response => AnswerRoute::InResponse(Some((code, reason))),
        Verdict::Fault(code, reason) if code.is_transient() => {
            AnswerRoute::Synchronous(code, reason)
        }
        Verdict::Ack | Verdict::NoAck | Verdict::Fault(..) => AnswerRoute::Elsewhere,
    }
}

/// Whether a message of a group not yet stored would open a group that counts against its
/// source's quota: a sequenced group stays open until it ends; a singleton ends on delivery.
pub fn starts_counted_group(request: &Request) -> bool {
    request.message_id.sequence.is_some()
}

/// Decides what to do with `msg`, given the stored state of its group (if any).
pub fn receive(
    stored: Option<&GroupState>,
    msg: Incoming<'_>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Outcome {
    let request = msg.request;
    let number = request.key().number;
    let n = slot(number);
    let params = GroupParams::of(request, msg.channel);
    let expired = request.expiry_time < saturating_sub(now, policy.clock_skew);

    let Some(stored) = stored else {
        if expired {
            return Outcome::fault(
                FaultCode::InvalidExpiryTime,
                "the message expired before it arrived",
            );
        }
        let mut state = GroupState::new(request.message_id.group_id.clone(), params, now);
        if state.time_limit(policy).is_some_and(|t| t <= now) {
            return Outcome::fault(FaultCode::GroupAborted, "the group's time limit has passed");
        }
        if starts_counted_group(request)
            && msg.open_groups_of_source >= policy.max_open_groups_per_source
        {
            // Transient: the sender resends later, when one of its groups has ended.
            return Outcome::fault(
                FaultCode::MessageProcessingFailure,
                "too many open groups from this source; end some groups, then resend",
            );
        }
        return accept(&mut state, msg, n, now, policy);
    };

    let mut state = stored.clone();
    // Time may have ended the group since the sweeper last looked at it.
    let mut discarded = Vec::new();
    match sweep(&mut state, now, policy) {
        Swept::Changed { discarded: d } => discarded = d,
        Swept::Purge | Swept::Unchanged => {}
    }
    let outcome = decide_existing(&mut state, msg, n, expired, params, now, policy);
    // Persist whatever changed, by the decision or by the sweep before it.
    let state = outcome
        .state
        .clone()
        .or((state != *stored).then_some(state));
    Outcome {
        state,
        discarded,
        ..outcome
    }
}

fn decide_existing(
    state: &mut GroupState,
    msg: Incoming<'_>,
    n: u64,
    expired: bool,
    params: GroupParams,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Outcome {
    let request = msg.request;
    let seq = request.message_id.sequence.as_ref();
    let exp = request.expiry_time;

    // Parameters must agree across the group (D8).
    if params != state.params {
        let why = describe_mismatch(&state.params, &params);
        return record_fault(state, n, exp, FaultCode::InvalidMessageParameters, why);
    }
    if let Some(seq) = seq
        && let Some(last) = state.last
    {
        if seq.last && seq.number != last {
            return record_fault(
                state,
                n,
                exp,
                FaultCode::InvalidMessageParameters,
                format!("the group's last message is {last}, not {}", seq.number),
            );
        }
        if seq.number > last {
            return record_fault(
                state,
                n,
                exp,
                FaultCode::InvalidMessageId,
                format!(
                    "number {} is beyond the group's last message {last}",
                    seq.number
                ),
            );
        }
    }

    // Duplicate check (before the expiry check, D1/D2).
    if (state.params.duplicate_elimination || !state.params.sequenced)
        && let Some(code) = state.faults.get(&n)
    {
        return Outcome::answer(Verdict::Fault(*code, "same fault as before".into()));
    }
    if !state.params.duplicate_elimination && state.delivered.contains(n) {
        if expired {
            // Not delivered again after its ExpiryTime, but acked: it was delivered, and a
            // fault would tell the sender otherwise.
            return Outcome::answer(ack_or_nothing(request));
        }
        // Without DuplicateElimination a resend is delivered again and acked (D2), whatever
        // became of the group since.
        return Outcome {
            action: Action::Deliver,
            ..Outcome::answer(ack_or_nothing(request))
        };
    }
    if state.params.duplicate_elimination {
        if state.delivered.contains(n) {
            // Acked even after its ExpiryTime: the ack says "delivered", which is true, and a
            // sender whose earlier acks were lost must not be told otherwise — a fault here
            // would make it report a delivered message as failed.
            return Outcome::answer(ack_or_nothing(request));
        }
        if state.buffered.contains_key(&n) {
            // Not stored twice, not acked before it is delivered (D2, D6).
            return Outcome::answer(Verdict::NoAck);
        }
    }

    match state.status {
        GroupStatus::Open => {}
        GroupStatus::Complete => {
            return Outcome::fault(
                FaultCode::InvalidMessageId,
                "the group is complete; this number is not part of it",
            );
        }
        GroupStatus::Expired | GroupStatus::Idle | GroupStatus::Aborted => {
            let why = format!("the group has ended ({})", state.status.as_str());
            return record_fault(state, n, exp, FaultCode::GroupAborted, why);
        }
    }
    if expired {
        return Outcome::fault(
            FaultCode::InvalidExpiryTime,
            "the message expired before it arrived",
        );
    }
    accept(state, msg, n, now, policy)
}

/// Delivers or buffers an acceptable message, updating the group.
fn accept(
    state: &mut GroupState,
    msg: Incoming<'_>,
    n: u64,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Outcome {
    let request = msg.request;
    let seq = request.message_id.sequence.as_ref();
    let ordered = state.params.message_order;
    let ahead_of_gap = ordered && n != state.next_expected;
    if ahead_of_gap
        && (state.buffered.len() >= policy.buffer_max_messages
            || state.buffered_bytes().saturating_add(msg.body_bytes) > policy.buffer_max_bytes)
    {
        // Transient, and the group is left exactly as it was: the sender resends later (D6).
        return Outcome::fault(
            FaultCode::MessageProcessingFailure,
            "the group's buffer for out-of-order messages is full; resend later",
        );
    }
    if let Some(seq) = seq
        && seq.last
    {
        if state
            .delivered
            .pairs()
            .last()
            .is_some_and(|&(_, to)| to > seq.number)
            || state
                .buffered
                .keys()
                .next_back()
                .is_some_and(|&b| b > seq.number)
        {
            return record_fault(
                state,
                n,
                request.expiry_time,
                FaultCode::InvalidMessageParameters,
                format!(
                    "last='true' on {} but higher numbers were received",
                    seq.number
                ),
            );
        }
        state.last = Some(seq.number);
    }
    state.last_activity = now;
    state.max_expiry = state.max_expiry.max(request.expiry_time);

    if ahead_of_gap {
        state.buffered.insert(
            n,
            Buffered {
                expiry: request.expiry_time,
                bytes: msg.body_bytes,
                reply: request.reply_pattern.clone(),
            },
        );
        return Outcome {
            action: Action::Buffer,
            verdict: Verdict::NoAck,
            state: Some(state.clone()),
            released: Vec::new(),
            discarded: Vec::new(),
        };
    }

    state.delivered.insert(n);
    let mut released = Vec::new();
    if ordered {
        state.next_expected = n.saturating_add(1);
        while let Some(b) = state.buffered.remove(&state.next_expected) {
            state.delivered.insert(state.next_expected);
            released.push((state.next_expected, b));
            state.next_expected = state.next_expected.saturating_add(1);
        }
    }
    let complete = match (state.params.sequenced, state.last) {
        (false, _) => true,
        (true, Some(last)) => state.delivered.covers_prefix(last),
        (true, None) => false,
    };
    if complete {
        state.terminate(GroupStatus::Complete, now);
    }
    Outcome {
        action: Action::Deliver,
        verdict: ack_or_nothing(request),
        state: Some(state.clone()),
        released,
        discarded: Vec::new(),
    }
}

/// A final fault for this message, remembered so polls and duplicates get the same answer.
/// A final fault for this message, remembered so polls and duplicates get the same answer,
/// and the group kept until the message can no longer arrive. A number that was delivered is
/// never marked faulted: its resends must keep being acked (D2).
fn record_fault(
    state: &mut GroupState,
    n: u64,
    expiry: DateTime<Utc>,
    code: FaultCode,
    why: String,
) -> Outcome {
    if !state.delivered.contains(n) {
        state.faults.entry(n).or_insert(code);
        state.max_expiry = state.max_expiry.max(expiry);
    }
    Outcome {
        state: Some(state.clone()),
        ..Outcome::fault(code, why)
    }
}

fn describe_mismatch(stored: &GroupParams, new: &GroupParams) -> String {
    let what = if stored.channel != new.channel {
        "channel"
    } else if stored.sequenced != new.sequenced {
        "SequenceNum presence"
    } else if stored.ack_requested != new.ack_requested {
        "AckRequested"
    } else if stored.duplicate_elimination != new.duplicate_elimination {
        "DuplicateElimination"
    } else if stored.message_order != new.message_order {
        "MessageOrder"
    } else {
        "group time limit"
    };
    format!("{what} differs from earlier messages of the group")
}

#[cfg(test)]
mod tests {
    //! Group lifecycle on an injected clock (DESIGN D6–D8): every decision takes `now`.

    use chrono::{Duration, TimeZone};

    use super::*;
    use crate::rmp::group::{GroupStatus, Swept, sweep};
    use crate::wsr::datetime::XsDuration;
    use crate::wsr::{GroupId, GroupLimit, MessageId, ReplyPattern, SequenceNum};

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("date")
    }

    fn request(
        n: Option<u64>,
        last: bool,
        limit: Option<GroupLimit>,
        expiry: DateTime<Utc>,
    ) -> Request {
        Request {
            message_id: MessageId {
                group_id: GroupId::parse("mid:g").expect("group"),
                sequence: n.map(|number| SequenceNum {
                    number,
                    last,
                    group_limit: limit.clone(),
                }),
            },
            expiry_time: expiry,
            reply_pattern: ReplyPattern::Response,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: n.is_some(),
        }
    }

    /// Feeds a message into `state` at `now`, keeping the persisted state.
    fn feed(state: &mut Option<GroupState>, r: &Request, now: DateTime<Utc>) -> Outcome {
        let out = receive(
            state.as_ref(),
            Incoming {
                request: r,
                channel: "c",
                body_bytes: 10,
                open_groups_of_source: 0,
                room: crate::rmp::quota::SourceRoom::UNLIMITED,
            },
            now,
            &Policy::default(),
        );
        if let Some(s) = &out.state {
            *state = Some(s.clone());
        }
        out
    }

    /// The state a single delivered message leaves.
    fn g2_state(r: &Request, now: DateTime<Utc>) -> GroupState {
        let mut g = None;
        feed(&mut g, r, now);
        g.expect("state")
    }

    fn idle(spec: &str) -> Option<GroupLimit> {
        Some(GroupLimit::MaxIdleDuration(
            XsDuration::parse(spec).expect("duration"),
        ))
    }

    #[test]
    fn complete_when_last_and_everything_before_it_is_delivered() {
        let exp = t0() + Duration::hours(1);
        let mut g = None;
        feed(&mut g, &request(Some(0), false, idle("PT1H"), exp), t0());
        let out = feed(&mut g, &request(Some(2), true, idle("PT1H"), exp), t0());
        assert_eq!((out.action, out.verdict), (Action::Buffer, Verdict::NoAck));
        let out = feed(&mut g, &request(Some(1), false, idle("PT1H"), exp), t0());
        assert_eq!(out.action, Action::Deliver);
        assert_eq!(
            out.released.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec![2]
        );
        let state = g.clone().expect("state");
        assert_eq!(state.status, GroupStatus::Complete);
        // Beyond last: InvalidMessageId; a resend of 2: acked again (duplicate, not faulted).
        let out = feed(&mut g, &request(Some(3), false, idle("PT1H"), exp), t0());
        assert!(matches!(
            out.verdict,
            Verdict::Fault(FaultCode::InvalidMessageId, _)
        ));
        let out = feed(&mut g, &request(Some(2), true, idle("PT1H"), exp), t0());
        assert_eq!(out.verdict, Verdict::Ack);
        // Purged only after the latest ExpiryTime, plus the time senders have to poll.
        let mut s = g.clone().expect("state");
        assert_eq!(
            sweep(&mut s, exp, &Policy::default()),
            Swept::Unchanged,
            "still acceptable at its ExpiryTime"
        );
        let after = exp + Duration::milliseconds(1);
        assert_eq!(
            sweep(&mut s, after, &Policy::default()),
            Swept::Unchanged,
            "a sender may still ask about it"
        );
        let answered = after + Policy::default().answer_polls_for;
        assert_eq!(sweep(&mut s, answered, &Policy::default()), Swept::Purge);
    }

    #[test]
    fn group_expiry_time_ends_the_group() {
        let exp = t0() + Duration::hours(2);
        let limit = Some(GroupLimit::ExpiryTime(t0() + Duration::hours(1)));
        let mut g = None;
        feed(&mut g, &request(Some(0), false, limit.clone(), exp), t0());
        let mut s = g.clone().expect("state");
        assert_eq!(
            s.next_deadline(&Policy::default()),
            Some(t0() + Duration::hours(1))
        );
        let later = t0() + Duration::minutes(61);
        assert!(matches!(
            sweep(&mut s, later, &Policy::default()),
            Swept::Changed { .. }
        ));
        assert_eq!(s.status, GroupStatus::Expired);
        // Kept past the latest ExpiryTime, so a late duplicate is still recognised and a
        // poll is still answered.
        assert_eq!(
            s.purge_at(&Policy::default()),
            Some(exp + Duration::milliseconds(1) + Duration::hours(1))
        );
        let mut g2 = Some(s);
        let out = feed(&mut g2, &request(Some(1), false, limit.clone(), exp), later);
        assert!(matches!(
            out.verdict,
            Verdict::Fault(FaultCode::GroupAborted, _)
        ));
        let out = feed(&mut g2, &request(Some(0), false, limit, exp), later);
        assert_eq!(
            out.verdict,
            Verdict::Ack,
            "duplicate of a delivered message re-acked"
        );
    }

    #[test]
    fn idle_limit_and_the_default_idle_limit() {
        let exp = t0() + Duration::days(3);
        let mut g = None;
        feed(&mut g, &request(Some(0), false, idle("PT5M"), exp), t0());
        let mut s = g.clone().expect("state");
        assert_eq!(
            sweep(&mut s, t0() + Duration::minutes(4), &Policy::default()),
            Swept::Unchanged
        );
        assert!(matches!(
            sweep(&mut s, t0() + Duration::minutes(5), &Policy::default()),
            Swept::Changed { .. }
        ));
        assert_eq!(s.status, GroupStatus::Idle);

        // No limit named: the configured default idle (P1D) applies.
        let mut g = None;
        let mut r = request(Some(0), false, None, exp);
        r.message_id.group_id = GroupId::parse("mid:h").expect("group");
        feed(&mut g, &r, t0());
        let s = g.expect("state");
        assert_eq!(
            s.next_deadline(&Policy::default()),
            Some(t0() + Duration::days(1))
        );
    }

    #[test]
    fn an_expired_buffered_message_aborts_the_ordered_group() {
        let mut g = None;
        let long = t0() + Duration::days(1);
        feed(&mut g, &request(Some(0), false, idle("PT1H"), long), t0());
        let short = t0() + Duration::minutes(10);
        assert_eq!(
            feed(&mut g, &request(Some(2), false, idle("PT1H"), short), t0()).action,
            Action::Buffer
        );
        let mut s = g.clone().expect("state");
        assert_eq!(
            s.next_deadline(&Policy::default()),
            Some(short),
            "the buffered expiry is next"
        );
        let swept = sweep(&mut s, short, &Policy::default());
        let Swept::Changed { discarded } = swept else {
            panic!("{swept:?}")
        };
        assert_eq!(
            discarded.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(s.status, GroupStatus::Aborted);
        assert_eq!(s.faults.get(&2), Some(&FaultCode::GroupAborted));
        assert!(s.buffered.is_empty(), "discarded, never delivered");
        let mut g = Some(s);
        let out = feed(&mut g, &request(Some(1), false, idle("PT1H"), long), short);
        assert!(matches!(
            out.verdict,
            Verdict::Fault(FaultCode::GroupAborted, _)
        ));
        assert_eq!(out.action, Action::Drop);
    }

    #[test]
    fn buffer_limit_refuses_transiently() {
        let policy = Policy {
            buffer_max_messages: 1,
            ..Policy::default()
        };
        let exp = t0() + Duration::hours(1);
        let mut g = None;
        for (n, expected) in [(0, Action::Deliver), (2, Action::Buffer), (3, Action::Drop)] {
            let r = request(Some(n), false, idle("PT1H"), exp);
            let out = receive(
                g.as_ref(),
                Incoming {
                    request: &r,
                    channel: "c",
                    body_bytes: 1,
                    open_groups_of_source: 0,
                    room: crate::rmp::quota::SourceRoom::UNLIMITED,
                },
                t0(),
                &policy,
            );
            if let Some(s) = &out.state {
                g = Some(s.clone());
            }
            assert_eq!(out.action, expected, "{n}");
            if n == 3 {
                assert!(matches!(
                    out.verdict,
                    Verdict::Fault(FaultCode::MessageProcessingFailure, _)
                ));
                assert_eq!(
                    g.as_ref().map(|s| s.status),
                    Some(GroupStatus::Open),
                    "the group lives on"
                );
            }
        }
    }

    /// Chaos-harness finding: a resend delayed past its ExpiryTime, of a message delivered
    /// earlier whose ack was lost, was faulted InvalidExpiryTime — and the sender reported a
    /// delivered message as faulted. It is acked: the ack says "delivered", which is true.
    #[test]
    fn a_resend_of_a_delivered_message_is_acked_even_after_its_expiry() {
        let exp = t0() + Duration::seconds(10);
        for n in [None, Some(0)] {
            let mut g = None;
            let r = request(n, false, None, exp);
            assert_eq!(feed(&mut g, &r, t0()).action, Action::Deliver);
            let late = feed(&mut g, &r, exp + Duration::seconds(5));
            assert_eq!((late.action, late.verdict), (Action::Drop, Verdict::Ack));
        }
        // Without DuplicateElimination too (not delivered again, though).
        let mut g = None;
        let mut r = request(None, false, None, exp);
        r.duplicate_elimination = false;
        assert_eq!(feed(&mut g, &r, t0()).action, Action::Deliver);
        let late = feed(&mut g, &r, exp + Duration::seconds(5));
        assert_eq!((late.action, late.verdict), (Action::Drop, Verdict::Ack));
        // Never delivered and expired on arrival: still InvalidExpiryTime.
        let mut g = None;
        feed(&mut g, &request(Some(0), false, None, exp), t0());
        let out = feed(
            &mut g,
            &request(Some(1), false, None, exp),
            exp + Duration::seconds(5),
        );
        assert!(matches!(
            out.verdict,
            Verdict::Fault(FaultCode::InvalidExpiryTime, _)
        ));
    }

    #[test]
    fn singleton_duplicates_and_expiry() {
        let exp = t0() + Duration::minutes(5);
        let mut g = None;
        let r = request(None, false, None, exp);
        assert_eq!(feed(&mut g, &r, t0()).action, Action::Deliver);
        let dup = feed(&mut g, &r, t0() + Duration::minutes(1));
        assert_eq!((dup.action, dup.verdict), (Action::Drop, Verdict::Ack));
        // Expired on arrival (no state): InvalidExpiryTime, nothing stored.
        let mut fresh = None;
        let out = feed(&mut fresh, &r, exp + Duration::seconds(1));
        assert!(matches!(
            out.verdict,
            Verdict::Fault(FaultCode::InvalidExpiryTime, _)
        ));
        assert!(fresh.is_none());
        // The singleton's ID is purged only once a resend could no longer be accepted and
        // senders had `answer_polls_for` to ask about it.
        let no_poll_window = Policy {
            answer_polls_for: Duration::zero(),
            ..Policy::default()
        };
        let mut s = g.expect("state");
        assert_eq!(sweep(&mut s, exp, &no_poll_window), Swept::Unchanged);
        let after = exp + Duration::milliseconds(1);
        assert_eq!(sweep(&mut s, after, &no_poll_window), Swept::Purge);
        // With a clock skew allowance the ID is kept that much longer.
        let skewed = Policy {
            clock_skew: Duration::seconds(60),
            ..no_poll_window
        };
        let mut s = g2_state(&r, t0());
        assert_eq!(
            sweep(&mut s, exp + Duration::seconds(30), &skewed),
            Swept::Unchanged
        );
        assert_eq!(
            sweep(&mut s, exp + Duration::seconds(61), &skewed),
            Swept::Purge
        );
    }

    #[test]
    fn without_duplicate_elimination_a_resend_is_delivered_again_and_acked() {
        let exp = t0() + Duration::hours(1);
        let mut r = request(None, false, None, exp);
        r.duplicate_elimination = false;
        let mut g = None;
        assert_eq!(feed(&mut g, &r, t0()).action, Action::Deliver);
        assert_eq!(g.as_ref().map(|s| s.status), Some(GroupStatus::Complete));
        let again = feed(&mut g, &r, t0() + Duration::minutes(1));
        assert_eq!(
            (again.action, again.verdict),
            (Action::Deliver, Verdict::Ack)
        );
    }

    #[test]
    fn a_delivered_number_is_never_marked_faulted() {
        let exp = t0() + Duration::hours(1);
        let mut g = None;
        feed(&mut g, &request(Some(0), false, idle("PT1H"), exp), t0());
        // A resend of 0 with different parameters is refused, but 0 stays delivered...
        let odd = request(Some(0), false, idle("PT2H"), exp);
        let out = feed(&mut g, &odd, t0());
        assert!(matches!(
            out.verdict,
            Verdict::Fault(FaultCode::InvalidMessageParameters, _)
        ));
        assert!(g.as_ref().expect("state").faults.is_empty());
        // ...and a correct resend is still acked.
        let out = feed(&mut g, &request(Some(0), false, idle("PT1H"), exp), t0());
        assert_eq!(out.verdict, Verdict::Ack);
    }

    #[test]
    fn answers_travel_by_the_reply_pattern() {
        let exp = t0() + Duration::hours(1);
        let mut r = request(Some(1), false, None, exp);
        let fault = |c| Verdict::Fault(c, "why".into());
        assert_eq!(
            answer_route(Verdict::Ack, &r),
            AnswerRoute::InResponse(None)
        );
        assert_eq!(
            answer_route(Verdict::NoAck, &r),
            AnswerRoute::MayHold,
            "ordered, acked"
        );
        assert!(matches!(
            answer_route(fault(FaultCode::GroupAborted), &r),
            AnswerRoute::InResponse(Some(_))
        ));
        r.reply_pattern = ReplyPattern::Poll;
        assert_eq!(answer_route(Verdict::Ack, &r), AnswerRoute::Elsewhere);
        assert_eq!(answer_route(Verdict::NoAck, &r), AnswerRoute::Elsewhere);
        assert_eq!(
            answer_route(fault(FaultCode::GroupAborted), &r),
            AnswerRoute::Elsewhere
        );
        assert!(matches!(
            answer_route(fault(FaultCode::MessageProcessingFailure), &r),
            AnswerRoute::Synchronous(FaultCode::MessageProcessingFailure, _)
        ));
        let unordered = request(None, false, None, exp);
        assert_eq!(
            answer_route(Verdict::NoAck, &unordered),
            AnswerRoute::Elsewhere
        );
    }
}
