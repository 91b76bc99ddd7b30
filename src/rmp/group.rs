//! What the receiver remembers about one group (a singleton is a group of one): parameters that
//! must agree across its messages, what was delivered, buffered and faulted, and how the group
//! ends (D8) and is forgotten. Pure: every function takes the time as a parameter.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::ranges::RangeSet;
use crate::wsr::datetime::{XsDuration, saturating_add};
use crate::wsr::{FaultCode, GroupId, GroupLimit, ReplyPattern, Request};

/// Receiver settings the decisions depend on (DESIGN D3, D6, D8).
#[derive(Debug, Clone)]
pub struct Policy {
    /// How far in the past an ExpiryTime may lie before the message counts as expired (D3).
    pub clock_skew: chrono::Duration,
    /// Idle limit of a group that names neither limit (D8).
    pub default_idle: XsDuration,
    /// Per-group buffer for ordered messages ahead of a gap (D6).
    pub buffer_max_messages: usize,
    pub buffer_max_bytes: u64,
    /// How long a group's delivered IDs are kept after its last message can no longer be
    /// accepted, so that a sender whose acks were lost can still learn by PollRequest that
    /// its message was delivered (an unknown ID is answered with nothing, which the sender
    /// takes as "not delivered" once the message has expired).
    pub answer_polls_for: chrono::Duration,
    /// Most open groups one source (the peer address, until partners authenticate) may have
    /// at once: every group's state is kept until it ends, so without a quota one partner
    /// could fill the disk with new groups (D13).
    pub max_open_groups_per_source: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            clock_skew: chrono::Duration::zero(),
            default_idle: XsDuration {
                days: 1,
                ..XsDuration::default()
            },
            buffer_max_messages: 1000,
            buffer_max_bytes: 64 * 1024 * 1024,
            answer_polls_for: chrono::Duration::hours(1),
            max_open_groups_per_source: 10_000,
        }
    }
}

/// The parameters every message of a group must agree on (D8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupParams {
    pub channel: String,
    /// Whether the messages carry `SequenceNum` (a singleton does not).
    pub sequenced: bool,
    pub ack_requested: bool,
    pub duplicate_elimination: bool,
    pub message_order: bool,
    pub limit: Option<GroupLimit>,
}

impl GroupParams {
    pub fn of(request: &Request, channel: &str) -> GroupParams {
        let seq = request.message_id.sequence.as_ref();
        GroupParams {
            channel: channel.to_owned(),
            sequenced: seq.is_some(),
            ack_requested: request.ack_requested,
            duplicate_elimination: request.duplicate_elimination,
            message_order: request.message_order,
            limit: seq.and_then(|s| s.group_limit.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStatus {
    Open,
    /// `last` and everything before it delivered.
    Complete,
    /// `groupExpiryTime` passed.
    Expired,
    /// No message for the idle limit.
    Idle,
    /// An ordered gap can no longer be filled (D7).
    Aborted,
}

impl GroupStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupStatus::Open => "open",
            GroupStatus::Complete => "complete",
            GroupStatus::Expired => "expired",
            GroupStatus::Idle => "idle",
            GroupStatus::Aborted => "aborted",
        }
    }

    pub fn parse(s: &str) -> Option<GroupStatus> {
        [
            GroupStatus::Open,
            GroupStatus::Complete,
            GroupStatus::Expired,
            GroupStatus::Idle,
            GroupStatus::Aborted,
        ]
        .into_iter()
        .find(|g| g.as_str() == s)
    }
}

/// An ordered message held until the gap before it fills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffered {
    pub expiry: DateTime<Utc>,
    pub bytes: u64,
    /// How its ack (or fault) must travel once it is decided.
    pub reply: ReplyPattern,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    pub group_id: GroupId,
    pub params: GroupParams,
    /// The number marked `last="true"`, once seen.
    pub last: Option<u64>,
    /// Delivered numbers; a delivered singleton is number 0.
    pub delivered: RangeSet,
    /// Ordered groups: the number that can be delivered next.
    pub next_expected: u64,
    pub buffered: BTreeMap<u64, Buffered>,
    /// Final faults given to messages of the group, so that polls and duplicates see them.
    pub faults: BTreeMap<u64, FaultCode>,
    /// The latest ExpiryTime of any accepted message: the group is kept at least until then.
    pub max_expiry: DateTime<Utc>,
    pub last_activity: DateTime<Utc>,
    pub status: GroupStatus,
    pub terminated_at: Option<DateTime<Utc>>,
}

/// The slot of a message in its group's sets: its number, or 0 for a singleton.
pub fn slot(number: Option<u64>) -> u64 {
    number.unwrap_or(0)
}

impl GroupState {
    pub fn new(group_id: GroupId, params: GroupParams, now: DateTime<Utc>) -> GroupState {
        GroupState {
            group_id,
            params,
            last: None,
            delivered: RangeSet::new(),
            next_expected: 0,
            buffered: BTreeMap::new(),
            faults: BTreeMap::new(),
            max_expiry: now,
            last_activity: now,
            status: GroupStatus::Open,
            terminated_at: None,
        }
    }

    pub fn buffered_bytes(&self) -> u64 {
        self.buffered.values().map(|b| b.bytes).sum()
    }

    /// When the open group ends by its time limit (D8 b, c): `groupExpiryTime`, or the idle
    /// limit (its own or the default) after the last message. Singletons end on delivery.
    pub fn time_limit(&self, policy: &Policy) -> Option<DateTime<Utc>> {
        if !self.params.sequenced {
            return None;
        }
        // A limit beyond the representable range is the latest instant, never "no limit":
        // channels refuse such limits on arrival (`Agreement::check`), and a state stored
        // before that check still ends.
        let idle = |d: &XsDuration| {
            d.add_to(self.last_activity)
                .unwrap_or(DateTime::<Utc>::MAX_UTC)
        };
        match &self.params.limit {
            Some(GroupLimit::ExpiryTime(t)) => Some(*t),
            Some(GroupLimit::MaxIdleDuration(d)) => Some(idle(d)),
            None => Some(idle(&policy.default_idle)),
        }
    }

    /// When the open group is aborted unless its gap fills (D7): the earliest of its buffered
    /// messages' ExpiryTime and its time limit; `None` while nothing waits for a gap (then the
    /// time limit only ends it, `time_limit`) or once it ended.
    pub fn aborts_at(&self, policy: &Policy) -> Option<DateTime<Utc>> {
        if self.status != GroupStatus::Open || self.buffered.is_empty() {
            return None;
        }
        self.open_ends_at(policy)
    }

    /// While open: the first of its time limit and its buffered messages' ExpiryTime — when
    /// the sweep next has something to do to it (`sweep`).
    fn open_ends_at(&self, policy: &Policy) -> Option<DateTime<Utc>> {
        let earliest_buffered = self.buffered.values().map(|b| b.expiry).min();
        [self.time_limit(policy), earliest_buffered]
            .into_iter()
            .flatten()
            .min()
    }

    /// The first moment the group state may be forgotten: after termination and once no
    /// message of the group can be accepted any more — its latest ExpiryTime plus the allowed
    /// clock skew (D3, D8) — so that a late duplicate is always still recognised.
    pub fn purge_at(&self, policy: &Policy) -> Option<DateTime<Utc>> {
        self.terminated_at.map(|t| t.max(self.forget_at(policy)))
    }

    /// When nobody can need the group's IDs any more: no message of it can be accepted, and
    /// senders have had `answer_polls_for` to ask what became of theirs.
    fn forget_at(&self, policy: &Policy) -> DateTime<Utc> {
        saturating_add(self.no_longer_acceptable(policy), policy.answer_polls_for)
    }

    /// The first instant at which every message of the group counts as expired on arrival
    /// (the receiver refuses `expiry < now - skew`).
    fn no_longer_acceptable(&self, policy: &Policy) -> DateTime<Utc> {
        let skewed = saturating_add(self.max_expiry, policy.clock_skew);
        saturating_add(skewed, chrono::Duration::milliseconds(1))
    }

    /// The next moment something happens to this group by itself: a time limit, a buffered
    /// message expiring (D7), or the purge.
    pub fn next_deadline(&self, policy: &Policy) -> Option<DateTime<Utc>> {
        match self.status {
            GroupStatus::Open => self
                .open_ends_at(policy)
                // A singleton or group with nothing pending still has to be purged.
                .or(Some(self.no_longer_acceptable(policy))),
            _ => self.purge_at(policy),
        }
    }

    pub fn terminate(&mut self, status: GroupStatus, now: DateTime<Utc>) {
        if self.status == GroupStatus::Open {
            self.status = status;
            self.terminated_at = Some(now);
        }
    }

    /// Ends the group abnormally (D7): buffered messages are discarded, never delivered, and
    /// they and every later message get `GroupAborted`. Returns the discarded messages (their
    /// senders are owed the fault).
    pub fn abort(&mut self, now: DateTime<Utc>) -> Vec<(u64, Buffered)> {
        let discarded: Vec<(u64, Buffered)> =
            std::mem::take(&mut self.buffered).into_iter().collect();
        for (n, _) in &discarded {
            self.faults.insert(*n, FaultCode::GroupAborted);
        }
        self.status = GroupStatus::Open;
        self.terminate(GroupStatus::Aborted, now);
        discarded
    }
}

/// What the passage of time did to a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swept {
    /// Nothing due.
    Unchanged,
    /// The group ended or changed; buffered numbers listed were discarded with `GroupAborted`
    /// (their senders are told by callback or poll where possible).
    Changed { discarded: Vec<(u64, Buffered)> },
    /// Terminated and past its latest ExpiryTime: forget it.
    Purge,
}

/// Applies everything due at `now`: a buffered ordered message that expired while the gap is
/// open aborts the group (D7); a passed time limit ends it — aborted if an ordered gap is still
/// open, else expired or idle (D8); a terminated group past its purge time is forgotten.
pub fn sweep(state: &mut GroupState, now: DateTime<Utc>, policy: &Policy) -> Swept {
    if state.status != GroupStatus::Open {
        return match state.purge_at(policy) {
            Some(t) if t <= now => Swept::Purge,
            _ => Swept::Unchanged,
        };
    }
    if !state.params.sequenced {
        // A singleton that is still open was never delivered (its only message faulted).
        if state.no_longer_acceptable(policy) <= now {
            return Swept::Purge;
        }
        return Swept::Unchanged;
    }
    let buffered_expired = state.buffered.values().any(|b| b.expiry <= now);
    let limit_passed = state.time_limit(policy).is_some_and(|t| t <= now);
    if !buffered_expired && !limit_passed {
        return Swept::Unchanged;
    }
    if !state.buffered.is_empty() {
        let discarded = state.abort(now);
        return Swept::Changed { discarded };
    }
    let status = match state.params.limit {
        Some(GroupLimit::ExpiryTime(_)) => GroupStatus::Expired,
        _ => GroupStatus::Idle,
    };
    state.terminate(status, now);
    Swept::Changed {
        discarded: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    /// An ordered group with a gap says when it aborts: the earliest buffered ExpiryTime or
    /// its time limit, whichever is first; nothing once the gap is gone or the group ended.
    #[test]
    fn a_group_with_a_gap_tells_when_it_aborts() {
        let t0 = Utc
            .with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("t0");
        let params = GroupParams {
            channel: "c".into(),
            sequenced: true,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: true,
            limit: Some(GroupLimit::ExpiryTime(t0 + chrono::Duration::hours(2))),
        };
        let mut g = GroupState::new(GroupId::parse("mid:g@t").expect("id"), params, t0);
        let policy = Policy::default();
        assert_eq!(g.aborts_at(&policy), None, "no gap");
        let buffered = |minutes| Buffered {
            expiry: t0 + chrono::Duration::minutes(minutes),
            bytes: 1,
            reply: ReplyPattern::Response,
        };
        g.buffered.insert(3, buffered(90));
        g.buffered.insert(2, buffered(30));
        assert_eq!(
            g.aborts_at(&policy),
            Some(t0 + chrono::Duration::minutes(30))
        );
        g.buffered.clear();
        g.buffered.insert(2, buffered(600));
        assert_eq!(
            g.aborts_at(&policy),
            Some(t0 + chrono::Duration::hours(2)),
            "the time limit first"
        );
        g.abort(t0);
        assert_eq!(g.aborts_at(&policy), None, "ended");
    }
}
