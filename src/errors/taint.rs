//! The tainted byte ranges of one allocation.

use std::collections::BTreeMap;
use std::ops::Range;

use super::{FailureId, InvariantViolation};

/// The tainted regions of one allocation: disjoint byte ranges, each naming the failure
/// that left those bytes unwritten.
///
/// Tainting a range replaces whatever was there (the newest failure wins byte by byte);
/// [clearing](Taint::clear) a range (a write) removes the taint there. Ranges split where
/// a clear or a different failure cuts them, and adjacent ranges of the same failure
/// merge, so the ranges are always the coarsest description of the bytes. Every
/// operation costs O((k + 1) log n) for n ranges of which k are touched.
///
/// Reversed ranges (`start > end`) are treated as empty: the [`ErrorGraph`] rejects them
/// before they get here.
///
/// [`ErrorGraph`]: super::ErrorGraph
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taint {
    /// `start -> (end, failure)`. Invariants: `start < end`; disjoint (each `end` is at
    /// most the next `start`); two touching ranges (`end == next start`) name different
    /// failures (they would have been merged).
    ranges: BTreeMap<u64, (u64, FailureId)>,
    /// `failure -> tainted bytes`. Invariant: the sum of the lengths of the ranges naming
    /// the failure, and no entry is 0 (a failure with no range has no entry).
    bytes: BTreeMap<FailureId, u64>,
}

/// What one [`Taint::taint`] or [`Taint::clear`] changed in the set of failures the
/// allocation carries: the graph's carrier counts follow it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaintChange {
    /// The failure the allocation carries now and did not before the call.
    pub gained: Option<FailureId>,
    /// The failures the allocation carried before the call and no longer does (each once,
    /// ascending).
    pub lost: Vec<FailureId>,
}

impl Taint {
    /// An allocation with no tainted byte.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether no byte is tainted.
    pub fn is_clean(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The tainted ranges, in ascending order, each with its failure.
    pub fn ranges(&self) -> impl Iterator<Item = (Range<u64>, FailureId)> + '_ {
        self.ranges
            .iter()
            .map(|(&start, &(end, failure))| (start..end, failure))
    }

    /// The tainted parts of `range`, in ascending order, clipped to `range`.
    pub fn ranges_in(
        &self,
        range: Range<u64>,
    ) -> impl Iterator<Item = (Range<u64>, FailureId)> + '_ {
        let (start, end) = (range.start, range.end.max(range.start));
        let left = self
            .ranges
            .range(..start)
            .next_back()
            .filter(|&(_, &(e, _))| e > start && start < end)
            .map(move |(_, &(e, failure))| (start..e.min(end), failure));
        let rest = self
            .ranges
            .range(start..end)
            .map(move |(&s, &(e, failure))| (s..e.min(end), failure));
        left.into_iter().chain(rest)
    }

    /// The first (lowest) tainted part of `range`, clipped to `range`.
    pub fn first_in(&self, range: Range<u64>) -> Option<(Range<u64>, FailureId)> {
        self.ranges_in(range).next()
    }

    /// The distinct failures this allocation carries, ascending.
    pub fn failures(&self) -> impl ExactSizeIterator<Item = FailureId> + '_ {
        self.bytes.keys().copied()
    }

    /// Whether some byte names `failure`.
    pub fn carries(&self, failure: FailureId) -> bool {
        self.bytes.contains_key(&failure)
    }

    /// How many bytes name `failure`.
    pub fn bytes_of(&self, failure: FailureId) -> u64 {
        self.bytes.get(&failure).copied().unwrap_or(0)
    }

    /// How many bytes are tainted in all.
    pub fn tainted_bytes(&self) -> u64 {
        // Disjoint ranges of u64 offsets cannot add up past u64::MAX; saturate anyway.
        self.bytes.values().fold(0, |sum, &b| sum.saturating_add(b))
    }

    /// Taints `range` with `failure`, replacing any taint there, and merges it with
    /// touching ranges of the same failure. An empty range changes nothing.
    pub fn taint(&mut self, range: Range<u64>, failure: FailureId) -> TaintChange {
        let (start, end) = (range.start, range.end);
        if start >= end {
            return TaintChange::default();
        }
        let gained = (!self.carries(failure)).then_some(failure);
        let mut touched = Vec::new();
        self.remove_span(start, end, &mut touched);

        let mut new_start = start;
        let mut new_end = end;
        if let Some((&s, &(e, f))) = self.ranges.range(..start).next_back() {
            if e == start && f == failure {
                self.ranges.remove(&s);
                new_start = s;
            }
        }
        if let Some(&(e, f)) = self.ranges.get(&end) {
            if f == failure {
                self.ranges.remove(&end);
                new_end = e;
            }
        }
        self.ranges.insert(new_start, (new_end, failure));
        *self.bytes.entry(failure).or_insert(0) += end - start;

        TaintChange {
            gained,
            lost: self.lost_among(touched),
        }
    }

    /// Clears the taint in `range` (its bytes were written). An empty range changes
    /// nothing.
    pub fn clear(&mut self, range: Range<u64>) -> TaintChange {
        let mut touched = Vec::new();
        self.remove_span(range.start, range.end, &mut touched);
        TaintChange {
            gained: None,
            lost: self.lost_among(touched),
        }
    }

    /// Of the failures in `touched`, those no range names any more: sorted, deduplicated.
    fn lost_among(&self, mut touched: Vec<FailureId>) -> Vec<FailureId> {
        touched.retain(|f| !self.bytes.contains_key(f));
        touched.sort_unstable();
        touched.dedup();
        touched
    }

    /// Removes every tainted byte of `start..end`, splitting the ranges it cuts, and
    /// pushes the failures that lost bytes onto `touched`.
    fn remove_span(&mut self, start: u64, end: u64, touched: &mut Vec<FailureId>) {
        if start >= end {
            return;
        }
        // A range that begins before `start` and reaches into the span.
        if let Some((&s, &(e, f))) = self.ranges.range(..start).next_back() {
            if e > start {
                self.ranges.insert(s, (start, f));
                if e > end {
                    self.ranges.insert(end, (e, f));
                }
                self.sub_bytes(f, e.min(end) - start);
                touched.push(f);
            }
        }
        // Ranges that begin inside the span.
        while let Some((&s, &(e, f))) = self.ranges.range(start..end).next() {
            self.ranges.remove(&s);
            if e > end {
                self.ranges.insert(end, (e, f));
            }
            self.sub_bytes(f, e.min(end) - s);
            touched.push(f);
        }
    }

    /// Takes `n` bytes off `failure`'s count, dropping the entry at 0.
    fn sub_bytes(&mut self, failure: FailureId, n: u64) {
        if let Some(b) = self.bytes.get_mut(&failure) {
            debug_assert!(*b >= n, "taint byte count underflow");
            *b = b.saturating_sub(n);
            if *b == 0 {
                self.bytes.remove(&failure);
            }
        }
    }

    /// Checks every invariant written on the fields.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let mut counted: BTreeMap<FailureId, u64> = BTreeMap::new();
        let mut prev: Option<(u64, FailureId)> = None;
        for (&start, &(end, failure)) in &self.ranges {
            if start >= end {
                return Err(InvariantViolation(format!(
                    "empty or reversed taint range {start}..{end}"
                )));
            }
            if let Some((prev_end, prev_failure)) = prev {
                if prev_end > start {
                    return Err(InvariantViolation(format!(
                        "taint ranges overlap: one ends at {prev_end}, the next starts at {start}"
                    )));
                }
                if prev_end == start && prev_failure == failure {
                    return Err(InvariantViolation(format!(
                        "touching taint ranges of {failure} at {start} were not merged"
                    )));
                }
            }
            *counted.entry(failure).or_insert(0) += end - start;
            prev = Some((end, failure));
        }
        if counted != self.bytes {
            return Err(InvariantViolation(format!(
                "taint byte counts {:?} do not match the ranges {counted:?}",
                self.bytes
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(t: &Taint) -> Vec<(Range<u64>, FailureId)> {
        t.ranges().collect()
    }

    #[test]
    fn taint_splits_and_merges() {
        let (a, b) = (FailureId::mint(), FailureId::mint());
        let mut t = Taint::new();
        assert_eq!(
            t.taint(0..10, a),
            TaintChange {
                gained: Some(a),
                lost: vec![]
            }
        );
        // Touching ranges of the same failure merge, on either side.
        t.taint(10..20, a);
        t.taint(30..40, a);
        t.taint(20..30, a);
        assert_eq!(ranges(&t), vec![(0..40, a)]);
        // A different failure in the middle splits.
        let change = t.taint(15..25, b);
        assert_eq!(change.gained, Some(b));
        assert_eq!(ranges(&t), vec![(0..15, a), (15..25, b), (25..40, a)]);
        assert_eq!(t.bytes_of(a), 30);
        // Re-tainting b's range with a merges all three back.
        let change = t.taint(15..25, a);
        assert_eq!(
            change,
            TaintChange {
                gained: None,
                lost: vec![b]
            }
        );
        assert_eq!(ranges(&t), vec![(0..40, a)]);
        t.check_invariants().unwrap();
    }

    #[test]
    fn clear_splits_and_reports_losses() {
        let (a, b) = (FailureId::mint(), FailureId::mint());
        let mut t = Taint::new();
        t.taint(0..40, a);
        t.taint(50..60, b);
        assert!(t.clear(10..20).lost.is_empty());
        assert_eq!(ranges(&t), vec![(0..10, a), (20..40, a), (50..60, b)]);
        assert_eq!(t.clear(35..55).lost, vec![]);
        assert_eq!(ranges(&t), vec![(0..10, a), (20..35, a), (55..60, b)]);
        assert_eq!(t.clear(0..100).lost, vec![a, b]);
        assert!(t.is_clean());
        assert_eq!(t.tainted_bytes(), 0);
        t.check_invariants().unwrap();
    }

    #[test]
    fn queries_clip_to_the_range() {
        let (a, b) = (FailureId::mint(), FailureId::mint());
        let mut t = Taint::new();
        t.taint(10..20, a);
        t.taint(30..40, b);
        assert_eq!(t.first_in(0..10), None);
        assert_eq!(t.first_in(15..35), Some((15..20, a)));
        assert_eq!(t.first_in(25..35), Some((30..35, b)));
        assert_eq!(
            t.ranges_in(12..38).collect::<Vec<_>>(),
            vec![(12..20, a), (30..38, b)]
        );
        // Empty and reversed ranges find nothing and do nothing.
        assert_eq!(t.first_in(15..15), None);
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 18..12;
        assert_eq!(t.first_in(reversed.clone()), None);
        assert_eq!(t.clear(reversed.clone()), TaintChange::default());
        assert_eq!(t.taint(reversed, b), TaintChange::default());
        assert_eq!(t.tainted_bytes(), 20);
        t.check_invariants().unwrap();
    }
}
