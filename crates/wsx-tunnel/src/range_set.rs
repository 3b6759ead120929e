//! A set of `u64` values stored as disjoint, non-adjacent half-open ranges: received packet
//! numbers, acknowledged and lost stream offsets.

use std::collections::BTreeMap;
use std::ops::Range;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RangeSet {
    /// start -> end (exclusive); ranges never overlap or touch.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, value: u64) -> bool {
        self.map
            .range(..=value)
            .next_back()
            .is_some_and(|(_, &end)| value < end)
    }

    /// Adds `range`; returns whether any value in it was new.
    pub(crate) fn insert(&mut self, range: Range<u64>) -> bool {
        if range.is_empty() {
            return false;
        }
        let (mut start, mut end) = (range.start, range.end);
        // Merge with a range that starts before and reaches `start`.
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= end {
                return false;
            }
            if e >= start {
                start = s;
                self.map.remove(&s);
            }
        }
        // Absorb ranges that start inside [start, end].
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
        true
    }

    /// Removes `range` from the set.
    pub(crate) fn remove(&mut self, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..range.start).next_back() {
            if e > range.start {
                self.map.insert(s, range.start);
                if e > range.end {
                    self.map.insert(range.end, e);
                    return;
                }
            }
        }
        while let Some((&s, &e)) = self.map.range(range.start..range.end).next() {
            self.map.remove(&s);
            if e > range.end {
                self.map.insert(range.end, e);
                break;
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn min(&self) -> Option<u64> {
        self.map.keys().next().copied()
    }

    #[cfg(test)]
    pub(crate) fn max(&self) -> Option<u64> {
        self.map.values().next_back().map(|&end| end - 1)
    }

    /// The lowest range.
    pub(crate) fn first(&self) -> Option<Range<u64>> {
        self.map.iter().next().map(|(&s, &e)| s..e)
    }

    /// Removes and returns the lowest range.
    pub(crate) fn pop_first(&mut self) -> Option<Range<u64>> {
        self.map.pop_first().map(|(s, e)| s..e)
    }

    /// Drops the lowest ranges until at most `n` remain.
    pub(crate) fn keep_highest(&mut self, n: usize) {
        while self.map.len() > n {
            self.map.pop_first();
        }
    }

    /// Ranges in ascending order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = Range<u64>> + '_ {
        self.map.iter().map(|(&s, &e)| s..e)
    }

    /// The parts of `range` that are in the set, in ascending order.
    pub(crate) fn intersecting(&self, range: Range<u64>) -> impl Iterator<Item = Range<u64>> + '_ {
        let before = self
            .map
            .range(..range.start)
            .next_back()
            .map(|(&s, &e)| s..e);
        before
            .into_iter()
            .chain(self.map.range(range.start..range.end).map(|(&s, &e)| s..e))
            .filter_map(move |r| {
                let s = r.start.max(range.start);
                let e = r.end.min(range.end);
                (s < e).then_some(s..e)
            })
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn insert_merges_and_reports_novelty() {
        let mut set = RangeSet::new();
        assert!(set.insert(10..20));
        assert!(!set.insert(12..15));
        assert!(set.insert(20..25));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![10..25]);
        assert!(set.insert(0..5));
        assert!(set.insert(4..11));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0..25]);
        set.remove(5..7);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0..5, 7..25]);
        assert_eq!(set.intersecting(3..9).collect::<Vec<_>>(), vec![3..5, 7..9]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        (any::<bool>(), 0u64..200, 0u64..30).prop_map(|(ins, s, len)| {
            if ins {
                Op::Insert(s, s + len)
            } else {
                Op::Remove(s, s + len)
            }
        })
    }

    proptest! {
        /// The range set behaves exactly like a set of integers, and its ranges stay disjoint
        /// and non-adjacent.
        #[test]
        fn matches_a_plain_set(ops in proptest::collection::vec(op(), 0..60)) {
            let mut set = RangeSet::new();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(s, e) => {
                        let new = (s..e).any(|v| !model.contains(&v));
                        prop_assert_eq!(set.insert(s..e), new);
                        model.extend(s..e);
                    }
                    Op::Remove(s, e) => {
                        set.remove(s..e);
                        for v in s..e { model.remove(&v); }
                    }
                }
                let flat: BTreeSet<u64> = set.iter().flatten().collect();
                prop_assert_eq!(&flat, &model);
                let ranges: Vec<_> = set.iter().collect();
                for pair in ranges.windows(2) {
                    prop_assert!(pair[0].end < pair[1].start);
                }
                prop_assert_eq!(set.min(), model.first().copied());
                prop_assert_eq!(set.max(), model.last().copied());
                for v in 0..240 {
                    prop_assert_eq!(set.contains(v), model.contains(&v));
                }
                let window: Vec<u64> = set.intersecting(50..120).flatten().collect();
                let expected: Vec<u64> = model.range(50..120).copied().collect();
                prop_assert_eq!(window, expected);
            }
        }
    }
}
