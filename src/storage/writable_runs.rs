//! Which runs of a host address range were ever made readable and writable, so that a
//! map of a run that already is needs no call to the host.
//!
//! An unmapped run of host memory keeps its protection (`os_mapping`'s module doc): its
//! pages are dropped, but it stays writable until its range is released. A map of it
//! again would ask the host to make writable what is writable already: a system call
//! that changes nothing. Skipping it took the virtual pool's steady state on host
//! memory (`examples/peer_loops.rs steady virtual`, best of 3, six rounds, the builds
//! in turn) from 183.5-195.6 ns a step to 169.1-178.4, and its `mprotect` calls from
//! 26,821 to 4,494 over 300,000 steps and the set-up (`strace -c`).
//! The runs are kept as few intervals: a range's pool maps the same granules again and
//! again, so its writable runs soon merge into the span it uses.

/// The offsets of a range that are writable, as intervals. Invariant: the intervals
/// are sorted, non-empty, and neither overlap nor touch (touching ones are merged).
#[derive(Debug, Clone, Default)]
pub(crate) struct WritableRuns(Vec<(u64, u64)>);

impl WritableRuns {
    /// Whether every offset of `[start, end)` is writable (`start < end`).
    #[inline]
    pub(crate) fn cover(&self, start: u64, end: u64) -> bool {
        // The one interval that may hold `start`: the last that starts at or before it.
        let after = self.0.partition_point(|&(from, _)| from <= start);
        after > 0 && self.0[after - 1].1 >= end
    }

    /// Records `[start, end)` as writable (`start < end`), merging it with the
    /// intervals it overlaps or touches.
    pub(crate) fn add(&mut self, start: u64, end: u64) {
        let first = self.0.partition_point(|&(_, to)| to < start);
        let past = self.0.partition_point(|&(from, _)| from <= end);
        let (mut from, mut to) = (start, end);
        if first < past {
            from = from.min(self.0[first].0);
            to = to.max(self.0[past - 1].1);
        }
        self.0.splice(first..past, [(from, to)]);
    }

    /// Keeps only the offsets that `mapped` (sorted, disjoint `(offset, size)` runs)
    /// holds, and returns the rest as sorted, disjoint `(start, end)` intervals: the
    /// runs that are writable but mapped no more, which the caller makes inaccessible.
    pub(crate) fn keep_mapped(
        &mut self,
        mapped: impl IntoIterator<Item = (u64, u64)>,
    ) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut kept = WritableRuns::default();
        let mut mapped = mapped
            .into_iter()
            .map(|(offset, size)| (offset, offset + size));
        let mut run = mapped.next();
        for &(from, to) in &self.0 {
            let mut at = from;
            while at < to {
                // Skip the mapped runs that end by `at`.
                while run.is_some_and(|(_, end)| end <= at) {
                    run = mapped.next();
                }
                match run {
                    Some((start, end)) if start < to => {
                        if start > at {
                            gaps.push((at, start));
                        }
                        let (lo, hi) = (start.max(at), end.min(to));
                        kept.add(lo, hi);
                        at = hi;
                    }
                    _ => {
                        gaps.push((at, to));
                        at = to;
                    }
                }
            }
        }
        *self = kept;
        gaps
    }

    /// The number of intervals (for tests).
    #[cfg(test)]
    fn intervals(&self) -> usize {
        self.0.len()
    }

    /// Checks the invariant (for tests).
    #[cfg(test)]
    fn check(&self) -> Result<(), String> {
        for &(from, to) in &self.0 {
            if from >= to {
                return Err(format!("empty interval {from}..{to}"));
            }
        }
        for pair in self.0.windows(2) {
            if pair[0].1 >= pair[1].0 {
                return Err(format!("{:?} and {:?} overlap or touch", pair[0], pair[1]));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs added one after the other merge into one interval when they touch, and a
    /// run is covered only when every offset of it was added.
    #[test]
    fn touching_runs_merge_and_a_gap_is_not_covered() {
        let mut runs = WritableRuns::default();
        runs.add(10, 20);
        runs.add(30, 40);
        assert_eq!(runs.intervals(), 2);
        assert!(runs.cover(10, 20) && runs.cover(12, 18) && runs.cover(30, 40));
        assert!(!runs.cover(15, 35), "the gap 20..30 was never added");
        assert!(!runs.cover(0, 11) && !runs.cover(39, 41));
        runs.add(20, 30);
        assert_eq!(runs.intervals(), 1);
        assert!(runs.cover(10, 40));
    }

    proptest! {
        /// Against sets of offsets: after `keep_mapped`, an offset is writable exactly
        /// when it was writable and mapped, and the returned intervals are exactly the
        /// offsets that were writable and not mapped, sorted and disjoint.
        #[test]
        fn keep_mapped_leaves_the_mapped_and_returns_the_rest(
            added in prop::collection::vec((0u64..64, 1u64..16), 0..30),
            mapped_at in prop::collection::btree_set(0u64..80, 0..20),
            lengths in prop::collection::vec(1u64..6, 20),
        ) {
            let mut runs = WritableRuns::default();
            let mut writable = [false; 96];
            for (start, len) in added {
                runs.add(start, start + len);
                for offset in start..start + len {
                    writable[offset as usize] = true;
                }
            }
            // Disjoint sorted mapped runs from the chosen starts.
            let mut mapped = Vec::new();
            let mut is_mapped = [false; 96];
            let mut end = 0;
            for (start, len) in mapped_at.into_iter().zip(lengths) {
                if start >= end {
                    mapped.push((start, len));
                    for offset in start..start + len {
                        is_mapped[offset as usize] = true;
                    }
                    end = start + len;
                }
            }
            let gaps = runs.keep_mapped(mapped);
            prop_assert!(runs.check().is_ok(), "{:?}", runs.check());
            for pair in gaps.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "gaps {:?}", gaps);
            }
            for offset in 0..95u64 {
                let i = offset as usize;
                prop_assert_eq!(runs.cover(offset, offset + 1), writable[i] && is_mapped[i]);
                let in_gap = gaps.iter().any(|&(from, to)| (from..to).contains(&offset));
                prop_assert_eq!(in_gap, writable[i] && !is_mapped[i], "offset {}", offset);
            }
        }

        /// Against a set of offsets: after any runs are added, a run is covered exactly
        /// when each of its offsets was added, and the invariant holds.
        #[test]
        fn cover_is_exactly_the_offsets_added(
            added in prop::collection::vec((0u64..64, 1u64..16), 0..40),
            asked in prop::collection::vec((0u64..80, 1u64..20), 1..40),
        ) {
            let mut runs = WritableRuns::default();
            let mut offsets = [false; 96];
            for (start, len) in added {
                runs.add(start, start + len);
                prop_assert!(runs.check().is_ok(), "{:?}", runs.check());
                for offset in start..start + len {
                    offsets[offset as usize] = true;
                }
            }
            for (start, len) in asked {
                let expected = (start..start + len).all(|offset| offsets[offset as usize]);
                prop_assert_eq!(runs.cover(start, start + len), expected);
            }
        }
    }
}
