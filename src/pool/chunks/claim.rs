//! Claims: a block counted live in its edge granules and busy in the granules it
//! touches, taking idle chunks back where it may.

use super::{Chunks, WALKED};
use crate::pool::bins::{Link, SegmentIndex};

impl Chunks {
    /// Counts a block of `extent` bytes at `offset` of `arena` live in its edge
    /// granules and busy in the granules it touches (a chunk this makes busy leaves
    /// the idle list), and returns the bytes of the granules it touches that are
    /// unmapped: what [`Chunks::map_missing`] will map. The granule table does not
    /// grow here: the granules past its end are unmapped, and a block's edge among
    /// them is counted live when the storage has mapped it (see `Pending::booked`).
    #[inline(always)]
    pub(crate) fn claim(&mut self, arena: usize, offset: u64, extent: u64) -> u64 {
        // The common case: the block lies in one granule live blocks touch already.
        if let Some(g) = self.sole_granule(offset, extent) {
            let table = &mut self.table[arena];
            if let Some(live) = table.live.get_mut(g as usize) {
                if *live > 0 {
                    *live += 1;
                    return 0;
                }
                if let Some(index) = self.at(arena, g).get() {
                    if self.claim_alone(arena, g, index, self.inner(offset, extent)) {
                        return 0;
                    }
                }
            }
        }
        self.claim_each(arena, offset, extent)
    }

    /// [`Chunks::claim`] of a block that lies in granule `g` of `arena`, mapped by
    /// chunk `index`, which no live block touches (a block freed and placed again
    /// where it was, alone in its granule), covering granules `inner` wholly: takes
    /// the chunk back as [`Chunks::claim_each`] would, without the books a claim that
    /// maps keeps for [`Chunks::drop_idle`] and [`Chunks::map_missing`]. False,
    /// changing nothing but listing the [`Chunks::unlisted`] chunk, where the chunk
    /// cannot be taken back (see [`Chunks::take`]).
    #[inline]
    fn claim_alone(
        &mut self,
        arena: usize,
        g: u64,
        index: SegmentIndex,
        inner: (u64, u64),
    ) -> bool {
        if self.unlisted != Link::to(index) {
            self.list_unlisted();
        }
        if !self.take(index, inner, 1) {
            return false;
        }
        self.table[arena].live[g as usize] = 1;
        true
    }

    /// [`Chunks::claim`] of the granules `extent` bytes at `offset` touch: its
    /// edges granule by granule, the chunks over them, and its interior span by span.
    /// The granules past the table's end are unmapped: counted to map, with no entry
    /// written (the table grows only as the storage maps, in [`Chunks::map`]), so a
    /// block the storage then refuses costs no host memory for its granules.
    #[inline(never)]
    fn claim_each(&mut self, arena: usize, offset: u64, extent: u64) -> u64 {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        let inner = self.inner(offset, extent);
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return 0;
        };
        self.pending.arena = arena;
        self.pending.first = first;
        self.pending.end = end;
        self.pending.booked = self.table[arena].len() as u64;
        self.pending.taken.clear();
        let mut missing = self.claim_edge(arena, first, inner);
        if last > first {
            if last > first + WALKED {
                missing += self.claim_inside(arena, first, last, inner);
            } else if last > first + 1 {
                missing += self.claim_walk(arena, first, last, inner);
            }
            missing += self.claim_edge(arena, last, inner);
        }
        missing
    }

    /// Counts a block in edge granule `g` of `arena` of a block covering granules
    /// `inner` wholly; returns the bytes it adds to map (those of an unmapped
    /// granule, or of one in an idle chunk the block cannot take back, see
    /// [`Chunks::take`]). A granule past the table's end is unmapped and counted by
    /// no block: left to count when mapped (see `Pending::booked`).
    #[inline]
    fn claim_edge(&mut self, arena: usize, g: u64, inner: (u64, u64)) -> u64 {
        let Some(live) = self.table[arena].live.get_mut(g as usize) else {
            return self.granule;
        };
        *live += 1;
        if *live > 1 {
            return 0;
        }
        match self.at(arena, g).get() {
            Some(index) if self.take(index, inner, 1) => 0,
            _ => self.granule,
        }
    }

    /// Counts granules `(first, last)` of `arena` busy inside a block covering
    /// granules `inner` wholly; returns the bytes of those to map (unmapped, or in an
    /// idle chunk the block cannot take back). The chunks over the edges `first` and
    /// `last` may reach inside and are counted as the edges are; the chunks between
    /// them (the interior) lie wholly inside the block, so no other live block
    /// touches them: each is idle, and taken back with the idle spans' pieces over
    /// the interior (recorded for [`Chunks::map_missing`]), or unmapped.
    #[inline]
    fn claim_inside(&mut self, arena: usize, first: u64, last: u64, inner: (u64, u64)) -> u64 {
        let (interior, ends) = self.interior(arena, first, last);
        let mut missing = 0;
        for (index, granules) in ends.into_iter().flatten() {
            if !self.take(index, inner, granules) {
                missing += granules;
            }
        }
        let (from, to) = interior;
        let mut g = from;
        while g < to {
            let Some(index) = self.at(arena, g).get() else {
                let run = self.unmapped_run(arena, g, to);
                self.steps = self.steps.wrapping_add(run);
                missing += run;
                g += run;
                continue;
            };
            self.steps = self.steps.wrapping_add(1);
            // The idle span over the chunk holds the chunks after it up to its end.
            let stop = match self.span_of(index) {
                Some(span) => {
                    let stop = self.idle_span(span).span_end.min(to);
                    self.shrink(span, g, stop);
                    stop
                }
                None => {
                    debug_assert!(false, "a busy chunk inside a block being claimed");
                    let chunk = self.chunk(index);
                    (chunk.start + chunk.granules).min(to)
                }
            };
            self.pending.taken.push((g, stop));
            g = stop;
        }
        missing * self.granule
    }

    /// [`Chunks::claim_inside`] of a block of few granules (at most [`WALKED`] + 1),
    /// chunk by chunk: each chunk of `(first, last)` is taken back with
    /// [`Chunks::take`] (recorded for [`Chunks::map_missing`] where it lies between
    /// the edges' chunks) or left to map, as the chunks over the edges are. A step per
    /// chunk, and no search for the interior's ends.
    #[inline]
    fn claim_walk(&mut self, arena: usize, first: u64, last: u64, inner: (u64, u64)) -> u64 {
        let missing =
            self.each_chunk_inside::<false>(arena, first + 1, last, |chunks, index, granules| {
                let chunk = chunks.chunk(index);
                let (start, stop) = (chunk.start, chunk.start + chunk.granules);
                if !chunks.take(index, inner, granules) {
                    return granules;
                }
                if start > first && stop <= last {
                    chunks.pending.taken.push((start, stop));
                }
                0
            });
        missing * self.granule
    }

    /// Counts `granules` more granules of chunk `index` busy for a block covering
    /// granules `inner` wholly, if the block counts the chunk busy as it is: a busy
    /// chunk always, an idle one only when every granule of it will be touched by a
    /// live block for as long as it is busy again: a chunk of one granule, or one
    /// that lies within `inner` (granules no other block can touch while this one
    /// lives). Returns false, changing nothing, for any other idle chunk, which is
    /// unmapped before the block's chunks are mapped ([`Chunks::drop_idle`]). So a
    /// busy chunk holds only granules live blocks touch, whatever is kept: the eager
    /// policy's mapped bytes.
    #[inline]
    fn take(&mut self, index: SegmentIndex, inner: (u64, u64), granules: u64) -> bool {
        let unlisted = self.unlisted == Link::to(index);
        let chunk = self.chunk_mut(index);
        let (start, count) = (chunk.start, chunk.granules);
        if chunk.busy < count {
            // Busy (an idle chunk counts all its granules busy): counted, no more.
            chunk.busy += granules;
            return true;
        }
        if count > 1 && (start < inner.0 || start + count > inner.1) {
            debug_assert!(unlisted || self.span_of(index).is_some());
            return false;
        }
        if unlisted {
            // Idle on no list yet: nothing to take it off.
            self.unlisted = Link::NONE;
            self.idle_bytes -= count * self.granule;
        } else if chunk.span_end == start + count {
            // It heads an idle span of itself alone (as a chunk that went idle alone
            // and no neighbour followed does): off the list, no split.
            self.unlist(index);
            self.idle_bytes -= count * self.granule;
        } else if let Some(span) = self.span_of(index) {
            self.shrink(span, start, start + count);
        } else {
            // Busy in every granule: never so while a block claims one of them.
            debug_assert!(false, "a chunk busy in all its granules claimed again");
            self.chunk_mut(index).busy += granules;
            return true;
        }
        self.chunk_mut(index).busy = granules;
        true
    }

    /// Takes back whole every idle chunk that granules of `extent` bytes at `offset`
    /// of `arena` hold (counted busy in those granules), as [`Chunks::claim`] did
    /// before [`Chunks::take`]: for a block whose claim is undone without the
    /// storage at hand, so that [`Chunks::unclaim`] finds every chunk it touches
    /// busy. Passes the unmapped granules a run at a time, as `unclaim` does.
    pub(crate) fn adopt_idle(&mut self, arena: usize, offset: u64, extent: u64) {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        self.each_chunk_inside::<true>(arena, first, end, |chunks, index, granules| {
            let start = chunks.chunk(index).start;
            if let Some(span) = chunks.span_of(index) {
                let stop = start + chunks.chunk(index).granules;
                chunks.shrink(span, start, stop);
                chunks.chunk_mut(index).busy = granules;
            }
            0
        });
    }
}
