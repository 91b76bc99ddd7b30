//! A set of sequence numbers kept as sorted, disjoint, non-adjacent inclusive ranges: how a
//! group remembers which numbers were delivered without one entry per message.

use crate::wsr::SeqRange;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// (from, to) inclusive, sorted, disjoint, with gaps of at least one between them.
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Rebuilds a set from stored pairs; `None` unless they are sorted, disjoint and
    /// non-adjacent, as `pairs` produces them.
    pub fn from_pairs(pairs: Vec<(u64, u64)>) -> Option<RangeSet> {
        let ordered = pairs.iter().all(|&(from, to)| from <= to);
        let canonical = pairs
            .windows(2)
            .all(|w| w[0].1.checked_add(1).is_some_and(|next| next < w[1].0));
        (ordered && canonical).then_some(RangeSet { ranges: pairs })
    }

    pub fn pairs(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, n: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, to)| to < n);
        self.ranges.get(i).is_some_and(|&(from, _)| from <= n)
    }

    /// Adds one number; returns false if it was already there.
    pub fn insert(&mut self, n: u64) -> bool {
        if self.contains(n) {
            return false;
        }
        // The first range that ends at or after n - 1 (could absorb n from the left).
        let i = self
            .ranges
            .partition_point(|&(_, to)| to.saturating_add(1) < n);
        let joins_left = self
            .ranges
            .get(i)
            .is_some_and(|&(_, to)| to.saturating_add(1) == n);
        let right = if joins_left { i + 1 } else { i };
        let joins_right = self
            .ranges
            .get(right)
            .is_some_and(|&(from, _)| n.checked_add(1) == Some(from));
        match (joins_left, joins_right) {
            (true, true) => {
                self.ranges[i].1 = self.ranges[right].1;
                self.ranges.remove(right);
            }
            (true, false) => self.ranges[i].1 = n,
            (false, true) => self.ranges[right].0 = n,
            (false, false) => self.ranges.insert(i, (n, n)),
        }
        true
    }

    /// Whether every number of `0..=last` is in the set.
    pub fn covers_prefix(&self, last: u64) -> bool {
        self.ranges
            .first()
            .is_some_and(|&(from, to)| from == 0 && to >= last)
    }

    /// The ranges of the set that fall inside `query`, clipped to it.
    pub fn within(&self, query: SeqRange) -> Vec<SeqRange> {
        self.ranges
            .iter()
            .filter(|&&(from, to)| from <= query.to() && to >= query.from())
            .filter_map(|&(from, to)| SeqRange::new(from.max(query.from()), to.min(query.to())))
            .collect()
    }

    pub fn ranges(&self) -> impl Iterator<Item = SeqRange> + '_ {
        self.ranges
            .iter()
            .filter_map(|&(from, to)| SeqRange::new(from, to))
    }

    /// Number of values in the set (saturating).
    pub fn count(&self) -> u64 {
        self.ranges.iter().fold(0u64, |acc, &(from, to)| {
            acc.saturating_add(to - from).saturating_add(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn merges_neighbours() {
        let mut s = RangeSet::new();
        for n in [0, 2, 4, 1, 3] {
            assert!(s.insert(n));
        }
        assert!(!s.insert(2));
        assert_eq!(s.ranges, vec![(0, 4)]);
        assert!(s.covers_prefix(4));
        assert!(!s.covers_prefix(5));
        s.insert(u64::MAX);
        s.insert(u64::MAX - 1);
        assert_eq!(s.ranges, vec![(0, 4), (u64::MAX - 1, u64::MAX)]);
        assert_eq!(s.count(), 7);
    }

    proptest! {
        /// The set behaves exactly like a set of numbers, and stays canonical.
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec(0u64..64, 0..80), q in (0u64..64, 0u64..64)) {
            let mut s = RangeSet::new();
            let mut model = BTreeSet::new();
            for n in ops {
                prop_assert_eq!(s.insert(n), model.insert(n));
            }
            for n in 0..70 {
                prop_assert_eq!(s.contains(n), model.contains(&n));
            }
            for w in s.ranges.windows(2) {
                prop_assert!(w[0].1 + 1 < w[1].0, "canonical: {:?}", s.ranges);
            }
            let query = SeqRange::new(q.0.min(q.1), q.0.max(q.1)).expect("ordered");
            let inside: BTreeSet<u64> = s.within(query).iter().flat_map(|r| r.from()..=r.to()).collect();
            let expected: BTreeSet<u64> = model.range(query.from()..=query.to()).copied().collect();
            prop_assert_eq!(inside, expected);
            prop_assert_eq!(s.count(), model.len() as u64);
        }
    }
}
