//! Building `wsrm:Response` content: acks and faults for many messages of many groups, merged
//! into as few `ReplyRange`s as possible (batched callbacks, poll answers), and the answer to a
//! PollRequest from stored group state (D11).

use std::collections::BTreeMap;

use super::group::GroupState;
use super::ranges::RangeSet;
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

    /// Statements collected so far, before merging (for tests of the cost of an answer).
    #[cfg(test)]
    fn collected(&self) -> usize {
        self.groups
            .values()
            .map(|c| c.ranges.len() + usize::from(c.singleton.is_some()))
            .sum()
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

/// What a PollRequest asks, per group. References to one group are merged (their ranges
/// sorted and joined), so that each group's stored state is read and walked once however many
/// references name it, and overlapping ranges cannot multiply the answer.
#[derive(Debug, Default)]
pub struct Asked {
    groups: BTreeMap<GroupId, AskedGroup>,
}

/// The references of a PollRequest to one group.
#[derive(Debug, Default)]
pub struct AskedGroup {
    /// A reference without ranges: the singleton `groupId`, or, for a sequenced group, all
    /// of it (a harmless superset, digest §2.4).
    pub whole: bool,
    /// The numbers asked about by ranges.
    pub ranges: RangeSet,
}

impl Asked {
    /// Linear in the references given (plus a sort of each group's ranges).
    pub fn new(refs: &[RefToMessageIds]) -> Asked {
        let mut collected: BTreeMap<&GroupId, (bool, Vec<SeqRange>)> = BTreeMap::new();
        for r in refs {
            let entry = collected.entry(&r.group_id).or_default();
            entry.0 |= r.ranges.is_empty();
            entry.1.extend_from_slice(&r.ranges);
        }
        let groups = collected
            .into_iter()
            .map(|(group_id, (whole, ranges))| {
                let ranges = RangeSet::from_ranges(ranges);
                (group_id.clone(), AskedGroup { whole, ranges })
            })
            .collect();
        Asked { groups }
    }

    /// The groups asked about, each once.
    pub fn group_ids(&self) -> impl Iterator<Item = &GroupId> {
        self.groups.keys()
    }

    pub fn groups(&self) -> impl Iterator<Item = (&GroupId, &AskedGroup)> {
        self.groups.iter()
    }
}

impl AskedGroup {
    /// The numbers asked about in a sequenced group.
    fn numbers(&self) -> std::borrow::Cow<'_, RangeSet> {
        if self.whole {
            std::borrow::Cow::Owned(RangeSet::from_ranges(SeqRange::new(0, u64::MAX)))
        } else {
            std::borrow::Cow::Borrowed(&self.ranges)
        }
    }

    /// Whether the message with this number (`None`: the singleton) is asked about.
    pub fn asks(&self, number: Option<u64>) -> bool {
        match number {
            None => self.whole,
            Some(n) => self.whole || self.ranges.contains(n),
        }
    }
}

/// A fault remembered for a message that left no group state (defective or refused on
/// arrival), for its sender's polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedFault {
    /// `None` for a singleton.
    pub number: Option<u64>,
    pub code: FaultCode,
}

/// Answers a PollRequest from stored group state: acks for delivered messages, faults for
/// faulted ones, nothing for unknown or buffered ones (D11); then the faults recorded for
/// messages that left no group state, unless the group state says the message was delivered.
///
/// Cost: per group asked, one merge walk of the asked ranges against the delivered ranges
/// (`RangeSet::intersection`) and one range lookup of the faults per asked range, so time and
/// memory are linear in the references plus the state read — never references × ranges. The
/// answer holds at most (asked ranges + delivered ranges + faults) statements per group.
pub fn answer_poll<'s>(
    asked: &Asked,
    state: impl Fn(&GroupId) -> Option<&'s GroupState>,
    recorded: impl Fn(&GroupId) -> &'s [RecordedFault],
) -> Replies {
    let mut replies = Replies::new();
    for (group_id, a) in asked.groups() {
        let state = state(group_id);
        if let Some(state) = state {
            if !state.params.sequenced {
                if a.whole {
                    if let Some(code) = state.faults.get(&0) {
                        replies.add(group_id, None, Some(*code));
                    } else if state.delivered.contains(0) {
                        replies.add(group_id, None, None);
                    }
                }
            } else {
                let numbers = a.numbers();
                for delivered in state.delivered.intersection(&numbers).ranges() {
                    replies.add_range(group_id, delivered, None);
                }
                for &(from, to) in numbers.pairs() {
                    for (n, code) in state.faults.range(from..=to) {
                        replies.add(group_id, Some(*n), Some(*code));
                    }
                }
            }
        }
        for f in recorded(group_id) {
            // What the group state says wins: a delivered message is acked.
            let slot = f.number.unwrap_or(0);
            if state.is_some_and(|s| s.delivered.contains(slot)) {
                continue;
            }
            if a.asks(f.number) {
                replies.add(group_id, f.number, Some(f.code));
            }
        }
    }
    replies
}

/// Whether a poll answer may go out: never cut short, because what an answer leaves out the
/// sender may take as "not held"; one that would make more than `max` statements is refused
/// (`InvalidPollRequest`, with this reason) so the sender asks about less.
pub fn answer_fits(answer: &Response, max: usize) -> Result<(), String> {
    let made = statements(answer);
    if made > max {
        return Err(format!(
            "the answer would make {made} statements, more than max_poll_references ({max}); \
             ask about fewer messages or narrower ranges"
        ));
    }
    Ok(())
}

/// How many statements (`NonSequenceReply`s and `ReplyRange`s) a Response makes: what
/// `max_poll_references` bounds in a Response we read, and in a poll answer we write.
pub fn statements(response: &Response) -> usize {
    response
        .replies
        .iter()
        .map(|r| match r {
            Reply::NonSequence { .. } => 1,
            Reply::Sequence { ranges, .. } => ranges.len(),
        })
        .sum()
}

/// The statements of a partner's Response, indexed per group, for applying them to our own
/// messages: what is said about one message is found by binary search, so applying an answer
/// costs O((statements + messages) · log statements), never statements × messages.
#[derive(Debug, Default)]
pub struct Verdicts {
    groups: BTreeMap<GroupId, GroupVerdicts>,
}

#[derive(Debug, Default)]
struct GroupVerdicts {
    /// What is said about the singleton: distinct verdicts, in the order first said.
    singleton: Vec<Option<FaultCode>>,
    /// Per distinct verdict (ack or fault code, at most eleven), in the order first said in
    /// this group, the numbers it is said of.
    ranges: Vec<(Option<FaultCode>, RangeSet)>,
    /// Every number something is said of.
    named: RangeSet,
}

impl Verdicts {
    pub fn new(replies: &[Reply]) -> Verdicts {
        type Said = (
            Vec<Option<FaultCode>>,
            Vec<(Option<FaultCode>, Vec<SeqRange>)>,
        );
        let mut collected: BTreeMap<&GroupId, Said> = BTreeMap::new();
        for reply in replies {
            match reply {
                Reply::NonSequence { group_id, fault } => {
                    let said = &mut collected.entry(group_id).or_default().0;
                    if !said.contains(fault) {
                        said.push(*fault);
                    }
                }
                Reply::Sequence { group_id, ranges } => {
                    let said = &mut collected.entry(group_id).or_default().1;
                    for r in ranges {
                        match said.iter_mut().find(|(fault, _)| *fault == r.fault) {
                            Some((_, list)) => list.push(r.range),
                            None => said.push((r.fault, vec![r.range])),
                        }
                    }
                }
            }
        }
        let groups = collected
            .into_iter()
            .map(|(group_id, (singleton, said))| {
                let named = RangeSet::from_ranges(said.iter().flat_map(|(_, l)| l.iter().copied()));
                let ranges = said
                    .into_iter()
                    .map(|(fault, list)| (fault, RangeSet::from_ranges(list)))
                    .collect();
                let verdicts = GroupVerdicts {
                    singleton,
                    ranges,
                    named,
                };
                (group_id.clone(), verdicts)
            })
            .collect();
        Verdicts { groups }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Per group: whether its singleton is named, and every number named (sorted, disjoint
    /// ranges) — what the store has to look up, each group once.
    pub fn named(&self) -> impl Iterator<Item = (&GroupId, bool, &RangeSet)> {
        self.groups
            .iter()
            .map(|(g, v)| (g, !v.singleton.is_empty(), &v.named))
    }

    /// What is said about `key`, in the order it is first said in its group: one verdict,
    /// unless the Response contradicts itself (then the first that changes the message's
    /// state decides, as when applying statements one by one).
    pub fn about(&self, key: &MessageKey) -> Vec<Option<FaultCode>> {
        let Some(v) = self.groups.get(&key.group_id) else {
            return Vec::new();
        };
        match key.number {
            None => v.singleton.clone(),
            Some(n) => v
                .ranges
                .iter()
                .filter(|(_, set)| set.contains(n))
                .map(|(fault, _)| *fault)
                .collect(),
        }
    }

    /// Whether anything is said about `key`.
    pub fn names(&self, key: &MessageKey) -> bool {
        self.groups
            .get(&key.group_id)
            .is_some_and(|v| match key.number {
                None => !v.singleton.is_empty(),
                Some(n) => v.named.contains(n),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::group::GroupParams;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn gid(s: &str) -> GroupId {
        GroupId::parse(s).expect("group")
    }

    fn group(id: &str, sequenced: bool, delivered: &[u64], faults: &[u64]) -> GroupState {
        let params = GroupParams {
            channel: "default".into(),
            sequenced,
            ack_requested: true,
            duplicate_elimination: true,
            message_order: false,
            limit: None,
        };
        let mut state = GroupState::new(gid(id), params, chrono::DateTime::UNIX_EPOCH);
        for &n in delivered {
            state.delivered.insert(n);
        }
        for &n in faults {
            state.faults.insert(n, FaultCode::InvalidExpiryTime);
        }
        state
    }

    type Said = BTreeSet<(String, Option<u64>, Option<FaultCode>)>;

    /// Every (group, number, verdict) a Response states, ranges expanded.
    fn said(response: Option<Response>) -> Said {
        let mut out = Said::new();
        for reply in response.map(|r| r.replies).unwrap_or_default() {
            match reply {
                Reply::NonSequence { group_id, fault } => {
                    out.insert((group_id.as_str().to_owned(), None, fault));
                }
                Reply::Sequence { group_id, ranges } => {
                    for r in ranges {
                        for n in r.range.from()..=r.range.to() {
                            out.insert((group_id.as_str().to_owned(), Some(n), r.fault));
                        }
                    }
                }
            }
        }
        out
    }

    /// The answer as D11 states it, one reference and one number at a time: the reference
    /// implementation the merge walk must agree with.
    fn naive_answer(
        refs: &[RefToMessageIds],
        groups: &[GroupState],
        recorded: &[(&str, RecordedFault)],
    ) -> Said {
        let mut out = Said::new();
        for r in refs {
            let g = r.group_id.as_str().to_owned();
            let asks = |n: Option<u64>| match n {
                None => r.ranges.is_empty(),
                Some(n) => r.ranges.is_empty() || r.ranges.iter().any(|q| q.contains(n)),
            };
            let state = groups.iter().find(|s| s.group_id == r.group_id);
            if let Some(s) = state {
                if s.params.sequenced {
                    for n in 0..64 {
                        if !asks(Some(n)) {
                            continue;
                        }
                        if let Some(code) = s.faults.get(&n) {
                            out.insert((g.clone(), Some(n), Some(*code)));
                        }
                        if s.delivered.contains(n) {
                            out.insert((g.clone(), Some(n), None));
                        }
                    }
                } else if asks(None) {
                    if let Some(code) = s.faults.get(&0) {
                        out.insert((g.clone(), None, Some(*code)));
                    } else if s.delivered.contains(0) {
                        out.insert((g.clone(), None, None));
                    }
                }
            }
            for (_, f) in recorded.iter().filter(|(id, _)| *id == g) {
                if state.is_some_and(|s| s.delivered.contains(f.number.unwrap_or(0))) {
                    continue;
                }
                if asks(f.number) {
                    out.insert((g.clone(), f.number, Some(f.code)));
                }
            }
        }
        out
    }

    fn answer(
        refs: &[RefToMessageIds],
        groups: &[GroupState],
        recorded: &[(&str, RecordedFault)],
    ) -> Replies {
        let asked = Asked::new(refs);
        let by_group: BTreeMap<&str, Vec<RecordedFault>> =
            recorded.iter().fold(BTreeMap::new(), |mut m, (g, f)| {
                m.entry(*g).or_insert_with(Vec::new).push(*f);
                m
            });
        answer_poll(
            &asked,
            |g| groups.iter().find(|s| &s.group_id == g),
            |g| by_group.get(g.as_str()).map_or(&[][..], Vec::as_slice),
        )
    }

    proptest! {
        /// The merge walk answers exactly what D11 says, reference by reference.
        #[test]
        fn poll_answer_matches_the_naive_one(
            delivered in proptest::collection::vec(0u64..64, 0..40),
            faults in proptest::collection::vec(0u64..64, 0..6),
            queries in proptest::collection::vec((0usize..3, proptest::option::of((0u64..64, 0u64..20))), 1..12),
            singleton_delivered in any::<bool>(),
            recorded_numbers in proptest::collection::vec(proptest::option::of(0u64..64), 0..5),
        ) {
            let faults: Vec<u64> = faults.into_iter().filter(|n| !delivered.contains(n)).collect();
            let groups = vec![
                group("mid:a", true, &delivered, &faults),
                group("mid:s", false, if singleton_delivered { &[0] } else { &[] }, &[]),
            ];
            let names = ["mid:a", "mid:s", "mid:unknown"];
            let mut refs: Vec<RefToMessageIds> = Vec::new();
            for (g, q) in queries {
                refs.push(RefToMessageIds {
                    group_id: gid(names[g]),
                    ranges: q.and_then(|(f, len)| SeqRange::new(f, f + len)).into_iter().collect(),
                });
            }
            let recorded: Vec<(&str, RecordedFault)> = recorded_numbers
                .iter()
                .enumerate()
                .map(|(i, &number)| (names[i % 3], RecordedFault { number, code: FaultCode::InvalidRequest }))
                .collect();
            let got = answer(&refs, &groups, &recorded).into_response();
            prop_assert_eq!(said(got), naive_answer(&refs, &groups, &recorded));
        }
    }

    /// Issue 12, item 4: 30 000 asked ranges against a group with 2 000 delivered ranges. The
    /// answer is collected with one statement per delivered range, not one per pair (60 000 000
    /// pairs, 2 GiB on commit 9982466), and says exactly the 2 000 ranges.
    #[test]
    fn a_poll_costs_its_references_plus_the_state_not_their_product() {
        let delivered: Vec<u64> = (0..2_000).map(|i| 2 * i).collect();
        let groups = vec![group("mid:amp", true, &delivered, &[])];
        let whole = SeqRange::new(0, u64::MAX).expect("range");
        let refs = vec![RefToMessageIds {
            group_id: gid("mid:amp"),
            ranges: vec![whole; 30_000],
        }];
        let replies = answer(&refs, &groups, &[]);
        assert!(
            replies.collected() <= 2_000 + 1,
            "{} statements collected",
            replies.collected()
        );
        let response = replies.into_response().expect("acks");
        assert_eq!(statements(&response), 2_000);
        // 30 000 references of one range each, disjoint, hostile order: bounded the same way.
        let refs: Vec<RefToMessageIds> = (0..30_000u64)
            .rev()
            .map(|i| RefToMessageIds {
                group_id: gid("mid:amp"),
                ranges: vec![SeqRange::single(i)],
            })
            .collect();
        let replies = answer(&refs, &groups, &[]);
        assert!(replies.collected() <= 2_000 + 30_000);
        let response = replies.into_response().expect("acks");
        assert_eq!(statements(&response), 2_000);
    }

    /// Applying a partner's answer: what it says of each message, found per message.
    #[test]
    fn verdicts_say_what_the_statements_say() {
        let replies = vec![
            Reply::Sequence {
                group_id: gid("mid:a"),
                ranges: vec![
                    ReplyRange {
                        range: SeqRange::new(0, 4).expect("r"),
                        fault: None,
                    },
                    ReplyRange {
                        range: SeqRange::single(9),
                        fault: Some(FaultCode::InvalidMessageId),
                    },
                    ReplyRange {
                        range: SeqRange::new(3, 9).expect("r"),
                        fault: None,
                    },
                ],
            },
            Reply::NonSequence {
                group_id: gid("mid:s"),
                fault: Some(FaultCode::GroupAborted),
            },
        ];
        let v = Verdicts::new(&replies);
        assert_eq!(v.about(&key("mid:a", Some(2))), vec![None]);
        assert_eq!(
            v.about(&key("mid:a", Some(9))),
            vec![None, Some(FaultCode::InvalidMessageId)]
        );
        assert!(v.about(&key("mid:a", Some(10))).is_empty());
        assert!(v.about(&key("mid:a", None)).is_empty());
        assert_eq!(
            v.about(&key("mid:s", None)),
            vec![Some(FaultCode::GroupAborted)]
        );
        assert!(v.names(&key("mid:a", Some(7))) && !v.names(&key("mid:b", Some(7))));
        let named: Vec<_> = v
            .named()
            .map(|(g, s, r)| (g.as_str(), s, r.pairs().to_vec()))
            .collect();
        assert_eq!(
            named,
            vec![("mid:a", false, vec![(0, 9)]), ("mid:s", true, vec![])]
        );
    }

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
