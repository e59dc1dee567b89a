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

/// A phase's planned blocks (its entries, by size: [`Plan::offsets_by_size`]) by offset,
/// with the longest extent among them; none where the phase gives no lifetimes (or a
/// size the alignment cannot pad).
///
/// [`Plan::offsets_by_size`]: crate::plan_file::Plan::offsets_by_size
pub(super) fn spans_of(entries: &HashMap<u64, Vec<PlanEntry>>, alignment: u64) -> (Vec<Span>, u64) {
    let mut spans = Vec::with_capacity(entries.values().map(Vec::len).sum());
    for (&size, entries) in entries {
        let Some(extent) = extent_of(size, alignment) else {
            return (Vec::new(), 0);
        };
        for entry in entries {
            // A plan gives an end for every request of a phase or for none.
            let Some(end) = entry.end else {
                return (Vec::new(), 0);
            };
            spans.push((
                entry.offset,
                entry.offset.saturating_add(extent),
                entry.position,
                end,
            ));
        }
    }
    spans.sort_unstable();
    let longest = spans.iter().map(|span| span.1 - span.0).max().unwrap_or(0);
    (spans, longest)
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
        let Some((spans, longest)) = self.spans.get(phase) else {
            return false;
        };
        if spans.is_empty() {
            return false;
        }
        let end = offset.saturating_add(extent);
        let low = spans.partition_point(|span| span.0.saturating_add(*longest) <= offset);
        spans[low..]
            .iter()
            .take_while(|span| span.0 < end)
            .all(|&(_, stop, position, finish)| stop <= offset || position >= to || finish <= from)
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
