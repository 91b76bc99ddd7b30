//! The receive plan: what storing one received message (or sweeping one due group) changes,
//! decided over the stored group state and the message, as a list of writes for the store to
//! make with primitive statements. The store decides nothing here: it reads the group, asks
//! for the plan, applies it.

use chrono::{DateTime, Utc};

use super::group::{Buffered, GroupState, Policy, Swept, slot, sweep};
use super::quota::HeldBack;
use super::receiver::{Action, Incoming, Verdict, receive};
use crate::wsr::{FaultCode, ReplyPattern};

/// A fault notice is kept at least this long, even for a message that had already expired
/// (that is often why it was refused), so its sender can still learn of it.
pub const FAULT_NOTICE_RETENTION: chrono::Duration = chrono::Duration::hours(1);

/// How long a fault notice about a message expiring at `expiry` is kept.
pub fn fault_notice_until(expiry: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    expiry.max(now + FAULT_NOTICE_RETENTION)
}

/// An ack (`fault` `None`) or fault owed to a sender by the Callback pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwedCallback {
    pub endpoint: String,
    /// The message's number (`None`: a singleton).
    pub number: Option<u64>,
    pub fault: Option<FaultCode>,
    /// Dropped unsent after this.
    pub keep_until: DateTime<Utc>,
}

/// A fault remembered for a Poll-pattern sender's polls, because the group state does not
/// keep it (D4, D11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollFault {
    pub number: Option<u64>,
    pub code: FaultCode,
    pub keep_until: DateTime<Utc>,
}

/// The group's new state and when the sweeper must look at it next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupWrite {
    pub state: GroupState,
    pub deadline: Option<DateTime<Utc>>,
}

/// Everything one received message changes, in the order the store applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivePlan {
    pub verdict: Verdict,
    /// This message: appended to the inbox, held in the ordered buffer, or neither.
    pub action: Action,
    /// Buffered messages that move into the inbox now, in this order (after this message).
    pub release: Vec<u64>,
    /// Buffered messages dropped (the group aborted).
    pub discard: Vec<u64>,
    /// Replies to queue for callback endpoints.
    pub callbacks: Vec<OwedCallback>,
    pub poll_fault: Option<PollFault>,
    /// `None`: the group state is not written (nothing stored for it changes).
    pub group: Option<GroupWrite>,
    /// The payload bytes of the buffered messages `discard` names: the store takes them off
    /// their source's stored bytes.
    pub discarded_bytes: u64,
    /// The quota that refused the message (then its verdict is the transient fault, and
    /// nothing is written).
    pub held_back: Option<HeldBack>,
}

impl ReceivePlan {
    /// A message its source's quota refuses: answered with the transient fault, nothing of
    /// it or its group written (as if it had not arrived; the sweeper still applies whatever
    /// time did to the group).
    fn held_back(held: HeldBack, reason: String) -> ReceivePlan {
        ReceivePlan {
            verdict: Verdict::Fault(FaultCode::MessageProcessingFailure, reason),
            action: Action::Drop,
            release: Vec::new(),
            discard: Vec::new(),
            callbacks: Vec::new(),
            poll_fault: None,
            group: None,
            discarded_bytes: 0,
            held_back: Some(held),
        }
    }
}

/// When the sweeper must look at the group next. A deadline the sweep would not act on must
/// not stay due, or the sweeper would spin.
pub fn group_deadline(
    state: &GroupState,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    state
        .next_deadline(policy)
        .filter(|d| *d > now || state_due(state, now, policy))
}

/// Whether a sweep at `now` would change or purge the group.
fn state_due(state: &GroupState, now: DateTime<Utc>, policy: &Policy) -> bool {
    let mut probe = state.clone();
    sweep(&mut probe, now, policy) != Swept::Unchanged
}

/// The callback owed for `message` (a buffered message, or the one just received), if it
/// travels by callback.
fn owed(
    message: &Buffered,
    number: Option<u64>,
    fault: Option<FaultCode>,
    now: DateTime<Utc>,
) -> Option<OwedCallback> {
    let ReplyPattern::Callback(to) = &message.reply else {
        return None;
    };
    let keep_until = match fault {
        Some(_) => fault_notice_until(message.expiry, now),
        None => message.expiry,
    };
    Some(OwedCallback {
        endpoint: to.uri.clone(),
        number,
        fault,
        keep_until,
    })
}

/// The plan for one received message against its group's stored state.
pub fn plan_receive(
    stored: Option<&GroupState>,
    incoming: Incoming<'_>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> ReceivePlan {
    let request = incoming.request;
    let key = request.key();
    let outcome = receive(stored, incoming, now, policy);
    // Only a message that would be stored counts against its source: a duplicate or a
    // refusal costs the source nothing.
    if outcome.action != Action::Drop
        && let Some((held, reason)) = incoming.room.refusal(incoming.body_bytes)
    {
        return ReceivePlan::held_back(held, reason);
    }
    let mut callbacks = Vec::new();
    let release: Vec<u64> = outcome.released.iter().map(|(n, _)| *n).collect();
    if request.ack_requested {
        callbacks.extend(
            outcome
                .released
                .iter()
                .filter_map(|(n, b)| owed(b, Some(*n), None, now)),
        );
    }
    let discard: Vec<u64> = outcome.discarded.iter().map(|(n, _)| *n).collect();
    let discarded_bytes = outcome.discarded.iter().map(|(_, b)| b.bytes).sum();
    callbacks.extend(
        outcome
            .discarded
            .iter()
            .filter_map(|(n, b)| owed(b, Some(*n), Some(FaultCode::GroupAborted), now)),
    );
    let poll_fault = match (&request.reply_pattern, &outcome.verdict) {
        (ReplyPattern::Poll, Verdict::Fault(code, _)) => {
            let in_state = outcome
                .state
                .as_ref()
                .is_some_and(|s| s.faults.contains_key(&slot(key.number)));
            (!code.is_transient() && !in_state).then(|| PollFault {
                number: key.number,
                code: *code,
                keep_until: fault_notice_until(request.expiry_time, now),
            })
        }
        _ => None,
    };
    // This message's own answer, when it travels by callback.
    let own_fault = match &outcome.verdict {
        Verdict::Ack => Some(None),
        Verdict::Fault(code, _) if !code.is_transient() => Some(Some(*code)),
        _ => None,
    };
    if let Some(fault) = own_fault {
        let this = Buffered {
            expiry: request.expiry_time,
            bytes: 0,
            reply: request.reply_pattern.clone(),
        };
        callbacks.extend(owed(&this, key.number, fault, now));
    }
    let group = outcome.state.map(|state| GroupWrite {
        deadline: group_deadline(&state, policy, now),
        state,
    });
    ReceivePlan {
        verdict: outcome.verdict,
        action: outcome.action,
        release,
        discard,
        callbacks,
        poll_fault,
        group,
        discarded_bytes,
        held_back: None,
    }
}

/// What sweeping one due group changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepPlan {
    /// Nothing to do (a deadline computed before a change): write the state back to re-arm
    /// its deadline.
    Rearm(GroupWrite),
    /// The group expired, idled out or aborted: drop the buffered messages named, queue the
    /// callbacks, write the new state.
    Changed {
        group: GroupWrite,
        discard: Vec<u64>,
        callbacks: Vec<OwedCallback>,
    },
    /// Forget the group and anything still buffered for it.
    Purge,
}

pub fn plan_sweep(mut state: GroupState, now: DateTime<Utc>, policy: &Policy) -> SweepPlan {
    match sweep(&mut state, now, policy) {
        Swept::Unchanged => SweepPlan::Rearm(GroupWrite {
            deadline: group_deadline(&state, policy, now),
            state,
        }),
        Swept::Changed { discarded } => changed(state, &discarded, now, policy),
        Swept::Purge => SweepPlan::Purge,
    }
}

/// An operator's abort of an open sequenced group (a stuck ordered group, D7): what the
/// sweep does when the gap outlives a buffered message — the buffered messages are
/// discarded, never delivered, their senders told `GroupAborted` by callback where they asked
/// for one, and every later message of the group gets `GroupAborted`. `None` for a group that
/// ended or a singleton: there is nothing to abort.
pub fn plan_abort(mut state: GroupState, now: DateTime<Utc>, policy: &Policy) -> Option<SweepPlan> {
    if state.status != crate::rmp::group::GroupStatus::Open || !state.params.sequenced {
        return None;
    }
    let discarded = state.abort(now);
    Some(changed(state, &discarded, now, policy))
}

/// The plan of a group that ended abnormally: discard what was buffered, owe its senders
/// their `GroupAborted`, write the new state.
fn changed(
    state: GroupState,
    discarded: &[(u64, crate::rmp::group::Buffered)],
    now: DateTime<Utc>,
    policy: &Policy,
) -> SweepPlan {
    let callbacks = discarded
        .iter()
        .filter_map(|(n, b)| owed(b, Some(*n), Some(FaultCode::GroupAborted), now))
        .collect();
    SweepPlan::Changed {
        discard: discarded.iter().map(|(n, _)| *n).collect(),
        callbacks,
        group: GroupWrite {
            deadline: group_deadline(&state, policy, now),
            state,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::group::GroupStatus;
    use crate::rmp::quota::{SourceQuota, SourceRoom};
    use crate::wsr::{GroupId, MessageId, ReplyTo, Request, SequenceNum};
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0)
            .single()
            .expect("time")
    }

    fn policy() -> Policy {
        Policy::default()
    }

    fn request(group: &str, number: Option<u64>, reply: ReplyPattern) -> Request {
        Request {
            message_id: MessageId {
                group_id: GroupId::parse(group).expect("group id"),
                sequence: number.map(|number| SequenceNum {
                    number,
                    last: false,
                    group_limit: None,
                }),
            },
            expiry_time: now() + chrono::Duration::hours(1),
            reply_pattern: reply,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: number.is_some(),
        }
    }

    fn plan(stored: Option<&GroupState>, request: &Request) -> ReceivePlan {
        plan_with_room(stored, request, SourceRoom::UNLIMITED)
    }

    fn plan_with_room(
        stored: Option<&GroupState>,
        request: &Request,
        room: SourceRoom,
    ) -> ReceivePlan {
        plan_receive(
            stored,
            Incoming {
                request,
                channel: "default",
                body_bytes: 10,
                open_groups_of_source: 0,
                room,
            },
            now(),
            &policy(),
        )
    }

    fn full() -> SourceRoom {
        SourceRoom {
            quota: SourceQuota {
                max_stored_bytes: 100,
                max_messages_per_second: 0,
            },
            stored_bytes: 95,
            rate_allows: true,
        }
    }

    #[test]
    fn a_message_its_source_has_no_room_for_is_refused_transiently_and_nothing_written() {
        let r = request("mid:held@test", Some(0), callback());
        let p = plan_with_room(None, &r, full());
        assert!(
            matches!(
                p.verdict,
                Verdict::Fault(FaultCode::MessageProcessingFailure, _)
            ),
            "{:?}",
            p.verdict
        );
        assert_eq!(p.held_back, Some(HeldBack::StoredBytes));
        assert_eq!(p.action, Action::Drop);
        assert!(p.group.is_none() && p.callbacks.is_empty() && p.poll_fault.is_none());
        let no_rate = SourceRoom {
            rate_allows: false,
            ..SourceRoom::UNLIMITED
        };
        let p = plan_with_room(None, &r, no_rate);
        assert_eq!(p.held_back, Some(HeldBack::MessagesPerSecond));
    }

    #[test]
    fn a_duplicate_costs_its_source_nothing_even_when_it_has_no_room() {
        let r = request("mid:held-dup@test", None, ReplyPattern::Response);
        let first = plan(None, &r).group.expect("state").state;
        let again = plan_with_room(Some(&first), &r, full());
        assert_eq!(again.verdict, Verdict::Ack);
        assert_eq!(again.held_back, None);
    }

    fn callback() -> ReplyPattern {
        ReplyPattern::Callback(ReplyTo {
            uri: "http://127.0.0.1:9/acks".into(),
            reference_scheme: None,
        })
    }

    #[test]
    fn a_new_singleton_is_delivered_and_its_group_written_with_a_deadline() {
        let r = request("mid:one@test", None, ReplyPattern::Response);
        let p = plan(None, &r);
        assert_eq!(p.verdict, Verdict::Ack);
        assert_eq!(p.action, Action::Deliver);
        assert!(p.release.is_empty() && p.discard.is_empty() && p.callbacks.is_empty());
        let group = p.group.expect("group written");
        assert!(
            group.deadline.is_some(),
            "the sweeper must purge it one day"
        );
    }

    #[test]
    fn a_duplicate_is_acked_and_not_delivered_again() {
        let r = request("mid:dup@test", None, ReplyPattern::Response);
        let first = plan(None, &r).group.expect("state").state;
        let again = plan(Some(&first), &r);
        assert_eq!(again.verdict, Verdict::Ack);
        assert_eq!(again.action, Action::Drop);
    }

    #[test]
    fn an_ordered_gap_buffers_and_its_filler_releases_the_buffer_in_order_with_callbacks() {
        let second = request("mid:ord@test", Some(1), callback());
        let p = plan(None, &second);
        assert_eq!(p.action, Action::Buffer);
        assert!(
            p.callbacks.is_empty(),
            "a buffered message is acked on delivery"
        );
        let state = p.group.expect("state").state;
        let first = request("mid:ord@test", Some(0), callback());
        let p = plan(Some(&state), &first);
        assert_eq!(p.action, Action::Deliver);
        assert_eq!(p.release, vec![1]);
        let numbers: Vec<_> = p.callbacks.iter().map(|c| (c.number, c.fault)).collect();
        assert_eq!(numbers, vec![(Some(1), None), (Some(0), None)]);
    }

    #[test]
    fn a_poll_sender_gets_a_remembered_fault_when_the_state_keeps_none() {
        let mut r = request("mid:late@test", None, ReplyPattern::Poll);
        r.expiry_time = now() - chrono::Duration::seconds(5);
        let p = plan(None, &r);
        assert!(matches!(p.verdict, Verdict::Fault(..)), "{:?}", p.verdict);
        if p.group.is_none() {
            let fault = p.poll_fault.expect("remembered for polls");
            assert!(fault.keep_until >= now() + FAULT_NOTICE_RETENTION);
        }
    }

    #[test]
    fn a_sweep_of_an_expired_group_with_buffered_callbacks_discards_them_with_faults() {
        let mut second = request("mid:exp@test", Some(1), callback());
        second.expiry_time = now() + chrono::Duration::seconds(1);
        let state = plan(None, &second).group.expect("state").state;
        let later = now() + chrono::Duration::days(40);
        match plan_sweep(state, later, &policy()) {
            SweepPlan::Changed {
                discard,
                callbacks,
                group,
            } => {
                assert_eq!(discard, vec![1]);
                assert_eq!(callbacks.len(), 1);
                assert_eq!(callbacks[0].fault, Some(FaultCode::GroupAborted));
                assert_ne!(group.state.status, GroupStatus::Open);
            }
            SweepPlan::Purge => {}
            other => panic!("expected a change, got {other:?}"),
        }
    }

    #[test]
    fn a_sweep_before_any_deadline_only_rearms() {
        let r = request("mid:early@test", None, ReplyPattern::Response);
        let state = plan(None, &r).group.expect("state").state;
        assert!(matches!(
            plan_sweep(state, now(), &policy()),
            SweepPlan::Rearm(_)
        ));
    }
}
