//! The storage's maps and unmaps for a claim: the idle chunks it could not take
//! back unmapped, the granules it left unmapped mapped, one chunk at a time.

use super::table::{grow_table, name_chunk};
use super::{Calls, Chunk, Chunks, Pending, WALKED};
use crate::pool::bins::{index_at, Link, SegmentIndex};
use crate::storage::{MappingError, StorageId, VirtualMemory};

impl Chunks {
    /// The parts of granules `[first, end)` of `arena` that the chunks over its
    /// first and its last granule hold (one part when one chunk holds both).
    fn mapped_ends(&self, arena: usize, first: u64, end: u64) -> [Option<(u64, u64)>; 2] {
        let part = |g: u64| {
            self.at(arena, g).get().map(|index| {
                let chunk = self.chunk(index);
                (
                    chunk.start.max(first),
                    (chunk.start + chunk.granules).min(end),
                )
            })
        };
        let head = part(first);
        let tail = part(end - 1).filter(|&tail| Some(tail) != head);
        [head, tail]
    }

    /// Whether the pending claim is the block of granules `[first, end)` of `arena`.
    fn is_pending(&self, arena: usize, first: u64, end: u64) -> bool {
        (self.pending.arena, self.pending.first, self.pending.end) == (arena, first, end)
    }

    /// Unmaps the idle chunks that granules of `extent` bytes at `offset` of `arena`
    /// (range `range`) hold: those the block just claimed there
    /// ([`Chunks::claim`], the last claim) could not take back, which hold its first
    /// or its last granule. A chunk the storage refuses to unmap is taken back whole
    /// instead (counted busy in the granules the block touches). Returns the calls
    /// made and the bytes of the granules the block touches left unmapped, which
    /// [`Chunks::map_missing`] maps.
    pub(crate) fn drop_idle(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> (Calls, u64) {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        debug_assert!(self.is_pending(arena, first, end));
        let mut calls = Calls::default();
        for g in [first, end - 1] {
            let Some(index) = self.at(arena, g).get() else {
                continue;
            };
            let chunk = self.chunk(index);
            let (start, stop) = (chunk.start, chunk.start + chunk.granules);
            let Some(span) = self.span_of(index) else {
                continue;
            };
            if self.unmap(memory, range, index) {
                calls.unmaps += 1;
            } else {
                self.shrink(span, start, stop);
                self.chunk_mut(index).busy = stop.min(end) - start.max(first);
            }
        }
        // Two sums, not one over a chained iterator: the chain's fold, compiled out of
        // line since the module's split into files, cost the steady state of
        // `examples/peer_loops.rs` 2.3 instructions a step (callgrind).
        let ends: u64 = self
            .mapped_ends(arena, first, end)
            .into_iter()
            .flatten()
            .map(|(lo, hi)| hi - lo)
            .sum();
        let taken: u64 = self.pending.taken.iter().map(|&(lo, hi)| hi - lo).sum();
        let mapped = ends + taken;
        (calls, (end - first - mapped) * self.granule)
    }

    /// Maps the unmapped granules that `extent` bytes at `offset` of `arena` (range
    /// `range`) touch, live for the block (the last claimed, after
    /// [`Chunks::drop_idle`]): each run of those it covers wholly as one chunk, and
    /// each edge granule it covers in part as a chunk of its own. The runs are the
    /// gaps between the chunks over its edges and the pieces its interior took back,
    /// the only chunks it holds. On a failed map, unmaps what this call mapped and
    /// changes nothing more: the granule table, grown only over the runs mapped, is
    /// cut back to the length and room it had.
    pub(crate) fn map_missing(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> Result<Calls, MappingError> {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        debug_assert!(self.is_pending(arena, first, end));
        let (inner_first, inner_end) = self.inner(offset, extent);
        let size = self.table[arena].size();
        self.fresh.clear();
        let result = if end - first <= WALKED + 1 {
            self.map_walk(memory, arena, range, (first, end), (inner_first, inner_end))
        } else {
            self.map_parts(memory, arena, range, (first, end), (inner_first, inner_end))
        };
        let fresh = std::mem::take(&mut self.fresh);
        let outcome = match result {
            Ok(()) => {
                // Every granule of a new chunk is one the block touches.
                for &index in &fresh {
                    let chunk = self.chunk_mut(index);
                    chunk.busy = chunk.granules;
                }
                self.count_edges_past();
                Ok(Calls {
                    maps: fresh.len() as u64,
                    unmaps: 0,
                })
            }
            Err(error) => {
                for &index in &fresh {
                    self.unmap(memory, range, index);
                }
                self.table[arena].cut_back(size);
                Err(error)
            }
        };
        self.fresh = fresh;
        outcome
    }

    /// Counts the pending block live in its edge granules that lay past the table's
    /// end at its claim (see `Pending::booked`), once [`Chunks::map_missing`] has
    /// mapped every granule it touches (the table holds them all now). Nothing
    /// counted them before: each was unmapped, past the table.
    #[inline]
    fn count_edges_past(&mut self) {
        let Pending {
            arena,
            first,
            end,
            booked,
            ..
        } = self.pending;
        if end <= booked {
            return;
        }
        let live = &mut self.table[arena].live;
        debug_assert!(live.len() as u64 >= end);
        let last = end - 1;
        if first >= booked {
            live[first as usize] += 1;
        }
        if last > first {
            live[last as usize] += 1;
        }
    }

    /// [`Chunks::map_missing`]'s maps for the block of granules `[first, end)`
    /// covering `inner` wholly: the gaps between the chunks over its edges and the
    /// pieces its interior took back, each run of granules it covers wholly as one
    /// chunk, each edge granule it covers in part as one. Each chunk mapped goes on
    /// `fresh`; stops at the first failed map.
    fn map_parts(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        (first, end): (u64, u64),
        (inner_first, inner_end): (u64, u64),
    ) -> Result<(), MappingError> {
        let [head, tail] = self.mapped_ends(arena, first, end);
        let taken = std::mem::take(&mut self.pending.taken);
        let mut result = Ok(());
        let mut g = first;
        let parts = head
            .into_iter()
            .chain(taken.iter().copied())
            .chain(tail)
            .chain([(end, end)]);
        'parts: for (lo, hi) in parts {
            while g < lo {
                self.steps = self.steps.wrapping_add(1);
                // The granules the block covers wholly go in runs; an edge granule it
                // covers in part, which a neighbour may share, is a chunk of its own.
                let stop = if (inner_first..inner_end).contains(&g) {
                    lo.min(inner_end)
                } else {
                    g + 1
                };
                match self.map(memory, arena, range, g, stop - g) {
                    Ok(index) => self.fresh.push(index),
                    Err(error) => {
                        result = Err(error);
                        break 'parts;
                    }
                }
                g = stop;
            }
            g = g.max(hi);
        }
        self.pending.taken = taken;
        result
    }

    /// [`Chunks::map_parts`] for a block of few granules (at most [`WALKED`] + 1):
    /// the same chunks mapped, found by walking its granules through the table (a
    /// step per chunk or run) instead of from the pieces its claim recorded.
    fn map_walk(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        (first, end): (u64, u64),
        (inner_first, inner_end): (u64, u64),
    ) -> Result<(), MappingError> {
        let mut g = first;
        while g < end {
            self.steps = self.steps.wrapping_add(1);
            if let Some(index) = self.at(arena, g).get() {
                let chunk = self.chunk(index);
                g = chunk.start + chunk.granules;
                continue;
            }
            let mut stop = g + 1;
            if (inner_first..inner_end).contains(&g) {
                while stop < inner_end && self.at(arena, stop).is_none() {
                    stop += 1;
                }
            }
            let index = self.map(memory, arena, range, g, stop - g)?;
            self.fresh.push(index);
            g = stop;
        }
        Ok(())
    }

    /// Maps `granules` granules of `arena` from `start` as a new chunk (busy in
    /// none, and on no idle span, until the caller counts it). The granule table
    /// grows over the run only once the storage has mapped it, so its host memory
    /// follows the memory mapped, not the requests; where the host has no memory
    /// for the run's entries (a run of billions of granules) the run is unmapped
    /// again and the map is out of memory.
    #[inline(always)]
    fn map(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        start: u64,
        granules: u64,
    ) -> Result<SegmentIndex, MappingError> {
        let bytes = granules * self.granule;
        memory.map(range, start * self.granule, bytes)?;
        let table = &mut self.table[arena];
        let end = start + granules;
        if (table.len() as u64) < end && grow_table(table, end).is_none() {
            return Err(self.unmap_unbooked(memory, range, start, bytes));
        }
        let index = index_at(
            self.chunks
                .insert(Chunk {
                    arena,
                    start,
                    granules,
                    busy: 0,
                    span: Link::NONE,
                    span_end: 0,
                    span_largest: 0,
                    indexed: false,
                    prev: Link::NONE,
                    next: Link::NONE,
                })
                .index,
        );
        let table = &mut self.table[arena].chunk;
        name_chunk(&mut table[start as usize..end as usize], Link::to(index));
        self.mapped_bytes += bytes;
        Ok(index)
    }

    /// Unmaps the run of `bytes` bytes at granule `start` of `range` that
    /// [`Chunks::map`] just mapped and the granule table has no room to name; the
    /// error of the map. The storage unmaps a run it just mapped, but for a broken
    /// rule, which is the error then.
    #[cold]
    #[inline(never)]
    fn unmap_unbooked(
        &self,
        memory: &mut dyn VirtualMemory,
        range: StorageId,
        start: u64,
        bytes: u64,
    ) -> MappingError {
        match memory.unmap(range, start * self.granule, bytes) {
            Ok(()) => MappingError::OutOfMemory { size: bytes },
            Err(error) => error,
        }
    }

    /// Unmaps chunk `index` (taking it out of its idle span); false, changing
    /// nothing, when the storage refuses.
    pub(super) fn unmap(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageId,
        index: SegmentIndex,
    ) -> bool {
        let chunk = self.chunk(index);
        let (arena, start, granules) = (chunk.arena, chunk.start, chunk.granules);
        let bytes = granules * self.granule;
        if memory.unmap(range, start * self.granule, bytes).is_err() {
            return false;
        }
        if let Some(span) = self.span_of(index) {
            self.shrink(span, start, start + granules);
        }
        name_chunk(
            &mut self.table[arena].chunk[start as usize..(start + granules) as usize],
            Link::NONE,
        );
        self.chunks.discard_at(index.get());
        self.mapped_bytes -= bytes;
        true
    }
}
