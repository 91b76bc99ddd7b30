//! Building `wsrm:Response` content: acks and faults for many messages of many groups, merged
//! into as few `ReplyRange`s as possible (batched callbacks, poll answers), and the answer to a
//! PollRequest from stored group state (D11).

use std::collections::BTreeMap;

use super::group::GroupState;
use crate::wsr::{
    FaultCode, GroupId, MessageKey, RefToMessageIds, Reply, ReplyRange, Response, SeqRange,
};

/// The reply element for one message: `NonSequenceReply` for a singleton, else a one-number
/// `SequenceReplies`.
pub fn reply_for(key: &MessageKey, fault: Option<FaultCode>) -> Reply {
    match key.number {
        None => Reply::NonSequence {
            group_id: key.group_id.clone(),
            fault,
        },
        Some(n) => Reply::Sequence {
            group_id: key.group_id.clone(),
            ranges: vec![ReplyRange {
                range: SeqRange::single(n),
                fault,
            }],
        },
    }
}

/// One statement of a `wsrm:Response`: about a singleton (`range` `None`) or a range of a
/// group, an ack (`fault` `None`) or a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyItem {
    pub group_id: GroupId,
    pub range: Option<SeqRange>,
    pub fault: Option<FaultCode>,
}

impl ReplyItem {
    /// Whether this statement is about the message `key`.
    pub fn covers(&self, key: &MessageKey) -> bool {
        self.group_id == key.group_id
            && match (self.range, key.number) {
                (None, None) => true,
                (Some(r), Some(n)) => r.contains(n),
                _ => false,
            }
    }
}

/// The statements a reply element makes, one per singleton or range.
pub fn items(reply: &Reply) -> Vec<ReplyItem> {
    match reply {
        Reply::NonSequence { group_id, fault } => vec![ReplyItem {
            group_id: group_id.clone(),
            range: None,
            fault: *fault,
        }],
        Reply::Sequence { group_id, ranges } => ranges
            .iter()
            .map(|r| ReplyItem {
                group_id: group_id.clone(),
                range: Some(r.range),
                fault: r.fault,
            })
            .collect(),
    }
}

/// Acks (`None`) and faults (`Some(code)`) collected per group.
#[derive(Debug, Default)]
pub struct Replies {
    groups: BTreeMap<GroupId, Collected>,
}

#[derive(Debug, Default)]
struct Collected {
    singleton: Option<Option<FaultCode>>,
    ranges: Vec<(SeqRange, Option<FaultCode>)>,
}

impl Replies {
    pub fn new() -> Replies {
        Replies::default()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// One message: a singleton when `number` is `None`.
    pub fn add(&mut self, group_id: &GroupId, number: Option<u64>, fault: Option<FaultCode>) {
        match number {
            None => self.group(group_id).singleton = Some(fault),
            Some(n) => self.add_range(group_id, SeqRange::single(n), fault),
        }
    }

    /// One statement of another Response (a poll answer passed on, a queued callback).
    pub fn add_item(&mut self, item: &ReplyItem) {
        match item.range {
            Some(range) => self.add_range(&item.group_id, range, item.fault),
            None => self.add(&item.group_id, None, item.fault),
        }
    }

    pub fn add_range(&mut self, group_id: &GroupId, range: SeqRange, fault: Option<FaultCode>) {
        self.group(group_id).ranges.push((range, fault));
    }

    fn group(&mut self, group_id: &GroupId) -> &mut Collected {
        self.groups.entry(group_id.clone()).or_default()
    }

    /// The Response, or `None` when there is nothing to say (an empty one is invalid, D11).
    pub fn into_response(self) -> Option<Response> {
        let mut replies = Vec::new();
        for (group_id, collected) in self.groups {
            if let Some(fault) = collected.singleton {
                replies.push(Reply::NonSequence {
                    group_id: group_id.clone(),
                    fault,
                });
            }
            let ranges = merge(collected.ranges);
            if !ranges.is_empty() {
                replies.push(Reply::Sequence { group_id, ranges });
            }
        }
        (!replies.is_empty()).then_some(Response { replies })
    }
}

/// Sorts ranges and joins overlapping or adjacent ones that say the same thing.
fn merge(mut ranges: Vec<(SeqRange, Option<FaultCode>)>) -> Vec<ReplyRange> {
    ranges.sort_by_key(|(r, f)| (r.from(), r.to(), *f));
    let mut out: Vec<ReplyRange> = Vec::new();
    for (range, fault) in ranges {
        if let Some(prev) = out.last_mut() {
            let touches = prev
                .range
                .to()
                .checked_add(1)
                .is_none_or(|next| range.from() <= next);
            if prev.fault == fault && touches {
                let to = prev.range.to().max(range.to());
                prev.range = SeqRange::new(prev.range.from(), to).unwrap_or(prev.range);
                continue;
            }
        }
        out.push(ReplyRange { range, fault });
    }
    out
}

/// Answers a PollRequest from stored group state: acks for delivered messages, faults for
/// faulted ones, nothing for unknown or buffered ones (D11). A reference without ranges to a
/// sequenced group is answered for the whole group (a harmless superset, digest §2.4).
/// Returned as `Replies`, so that what the group state does not hold can still be added.
pub fn answer_poll<'s>(
    refs: &[RefToMessageIds],
    lookup: impl Fn(&GroupId) -> Option<&'s GroupState>,
) -> Replies {
    let mut replies = Replies::new();
    for r in refs {
        let Some(state) = lookup(&r.group_id) else {
            continue;
        };
        if !state.params.sequenced {
            if r.ranges.is_empty() {
                if let Some(code) = state.faults.get(&0) {
                    replies.add(&r.group_id, None, Some(*code));
                } else if state.delivered.contains(0) {
                    replies.add(&r.group_id, None, None);
                }
            }
            continue;
        }
        let whole = [SeqRange::new(0, u64::MAX).unwrap_or(SeqRange::single(0))];
        let queries = if r.ranges.is_empty() {
            &whole[..]
        } else {
            &r.ranges[..]
        };
        for query in queries {
            for delivered in state.delivered.within(*query) {
                replies.add_range(&r.group_id, delivered, None);
            }
            for (n, code) in state.faults.range(query.from()..=query.to()) {
                replies.add(&r.group_id, Some(*n), Some(*code));
            }
        }
    }
    replies
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(group: &str, number: Option<u64>) -> MessageKey {
        MessageKey {
            group_id: GroupId::parse(group).expect("group"),
            number,
        }
    }

    #[test]
    fn a_statement_covers_its_singleton_or_the_numbers_of_its_range() {
        let single = ReplyItem {
            group_id: GroupId::parse("mid:a").expect("group"),
            range: None,
            fault: None,
        };
        assert!(single.covers(&key("mid:a", None)));
        assert!(!single.covers(&key("mid:a", Some(0))));
        assert!(!single.covers(&key("mid:b", None)));
        let range = ReplyItem {
            range: SeqRange::new(2, 5),
            ..single
        };
        assert!(range.covers(&key("mid:a", Some(2))));
        assert!(range.covers(&key("mid:a", Some(5))));
        assert!(!range.covers(&key("mid:a", Some(6))));
        assert!(!range.covers(&key("mid:a", None)));
    }
}
