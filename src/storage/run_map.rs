//! The mapped runs of one address range by offset, for [`MappedRuns`]' checks of
//! every map and unmap: a sorted vector while the runs are few, a B-tree once they
//! are many. The virtual pool's idle spans are found by their first granule the same
//! way (`pool::chunks`).
//!
//! A range usually holds a few hundred runs at most (the default layout's replays
//! of the shared traces stay within [`FEW_RUNS`]), and then a binary search over a
//! contiguous vector, with an insertion that moves a few KiB, costs less than the
//! B-tree's node scans and allocations: on transformer-train the default's replay
//! went from 1.29x to 1.23x `compact`'s time per event, on gpt2-train from 1.24x to
//! 1.20x (medians of 6 runs of `examples/replay_ab.rs` alternating the two builds).
//! An insertion moves the runs after it, though, so past [`FEW_RUNS`] runs the runs
//! move to a B-tree for good: in the steady state of `benches/peers.rs`
//! (`examples/default_calls.rs -- steady`) a vector alone took 1.85x the
//! instructions, this map 1.002x the B-tree's.
//!
//! [`MappedRuns`]: super::virtual_memory::MappedRuns

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

/// The most runs kept in a sorted vector (16 bytes each: moving half of them costs
/// about what a B-tree insertion does).
pub(crate) const FEW_RUNS: usize = 256;

/// Runs (offset, value: a size, or what else a run is known by) of one range, by
/// offset. Invariant: in `Few`, sorted by offset with distinct offsets and at most
/// [`FEW_RUNS`] long.
#[derive(Debug, Clone)]
pub(crate) enum RunMap<V: Copy = u64> {
    /// Few runs, sorted by offset.
    Few(Vec<(u64, V)>),
    /// Many runs.
    Many(BTreeMap<u64, V>),
}

impl<V: Copy> Default for RunMap<V> {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl RunMap {
    /// Records a run of `size` bytes at `offset` unless it overlaps a run (each
    /// run's value its size); returns whether it did. Where the runs are few, one
    /// search finds both the run before it and its place (no run starts in
    /// `[offset, offset + size)` when the last one starting before its end ends by
    /// `offset`).
    pub(crate) fn insert_clear(&mut self, offset: u64, size: u64) -> bool {
        let Some(end) = offset.checked_add(size) else {
            return false;
        };
        match self {
            Self::Few(runs) if runs.len() < FEW_RUNS => {
                let at = runs.partition_point(|&(start, _)| start < end);
                if at > 0 && runs[at - 1].0 + runs[at - 1].1 > offset {
                    return false;
                }
                runs.insert(at, (offset, size));
                true
            }
            _ => {
                if self
                    .last_before(end)
                    .is_some_and(|(start, length)| start + length > offset)
                {
                    return false;
                }
                self.insert(offset, size);
                true
            }
        }
    }
}

impl<V: Copy> RunMap<V> {
    /// The number of runs.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Few(runs) => runs.len(),
            Self::Many(runs) => runs.len(),
        }
    }

    /// The run starting last before `end`, as `(offset, value)`.
    #[inline]
    pub(crate) fn last_before(&self, end: u64) -> Option<(u64, V)> {
        match self {
            Self::Few(runs) => {
                let count = runs.partition_point(|&(start, _)| start < end);
                count.checked_sub(1).map(|last| runs[last])
            }
            Self::Many(runs) => runs
                .range(..end)
                .next_back()
                .map(|(&start, &size)| (start, size)),
        }
    }

    /// The value of the run at `offset`, if one starts there.
    #[inline]
    pub(crate) fn get(&self, offset: u64) -> Option<V> {
        match self {
            Self::Few(runs) => runs
                .binary_search_by_key(&offset, |&(start, _)| start)
                .ok()
                .map(|at| runs[at].1),
            Self::Many(runs) => runs.get(&offset).copied(),
        }
    }

    /// Records a run of `size` (its value) at `offset` (replacing one that starts
    /// there).
    pub(crate) fn insert(&mut self, offset: u64, size: V) {
        match self {
            Self::Few(runs) => match runs.binary_search_by_key(&offset, |&(start, _)| start) {
                Ok(at) => runs[at].1 = size,
                Err(_) if runs.len() >= FEW_RUNS => {
                    let mut many: BTreeMap<u64, V> = runs.drain(..).collect();
                    many.insert(offset, size);
                    *self = Self::Many(many);
                }
                Err(at) => runs.insert(at, (offset, size)),
            },
            Self::Many(runs) => {
                runs.insert(offset, size);
            }
        }
    }

    /// Forgets the run at `offset` if one starts there and `matches` its value (one
    /// search); returns the value forgotten.
    pub(crate) fn remove_if(&mut self, offset: u64, matches: impl FnOnce(V) -> bool) -> Option<V> {
        match self {
            Self::Few(runs) => {
                let at = runs
                    .binary_search_by_key(&offset, |&(start, _)| start)
                    .ok()?;
                matches(runs[at].1).then(|| runs.remove(at).1)
            }
            Self::Many(runs) => match runs.entry(offset) {
                Entry::Occupied(run) if matches(*run.get()) => Some(run.remove()),
                _ => None,
            },
        }
    }

    /// Moves the run at `offset` to `to`, where no run starts between the two (so
    /// the order of runs stays), with value `value`; does nothing if no run starts at
    /// `offset`.
    pub(crate) fn move_start(&mut self, offset: u64, to: u64, value: V) {
        match self {
            Self::Few(runs) => {
                if let Ok(at) = runs.binary_search_by_key(&offset, |&(start, _)| start) {
                    debug_assert!(runs.get(at + 1).is_none_or(|&(next, _)| next > to));
                    debug_assert!(at == 0 || runs[at - 1].0 < to);
                    runs[at] = (to, value);
                }
            }
            Self::Many(runs) => {
                if runs.remove(&offset).is_some() {
                    runs.insert(to, value);
                }
            }
        }
    }

    /// Forgets the run at `offset`; returns its value, if one started there.
    pub(crate) fn remove(&mut self, offset: u64) -> Option<V> {
        match self {
            Self::Few(runs) => runs
                .binary_search_by_key(&offset, |&(start, _)| start)
                .ok()
                .map(|at| runs.remove(at).1),
            Self::Many(runs) => runs.remove(&offset),
        }
    }

    /// Every run as `(offset, value)`, by offset.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        let (few, many) = match self {
            Self::Few(runs) => (Some(runs.iter().copied()), None),
            Self::Many(runs) => (None, Some(runs.iter().map(|(&start, &size)| (start, size)))),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// Every run as `(offset, value)`, by offset, consuming the map.
    pub(crate) fn into_vec(self) -> Vec<(u64, V)> {
        match self {
            Self::Few(runs) => runs,
            Self::Many(runs) => runs.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Past [`FEW_RUNS`] runs the map is a B-tree and answers as before.
    #[test]
    fn many_runs_move_to_a_btree() {
        let mut runs = RunMap::default();
        // Every other offset, descending, so each insertion lands first.
        for run in (0..=FEW_RUNS as u64).rev() {
            runs.insert(run * 2, 1);
        }
        assert!(matches!(runs, RunMap::Many(_)));
        assert_eq!(runs.last_before(7), Some((6, 1)));
        assert_eq!(runs.get(4), Some(1));
        assert_eq!(runs.get(5), None);
        runs.move_start(8, 9, 2);
        assert_eq!((runs.get(8), runs.get(9)), (None, Some(2)));
        runs.move_start(9, 8, 1);
        assert_eq!(runs.remove(4), Some(1));
        assert_eq!(runs.last_before(6), Some((2, 1)));
        assert_eq!(runs.iter().count(), FEW_RUNS);
        assert_eq!(runs.len(), FEW_RUNS);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// `insert_clear` and `remove_if` against a `BTreeMap` of runs checked by
        /// hand, past [`FEW_RUNS`] runs: a run is recorded exactly when it overlaps
        /// none, and removed exactly when its value matches.
        #[test]
        fn insert_clear_records_exactly_the_runs_that_fit(
            steps in prop::collection::vec((prop::bool::weighted(0.8), 0u64..1200, 1u64..4), 1..1500),
        ) {
            let (mut runs, mut model) = (RunMap::default(), BTreeMap::<u64, u64>::new());
            for (insert, offset, size) in steps {
                if insert {
                    let fits = model
                        .range(..offset + size)
                        .next_back()
                        .is_none_or(|(&start, &length)| start + length <= offset);
                    prop_assert_eq!(runs.insert_clear(offset, size), fits);
                    if fits {
                        model.insert(offset, size);
                    }
                } else {
                    let expected = model.get(&offset).copied().filter(|&length| length == size);
                    prop_assert_eq!(runs.remove_if(offset, |length| length == size), expected);
                    if expected.is_some() {
                        model.remove(&offset);
                    }
                }
                prop_assert_eq!(runs.len(), model.len());
            }
            prop_assert_eq!(runs.into_vec(), model.into_iter().collect::<Vec<_>>());
        }

        /// The same inserts and removes against a `RunMap` and a `BTreeMap`, past
        /// [`FEW_RUNS`] runs (seven steps in ten insert, so most long programs cross
        /// it): every query answers the same after every step.
        #[test]
        fn answers_as_a_btree_map(
            steps in prop::collection::vec((prop::bool::weighted(0.7), 0u64..400, 1u64..4), 1..1200),
        ) {
            let (mut runs, mut model) = (RunMap::default(), BTreeMap::new());
            for (insert, offset, size) in steps {
                if insert {
                    runs.insert(offset, size);
                    model.insert(offset, size);
                } else {
                    prop_assert_eq!(runs.remove(offset), model.remove(&offset));
                }
                prop_assert_eq!(runs.get(offset), model.get(&offset).copied());
                let end = offset + size;
                prop_assert_eq!(
                    runs.last_before(end),
                    model.range(..end).next_back().map(|(&o, &s)| (o, s))
                );
                prop_assert_eq!(runs.last_before(0), None);
                prop_assert_eq!(runs.len(), model.len());
                if let RunMap::Few(few) = &runs {
                    prop_assert!(few.len() <= FEW_RUNS);
                }
            }
            let all: Vec<(u64, u64)> = model.into_iter().collect();
            prop_assert_eq!(runs.iter().collect::<Vec<_>>(), all.clone());
            prop_assert_eq!(runs.into_vec(), all);
        }
    }
}
