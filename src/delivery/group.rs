//! `ordering = group` (DESIGN §5): messages of one WS-R group go to one member at a time, in
//! sequence order. The subscription keeps one head per group — the lowest offset of the group
//! still waiting or leased — and only a head may be handed out (`pick` also holds it back while
//! another message of its group is leased). These rules say where a group's head is.

use std::collections::BTreeMap;

use super::lease::Lease;

/// The head of a group once `offset` joins it (newly matched, or a replayed dead letter): the
/// lower of the two, so a group never skips back past what it already handed out.
pub fn head_with(current: Option<i64>, offset: i64) -> i64 {
    current.map_or(offset, |head| head.min(offset))
}

/// The first message of each group among messages newly matched in offset order: the head
/// each group gets unless it already has a lower one.
pub fn first_of_each<'a>(
    matched: impl IntoIterator<Item = (i64, &'a str)>,
) -> BTreeMap<&'a str, i64> {
    let mut firsts = BTreeMap::new();
    for (offset, group) in matched {
        firsts.entry(group).or_insert(offset);
    }
    firsts
}

/// What becomes of a group's head when the message at `settled` finished (settled or
/// dead-lettered). `head`: the group's head; `next_pending`: the group's lowest offset above
/// it that still waits or is leased. `None` keeps the head as it is; `Some(None)`: the group
/// has nothing pending (its head goes until a message arrives); `Some(Some(o))`: `o` is next.
pub fn after_finish(head: i64, settled: i64, next_pending: Option<i64>) -> Option<Option<i64>> {
    (head == settled).then_some(next_pending)
}

/// Whether a message still counts for its group's order (waiting or leased).
pub fn pending(lease: &Lease) -> bool {
    !lease.finished()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::lease::tests::{policy, t0};
    use crate::delivery::lease::{Outcome, State};

    #[test]
    fn a_group_hands_out_its_head_only_and_the_next_only_after_the_settle() {
        // Three messages of group g, one of h, matched in one pass.
        let firsts = first_of_each([(1, "g"), (2, "h"), (3, "g"), (4, "g")]);
        assert_eq!(firsts.get("g"), Some(&1));
        assert_eq!(firsts.get("h"), Some(&2));
        assert_eq!(head_with(None, 1), 1);
        // The head is leased; nothing else of g goes out (see pick's group_busy), and the head
        // stays while the lease is open.
        let mut head = Lease::new(t0());
        let attempt = head.acquire("A", t0(), &policy());
        assert!(pending(&head));
        assert_eq!(after_finish(1, 3, Some(3)), None, "another message settled");
        head.settle(attempt, "A", Outcome::Accepted, t0(), &policy(), None)
            .expect("live");
        assert_eq!(head.state, State::Done);
        assert!(!pending(&head));
        // Settled: the next pending message of the group becomes its head.
        assert_eq!(after_finish(1, 1, Some(3)), Some(Some(3)));
        assert_eq!(after_finish(4, 4, None), Some(None), "nothing left");
    }

    #[test]
    fn a_replayed_dead_letter_goes_before_the_current_head() {
        assert_eq!(head_with(Some(7), 3), 3);
        assert_eq!(head_with(Some(3), 7), 3);
    }
}
