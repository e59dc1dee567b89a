//! The plan's lookup: a request matched to its own planned entry, else to another entry
//! of its size whose planned lifetime fits, else to a free kept region of its size.

use std::collections::HashMap;

use super::{PlannedPool, ALIGN_WINDOW};
use crate::error::PoolError;
use crate::plan_file::PlanEntry;
use crate::pool::{extent_of, Placement};
use crate::storage::ComputeStorage;

/// How many entries of its size on either side of its own a request whose own entry is
/// held looks through for one whose planned lifetime fits (bounds the work per miss).
const FIT_REACH: usize = 32;

/// A request placed off its own entry: its size and extent, where it is expected in
/// the plan's order, the entry it was planned at, and the plan phase it follows.
#[derive(Debug, Clone, Copy)]
struct Fit {
    size: u64,
    extent: u64,
    expected: i64,
    own: PlanEntry,
    phase: usize,
}

/// One planned block of a phase: `(offset, end offset, position, end)` (see
/// [`PlanEntry`]).
pub(super) type Span = (u64, u64, usize, usize);

/// A phase's planned blocks by offset, with the largest end offset of each node of a
/// segment tree over them, so that a search for the blocks that meet a range skips
/// every run of blocks that end before it: with one block as long as the arena, a
/// bound from the longest block made every search walk every block below the range
/// (a plan of a million small blocks took milliseconds a miss).
///
/// Invariant: `spans` is sorted; `ends` has `2 * leaves` entries, `leaves` the least
/// power of two at least `spans.len()`, and `ends[i]` is the largest end offset of
/// node `i`'s spans (node 1 the root, node `i`'s children `2i` and `2i + 1`, leaf
/// `leaves + k` span `k`; 0 where a node holds no span).
#[derive(Debug, Clone)]
pub(super) struct Spans {
    spans: Vec<Span>,
    ends: Vec<u64>,
    leaves: usize,
}

impl Default for Spans {
    /// No spans, the tree of one empty leaf (as [`Spans::new`] makes it).
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Spans {
    fn new(mut spans: Vec<Span>) -> Self {
        spans.sort_unstable();
        let leaves = spans.len().next_power_of_two();
        let mut ends = vec![0; 2 * leaves];
        for (k, span) in spans.iter().enumerate() {
            ends[leaves + k] = span.1;
        }
        for node in (1..leaves).rev() {
            ends[node] = ends[2 * node].max(ends[2 * node + 1]);
        }
        Self {
            spans,
            ends,
            leaves,
        }
    }

    /// Whether `fits` holds for every span among the first `count` that ends past
    /// `offset` (in offset order, stopping at the first that fails).
    fn all_ending_past(&self, count: usize, offset: u64, fits: &impl Fn(&Span) -> bool) -> bool {
        self.node_all(1, 0, self.leaves, count, offset, fits)
    }

    /// [`Spans::all_ending_past`] within node `node`, which holds spans `first..last`.
    fn node_all(
        &self,
        node: usize,
        first: usize,
        last: usize,
        count: usize,
        offset: u64,
        fits: &impl Fn(&Span) -> bool,
    ) -> bool {
        if first >= count || self.ends[node] <= offset {
            return true;
        }
        if last - first == 1 {
            return fits(&self.spans[first]);
        }
        let middle = first + (last - first) / 2;
        self.node_all(2 * node, first, middle, count, offset, fits)
            && self.node_all(2 * node + 1, middle, last, count, offset, fits)
    }
}

/// A phase's planned blocks (its entries, by size: [`Plan::offsets_by_size`]) by
/// offset; none where the phase gives no lifetimes (or a size the alignment cannot pad).
///
/// [`Plan::offsets_by_size`]: crate::plan_file::Plan::offsets_by_size
pub(super) fn spans_of(entries: &HashMap<u64, Vec<PlanEntry>>, alignment: u64) -> Spans {
    let mut spans = Vec::with_capacity(entries.values().map(Vec::len).sum());
    for (&size, entries) in entries {
        let Some(extent) = extent_of(size, alignment) else {
            return Spans::default();
        };
        for entry in entries {
            // A plan gives an end for every request of a phase or for none.
            let Some(end) = entry.end else {
                return Spans::default();
            };
            spans.push((
                entry.offset,
                entry.offset.saturating_add(extent),
                entry.position,
                end,
            ));
        }
    }
    Spans::new(spans)
}

impl PlannedPool {
    /// Places a request of `size` bytes (`extent` with padding) at its planned offset:
    /// the `k`-th of that size in this step's phase, where entries planned more than
    /// [`ALIGN_WINDOW`] before where the request is expected in the plan's order, and
    /// optional entries a live block holds, are passed over (the run did not make
    /// them); an entry planned more than that after it is left for a later request.
    /// Where that entry's bytes are held, or another request took it, tries another
    /// entry whose planned lifetime fits ([`PlannedPool::place_fitting`]), then a kept
    /// region ([`PlannedPool::place_kept`]). Counts the request and books a hit or a miss.
    pub(super) fn place_planned(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
        extent: u64,
    ) -> Result<Option<Placement>, PoolError> {
        let mut k = self.taken.get(&size).copied().unwrap_or(0);
        let position = i64::try_from(self.requests).unwrap_or(i64::MAX);
        self.requests = self.requests.saturating_add(1);
        let window = ALIGN_WINDOW as i64;
        // Where in the plan's order this request is expected: its own position, less
        // the drift the last request placed from the plan showed.
        let expected = position.saturating_sub(self.drift);
        let Some(last) = self.offsets.len().checked_sub(1) else {
            self.stats.misses_unplanned += 1;
            return Ok(None);
        };
        let phase = self.plan_phase(last);
        let entries = self.offsets[phase]
            .get(&size)
            .map_or(&[][..], Vec::as_slice);
        let first = k;
        let mut chosen = None;
        while let Some(entry) = entries.get(k) {
            let at = i64::try_from(entry.position).unwrap_or(i64::MAX);
            // An entry planned well before this request is one the run did not
            // make: passed over. One planned well after it belongs to a later
            // request: this one is a request the plan did not foresee.
            if at < expected.saturating_sub(window)
                || entry.optional && self.held(entry.offset, entry.offset.saturating_add(extent))
            {
                k += 1;
                continue;
            }
            if at <= expected.saturating_add(window) {
                chosen = Some((k, *entry));
                k += 1;
            }
            break;
        }
        // The entries a request whose own entry is held may take instead.
        let around =
            first.saturating_sub(FIT_REACH)..entries.len().min(k.saturating_add(FIT_REACH));
        if let Some((_, entry)) = chosen {
            self.drift = position.saturating_sub(entry.position as i64);
        }
        self.taken.insert(size, k);
        let mut placed = None;
        if let Some((index, entry)) = chosen {
            if entry.offset % self.alignment == 0 && self.used.insert((size, index)) {
                placed = self.place_in_arena(storage, entry.offset, size, extent)?;
                if placed.is_none() {
                    self.used.remove(&(size, index));
                }
            }
            if placed.is_none() {
                let fit = Fit {
                    size,
                    extent,
                    expected,
                    own: entry,
                    phase,
                };
                placed = self.place_fitting(storage, fit, around)?;
            }
        }
        if placed.is_none() {
            placed = self.place_kept(storage, size, extent)?;
        }
        match (placed, chosen) {
            (Some(_), _) => self.stats.hits += 1,
            (None, None) => self.stats.misses_unplanned += 1,
            (None, Some(_)) => self.stats.misses_held += 1,
        }
        Ok(placed)
    }

    /// The plan phase the run's current phase follows, given the plan's `last` phase:
    /// the run's own where the plan has it, else the phases from `cycle_start` on in
    /// turn (the last one alone where the plan gives no cycle).
    fn plan_phase(&self, last: usize) -> usize {
        if self.phase <= last {
            return self.phase;
        }
        let start = self.cycle_start.min(last);
        start + (self.phase - start) % (last + 1 - start)
    }

    /// Places a request whose own entry (`fit.own`) is held, or was taken by another
    /// request out of order, at another entry of its size (among the phase's entries
    /// of that size with indices `around`, in plan order) that no request of this step
    /// took, whose bytes no live block holds, and where the plan places no block whose
    /// planned lifetime meets the request's (taken to be its own entry's, from
    /// `fit.expected` to `fit.own.end`). That entry's request, if the run makes it
    /// later, then finds it taken and looks for another the same way. `Ok(None)` where
    /// none fits or the plan gives no lifetimes.
    fn place_fitting(
        &mut self,
        storage: &mut dyn ComputeStorage,
        fit: Fit,
        around: std::ops::Range<usize>,
    ) -> Result<Option<Placement>, PoolError> {
        let Some(own_end) = fit.own.end else {
            return Ok(None);
        };
        let from = usize::try_from(fit.expected.max(0)).unwrap_or(usize::MAX);
        for index in around {
            let Some(&entry) = self.offsets[fit.phase]
                .get(&fit.size)
                .and_then(|entries| entries.get(index))
            else {
                break;
            };
            if entry.optional
                || entry.offset % self.alignment != 0
                || self.used.contains(&(fit.size, index))
                || self.held(entry.offset, entry.offset.saturating_add(fit.extent))
                || !self.free_in_plan(fit.phase, entry.offset, fit.extent, from, own_end)
            {
                continue;
            }
            if let Some(placed) =
                self.place_in_arena(storage, entry.offset, fit.size, fit.extent)?
            {
                self.used.insert((fit.size, index));
                return Ok(Some(placed));
            }
        }
        Ok(None)
    }

    /// Whether no block plan phase `phase` places in `offset..offset + extent` has a
    /// planned lifetime that meets `from..to` (positions in the phase's order); false
    /// where the plan gives no lifetimes.
    fn free_in_plan(&self, phase: usize, offset: u64, extent: u64, from: usize, to: usize) -> bool {
        let Some(spans) = self.spans.get(phase) else {
            return false;
        };
        if spans.spans.is_empty() {
            return false;
        }
        let end = offset.saturating_add(extent);
        // The blocks that start before the range's end; of those, the ones that end
        // past its start meet it, and must not be live when the request is.
        let count = spans.spans.partition_point(|span| span.0 < end);
        spans.all_ending_past(count, offset, &|&(_, _, position, finish)| {
            position >= to || finish <= from
        })
    }

    /// Places a request its own entry could not serve in a kept region of its size
    /// (the first, in the plan's order, that no live block holds), from the plan's
    /// cycle on (its last phase where it gives no cycle): the plan holds a kept region from its block's request to the end of
    /// the run, so no planned block of a later step lands on it, and a block there
    /// takes no one's planned bytes. Such a request is a later step making again a
    /// block the first step kept (the gradients), or one of a step run in another
    /// order. `Ok(None)` when no kept region of the size is free.
    fn place_kept(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
        extent: u64,
    ) -> Result<Option<Placement>, PoolError> {
        if self.phase < self.cycle_start {
            return Ok(None);
        }
        let Some(regions) = self.kept.get(&size) else {
            return Ok(None);
        };
        let free = regions.iter().copied().find(|&offset| {
            offset % self.alignment == 0 && !self.held(offset, offset.saturating_add(extent))
        });
        match free {
            Some(offset) => self.place_in_arena(storage, offset, size, extent),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The tree's search answers as a walk of every span that starts before the
        /// range's end does (the walk the tree replaced, less its bound).
        #[test]
        fn the_tree_answers_as_a_walk_of_every_span(
            raw in proptest::collection::vec((0u64..200, 1u64..80, 0usize..20, 0usize..20), 0..60),
            offset in 0u64..250,
            extent in 1u64..80,
            from in 0usize..20,
            to in 0usize..20,
        ) {
            let spans = Spans::new(
                raw.iter().map(|&(start, length, position, end)| (start, start + length, position, end)).collect(),
            );
            let end = offset + extent;
            let fits = |&(_, _, position, finish): &Span| position >= to || finish <= from;
            let walked = spans
                .spans
                .iter()
                .take_while(|span| span.0 < end)
                .all(|span| span.1 <= offset || fits(span));
            let count = spans.spans.partition_point(|span| span.0 < end);
            prop_assert_eq!(spans.all_ending_past(count, offset, &fits), walked);
        }
    }
}
