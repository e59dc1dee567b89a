//! The idle list: idle chunks in idle spans, oldest first, found by hint or by
//! start, listed, split and taken off.

use super::{Chunk, Chunks};
use crate::pool::bins::{Link, SegmentIndex};

impl Chunks {
    /// The head of idle span `index`.
    #[inline]
    pub(super) fn idle_span(&self, index: SegmentIndex) -> &Chunk {
        self.chunk(index)
    }

    /// The head of idle span `index`.
    #[inline]
    fn idle_span_mut(&mut self, index: SegmentIndex) -> &mut Chunk {
        self.chunk_mut(index)
    }

    /// The indexed idle span holding granule `g` of `arena`, if any.
    #[inline]
    fn span_at(&self, arena: usize, g: u64) -> Option<SegmentIndex> {
        let (_, index) = self.span_starts[arena].last_before(g + 1)?;
        (self.idle_span(index).span_end > g).then_some(index)
    }

    /// The idle span holding chunk `index`, if it is idle: none where it counts fewer
    /// busy granules than it has (an idle chunk counts them all), its hint where that
    /// span holds it, else the span over its first granule.
    #[inline]
    pub(super) fn span_of(&self, index: SegmentIndex) -> Option<SegmentIndex> {
        let chunk = self.chunk(index);
        if chunk.busy < chunk.granules {
            return None;
        }
        if chunk.span_end > 0 {
            return Some(index);
        }
        if let Some(head) = self.chunks.linked(chunk.span) {
            if head.arena == chunk.arena && head.start <= chunk.start && chunk.start < head.span_end
            {
                return chunk.span.get();
            }
        }
        self.span_at(chunk.arena, chunk.start)
    }

    /// Lists the [`Chunks::unlisted`] chunk, if any, last on the idle list (joining
    /// the newest span where it follows on from it), as it would have been listed
    /// when it went idle.
    #[inline]
    pub(super) fn list_unlisted(&mut self) {
        if let Some(index) = self.unlisted.take() {
            self.list_idle(index, true);
        }
    }

    /// Lists chunk `index`, which no live block touches any more, last on the idle
    /// list, hinted: at the end of the newest span where it follows on from it and
    /// `join`, else as a span of its own (unindexed). What [`Chunks::append_idle`]
    /// does for one chunk, without looking the chunk up again through the table.
    /// Either way the chunks on the list keep their order (spans in the order they
    /// went idle, each in granule order), which is all [`Chunks::trim`] reads.
    #[inline]
    pub(super) fn idle_alone(&mut self, index: SegmentIndex, join: bool) {
        self.count_idle(index);
        self.list_idle(index, join);
    }

    /// Counts chunk `index`, which no live block touches any more, idle: all its
    /// granules busy (the count a chunk keeps while idle) and its bytes idle.
    #[inline]
    pub(super) fn count_idle(&mut self, index: SegmentIndex) {
        let chunk = self.chunk_mut(index);
        chunk.busy = chunk.granules;
        let bytes = chunk.granules * self.granule;
        self.idle_bytes += bytes;
    }

    /// The listing of [`Chunks::idle_alone`]: chunk `index`, counted idle, last on
    /// the idle list.
    #[inline]
    fn list_idle(&mut self, index: SegmentIndex, join: bool) {
        let tail = self.idle_tail;
        let link = Link::to(index);
        let chunk = self
            .chunks
            .linked(link)
            .expect("the table names live chunks");
        let (arena, start, end) = (chunk.arena, chunk.start, chunk.start + chunk.granules);
        if let Some(head) = self.chunks.linked_mut(tail) {
            if join && head.arena == arena && head.span_end == start {
                head.span_end = end;
                head.span_largest = head.span_largest.max(end - start);
                self.chunk_mut(index).span = tail;
                return;
            }
            head.next = link;
        } else {
            self.idle_head = link;
        }
        self.idle_tail = link;
        let chunk = self.chunk_mut(index);
        chunk.span = link;
        chunk.span_end = end;
        chunk.span_largest = end - start;
        chunk.indexed = false;
        chunk.prev = tail;
        chunk.next = Link::NONE;
    }

    /// Lists granules `[start, end)` of `arena` (whole chunks just gone idle, in
    /// granule order) last on the idle list: as the newest span, or as the end of it
    /// where they follow on from it. Returns the span they are in, indexed unless
    /// they are one chunk whose hint the caller sets (`hinted`).
    pub(super) fn append_idle(
        &mut self,
        arena: usize,
        start: u64,
        end: u64,
        hinted: bool,
    ) -> SegmentIndex {
        self.idle_bytes += (end - start) * self.granule;
        let tail = self.idle_tail;
        if let Some(head) = self.chunks.linked_mut(tail) {
            if head.arena == arena && head.span_end == start {
                head.span_end = end;
                head.span_largest = head.span_largest.max(end - start);
                if !hinted && !head.indexed {
                    head.indexed = true;
                    let first = head.start;
                    self.span_starts[arena].insert(first, tail.followed());
                }
                return tail.followed();
            }
        }
        self.insert_span(arena, (start, end), end - start, tail, !hinted)
    }

    /// Lists a span of granules `[start, end)` of `arena` (whole idle chunks, none
    /// of more than `largest` granules) right after span `after` (first where `after`
    /// is none), `indexed` or not, headed by the chunk at `start`. The caller counts
    /// its bytes.
    fn insert_span(
        &mut self,
        arena: usize,
        (start, end): (u64, u64),
        largest: u64,
        after: Link,
        indexed: bool,
    ) -> SegmentIndex {
        let index = self
            .at(arena, start)
            .get()
            .expect("an idle span holds whole mapped chunks");
        let next = match self.chunks.linked(after) {
            Some(head) => head.next,
            None => self.idle_head,
        };
        self.head_at(index, (end, largest), indexed, after, next);
        if indexed {
            self.span_starts[arena].insert(start, index);
        }
        index
    }

    /// Makes chunk `index` the head of an idle span up to granule `end` (of chunks
    /// of at most `largest` granules), between spans `prev` and `next` on the idle
    /// list.
    fn head_at(
        &mut self,
        index: SegmentIndex,
        (end, largest): (u64, u64),
        indexed: bool,
        prev: Link,
        next: Link,
    ) {
        let head = self.chunk_mut(index);
        head.span_end = end;
        head.span_largest = largest;
        head.indexed = indexed;
        head.prev = prev;
        head.next = next;
        match self.chunks.linked_mut(prev) {
            Some(before) => before.next = Link::to(index),
            None => self.idle_head = Link::to(index),
        }
        match self.chunks.linked_mut(next) {
            Some(after) => after.prev = Link::to(index),
            None => self.idle_tail = Link::to(index),
        }
    }

    /// Takes granules `[lo, hi)` (whole chunks) out of idle span `index`: what is
    /// left before them keeps the span's place on the idle list, and what is left
    /// after them follows it (indexed: its chunks' hints name this one).
    pub(super) fn shrink(&mut self, index: SegmentIndex, lo: u64, hi: u64) {
        let span = self.idle_span(index);
        let (arena, start, end) = (span.arena, span.start, span.span_end);
        let (indexed, prev, next) = (span.indexed, span.prev, span.next);
        let largest = span.span_largest;
        debug_assert!(start <= lo && lo < hi && hi <= end);
        self.idle_bytes -= (hi - lo) * self.granule;
        match (lo > start, hi < end) {
            (true, true) => {
                self.keep_front(index, lo);
                let rest = largest.min(end - hi);
                self.insert_span(arena, (hi, end), rest, Link::to(index), true);
            }
            (true, false) => self.keep_front(index, lo),
            (false, true) => {
                // The chunk at `hi` heads the rest, in the span's place. The hints of
                // the chunks after it named the old head: the rest is indexed unless
                // the new head is all of it.
                self.idle_span_mut(index).span_end = 0;
                let head = self
                    .at(arena, hi)
                    .get()
                    .expect("an idle span holds whole mapped chunks");
                let alone = hi + self.chunk(head).granules == end;
                let rest = (end, largest.min(end - hi));
                self.head_at(head, rest, indexed || !alone, prev, next);
                if indexed {
                    self.span_starts[arena].move_start(start, hi, head);
                } else if !alone {
                    self.span_starts[arena].insert(hi, head);
                }
            }
            (false, false) => self.unlist(index),
        }
    }

    /// Ends idle span `index` at granule `lo`, inside it.
    #[inline]
    fn keep_front(&mut self, index: SegmentIndex, lo: u64) {
        let span = self.idle_span_mut(index);
        span.span_end = lo;
        span.span_largest = span.span_largest.min(lo - span.start);
    }

    /// Takes idle span `index` off the idle list (and the index) whole; the caller
    /// counts its bytes.
    #[inline]
    pub(super) fn unlist(&mut self, index: SegmentIndex) {
        let span = self.idle_span_mut(index);
        let (arena, start) = (span.arena, span.start);
        let (indexed, prev, next) = (span.indexed, span.prev, span.next);
        span.span_end = 0;
        match self.chunks.linked_mut(prev) {
            Some(before) => before.next = next,
            None => self.idle_head = next,
        }
        match self.chunks.linked_mut(next) {
            Some(after) => after.prev = prev,
            None => self.idle_tail = prev,
        }
        if indexed {
            self.span_starts[arena].remove(start);
        }
    }
}
