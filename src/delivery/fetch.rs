//! What one fetch hands out (DESIGN §3, §5): the store reads its candidates a page at a time
//! (`pick::Candidate`s in offset order, each with its group), and this decides, purely, what
//! the page gives the member — which of them it takes (`pick`), each one's lease as handed out
//! (`settle::hand`), the group it binds to the member, the receipt and the deadline — and
//! whether another page is worth reading. Each backend reads the pages and writes the plan;
//! it decides nothing of its own.

use chrono::{DateTime, Utc};

use super::lease::Lease;
use super::pick::{Candidate, Members, pick};
use super::receipt::Receipt;
use super::settle;
use super::subscription::Rules;

/// Pages of candidates one fetch looks through at most: candidates held back (by another
/// member's group affinity, or kept from this member) must not hide the ones after them, but
/// a fetch must not read a whole backlog of them either.
pub const CANDIDATE_PAGES: usize = 8;

/// How much one fetch may hand out: at most `max` messages and `max_bytes` bytes of payload.
/// A fetch that has handed out nothing yet takes its first message whatever its size when
/// `first_may_exceed` (a consumer must be able to take any message the gateway accepted);
/// a push worker with messages still in flight does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Take {
    pub max: usize,
    pub max_bytes: usize,
    pub first_may_exceed: bool,
}

impl Take {
    /// A consumer's fetch: at least one message, then up to the bounds.
    pub fn pull(max: usize, max_bytes: usize) -> Take {
        Take {
            max,
            max_bytes,
            first_may_exceed: true,
        }
    }
}

/// What a fetch has handed out so far, against its `Take`: the store asks it before it
/// writes each hand-out (it knows a message's size only once it has read it).
#[derive(Debug, Clone)]
pub struct Budget {
    take: Take,
    count: usize,
    bytes: usize,
}

impl Budget {
    pub fn new(take: Take) -> Budget {
        Budget {
            take,
            count: 0,
            bytes: 0,
        }
    }

    /// Whether a message of `size` bytes may be handed out next; if so, it is counted.
    pub fn admit(&mut self, size: usize) -> bool {
        let first = self.count == 0 && self.take.first_may_exceed;
        let fits = self.count < self.take.max
            && (first || self.bytes.saturating_add(size) <= self.take.max_bytes);
        if fits {
            self.count += 1;
            self.bytes = self.bytes.saturating_add(size);
        }
        fits
    }

    /// How many more messages a page may plan for.
    pub fn wanted(&self) -> usize {
        self.take.max.saturating_sub(self.count)
    }

    pub fn count(&self) -> usize {
        self.count
    }
}

/// How many candidates a page reads for a fetch of at most `max`: room for some held back.
pub fn page_size(max: usize) -> i64 {
    (max as i64).saturating_mul(4).saturating_add(32)
}

/// One message handed to the member: what the store writes, and what the fetch answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOut {
    pub offset: i64,
    /// The lease as handed out, to write back.
    pub lease: Lease,
    /// `ordering = group`: the group now bound to the member (its affinity), to write.
    pub binds_group: Option<String>,
    pub receipt: Receipt,
    /// When the lease ends; `None` in settle mode `settled`.
    pub deadline: Option<DateTime<Utc>>,
    /// Settled on sending and put straight back: the other members may take it now.
    pub released: bool,
}

/// What one page of `candidates` (with their `groups`, index for index) gives `members.me` of
/// subscription `subscription` under `rules`: at most `want` hand-outs, in offset order.
pub fn plan_page(
    subscription: i64,
    rules: &Rules,
    members: &Members<'_>,
    candidates: &[Candidate],
    groups: &[Option<String>],
    want: usize,
    now: DateTime<Utc>,
) -> Vec<HandOut> {
    pick(candidates, members, want, now)
        .into_iter()
        .filter_map(|i| {
            let candidate = candidates.get(i)?;
            let mut lease = candidate.lease.clone();
            let handing = settle::hand(rules, &mut lease, members.me, now);
            Some(HandOut {
                offset: candidate.offset,
                lease,
                binds_group: groups.get(i).cloned().flatten(),
                receipt: Receipt {
                    subscription: subscription.to_string(),
                    offset: candidate.offset,
                    attempt: handing.attempt,
                    consumer: members.me.to_owned(),
                },
                deadline: handing.deadline,
                released: handing.released,
            })
        })
        .collect()
}

/// Where the next page of candidates starts (after which offset), or `None`: the fetch has
/// `max` (`handed` so far), or this page of `page` was the last there is.
pub fn next_page(candidates: &[Candidate], page: i64, handed: usize, max: usize) -> Option<i64> {
    match candidates.last() {
        Some(last) if handed < max && candidates.len() as i64 == page => Some(last.offset),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use chrono::Duration;

    use super::*;
    use crate::delivery::lease::State;
    use crate::delivery::lease::tests::t0;
    use crate::delivery::subscription::{DefaultOutcome, Mode, Ordering, SettleMode};

    fn rules(settle_mode: SettleMode, default_outcome: DefaultOutcome) -> Rules {
        Rules {
            mode: Mode::Pull,
            settle_mode,
            default_outcome,
            ack_wait_ms: 30_000,
            max_deliveries: 2,
            backoff_ms: vec![1_000],
            ordering: Ordering::Group,
            durable: true,
        }
    }

    fn candidate(offset: i64) -> Candidate {
        Candidate {
            offset,
            lease: Lease::new(t0()),
            affinity: None,
            group_busy: false,
        }
    }

    fn live() -> BTreeSet<String> {
        ["A".to_owned(), "B".to_owned()].into()
    }

    fn members(live: &BTreeSet<String>) -> Members<'_> {
        Members {
            me: "A",
            live,
            strict_avoid: false,
        }
    }

    #[test]
    fn page_size_leaves_room_for_candidates_held_back() {
        assert_eq!(page_size(1), 36);
        assert_eq!(page_size(10), 72);
        assert_eq!(page_size(1000), 4032);
    }

    #[test]
    fn a_page_hands_out_leases_with_receipts_deadlines_and_groups() {
        let live = live();
        let candidates = [candidate(3), candidate(5)];
        let groups = [Some("g1".to_owned()), None];
        let r = rules(SettleMode::Unsettled, DefaultOutcome::Accepted);
        let plan = plan_page(9, &r, &members(&live), &candidates, &groups, 10, t0());
        assert_eq!(plan.len(), 2);
        let first = &plan[0];
        assert_eq!(first.offset, 3);
        assert_eq!(
            first.receipt,
            Receipt {
                subscription: "9".into(),
                offset: 3,
                attempt: 1,
                consumer: "A".into(),
            }
        );
        assert_eq!(first.deadline, Some(t0() + Duration::milliseconds(30_000)));
        assert!(matches!(first.lease.state, State::Acquired { .. }));
        assert_eq!(first.binds_group.as_deref(), Some("g1"));
        assert!(!first.released);
        // Without a group, nothing is bound.
        assert_eq!(plan[1].offset, 5);
        assert_eq!(plan[1].binds_group, None);
    }

    #[test]
    fn a_page_hands_out_no_more_than_wanted_and_only_what_pick_chooses() {
        let live = live();
        let mut busy = candidate(4);
        busy.group_busy = true;
        let mut bound_elsewhere = candidate(6);
        bound_elsewhere.affinity = Some("B".into());
        let candidates = [
            candidate(2),
            busy,
            bound_elsewhere,
            candidate(8),
            candidate(9),
        ];
        let groups = [None, None, None, None, None];
        let r = rules(SettleMode::Unsettled, DefaultOutcome::Accepted);
        let plan = plan_page(1, &r, &members(&live), &candidates, &groups, 2, t0());
        let offsets: Vec<i64> = plan.iter().map(|h| h.offset).collect();
        assert_eq!(offsets, [2, 8]);
        assert!(plan_page(1, &r, &members(&live), &candidates, &groups, 0, t0()).is_empty());
    }

    #[test]
    fn settled_mode_hands_out_without_deadline_and_may_release_at_once() {
        let live = live();
        let candidates = [candidate(1)];
        let groups = [None];
        let accepted = rules(SettleMode::Settled, DefaultOutcome::Accepted);
        let plan = plan_page(1, &accepted, &members(&live), &candidates, &groups, 1, t0());
        assert_eq!(plan[0].deadline, None);
        assert!(!plan[0].released);
        let released = rules(SettleMode::Settled, DefaultOutcome::Released);
        let plan = plan_page(1, &released, &members(&live), &candidates, &groups, 1, t0());
        assert_eq!(plan[0].deadline, None);
        assert!(plan[0].released);
        assert!(matches!(plan[0].lease.state, State::Available { .. }));
    }

    #[test]
    fn a_budget_takes_the_first_message_whatever_its_size_then_only_what_fits() {
        let mut pull = Budget::new(Take::pull(3, 100));
        assert!(pull.admit(500), "a consumer can always take one message");
        assert!(!pull.admit(1), "then nothing beyond the bytes");
        assert_eq!((pull.count(), pull.wanted()), (1, 2));

        let mut small = Budget::new(Take::pull(3, 100));
        assert!(small.admit(40) && small.admit(60));
        assert!(!small.admit(1), "100 bytes handed out");
        let mut counted = Budget::new(Take::pull(2, 1000));
        assert!(counted.admit(1) && counted.admit(1));
        assert!(!counted.admit(1), "max reached");

        // A push worker with posts in flight takes nothing that would exceed its bytes.
        let mut push = Budget::new(Take {
            max: 5,
            max_bytes: 10,
            first_may_exceed: false,
        });
        assert!(!push.admit(11));
        assert!(push.admit(10));
        assert_eq!(push.count(), 1);
    }

    #[test]
    fn next_page_only_while_wanting_more_and_the_page_was_full() {
        let full = [candidate(3), candidate(7)];
        assert_eq!(next_page(&full, 2, 0, 5), Some(7));
        // Enough handed out.
        assert_eq!(next_page(&full, 2, 5, 5), None);
        // A short page was the last there is.
        assert_eq!(next_page(&full[..1], 2, 0, 5), None);
        assert_eq!(next_page(&[], 2, 0, 5), None);
    }
}
