//! The receiving RMP's decision for one reliable message (DESIGN §4): receive → duplicate check
//! → expiry check → deliver (or buffer) → ack. Pure: the group's stored state and the time go
//! in; the new state, what to do with the message and what to answer come out. The store
//! applies the outcome in one transaction, and only after its commit is anything answered.

use chrono::{DateTime, Utc};

use super::group::{Buffered, GroupParams, GroupState, GroupStatus, Policy, Swept, slot, sweep};
use crate::wsr::{FaultCode, Request};

/// One message as the receiver sees it.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    pub request: &'a Request,
    pub channel: &'a str,
    /// Size of the payload, for the buffer limit.
    pub body_bytes: u64,
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
    let expired = request.expiry_time < now - policy.clock_skew;

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

    // Parameters must agree across the group (D8).
    if params != state.params {
        let why = describe_mismatch(&state.params, &params);
        return record_fault(state, n, FaultCode::InvalidMessageParameters, why);
    }
    if let Some(seq) = seq {
        if let Some(last) = state.last {
            if seq.last && seq.number != last {
                return record_fault(
                    state,
                    n,
                    FaultCode::InvalidMessageParameters,
                    format!("the group's last message is {last}, not {}", seq.number),
                );
            }
            if seq.number > last {
                return record_fault(
                    state,
                    n,
                    FaultCode::InvalidMessageId,
                    format!(
                        "number {} is beyond the group's last message {last}",
                        seq.number
                    ),
                );
            }
        }
    }

    // Duplicate check (before the expiry check, D1/D2).
    if state.params.duplicate_elimination || !state.params.sequenced {
        if let Some(code) = state.faults.get(&n) {
            return Outcome::answer(Verdict::Fault(*code, "same fault as before".into()));
        }
    }
    if state.params.duplicate_elimination {
        if state.delivered.contains(n) {
            if expired {
                return Outcome::fault(
                    FaultCode::InvalidExpiryTime,
                    "a resend of a delivered message that has since expired",
                );
            }
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
            return record_fault(state, n, FaultCode::GroupAborted, why);
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
    state.last_activity = now;
    state.max_expiry = state.max_expiry.max(request.expiry_time);
    if let Some(seq) = seq {
        if seq.last {
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
                    FaultCode::InvalidMessageParameters,
                    format!(
                        "last='true' on {} but higher numbers were received",
                        seq.number
                    ),
                );
            }
            state.last = Some(seq.number);
        }
    }

    let ordered = state.params.message_order;
    if ordered && n != state.next_expected {
        if state.buffered.len() >= policy.buffer_max_messages
            || state.buffered_bytes() + msg.body_bytes > policy.buffer_max_bytes
        {
            // Transient: the sender resends later, the group lives on (D6).
            return Outcome::fault(
                FaultCode::MessageProcessingFailure,
                "the group's buffer for out-of-order messages is full; resend later",
            );
        }
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
fn record_fault(state: &mut GroupState, n: u64, code: FaultCode, why: String) -> Outcome {
    state.faults.entry(n).or_insert(code);
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
