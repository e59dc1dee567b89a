//! The mapped runs of one address range by offset, for [`MappedRuns`]' checks of
//! every map and unmap: a sorted vector while the runs are few, sorted leaves once they
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
//! move for good to sorted leaves of at most [`LEAF_RUNS`] runs each, found by a
//! binary search of the leaves' first offsets ([`Leaves`]): one search of each level
//! and a move of at most one leaf's runs per call, where the B-tree this replaced
//! walked its nodes key by key, three times for a checked map (both ends of a range
//! query, then the insertion). In the steady state of `benches/peers.rs` a checked
//! map took 680 instructions in the B-tree and takes 265 in the leaves, a checked
//! unmap 377 and 263 (callgrind of `examples/peer_loops.rs --no-bytes steady virtual
//! 120000`, inclusive per call). Leaves of 32, 64 or 128 runs cost the steady state
//! and the replays of large-tensors, conv-dynamic x128 and seq2seq-train x128 within
//! 1.4 % of each other, and a move to leaves at 64, 128 or 256 runs the same and
//! those of gpt2-train, transformer-train and lstm-train x128 within 0.9 %.
//!
//! [`MappedRuns`]: super::virtual_memory::MappedRuns

/// The most runs kept in a sorted vector (16 bytes each), before they move to
/// [`Leaves`] (64 and 128 cost the same, see the module doc).
pub(crate) const FEW_RUNS: usize = 256;

/// The most runs of one leaf of [`Leaves`] (1 KiB of `u64` runs): a leaf past it
/// splits in two halves.
const LEAF_RUNS: usize = 64;

/// Runs (offset, value: a size, or what else a run is known by) of one range, by
/// offset. Invariant: in `Few`, sorted by offset with distinct offsets and at most
/// [`FEW_RUNS`] long.
#[derive(Debug, Clone)]
pub(crate) enum RunMap<V: Copy = u64> {
    /// Few runs, sorted by offset.
    Few(Vec<(u64, V)>),
    /// Many runs.
    Many(Leaves<V>),
}

impl<V: Copy> Default for RunMap<V> {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl RunMap {
    /// Records a run of `size` bytes at `offset` unless it is empty or overlaps a
    /// run (each run's value its size); returns whether it did. One search (of each
    /// level, where the runs are many) finds both the run before it and its place (no
    /// run starts in `[offset, offset + size)` when the last one starting before its
    /// end ends by `offset`; an empty run would miss one starting at `offset`).
    pub(crate) fn insert_clear(&mut self, offset: u64, size: u64) -> bool {
        let Some(end) = offset.checked_add(size).filter(|_| size > 0) else {
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
            Self::Few(_) => {
                // Full: the insertion moves the runs to leaves.
                if self
                    .last_before(end)
                    .is_some_and(|(start, length)| start + length > offset)
                {
                    return false;
                }
                self.insert(offset, size);
                true
            }
            Self::Many(runs) => runs.insert_clear(offset, size, end),
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
            Self::Many(runs) => runs.last_before(end),
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
            Self::Many(runs) => runs.get(offset),
        }
    }

    /// Records a run of `size` (its value) at `offset` (replacing one that starts
    /// there).
    pub(crate) fn insert(&mut self, offset: u64, size: V) {
        match self {
            Self::Few(runs) => match runs.binary_search_by_key(&offset, |&(start, _)| start) {
                Ok(at) => runs[at].1 = size,
                Err(_) if runs.len() >= FEW_RUNS => {
                    let mut many = Leaves::from_sorted(std::mem::take(runs));
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
            Self::Many(runs) => runs.remove_if(offset, matches),
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
            Self::Many(runs) => runs.move_start(offset, to, value),
        }
    }

    /// Forgets the run at `offset`; returns its value, if one started there.
    pub(crate) fn remove(&mut self, offset: u64) -> Option<V> {
        match self {
            Self::Few(runs) => runs
                .binary_search_by_key(&offset, |&(start, _)| start)
                .ok()
                .map(|at| runs.remove(at).1),
            Self::Many(runs) => runs.remove_if(offset, |_| true),
        }
    }

    /// Every run as `(offset, value)`, by offset.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        let (few, many) = match self {
            Self::Few(runs) => (Some(runs.iter().copied()), None),
            Self::Many(runs) => (None, Some(runs.leaves.iter().flatten().copied())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// Every run as `(offset, value)`, by offset, consuming the map.
    pub(crate) fn into_vec(self) -> Vec<(u64, V)> {
        match self {
            Self::Few(runs) => runs,
            Self::Many(runs) => runs.leaves.concat(),
        }
    }
}

impl Leaves<u64> {
    /// [`RunMap::insert_clear`] of a non-empty run `[offset, end)` with one search
    /// of each level: the last run starting before `end`, found in the last leaf
    /// starting before `end`, is both the run to check against and the one the run
    /// goes right after.
    fn insert_clear(&mut self, offset: u64, size: u64, end: u64) -> bool {
        // Where no run starts before `end`, the run goes first into the first leaf.
        let Some((leaf, at)) = self.last_place_before(end) else {
            self.insert(offset, size);
            return true;
        };
        let runs = &mut self.leaves[leaf];
        let (start, length) = runs[at];
        if start + length > offset {
            return false;
        }
        // No run starts in `[offset, end)`, so the run goes right after the last one
        // starting before `end`.
        runs.insert(at + 1, (offset, size));
        self.len += 1;
        self.split_full(leaf);
        true
    }
}

/// Many runs by offset, in sorted leaves: a two-level sorted vector. A call finds
/// its leaf by a binary search of the leaves' first offsets, then its run by one of
/// the leaf, and moves at most the runs after it in that leaf (a leaf's runs are
/// contiguous, so the move is one `memmove` of at most [`LEAF_RUNS`] runs); a leaf
/// that fills splits in two, and one that empties goes (or, nearly empty, joins a
/// neighbour), each moving the leaves after it (a pointer and an offset each): a
/// leaf splits only after at least [`LEAF_RUNS`] / 2 insertions into it since it
/// was made, and each merge undoes a split or the making of a leaf (when the runs
/// moved here, or into no leaf).
///
/// Invariant: every leaf is non-empty, sorted by offset with distinct offsets, and at
/// most [`LEAF_RUNS`] long; every run of a leaf lies before every run of the next;
/// `firsts[i]` is the offset of `leaves[i]`'s first run; `len` counts the runs.
#[derive(Debug, Clone)]
pub(crate) struct Leaves<V: Copy> {
    firsts: Vec<u64>,
    leaves: Vec<Vec<(u64, V)>>,
    len: usize,
}

impl<V: Copy> Leaves<V> {
    /// The leaves of `runs` (sorted by offset, distinct offsets), half full each, so
    /// that insertions fill them before any splits.
    fn from_sorted(runs: Vec<(u64, V)>) -> Self {
        let len = runs.len();
        let leaves: Vec<Vec<(u64, V)>> = runs
            .chunks(LEAF_RUNS / 2)
            .map(|leaf| {
                let mut owned = Vec::with_capacity(LEAF_RUNS + 1);
                owned.extend_from_slice(leaf);
                owned
            })
            .collect();
        let firsts = leaves.iter().map(|leaf| leaf[0].0).collect();
        Self {
            firsts,
            leaves,
            len,
        }
    }

    /// The index of the leaf whose runs may hold `offset`: the last whose first
    /// offset is at most it, or the first leaf; `None` when there is no leaf.
    #[inline]
    fn leaf_of(&self, offset: u64) -> Option<usize> {
        if self.leaves.is_empty() {
            return None;
        }
        Some(
            self.firsts
                .partition_point(|&first| first <= offset)
                .saturating_sub(1),
        )
    }

    /// The number of runs.
    fn len(&self) -> usize {
        self.len
    }

    /// Where the run starting last before `end` is, as (leaf, place in it): in the
    /// last leaf starting before `end` (its first run does, so the search in it finds
    /// one; every run starting before `end` is in it or before it).
    #[inline]
    fn last_place_before(&self, end: u64) -> Option<(usize, usize)> {
        let leaf = self
            .firsts
            .partition_point(|&first| first < end)
            .checked_sub(1)?;
        let count = self.leaves[leaf].partition_point(|&(start, _)| start < end);
        Some((leaf, count - 1))
    }

    /// The run starting last before `end`, as `(offset, value)`.
    #[inline]
    fn last_before(&self, end: u64) -> Option<(u64, V)> {
        let (leaf, at) = self.last_place_before(end)?;
        Some(self.leaves[leaf][at])
    }

    /// The value of the run at `offset`, if one starts there.
    #[inline]
    fn get(&self, offset: u64) -> Option<V> {
        let runs = &self.leaves[self.leaf_of(offset)?];
        runs.binary_search_by_key(&offset, |&(start, _)| start)
            .ok()
            .map(|at| runs[at].1)
    }

    /// Splits leaf `leaf` in two halves if it holds more than [`LEAF_RUNS`] runs.
    #[inline]
    fn split_full(&mut self, leaf: usize) {
        let runs = &mut self.leaves[leaf];
        if runs.len() > LEAF_RUNS {
            let mut upper = Vec::with_capacity(LEAF_RUNS + 1);
            upper.extend_from_slice(&runs[LEAF_RUNS / 2..]);
            runs.truncate(LEAF_RUNS / 2);
            self.firsts.insert(leaf + 1, upper[0].0);
            self.leaves.insert(leaf + 1, upper);
        }
    }

    /// Records a run with `value` at `offset` (replacing one that starts there).
    fn insert(&mut self, offset: u64, value: V) {
        let Some(leaf) = self.leaf_of(offset) else {
            self.firsts.push(offset);
            self.leaves.push(vec![(offset, value)]);
            self.len = 1;
            return;
        };
        let runs = &mut self.leaves[leaf];
        let at = match runs.binary_search_by_key(&offset, |&(start, _)| start) {
            Ok(at) => {
                runs[at].1 = value;
                return;
            }
            Err(at) => at,
        };
        runs.insert(at, (offset, value));
        self.len += 1;
        if at == 0 {
            // Only the first leaf takes a run before its first.
            self.firsts[leaf] = offset;
        }
        self.split_full(leaf);
    }

    /// Forgets the run at `offset` if one starts there and `matches` its value;
    /// returns the value forgotten.
    fn remove_if(&mut self, offset: u64, matches: impl FnOnce(V) -> bool) -> Option<V> {
        let leaf = self.leaf_of(offset)?;
        let runs = &mut self.leaves[leaf];
        let at = runs
            .binary_search_by_key(&offset, |&(start, _)| start)
            .ok()?;
        if !matches(runs[at].1) {
            return None;
        }
        let (_, value) = runs.remove(at);
        self.len -= 1;
        if runs.is_empty() {
            self.firsts.remove(leaf);
            self.leaves.remove(leaf);
        } else {
            if at == 0 {
                self.firsts[leaf] = runs[0].0;
            }
            self.merge_small(leaf);
        }
        Some(value)
    }

    /// Merges leaf `leaf`, when a removal left it with at most a quarter of
    /// [`LEAF_RUNS`], into a neighbour with which it holds at most half, so that a
    /// nearly empty leaf does not stay where a neighbour has room for its runs (one
    /// between two fuller leaves stays); a merged leaf has room for at least half of
    /// [`LEAF_RUNS`] insertions before it splits again.
    #[inline]
    fn merge_small(&mut self, leaf: usize) {
        let len = self.leaves[leaf].len();
        if len > LEAF_RUNS / 4 {
            return;
        }
        let into = if leaf > 0 && self.leaves[leaf - 1].len() + len <= LEAF_RUNS / 2 {
            leaf - 1
        } else if self
            .leaves
            .get(leaf + 1)
            .is_some_and(|next| next.len() + len <= LEAF_RUNS / 2)
        {
            leaf
        } else {
            return;
        };
        // Leaf `into + 1` joins leaf `into`: its runs all lie after those.
        let after = self.leaves.remove(into + 1);
        self.firsts.remove(into + 1);
        self.leaves[into].extend_from_slice(&after);
    }

    /// Moves the run at `offset` to `to` (no run starts between the two), with
    /// `value`; does nothing if no run starts at `offset`.
    fn move_start(&mut self, offset: u64, to: u64, value: V) {
        let Some(leaf) = self.leaf_of(offset) else {
            return;
        };
        let runs = &mut self.leaves[leaf];
        let Ok(at) = runs.binary_search_by_key(&offset, |&(start, _)| start) else {
            return;
        };
        runs[at] = (to, value);
        if at == 0 {
            self.firsts[leaf] = to;
        }
        // No run starts between `offset` and `to`, so the run keeps its place among
        // the runs, and so among the leaves.
        debug_assert!(leaf == 0 || self.leaves[leaf - 1].last().is_some_and(|&(s, _)| s < to));
        debug_assert!(self.leaves.get(leaf + 1).is_none_or(|next| next[0].0 > to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    impl<V: Copy> Leaves<V> {
        /// Checks the invariant of [`Leaves`].
        fn check(&self) {
            assert_eq!(self.firsts.len(), self.leaves.len());
            assert_eq!(self.len, self.leaves.iter().map(Vec::len).sum::<usize>());
            let mut last = None;
            for (first, runs) in self.firsts.iter().zip(&self.leaves) {
                assert!(!runs.is_empty() && runs.len() <= LEAF_RUNS);
                assert_eq!(*first, runs[0].0);
                for &(start, _) in runs {
                    assert!(last.is_none_or(|last| last < start), "runs out of order");
                    last = Some(start);
                }
            }
        }
    }

    /// Checks the invariant of a map's leaves, where it has them.
    fn check(runs: &RunMap) {
        if let RunMap::Many(leaves) = runs {
            leaves.check();
        }
    }

    /// Past [`FEW_RUNS`] runs the map moves to sorted leaves and answers as before.
    #[test]
    fn many_runs_move_to_leaves() {
        let mut runs = RunMap::default();
        // Every other offset, descending, so each insertion lands first.
        for run in (0..=FEW_RUNS as u64).rev() {
            runs.insert(run * 2, 1);
        }
        assert!(matches!(runs, RunMap::Many(_)));
        check(&runs);
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
        check(&runs);
    }

    /// `insert_clear` refuses an empty run, few runs or many, even at an offset where
    /// none starts (where its one search would find nothing in the way).
    #[test]
    fn an_empty_run_is_refused() {
        let mut runs = RunMap::default();
        runs.insert(4, 2);
        assert!(!runs.insert_clear(4, 0));
        assert!(!runs.insert_clear(9, 0));
        for run in 0..=FEW_RUNS as u64 {
            runs.insert(100 + run * 2, 1);
        }
        assert!(matches!(runs, RunMap::Many(_)));
        assert!(!runs.insert_clear(4, 0));
        assert!(!runs.insert_clear(101, 0));
        assert_eq!(runs.len(), FEW_RUNS + 2);
        assert_eq!(runs.get(4), Some(2));
    }

    /// Leaves split as they fill (runs inserted last, first and in the middle) and
    /// go as they empty, down to none, and the map answers as a B-tree throughout.
    #[test]
    fn leaves_split_as_they_fill_and_go_as_they_empty() {
        let (mut runs, mut model) = (RunMap::default(), BTreeMap::new());
        let count = 8 * LEAF_RUNS as u64 + FEW_RUNS as u64;
        // Ascending (each run last), then the odd offsets below them descending
        // (each first in its leaf), then into the middle.
        let offsets = (0..count)
            .map(|run| 1_000_000 + run * 4)
            .chain((0..count).rev().map(|run| run * 4 + 1))
            .chain((0..count).map(|run| 1_000_000 + run * 4 + 2));
        for offset in offsets {
            runs.insert(offset, offset);
            model.insert(offset, offset);
        }
        let RunMap::Many(leaves) = &runs else {
            panic!("{} runs are many", runs.len());
        };
        leaves.check();
        assert!(leaves.leaves.len() > 3 * count as usize / LEAF_RUNS);
        assert_eq!(
            runs.iter().collect::<Vec<_>>(),
            model.clone().into_iter().collect::<Vec<_>>()
        );
        // Remove every run, in an order that empties leaves at both ends and inside.
        let mut order: Vec<u64> = model.keys().copied().collect();
        order.sort_by_key(|&offset| (offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 7, offset));
        for offset in order {
            assert_eq!(runs.last_before(offset + 1), Some((offset, offset)));
            assert_eq!(runs.remove_if(offset, |value| value != offset), None);
            assert_eq!(runs.remove(offset), model.remove(&offset));
            assert_eq!(runs.get(offset), None);
            assert_eq!(
                runs.last_before(offset + 1),
                model.range(..=offset).next_back().map(|(&o, &v)| (o, v))
            );
            check(&runs);
        }
        assert_eq!(runs.len(), 0);
        assert_eq!(runs.last_before(u64::MAX), None);
        runs.insert(7, 7);
        assert_eq!((runs.get(7), runs.len()), (Some(7), 1));
        check(&runs);
    }

    /// A leaf that removals leave with at most a quarter of [`LEAF_RUNS`] joins a
    /// neighbour with which it holds at most half, and not before.
    #[test]
    fn a_nearly_empty_leaf_joins_its_neighbour() {
        let mut runs = RunMap::default();
        for run in 0..=FEW_RUNS as u64 {
            runs.insert(run * 10, run);
        }
        let leaves_of = |runs: &RunMap| match runs {
            RunMap::Many(leaves) => leaves.leaves.iter().map(Vec::len).collect::<Vec<_>>(),
            RunMap::Few(_) => panic!("{} runs are many", runs.len()),
        };
        let half = LEAF_RUNS / 2;
        let before = leaves_of(&runs);
        assert_eq!(&before[..3], &[half, half, half]);
        // Leaf 1 down to a quarter: its neighbours hold too many to join it.
        for run in half..half + LEAF_RUNS / 4 {
            runs.remove(run as u64 * 10);
        }
        let after = leaves_of(&runs);
        assert_eq!(&after[..3], &[half, LEAF_RUNS / 4, half]);
        // Leaf 2 down to a quarter as well: the two together hold half, and join.
        for run in 2 * half..2 * half + LEAF_RUNS / 4 {
            runs.remove(run as u64 * 10);
        }
        let merged = leaves_of(&runs);
        assert_eq!(&merged[..2], &[half, half]);
        assert_eq!(merged.len(), before.len() - 1);
        check(&runs);
        assert_eq!(
            runs.get(half as u64 * 10 + 10 * (LEAF_RUNS / 4) as u64),
            Some((half + LEAF_RUNS / 4) as u64)
        );
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
                check(&runs);
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
                check(&runs);
            }
            let all: Vec<(u64, u64)> = model.into_iter().collect();
            prop_assert_eq!(runs.iter().collect::<Vec<_>>(), all.clone());
            prop_assert_eq!(runs.into_vec(), all);
        }
    }
}
