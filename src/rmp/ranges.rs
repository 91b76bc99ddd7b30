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

    /// The set of the numbers of `ranges` (in any order, overlapping or not): one sort and
    /// one pass, so its cost is `O(n log n)` in the number of ranges given and its size at
    /// most that number.
    pub fn from_ranges(ranges: impl IntoIterator<Item = SeqRange>) -> RangeSet {
        let mut pairs: Vec<(u64, u64)> = ranges.into_iter().map(|r| (r.from(), r.to())).collect();
        pairs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(pairs.len());
        for (from, to) in pairs {
            match merged.last_mut() {
                // Overlapping or adjacent (`prev.1 + 1 >= from`, without overflow).
                Some(prev) if prev.1 >= from.saturating_sub(1) => prev.1 = prev.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        RangeSet { ranges: merged }
    }

    /// The numbers in both sets, in one merge pass over the two sorted lists: at most
    /// `self.len() + other.len()` steps, and never more ranges than that.
    pub fn intersection(&self, other: &RangeSet) -> RangeSet {
        self.intersection_counted(other).0
    }

    /// `intersection`, and the number of steps the walk took (for tests of its cost).
    pub fn intersection_counted(&self, other: &RangeSet) -> (RangeSet, usize) {
        let (a, b) = (&self.ranges, &other.ranges);
        let (mut i, mut j, mut steps) = (0, 0, 0);
        let mut out = Vec::new();
        while let (Some(&(af, at)), Some(&(bf, bt))) = (a.get(i), b.get(j)) {
            steps += 1;
            let (from, to) = (af.max(bf), at.min(bt));
            if from <= to {
                out.push((from, to));
            }
            // The range that ends first cannot meet anything further on the other side.
            if at < bt {
                i += 1;
            } else {
                j += 1;
            }
        }
        // Pieces of two canonical sets are disjoint, sorted and never adjacent: each piece
        // lies in one range of each set, and a gap of either set separates any two.
        (RangeSet { ranges: out }, steps)
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
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

    fn numbers(s: &RangeSet) -> BTreeSet<u64> {
        s.ranges.iter().flat_map(|&(f, t)| f..=t).collect()
    }

    fn canonical(s: &RangeSet) -> bool {
        RangeSet::from_pairs(s.ranges.clone()).is_some()
    }

    /// The shape of the PollRequest amplification (issue 12, item 4): 30 000 asked ranges
    /// against 2 000 delivered ones. The walk takes at most one step per range of either side
    /// and answers at most that many ranges (a cross product was 60 000 000 pairs).
    #[test]
    fn intersection_is_one_merge_pass() {
        let delivered = RangeSet::from_ranges((0..2_000u64).map(|i| SeqRange::single(2 * i)));
        assert_eq!(delivered.len(), 2_000);
        // Overlapping, all covering the whole group, in a hostile order.
        let whole = (0..30_000u64).map(|i| SeqRange::new(i % 3, u64::MAX - i).expect("range"));
        let asked = RangeSet::from_ranges(whole);
        assert_eq!(asked.len(), 1);
        let (both, steps) = delivered.intersection_counted(&asked);
        assert_eq!(both, delivered);
        assert!(steps <= delivered.len() + asked.len(), "{steps} steps");
        // Disjoint asked ranges, each meeting a delivered one: still linear.
        let asked = RangeSet::from_ranges((0..30_000u64).map(|i| SeqRange::single(3 * i)));
        assert_eq!(asked.len(), 30_000);
        let (both, steps) = delivered.intersection_counted(&asked);
        assert!(steps <= delivered.len() + asked.len(), "{steps} steps");
        assert_eq!(both.len(), 667, "multiples of 6 below 4000");
    }

    proptest! {
        /// `from_ranges` is the union of its ranges, canonical; `intersection` is the
        /// intersection, canonical, in at most one step per range of either set.
        #[test]
        fn union_and_intersection_match_sets(
            a in proptest::collection::vec((0u64..80, 0u64..6), 0..25),
            b in proptest::collection::vec((0u64..80, 0u64..6), 0..25),
        ) {
            let to_ranges = |v: &[(u64, u64)]| -> Vec<SeqRange> {
                v.iter().filter_map(|&(f, len)| SeqRange::new(f, f + len)).collect()
            };
            let (ra, rb) = (to_ranges(&a), to_ranges(&b));
            let model = |rs: &[SeqRange]| -> BTreeSet<u64> {
                rs.iter().flat_map(|r| r.from()..=r.to()).collect()
            };
            let (sa, sb) = (RangeSet::from_ranges(ra.clone()), RangeSet::from_ranges(rb.clone()));
            prop_assert!(canonical(&sa) && canonical(&sb));
            prop_assert!(sa.len() <= ra.len());
            prop_assert_eq!(numbers(&sa), model(&ra));
            let (both, steps) = sa.intersection_counted(&sb);
            prop_assert!(canonical(&both), "{:?}", both);
            prop_assert!(steps <= sa.len() + sb.len());
            prop_assert!(both.len() <= sa.len() + sb.len());
            let expected: BTreeSet<u64> = model(&ra).intersection(&model(&rb)).copied().collect();
            prop_assert_eq!(numbers(&both), expected);
        }

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
