//! Releases: a block's claim undone, the chunks no live block touches any more
//! made idle.

use super::{Chunks, WALKED};
use crate::pool::bins::{Link, SegmentIndex};

impl Chunks {
    /// Undoes [`Chunks::claim`] of a live block of `extent` bytes at `offset` of
    /// `arena`, every granule of which is mapped; chunks none of whose granules a live
    /// block touches any more become idle (newest last, in granule order: the chunk
    /// over its first granule, its interior as one span, the chunk over its last
    /// granule).
    #[inline(always)]
    pub(crate) fn uncover(&mut self, arena: usize, offset: u64, extent: u64) {
        // The common case: the block lies in one granule another live block touches;
        // the next, in one granule it alone touches (as `uncover_each` of one edge).
        if let Some(g) = self.sole_granule(offset, extent) {
            if let Some(live) = self.table[arena].live.get_mut(g as usize) {
                if *live > 1 {
                    *live -= 1;
                    return;
                }
                if *live == 1 {
                    self.uncover_alone(arena, g);
                    return;
                }
            }
        }
        let (first, end) = self.span(offset, extent);
        self.uncover_each(arena, first, end);
    }

    /// [`Chunks::uncover`] of the one live block that touches granule `g` of
    /// `arena` and lies in it: [`Chunks::uncover_each`] of one edge, without
    /// finding the block's granules again.
    #[inline]
    fn uncover_alone(&mut self, arena: usize, g: u64) {
        self.table[arena].live[g as usize] = 0;
        let Some(index) = self.at(arena, g).get() else {
            return;
        };
        let chunk = self.chunk_mut(index);
        chunk.busy -= 1;
        if chunk.busy == 0 {
            // Idle: counted now, listed when the list is next read or changed
            // (`unlisted`), unless a block takes it back first.
            self.list_unlisted();
            self.count_idle(index);
            self.unlisted = Link::to(index);
        }
    }

    /// [`Chunks::uncover`] of granules `[first, end)`: its edges granule by granule,
    /// the chunks over them, and its interior as one span, in granule order (the
    /// order chunks go idle in).
    #[inline(never)]
    fn uncover_each(&mut self, arena: usize, first: u64, end: u64) {
        self.list_unlisted();
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return;
        };
        self.uncover_edge(arena, first, true);
        // A block of few granules: its chunks after the first edge's go idle as spans
        // of their own, so that a block claimed again in its place unlists each
        // without a split (the list's order, and so the trim's, is the same).
        let few = last <= first + WALKED;
        if last > first + 1 && few {
            self.each_chunk_inside::<false>(arena, first + 1, last, |chunks, index, granules| {
                chunks.make_unbusy(index, granules, false);
                0
            });
        } else if last > first + 1 {
            let ((from, to), [head, tail]) = self.interior(arena, first, last);
            if let Some((index, granules)) = head {
                self.make_unbusy(index, granules, true);
            }
            if from < to {
                // Every chunk of the interior is the block's alone, busy in all its
                // granules (the count it keeps while idle). An interior of one chunk
                // (as mapped for the block) is hinted, as a chunk going idle alone is.
                let first_chunk = self.at(arena, from).get();
                let alone = first_chunk.filter(|&index| {
                    let chunk = self.chunk(index);
                    chunk.start + chunk.granules == to
                });
                let span = self.append_idle(arena, from, to, alone.is_some());
                if let Some(index) = alone {
                    self.chunk_mut(index).span = Link::to(span);
                }
            }
            if let Some((index, granules)) = tail {
                self.make_unbusy(index, granules, true);
            }
        }
        if last > first {
            self.uncover_edge(arena, last, !few);
        }
    }

    /// Undoes [`Chunks::claim`] of a block of `extent` bytes at `offset` of `arena`
    /// whose granules were not all mapped (a map failed, or the storage has no
    /// virtual memory), chunk by chunk: unmapped granules only lose the count (a
    /// block whose map failed holds none; an edge past the granule table's end was
    /// counted in no entry, see `Pending::booked`), a run of them at a time.
    #[cold]
    pub(crate) fn unclaim(&mut self, arena: usize, offset: u64, extent: u64) {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return;
        };
        self.uncover_edge(arena, first, true);
        if last > first {
            self.each_chunk_inside::<true>(arena, first + 1, last, |chunks, index, granules| {
                chunks.make_unbusy(index, granules, true);
                0
            });
            self.uncover_edge(arena, last, true);
        }
    }

    /// Counts a block gone from edge granule `g` of `arena` (a chunk this makes idle
    /// joins the newest span if `join`, see [`Chunks::idle_alone`]).
    #[inline]
    fn uncover_edge(&mut self, arena: usize, g: u64, join: bool) {
        let Some(live) = self.table[arena].live.get_mut(g as usize) else {
            return;
        };
        *live -= 1;
        if *live == 0 {
            if let Some(index) = self.at(arena, g).get() {
                self.make_unbusy(index, 1, join);
            }
        }
    }

    /// Takes `granules` from the busy ones of chunk `index`; idle (newest last)
    /// when none is left (joining the newest span if `join`).
    #[inline]
    fn make_unbusy(&mut self, index: SegmentIndex, granules: u64, join: bool) {
        let chunk = self.chunk_mut(index);
        chunk.busy -= granules;
        if chunk.busy == 0 {
            self.idle_alone(index, join);
        }
    }
}
