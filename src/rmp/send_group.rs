//! The sending RMP's group rules (DESIGN §6), pure: how a submission joins or starts a group
//! (numbers in submit order, checks of an existing group), which messages of a group an
//! earlier message's failure fails, the send window (which due messages may go out now),
//! closing a group with `last`, and whose replies may settle a message. The store reads the
//! rows these decide over and writes what they decide; no SQL says any of it.

use chrono::{DateTime, Utc};

use super::sender::{Event, OutState, Outbound};
use crate::wsr::{
    FaultCode, GroupId, Headers, MessageId, ReplyPattern, Request, SequenceNum, SoapVersion,
    write_envelope,
};

/// A stored outbound group as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRow {
    pub destination: String,
    pub ordered: bool,
    /// A sequenced group (else a singleton).
    pub sequenced: bool,
    /// The number the next message gets.
    pub next_number: u64,
    /// The number of the message submitted with `last`, once the group is closed.
    pub last_number: Option<u64>,
    /// Whether one of its messages ended faulted or failed.
    pub has_failed: bool,
}

/// What a submission asks of its group.
#[derive(Debug, Clone, Copy)]
pub struct Joining<'a> {
    pub destination: &'a str,
    pub sequenced: bool,
    pub ordered: bool,
    pub last: bool,
}

/// Where a submission goes: its number, and the group's numbering after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbered {
    /// `None` for a singleton.
    pub number: Option<u64>,
    pub next_number: u64,
    /// Set when the submission closes the group.
    pub last_number: Option<u64>,
}

/// A new group for the submission: a sequenced one starts at 0 (and is closed at once by a
/// `last` first message), a singleton has no number.
pub fn start_group(joining: Joining<'_>) -> Numbered {
    Numbered {
        number: joining.sequenced.then_some(0),
        next_number: u64::from(joining.sequenced),
        // Kept for a singleton too: closing it answers as for a closed group.
        last_number: joining.last.then_some(0),
    }
}

/// The next number of an existing group, in submit order, or why the submission cannot join
/// it (a conflict the application must fix; `group_id` only names the group in the answer).
pub fn join_group(
    group_id: &str,
    group: &GroupRow,
    joining: Joining<'_>,
) -> Result<Numbered, String> {
    if group.destination != joining.destination {
        return Err(format!(
            "group {group_id} goes to {}, not {}",
            group.destination, joining.destination
        ));
    }
    if !group.sequenced {
        return Err(format!("group {group_id} is a singleton"));
    }
    if group.ordered != joining.ordered {
        return Err(format!(
            "group {group_id} was created {}ordered",
            if joining.ordered { "un" } else { "" }
        ));
    }
    if group.last_number.is_some() {
        return Err(format!(
            "group {group_id} is closed: its last message was submitted"
        ));
    }
    if group.ordered && group.has_failed {
        return Err(format!(
            "ordered group {group_id} has a failed message: nothing after it can be \
             delivered; start a new group"
        ));
    }
    let number = group.next_number;
    Ok(Numbered {
        number: Some(number),
        next_number: number.saturating_add(1),
        last_number: joining.last.then_some(number),
    })
}

/// Our message as the sending RMP numbers it and writes it once: what a submission says,
/// borrowed (the store's `Submission::outgoing`).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The message id; a new group's id is made from it (`our_group_id`).
    pub id: &'a str,
    /// The group to continue, or `None`: a new one.
    pub group_id: Option<&'a GroupId>,
    pub joining: Joining<'a>,
    pub ack_requested: bool,
    pub duplicate_elimination: bool,
    pub reply: &'a ReplyPattern,
    pub version: SoapVersion,
    pub body: &'a str,
    pub expiry: DateTime<Utc>,
}

/// Where a planned submission goes, and the envelope it is sent in, unchanged, on every
/// attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub group_id: GroupId,
    /// Whether the group is new (inserted) or continued (its numbering updated).
    pub new_group: bool,
    pub numbered: Numbered,
    pub envelope: String,
}

/// The groupId of a group our message `id` starts: unguessable and unique across gateways
/// (D14), as the message id is.
pub fn our_group_id(id: &str) -> Result<GroupId, String> {
    GroupId::parse(&format!("mid:{id}@wsr-gateway"))
}

/// The submit plan: a new group for `out`, or the next number of `existing` (the stored
/// group `out.group_id` names, read by the store), with the `Request` and envelope written
/// once. `Err` is a conflict the application must fix.
pub fn plan_submit(out: &Outgoing<'_>, existing: Option<&GroupRow>) -> Result<Planned, String> {
    let (group_id, new_group, numbered) = match (out.group_id, existing) {
        (None, _) => (our_group_id(out.id)?, true, start_group(out.joining)),
        (Some(id), Some(group)) => (
            id.clone(),
            false,
            join_group(id.as_str(), group, out.joining)?,
        ),
        (Some(id), None) => return Err(format!("no outbound group {id}")),
    };
    let request = Request {
        message_id: MessageId {
            group_id: group_id.clone(),
            sequence: numbered.number.map(|number| SequenceNum {
                number,
                last: out.joining.last,
                group_limit: None,
            }),
        },
        expiry_time: out.expiry,
        reply_pattern: out.reply.clone(),
        ack_requested: out.ack_requested,
        duplicate_elimination: out.duplicate_elimination,
        message_order: out.joining.ordered,
    };
    let headers = Headers {
        request: Some(&request),
        ..Headers::default()
    };
    let envelope = write_envelope(out.version, headers, out.body);
    Ok(Planned {
        group_id,
        new_group,
        numbered,
        envelope,
    })
}

/// A message of a group as the failure rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub number: Option<u64>,
    pub state: OutState,
}

/// Failures of one message of an ordered group fail the rest of the group (S-t4): every later
/// message not final yet, with the reason returned. Nothing in an unordered group, and nothing
/// for a message that did not end faulted or failed.
pub fn failed_with(
    ordered: bool,
    failed: &Member,
    group: &[Member],
) -> (Vec<String>, Option<String>) {
    let fails = matches!(failed.state, OutState::Faulted(_) | OutState::Failed(_));
    let Some(from) = failed.number.filter(|_| ordered && fails) else {
        return (Vec::new(), None);
    };
    let rest: Vec<String> = group
        .iter()
        .filter(|m| m.number.is_some_and(|n| n > from) && !m.state.is_final())
        .map(|m| m.id.clone())
        .collect();
    let reason = format!(
        "an earlier message of its ordered group ({}) failed",
        failed.id
    );
    (rest, Some(reason))
}

/// A due message as the send window sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub ordered: bool,
    pub number: Option<u64>,
    pub expiry: DateTime<Utc>,
    /// The lowest number of its group not acknowledged yet.
    pub lowest_open: Option<u64>,
}

/// Whether a due message may go out now: always for an unordered group or a singleton, and
/// for one past its ExpiryTime (the stop rules settle it); for an ordered group only within
/// `window` messages of its lowest number not yet acknowledged (a destination holds later
/// ones until the gap is filled).
pub fn in_window(c: &Candidate, window: u64, now: DateTime<Utc>) -> bool {
    if !c.ordered || c.expiry <= now {
        return true;
    }
    match (c.number, c.lowest_open) {
        (Some(n), Some(lowest)) => n < lowest.saturating_add(window.max(1)),
        // Nothing below it open (it is itself acked, or not numbered): nothing holds it.
        _ => true,
    }
}

/// The window of a destination: its own (a partner's `send_window`), else `default`.
pub fn window_for(
    destination: &str,
    windows: &std::collections::BTreeMap<String, u64>,
    default: u64,
) -> u64 {
    windows.get(destination).copied().unwrap_or(default).max(1)
}

/// What the verdicts said about one message (acks `None`, faults `Some(code)`, in the order
/// said) do to it: the sender's state machine applied to each (an ack wins over a resend, a
/// `MessageProcessingFailure` keeps it scheduled, another fault stops it).
pub fn settle(
    before: &Outbound,
    said: impl IntoIterator<Item = Option<FaultCode>>,
    now: DateTime<Utc>,
) -> Outbound {
    let mut after = before.clone();
    for fault in said {
        after.apply(
            match fault {
                None => Event::Acked,
                Some(code) => Event::Faulted(code),
            },
            now,
        );
    }
    after
}

/// Whether only a poll can settle a message: a Poll-pattern message waiting for its ack, or
/// one of any pattern in doubt (`Outbound::in_doubt`: sent, no verdict, no resend to come
/// before ExpiryTime).
pub fn awaits_poll(reply_pattern: &str, out: &Outbound) -> bool {
    out.state == OutState::Sent && (reply_pattern == "Poll" || out.in_doubt())
}

/// The group's most recent message, as closing the group reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newest {
    pub number: Option<u64>,
    pub attempts: u32,
    pub state: OutState,
    pub last_number: Option<u64>,
}

/// What closing a group does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Closed before: its last number.
    Already(u64),
    /// Mark message `number` last (its envelope is rewritten once, before any attempt).
    Mark(u64),
}

/// Closing a group after the fact marks its newest message `last`, but only while no attempt
/// has gone out with it (the envelope never changes once sent); else the application submits
/// a last message instead.
pub fn close_group(group_id: &str, newest: &Newest) -> Result<Close, String> {
    if let Some(last) = newest.last_number {
        return Ok(Close::Already(last));
    }
    let Some(number) = newest.number else {
        return Err("a singleton has no group to close".into());
    };
    if newest.attempts > 0 {
        return Err(format!(
            "message {number} of {group_id} was already sent without last=\"true\"; \
             submit a last message with group.last = true"
        ));
    }
    if newest.state != OutState::Queued {
        return Err(format!(
            "message {number} of {group_id} is being sent or has failed; submit a last \
             message with group.last = true"
        ));
    }
    Ok(Close::Mark(number))
}

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

/// A message as `may_settle` sees it.
#[derive(Debug, Clone, Copy)]
pub struct Settled<'a> {
    pub destination: &'a str,
    pub partner: &'a str,
    pub reply_pattern: &'a str,
    pub state: &'a OutState,
}

impl ReplySource<'_> {
    /// Whether a reply from this source may settle the message: it was sent (a queued one
    /// has not gone out; a final one stays as it is), and it went to this destination, or by
    /// the Callback pattern to a partner the caller speaks for.
    pub fn may_settle(&self, m: &Settled<'_>) -> bool {
        if *m.state != OutState::Sent {
            return false;
        }
        match self {
            ReplySource::Destination(d) => m.destination == *d,
            ReplySource::Callback { partners } => {
                m.reply_pattern == "Callback" && partners.iter().any(|p| p == m.partner)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::sender::RetrySchedule;
    use chrono::TimeZone;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("date")
    }

    fn outgoing<'a>(
        group: Option<&'a GroupId>,
        last: bool,
        reply: &'a ReplyPattern,
    ) -> Outgoing<'a> {
        Outgoing {
            id: "0190-abc",
            group_id: group,
            joining: Joining {
                destination: "http://peer/wsr",
                sequenced: true,
                ordered: true,
                last,
            },
            ack_requested: true,
            duplicate_elimination: true,
            reply,
            version: SoapVersion::Soap12,
            body: "<m:Order xmlns:m=\"urn:test\"/>",
            expiry: t0(),
        }
    }

    fn read_back(envelope: &str) -> Request {
        crate::wsr::read_envelope(envelope.as_bytes(), &crate::wsr::Limits::default())
            .expect("our envelope reads")
            .request
            .expect("with its Request")
    }

    #[test]
    fn a_new_group_is_named_from_the_message_id_and_starts_at_zero() {
        let reply = ReplyPattern::Response;
        let plan = plan_submit(&outgoing(None, false, &reply), None).expect("planned");
        assert_eq!(plan.group_id.as_str(), "mid:0190-abc@wsr-gateway");
        assert!(plan.new_group);
        assert_eq!(plan.numbered.number, Some(0));
        let request = read_back(&plan.envelope);
        assert_eq!(request.message_id.group_id, plan.group_id);
        assert_eq!(request.key().number, Some(0));
        assert!(request.message_order && request.ack_requested);
        assert!(
            plan.envelope.contains("urn:test"),
            "the body is in the envelope"
        );
    }

    #[test]
    fn a_continued_group_numbers_in_submit_order_and_marks_last() {
        let id = GroupId::parse("mid:g@wsr-gateway").expect("id");
        let stored = GroupRow {
            destination: "http://peer/wsr".into(),
            ordered: true,
            sequenced: true,
            next_number: 7,
            last_number: None,
            has_failed: false,
        };
        let reply = ReplyPattern::Poll;
        let plan = plan_submit(&outgoing(Some(&id), true, &reply), Some(&stored)).expect("plan");
        assert!(!plan.new_group);
        assert_eq!(plan.numbered.number, Some(7));
        assert_eq!(plan.numbered.last_number, Some(7));
        let request = read_back(&plan.envelope);
        let sequence = request.message_id.sequence.expect("numbered");
        assert_eq!((sequence.number, sequence.last), (7, true));
        assert_eq!(request.reply_pattern, ReplyPattern::Poll);
    }

    #[test]
    fn a_group_that_is_not_stored_or_does_not_fit_is_a_conflict() {
        let id = GroupId::parse("mid:g@wsr-gateway").expect("id");
        let reply = ReplyPattern::Response;
        let missing = plan_submit(&outgoing(Some(&id), false, &reply), None);
        assert_eq!(missing, Err("no outbound group mid:g@wsr-gateway".into()));
        let elsewhere = GroupRow {
            destination: "http://other/wsr".into(),
            ordered: true,
            sequenced: true,
            next_number: 1,
            last_number: None,
            has_failed: false,
        };
        let refused = plan_submit(&outgoing(Some(&id), false, &reply), Some(&elsewhere));
        assert!(refused.is_err_and(|why| why.contains("goes to http://other/wsr")));
    }

    fn joining(ordered: bool, last: bool) -> Joining<'static> {
        Joining {
            destination: "http://peer/wsr",
            sequenced: true,
            ordered,
            last,
        }
    }

    fn group(ordered: bool) -> GroupRow {
        GroupRow {
            destination: "http://peer/wsr".into(),
            ordered,
            sequenced: true,
            next_number: 3,
            last_number: None,
            has_failed: false,
        }
    }

    #[test]
    fn numbers_follow_submit_order() {
        let first = start_group(joining(true, false));
        assert_eq!(first.number, Some(0));
        assert_eq!(first.next_number, 1);
        assert_eq!(first.last_number, None);
        let alone = start_group(Joining {
            sequenced: false,
            ..joining(false, true)
        });
        assert_eq!(alone.number, None, "a singleton has no number");
        assert_eq!(start_group(joining(false, true)).last_number, Some(0));
        let next = join_group("g", &group(true), joining(true, false)).expect("joins");
        assert_eq!((next.number, next.next_number), (Some(3), 4));
        let last = join_group("g", &group(true), joining(true, true)).expect("joins");
        assert_eq!(last.last_number, Some(3), "last closes the group");
    }

    #[test]
    fn a_group_refuses_what_does_not_fit_it() {
        let refused = |g: GroupRow, j: Joining<'_>| join_group("g", &g, j).expect_err("refused");
        let mut other = group(true);
        other.destination = "http://elsewhere/wsr".into();
        assert!(refused(other, joining(true, false)).contains("goes to"));
        let mut single = group(false);
        single.sequenced = false;
        assert!(refused(single, joining(false, false)).contains("singleton"));
        assert!(refused(group(true), joining(false, false)).contains("created ordered"));
        assert!(refused(group(false), joining(true, false)).contains("created unordered"));
        let mut closed = group(true);
        closed.last_number = Some(2);
        assert!(refused(closed, joining(true, false)).contains("closed"));
        let mut failed = group(true);
        failed.has_failed = true;
        assert!(refused(failed.clone(), joining(true, false)).contains("failed message"));
        failed.ordered = false;
        assert!(
            join_group("g", &failed, joining(false, false)).is_ok(),
            "an unordered group carries on after a failure"
        );
    }

    fn member(id: &str, number: u64, state: OutState) -> Member {
        Member {
            id: id.into(),
            number: Some(number),
            state,
        }
    }

    #[test]
    fn a_failure_in_an_ordered_group_fails_the_later_messages_not_final() {
        let failed = member("m1", 1, OutState::Faulted(FaultCode::InvalidMessageId));
        let group = vec![
            member("m0", 0, OutState::Sent),
            failed.clone(),
            member("m2", 2, OutState::Queued),
            member("m3", 3, OutState::Acked),
            member("m4", 4, OutState::Sent),
        ];
        let (rest, reason) = failed_with(true, &failed, &group);
        assert_eq!(rest, vec!["m2".to_owned(), "m4".to_owned()]);
        assert!(reason.expect("a reason").contains("(m1)"));
        assert_eq!(failed_with(false, &failed, &group).0, Vec::<String>::new());
        let acked = member("m1", 1, OutState::Acked);
        assert!(failed_with(true, &acked, &group).0.is_empty());
    }

    #[test]
    fn the_send_window_holds_ordered_messages_beyond_the_lowest_open_one() {
        let now = t0();
        let c = |ordered, number, lowest_open| Candidate {
            ordered,
            number: Some(number),
            expiry: now + chrono::Duration::seconds(60),
            lowest_open,
        };
        assert!(in_window(&c(true, 4, Some(2)), 3, now));
        assert!(!in_window(&c(true, 5, Some(2)), 3, now));
        assert!(in_window(&c(false, 50, Some(2)), 3, now), "unordered");
        assert!(in_window(&c(true, 0, None), 1, now));
        assert!(
            in_window(&c(true, 2, Some(2)), 0, now),
            "a window is at least 1"
        );
        let mut expired = c(true, 9, Some(2));
        expired.expiry = now;
        assert!(
            in_window(&expired, 1, now),
            "expired: the stop rules settle it"
        );
    }

    #[test]
    fn polls_ask_about_poll_pattern_messages_and_those_in_doubt() {
        let schedule = RetrySchedule::Waits(vec![std::time::Duration::from_secs(5)]);
        let mut m = Outbound::new(t0() + chrono::Duration::seconds(60), schedule, t0());
        assert!(!awaits_poll("Poll", &m), "not sent yet");
        m.apply(Event::Sent, t0());
        assert!(awaits_poll("Poll", &m));
        assert!(!awaits_poll("Response", &m), "a resend is to come");
        m.apply(Event::Sent, t0() + chrono::Duration::seconds(5));
        assert!(awaits_poll("Response", &m), "in doubt");
        m.apply(Event::Acked, t0() + chrono::Duration::seconds(6));
        assert!(!awaits_poll("Poll", &m), "settled");
    }

    #[test]
    fn a_destination_has_its_own_window_or_the_default() {
        let windows = [("http://slow/wsr".to_owned(), 1)].into_iter().collect();
        assert_eq!(window_for("http://slow/wsr", &windows, 8), 1);
        assert_eq!(window_for("http://other/wsr", &windows, 8), 8);
        assert_eq!(window_for("http://other/wsr", &windows, 0), 1);
    }

    #[test]
    fn replies_ack_fault_or_keep_a_message_scheduled() {
        let schedule = RetrySchedule::Waits(vec![std::time::Duration::from_secs(5); 3]);
        let mut sent = Outbound::new(t0() + chrono::Duration::seconds(60), schedule, t0());
        sent.apply(Event::Sent, t0());
        assert_eq!(settle(&sent, [None], t0()).state, OutState::Acked);
        let retried = settle(&sent, [Some(FaultCode::MessageProcessingFailure)], t0());
        assert_eq!(retried, sent, "retried on its schedule");
        let faulted = settle(&sent, [Some(FaultCode::InvalidMessageId), None], t0());
        assert_eq!(
            faulted.state,
            OutState::Faulted(FaultCode::InvalidMessageId),
            "the first final verdict stays"
        );
        assert_eq!(settle(&sent, [], t0()), sent);
    }

    #[test]
    fn a_group_closes_only_before_its_newest_message_went_out() {
        let newest = |attempts, state, last_number| Newest {
            number: Some(4),
            attempts,
            state,
            last_number,
        };
        assert_eq!(
            close_group("g", &newest(0, OutState::Queued, None)),
            Ok(Close::Mark(4))
        );
        assert_eq!(
            close_group("g", &newest(3, OutState::Sent, Some(4))),
            Ok(Close::Already(4))
        );
        assert!(
            close_group("g", &newest(1, OutState::Sent, None))
                .expect_err("sent")
                .contains("already sent")
        );
        assert!(
            close_group("g", &newest(0, OutState::Failed("x".into()), None))
                .expect_err("failed")
                .contains("has failed")
        );
        let single = Newest {
            number: None,
            ..newest(0, OutState::Queued, None)
        };
        assert!(close_group("g", &single).is_err());
    }

    #[test]
    fn only_the_destination_or_its_callback_partner_settles_a_sent_message() {
        let sent = OutState::Sent;
        let m = Settled {
            destination: "http://a/wsr",
            partner: "a",
            reply_pattern: "Callback",
            state: &sent,
        };
        assert!(ReplySource::Destination("http://a/wsr").may_settle(&m));
        assert!(!ReplySource::Destination("http://b/wsr").may_settle(&m));
        let a = ["a".to_owned()];
        let b = ["b".to_owned()];
        assert!(ReplySource::Callback { partners: &a }.may_settle(&m));
        assert!(!ReplySource::Callback { partners: &b }.may_settle(&m));
        let response = Settled {
            reply_pattern: "Response",
            ..m
        };
        assert!(!ReplySource::Callback { partners: &a }.may_settle(&response));
        let queued = OutState::Queued;
        let unsent = Settled {
            state: &queued,
            ..m
        };
        assert!(!ReplySource::Destination("http://a/wsr").may_settle(&unsent));
    }
}
