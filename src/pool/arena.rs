//! One address range carved into blocks, placed best-fit with coalescing in O(1):
//! the placement of the virtual pool.
//!
//! The range is a chain of segments ordered by offset; free segments are also on the
//! size-class lists of [`FreeHeads`] (the sliced pool's bins), linked through the
//! segments. A reservation takes one of the first few members of its own class that
//! fits, else the first member of the smallest larger class (its last, the one freed
//! longest ago, when the request is negligible against every member, and a smaller
//! one of the next few when splitting the first would leave no more than it: see
//! [`FreeHeads::find_sparing_recent`]), and splits it; a release merges the segment
//! with its free neighbours. Unlike the sliced pool there are no
//! pages: the range is one page as large as the address space reserved, so
//! coalescing never stops at a page boundary.
//!
//! Coalescing is deferred as in the sliced pool: the segment released last waits off
//! the lists, unmerged, until the next place or release; a place of its very extent,
//! when it has no free neighbour, takes it back as it is (what eager coalescing
//! would have placed there too: it would be first on its class's list). In one large
//! range the segment freed last often has free space after it; when its previous
//! neighbour is used and the merged segment is what the search would take, a place
//! of its extent takes it back as well, leaving the free space after it listed: the
//! same bytes as merging, placing and splitting (checked against eager coalescing by
//! a proptest).
//!
//! Segments live in a store of their own (`Segments`) in which a link costs one
//! bounds check: on the shared traces this and the rule above took the virtual
//! pool's replay from 1.32x to 1.14x the instructions of the default layout's.
//!
//! Arithmetic on offsets and extents wraps instead of being checked: segments tile
//! the range (checked by [`Arena::check`]), so an offset plus an extent, or the
//! extents of neighbours summed, are at most the range's size, and a split takes at
//! most the free segment's extent; the count of used blocks is at most the number of
//! segments. The checks the build adds elsewhere (`overflow-checks`) cost the
//! virtual pool's replay 4 % here (gpt2-train, `examples/replay_ab.rs`) for sums that
//! cannot overflow.

use super::bins::{
    class_floor, class_of, index_at, spares_recent, FreeHeads, FreeLinks, FreeSegments, Link,
    SegmentIndex, SegmentState, StateView, OWN_CLASS_PROBES,
};
use super::{ensure, SlotId};

/// A run of bytes of the range, used by one reservation or free.
#[derive(Debug, Clone)]
struct Segment {
    offset: u64,
    /// The bytes the segment spans (a multiple of the alignment, except maybe the
    /// last segment of the range).
    extent: u64,
    /// The segment before this one in the range.
    prev: Link,
    /// The segment after this one in the range.
    next: Link,
    /// When listed: its neighbours on its class's list. When used: the bytes asked
    /// for ([`FreeLinks::holding`]; a used segment is on no list, so the two never
    /// meet). When deferred or vacant: nothing. One field for both keeps a segment 40
    /// bytes instead of 48: where blocks come and go in order, each step brings one
    /// cold segment into the cache (BENCHMARKS.md, the FIFO's cache misses).
    free: FreeLinks,
    /// Used, deferred, listed (with its class) or vacant (no segment).
    state: SegmentState,
    /// Counts the segments this entry of [`Segments`] has held, so an old id is
    /// never taken for a new segment.
    generation: u32,
}

/// The segments of one arena, addressed by index: like the pools' `Slab`, but a
/// vacant entry is a segment in state `Vacant` rather than an `Option`, so following
/// a link (always to a live segment, or [`Link::NONE`], which is past the end: see
/// [`Link::position`]) costs one bounds check. Vacant indices are reused last-freed first.
#[derive(Debug, Clone, Default)]
struct Segments {
    entries: Vec<Segment>,
    /// Invariant: exactly the indices of the entries in state `Vacant`.
    vacant: Vec<SegmentIndex>,
}

impl Segments {
    /// Stores a segment and returns its id.
    #[inline]
    fn insert(&mut self, mut segment: Segment) -> SlotId {
        if let Some(index) = self.vacant.pop() {
            let entry = &mut self.entries[index.get() as usize];
            let generation = entry.generation.wrapping_add(1);
            segment.generation = generation;
            *entry = segment;
            return SlotId {
                index: index.get(),
                generation,
            };
        }
        let index = index_at(u32::try_from(self.entries.len()).unwrap_or(u32::MAX));
        segment.generation = 0;
        self.entries.push(segment);
        SlotId {
            index: index.get(),
            generation: 0,
        }
    }

    /// The segment a link names (`None` for [`Link::NONE`]). Links name live
    /// segments only.
    #[inline(always)]
    fn at(&self, link: Link) -> Option<&Segment> {
        self.entries.get(link.position())
    }

    /// The segment a link names (`None` for [`Link::NONE`]).
    #[inline(always)]
    fn at_mut(&mut self, link: Link) -> Option<&mut Segment> {
        self.entries.get_mut(link.position())
    }

    /// The live segment `slot` names, if any (ids come from outside: checked).
    #[inline]
    fn get(&self, slot: SlotId) -> Option<&Segment> {
        self.entries.get(slot.index as usize).filter(|segment| {
            segment.generation == slot.generation && segment.state != SegmentState::VACANT
        })
    }

    /// The id of the live segment at `index`.
    #[inline]
    fn id_at(&self, index: SegmentIndex) -> Option<SlotId> {
        let segment = self.entries.get(index.get() as usize)?;
        (segment.state != SegmentState::VACANT).then_some(SlotId {
            index: index.get(),
            generation: segment.generation,
        })
    }

    /// Makes the live segment at `index` vacant.
    #[inline]
    fn discard_at(&mut self, index: SegmentIndex) {
        if let Some(segment) = self.entries.get_mut(index.get() as usize) {
            if segment.state != SegmentState::VACANT {
                segment.state = SegmentState::VACANT;
                self.vacant.push(index);
            }
        }
    }

    /// The number of live segments.
    fn len(&self) -> usize {
        self.entries.len() - self.vacant.len()
    }
}

impl FreeSegments for Segments {
    #[inline(always)]
    fn free_entry(&self, link: Link) -> Option<(u64, SegmentState, FreeLinks)> {
        self.at(link)
            .map(|segment| (segment.extent, segment.state, segment.free))
    }

    #[inline(always)]
    fn free_entry_mut(&mut self, link: Link) -> Option<(&mut SegmentState, &mut FreeLinks)> {
        self.at_mut(link)
            .map(|segment| (&mut segment.state, &mut segment.free))
    }
}

/// A used block: where it is, and the bytes asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    /// The block's id (its segment).
    pub(crate) slot: SlotId,
    /// The offset of its first byte in the range.
    pub(crate) offset: u64,
    /// The bytes it spans.
    pub(crate) extent: u64,
    /// The bytes asked for.
    pub(crate) size: u64,
}

/// An address range of `size` bytes carved into used and free segments.
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    size: u64,
    segments: Segments,
    /// Invariant: the class lists hold exactly the free segments but the deferred
    /// one, each on the list of its extent's class, most recently freed first.
    free: FreeHeads,
    /// The segment at offset 0 ([`Link::NONE`] only for an empty range).
    first: Link,
    /// The number of used segments.
    used: usize,
    /// The segment released last, not yet merged. Invariant: it is `Deferred`, on no
    /// list, and the only free segment that may neighbour another free one.
    deferred: Link,
    /// Counts the changes to the class lists (a segment listed, unlisted or resized
    /// while listed): what [`Arena::merged_would_be_taken`] reads changes only with
    /// it.
    lists_version: u64,
    /// `(next, extent, lists_version)` of the last place that took the deferred
    /// segment back beside its free next neighbour `next` for `extent` bytes. Where
    /// all three are the same at the next place, so is the answer (the answer is read
    /// off the lists and those two only), and the place takes the segment back without
    /// asking again: a block freed and placed again, alone before the free rest of the
    /// range (the Python loop of 4 KiB reserves), asks once.
    taken_back: (Link, u64, u64),
}

impl Arena {
    /// A range of `size` bytes, all free.
    pub(crate) fn new(size: u64) -> Self {
        let mut arena = Self {
            size,
            segments: Segments::default(),
            free: FreeHeads::default(),
            first: Link::NONE,
            used: 0,
            deferred: Link::NONE,
            lists_version: 0,
            taken_back: (Link::NONE, 0, 0),
        };
        if size > 0 {
            let first = index_at(
                arena
                    .segments
                    .insert(Segment {
                        offset: 0,
                        extent: size,
                        prev: Link::NONE,
                        next: Link::NONE,
                        free: FreeLinks::default(),
                        state: SegmentState::DEFERRED,
                        generation: 0,
                    })
                    .index,
            );
            arena.first = Link::to(first);
            arena.link(first);
        }
        arena
    }

    /// The number of used blocks.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    #[inline]
    fn segment(&self, index: SegmentIndex) -> &Segment {
        &self.segments.entries[index.get() as usize]
    }

    #[inline]
    fn segment_mut(&mut self, index: SegmentIndex) -> &mut Segment {
        &mut self.segments.entries[index.get() as usize]
    }

    /// The listed free segment `link` names, if it names one.
    #[inline]
    fn free_at(&self, link: Link) -> Option<SegmentIndex> {
        let segment = self.segments.at(link)?;
        segment.state.is_listed().then(|| link.followed())
    }

    /// Puts free segment `index`, on no list, first on the list of its extent's
    /// class.
    #[inline]
    fn link(&mut self, index: SegmentIndex) {
        let class = class_of(self.segment(index).extent);
        self.free.push(&mut self.segments, class, index);
        self.lists_version = self.lists_version.wrapping_add(1);
    }

    /// Takes listed free segment `index` off its list.
    #[inline]
    fn unlink(&mut self, index: SegmentIndex) {
        let other_list = self.free.remove(&mut self.segments, index);
        debug_assert!(other_list.is_none(), "an arena lists only by class");
        self.lists_version = self.lists_version.wrapping_add(1);
    }

    /// Moves listed free segment `index` first on its class's list, where it is not
    /// first already (a block freed and placed again before the free rest of the
    /// range: 34 instructions fewer a step of a Python loop of 4 KiB reserves when
    /// added, `bench_reserve.py --loop default`, callgrind). Out of line: the place that
    /// calls it is inlined into every reserve (inline, the FIFO step of
    /// `examples/peer_loops.rs` ran 4 instructions more), and this path is not the
    /// common one.
    #[inline(never)]
    fn list_first(&mut self, index: SegmentIndex) {
        if self.free.head(class_of(self.segment(index).extent)) != Link::to(index) {
            self.unlink(index);
            self.link(index);
        }
    }

    /// Changes the extent of listed free segment `index` to `extent`, leaving it
    /// first on its class's list: in place when it is first already and its class
    /// stays, else by taking it off and putting it back (the same lists either way).
    #[inline(always)]
    fn resize_free(&mut self, index: SegmentIndex, extent: u64) {
        let class = class_of(extent);
        let segment = self.segment(index);
        let in_place = segment.state == SegmentState::listed(class) && segment.free.prev.is_none();
        if in_place {
            // A listed segment resized (the unlink below counts the other way).
            self.lists_version = self.lists_version.wrapping_add(1);
        } else {
            self.unlink(index);
            self.free.push(&mut self.segments, class, index);
        }
        self.segment_mut(index).extent = extent;
    }

    /// Whether, were the deferred segment of `extent` bytes (whose previous
    /// neighbour is used) merged with its listed free next neighbour `next`, a place
    /// of `extent` bytes would take the merged segment: what [`FreeHeads::find`]
    /// would see after the merge, which unlists `next` and lists the merged segment
    /// first on its class. Lets a place take the deferred segment back as it is,
    /// placing what eager coalescing places.
    #[inline]
    fn merged_would_be_taken(&self, next: SegmentIndex, extent: u64) -> bool {
        let next_segment = self.segment(next);
        let class = class_of(extent);
        let merged_class = class_of(extent.wrapping_add(next_segment.extent));
        if merged_class == class {
            // First on the request's own class, and it fits.
            return true;
        }
        // No member of the request's own class but `next` fits within the probes...
        let mut cursor = self.free.head(class);
        let mut probes = 0;
        while probes < OWN_CLASS_PROBES {
            let Some(segment) = self.segments.at(cursor) else {
                break;
            };
            if cursor != Link::to(next) {
                if segment.extent >= extent {
                    return false;
                }
                probes += 1;
            }
            cursor = segment.free.next;
        }
        // ...and no class between the request's and the merged one's holds a segment
        // once `next` is unlisted.
        let Some(next_class) = next_segment.state.class() else {
            return false;
        };
        let next_alone =
            self.free.head(next_class) == Link::to(next) && next_segment.free.next.is_none();
        let mut larger = self.free.first_from(class + 1);
        if next_alone && larger == Some(next_class) {
            larger = self.free.first_from(next_class + 1);
        }
        if larger.is_some_and(|larger| larger < merged_class) {
            return false;
        }
        // The merged segment is then first on the smallest larger class. A search that
        // spares the recent takes that class's last member, which is the merged segment
        // only when it is alone there (`next` unlisted)...
        if spares_recent(merged_class, extent) {
            return self.free.head(merged_class).is_none()
                || (next_alone && next_class == merged_class);
        }
        // ...any other its first member, the merged segment, unless one of the members
        // after it within the probes is no larger than the rest splitting it leaves,
        // the bytes of `next` (none when those are below the class's sizes).
        if next_segment.extent < class_floor(extent.wrapping_add(next_segment.extent)) {
            return true;
        }
        let (mut cursor, mut probes) = (self.free.head(merged_class), 1);
        while probes < OWN_CLASS_PROBES {
            let Some(segment) = self.segments.at(cursor) else {
                break;
            };
            if cursor != Link::to(next) {
                if segment.extent <= next_segment.extent {
                    return false;
                }
                probes += 1;
            }
            cursor = segment.free.next;
        }
        true
    }

    /// Whether the last place that took the deferred segment back did so beside `next`
    /// for `extent` bytes, with the lists as they are now (see `Arena::taken_back`).
    #[inline(always)]
    fn known_taken_back(&self, next: SegmentIndex, extent: u64) -> bool {
        let known = self.taken_back == (Link::to(next), extent, self.lists_version);
        debug_assert!(!known || self.merged_would_be_taken(next, extent));
        known
    }

    /// Places a block of `extent` bytes for `size` bytes at the start of a best-fit
    /// free segment; `None` when no free segment is large enough.
    #[inline(always)]
    pub(crate) fn place(&mut self, size: u64, extent: u64) -> Option<Block> {
        if let Some(deferred) = self.deferred.get() {
            let segment = self.segment(deferred);
            if segment.extent == extent && self.free_at(segment.prev).is_none() {
                match self.free_at(segment.next) {
                    None => {
                        self.deferred = Link::NONE;
                        return Some(self.occupy(deferred, size));
                    }
                    Some(next)
                        if self.known_taken_back(next, extent)
                            || self.merged_would_be_taken(next, extent) =>
                    {
                        // Eager coalescing would merge the pair, place the block at
                        // its start and list the rest (the very bytes of `next`) first
                        // on its class: the same bytes, without the merge and split.
                        self.list_first(next);
                        self.deferred = Link::NONE;
                        // Listing `next` first keeps the answer (the probes skip it,
                        // and a class it heads alone is passed over).
                        self.taken_back = (Link::to(next), extent, self.lists_version);
                        return Some(self.occupy(deferred, size));
                    }
                    Some(_) => {}
                }
            }
            self.flush_deferred();
        }
        let index = self.free.find_sparing_recent(&self.segments, extent)?;
        let free = self.segment(index);
        let (offset, free_extent, prev) = (free.offset, free.extent, free.prev);
        let taken = if free_extent == extent {
            self.unlink(index);
            index
        } else {
            let taken = SegmentIndex::stored(
                self.segments
                    .insert(Segment {
                        offset,
                        extent,
                        prev,
                        next: Link::to(index),
                        free: FreeLinks::holding(size),
                        state: SegmentState::USED,
                        generation: 0,
                    })
                    .index,
            );
            match self.segments.at_mut(prev) {
                Some(prev) => prev.next = Link::to(taken),
                None => self.first = Link::to(taken),
            }
            let rest = self.segment_mut(index);
            rest.offset = rest.offset.wrapping_add(extent);
            rest.prev = Link::to(taken);
            self.resize_free(index, free_extent.wrapping_sub(extent));
            taken
        };
        Some(self.occupy(taken, size))
    }

    /// Marks free segment `index`, on no list, used for `size` bytes, under a new
    /// generation: a segment freed and taken again in place (not merged away) keeps
    /// its entry, and the id of the block it held before must not name the new one
    /// (a stale id's release freed the new block, its bytes then handed out twice).
    #[inline]
    fn occupy(&mut self, index: SegmentIndex, size: u64) -> Block {
        let segment = self.segment_mut(index);
        segment.state = SegmentState::USED;
        segment.free = FreeLinks::holding(size);
        segment.generation = segment.generation.wrapping_add(1);
        let slot = SlotId {
            index: index.get(),
            generation: segment.generation,
        };
        let (offset, extent) = (segment.offset, segment.extent);
        self.used = self.used.wrapping_add(1);
        Block {
            slot,
            offset,
            extent,
            size,
        }
    }

    /// The used block `slot` names, if any.
    #[inline]
    pub(crate) fn get(&self, slot: SlotId) -> Option<Block> {
        let segment = self.segments.get(slot)?;
        (segment.state == SegmentState::USED).then_some(Block {
            slot,
            offset: segment.offset,
            extent: segment.extent,
            size: segment.free.held(),
        })
    }

    /// Frees the used block `slot` names (merged with its free neighbours at the
    /// next place or release); returns it, or `None` when `slot` names no used
    /// block.
    #[inline(always)]
    pub(crate) fn release(&mut self, slot: SlotId) -> Option<Block> {
        let block = self.get(slot)?;
        // A used segment's index is a live entry's, below `u32::MAX`.
        let index = SegmentIndex::stored(slot.index);
        self.used = self.used.wrapping_sub(1);
        if let Some(deferred) = self.deferred.get() {
            let segment = self.segment(index);
            if segment.next == Link::to(deferred) {
                self.join_deferred(index, deferred);
                return Some(block);
            }
            if segment.prev == Link::to(deferred) {
                self.join_deferred(deferred, index);
                return Some(block);
            }
            self.coalesce(deferred);
        }
        let segment = self.segment_mut(index);
        segment.state = SegmentState::DEFERRED;
        self.deferred = Link::to(index);
        Some(block)
    }

    /// Frees a used segment beside the deferred segment, `first` the one before
    /// `second`: the two become one deferred segment, without a merge with listed
    /// neighbours yet (blocks freed one after another, in the order they were placed
    /// in or its reverse). The lists change at the next place or release, as eager
    /// coalescing would have left them: releases read no list, and a deferred segment
    /// looks used to its neighbours' merges.
    #[inline(never)]
    fn join_deferred(&mut self, first: SegmentIndex, second: SegmentIndex) {
        let absorbed = self.segment(second);
        let (extent, after) = (absorbed.extent, absorbed.next);
        self.segments.discard_at(second);
        if let Some(segment) = self.segments.at_mut(after) {
            segment.prev = Link::to(first);
        }
        let segment = self.segment_mut(first);
        segment.next = after;
        segment.extent = segment.extent.wrapping_add(extent);
        segment.state = SegmentState::DEFERRED;
        self.deferred = Link::to(first);
    }

    /// Merges and lists the deferred segment, if any.
    #[inline]
    fn flush_deferred(&mut self) {
        if let Some(deferred) = self.deferred.take() {
            self.coalesce(deferred);
        }
    }

    /// Merges free segment `index`, on no list, with its listed free neighbours, and
    /// lists what results (first on its class). The free neighbour before absorbs it
    /// (and the one after), else the one after absorbs it, each resized in place on
    /// its list where its class stays (as the sliced pool does).
    fn coalesce(&mut self, index: SegmentIndex) {
        let segment = self.segment(index);
        let (offset, extent, prev, next) =
            (segment.offset, segment.extent, segment.prev, segment.next);
        match (self.free_at(prev), self.free_at(next)) {
            (Some(prev), free_next) => {
                self.segments.discard_at(index);
                let mut merged = self.segment(prev).extent.wrapping_add(extent);
                let mut after = next;
                if let Some(next) = free_next {
                    self.unlink(next);
                    let absorbed = self.segment(next);
                    (merged, after) = (merged.wrapping_add(absorbed.extent), absorbed.next);
                    self.segments.discard_at(next);
                }
                if let Some(after) = self.segments.at_mut(after) {
                    after.prev = Link::to(prev);
                }
                self.segment_mut(prev).next = after;
                self.resize_free(prev, merged);
            }
            (None, Some(next)) => {
                self.segments.discard_at(index);
                match self.segments.at_mut(prev) {
                    Some(before) => before.next = Link::to(next),
                    None => self.first = Link::to(next),
                }
                let merged = self.segment(next).extent.wrapping_add(extent);
                let absorbing = self.segment_mut(next);
                absorbing.offset = offset;
                absorbing.prev = prev;
                self.resize_free(next, merged);
            }
            (None, None) => self.link(index),
        }
    }

    /// Every used block, in offset order.
    pub(crate) fn blocks(&self) -> impl Iterator<Item = Block> + '_ {
        let mut cursor = self.first;
        std::iter::from_fn(move || loop {
            let index = cursor.get()?;
            let segment = self.segments.at(cursor)?;
            cursor = segment.next;
            if segment.state == SegmentState::USED {
                return self.segments.id_at(index).and_then(|slot| self.get(slot));
            }
        })
    }

    /// Checks the chain and the lists: segments tile the range without gap or
    /// overlap, no two free segments neighbour, every free segment is on the list of
    /// its class and nothing else is. Extents are multiples of `alignment` but for
    /// the range's last segment.
    pub(crate) fn check(&self, alignment: u64) -> Result<(), String> {
        let (mut cursor, mut prev, mut offset) = (self.first, Link::NONE, 0u64);
        let (mut seen, mut free_seen, mut prev_free) = (0usize, 0usize, false);
        let mut deferred_seen = false;
        while cursor.is_some() {
            let segment = self
                .segments
                .at(cursor)
                .ok_or("the range links to a dead segment")?;
            seen += 1;
            ensure(seen <= self.segments.len(), || {
                "the range's chain loops".into()
            })?;
            ensure(segment.offset == offset, || {
                format!("gap or overlap at offset {offset}")
            })?;
            ensure(segment.prev == prev, || "broken back link".into())?;
            ensure(segment.extent > 0, || "empty segment".into())?;
            ensure(segment.offset % alignment == 0, || {
                "misaligned block".into()
            })?;
            ensure(
                segment.extent % alignment == 0 || segment.offset + segment.extent == self.size,
                || "extent not a multiple of the alignment".into(),
            )?;
            match segment.state.view() {
                StateView::Used => {
                    ensure(segment.free.held() <= segment.extent, || {
                        "size beyond extent".into()
                    })?;
                    prev_free = false;
                }
                StateView::Deferred => {
                    ensure(cursor == self.deferred, || {
                        format!("a deferred segment at {offset} is not the arena's")
                    })?;
                    deferred_seen = true;
                    free_seen += 1;
                    prev_free = false;
                }
                StateView::Listed(class) => {
                    ensure(!prev_free, || {
                        format!("two free segments neighbour at offset {offset}")
                    })?;
                    ensure(class == class_of(segment.extent), || {
                        format!("free segment at {offset} is on the wrong list")
                    })?;
                    free_seen += 1;
                    prev_free = true;
                }
                StateView::WholePage | StateView::Vacant => {
                    return Err(format!(
                        "the range links to a segment in state {:?}",
                        segment.state
                    ));
                }
            }
            offset += segment.extent;
            (prev, cursor) = (cursor, segment.next);
        }
        ensure(offset == self.size, || {
            format!("segments cover {offset} of the range's {} bytes", self.size)
        })?;
        ensure(seen == self.segments.len(), || "orphan segments".into())?;
        ensure(seen - free_seen == self.used, || {
            "the count of used blocks drifted".into()
        })?;
        let listed = self.free.check_lists(&self.segments, self.segments.len())?;
        ensure(deferred_seen == self.deferred.is_some(), || {
            "the deferred segment is not a free segment of the range".into()
        })?;
        ensure(listed + usize::from(deferred_seen) == free_seen, || {
            format!("{listed} segments are listed, {free_seen} are free")
        })?;
        ensure(
            self.segments.vacant.iter().all(|&index| {
                self.segments
                    .at(Link::to(index))
                    .is_some_and(|segment| segment.state == SegmentState::VACANT)
            }),
            || "a vacant entry holds a segment".into(),
        )?;
        self.free.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::bins::{class_of, SPARE_RATIO};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The same program against two arenas, one deferring coalescing (and taking
        /// the deferred segment back without merging when that places the same) and
        /// one merging at every release: every block is placed at the same bytes
        /// (segment ids may differ), and both arenas' invariants hold after every
        /// step.
        #[test]
        fn deferred_coalescing_places_as_eager_coalescing(
            steps in prop::collection::vec(
                prop_oneof![
                    (1u64..6).prop_map(|units| Some(units * 64)),
                    // More than SPARE_RATIO times the small ones: a small request
                    // that must split these takes the one listed longest ago.
                    (300u64..360).prop_map(|units| Some(units * 64)),
                    Just(None),
                ],
                1..300,
            ),
            picks in prop::collection::vec(any::<usize>(), 300),
        ) {
            let (mut deferring, mut eager) = (Arena::new(1 << 24), Arena::new(1 << 24));
            // Each live block's id in both arenas.
            let mut live: Vec<(SlotId, SlotId)> = Vec::new();
            let bytes = |block: Block| (block.offset, block.extent, block.size);
            for (step, pick) in steps.into_iter().zip(picks) {
                match step {
                    Some(extent) => {
                        let placed = deferring.place(extent, extent).unwrap();
                        let twin = eager.place(extent, extent).unwrap();
                        prop_assert_eq!(bytes(placed), bytes(twin));
                        live.push((placed.slot, twin.slot));
                    }
                    None if !live.is_empty() => {
                        let (slot, twin) = live.swap_remove(pick % live.len());
                        let released = deferring.release(slot).map(bytes);
                        prop_assert_eq!(released, eager.release(twin).map(bytes));
                        eager.flush_deferred();
                    }
                    None => {}
                }
                deferring.check(64).map_err(TestCaseError::fail)?;
                eager.check(64).map_err(TestCaseError::fail)?;
                prop_assert_eq!(eager.deferred, Link::NONE);
            }
        }
    }

    /// Holes of `hole` bytes freed in the order of their offsets, each between used
    /// 64-byte guards so that none merges: returns the arena and the holes' offsets,
    /// oldest first.
    fn arena_with_holes(hole: u64, count: usize) -> (Arena, Vec<u64>) {
        let mut arena = Arena::new(1 << 22);
        let mut blocks = Vec::new();
        for _ in 0..count {
            blocks.push(arena.place(hole, hole).unwrap());
            arena.place(64, 64).unwrap();
        }
        for block in &blocks {
            arena.release(block.slot).unwrap();
        }
        (arena, blocks.iter().map(|block| block.offset).collect())
    }

    /// A request under 1/`SPARE_RATIO` of every segment of the class it must split
    /// takes the one freed longest ago, and the hole freed last is left whole for the
    /// next request of its size, which reuses it exactly.
    #[test]
    fn a_negligible_request_spares_the_hole_freed_last() {
        let hole = 64 << 10;
        let (mut arena, holes) = arena_with_holes(hole, 3);
        let tiny = arena.place(64, 64).unwrap();
        assert_eq!(tiny.offset, holes[0], "the hole freed first");
        let again = arena.place(hole, hole).unwrap();
        assert_eq!(again.offset, holes[2], "the hole freed last, whole");
        arena.check(64).unwrap();
    }

    /// A request within `SPARE_RATIO` times of the class it splits takes the segment
    /// freed last, as every search of its own class does.
    #[test]
    fn a_request_near_the_holes_size_takes_the_hole_freed_last() {
        let hole = 64 << 10;
        let (mut arena, holes) = arena_with_holes(hole, 3);
        let half = arena.place(hole / 2, hole / 2).unwrap();
        assert_eq!(half.offset, holes[2]);
        // Just at the ratio: every member is exactly SPARE_RATIO times the request,
        // not more, so the segment freed last is taken still.
        let (mut arena, holes) = arena_with_holes(hole, 3);
        let at_ratio = arena.place(64, hole / SPARE_RATIO).unwrap();
        assert_eq!(at_ratio.offset, holes[2]);
        arena.check(64).unwrap();
    }

    /// A request that must split a segment of a larger class takes the one freed last,
    /// unless another of the class's first members is no larger than what splitting
    /// it would leave: then that one, and the segment freed last stays whole for a
    /// request of its size.
    #[test]
    fn a_request_splitting_a_larger_class_spares_the_hole_freed_last_for_a_cut_one() {
        // Two holes of one class (65,536 to 73,727 bytes), the smaller freed first.
        let (smaller, larger) = (65_536, 69_952);
        assert_eq!(class_of(smaller), class_of(larger));
        let holes = || {
            let mut arena = Arena::new(1 << 22);
            let first = arena.place(smaller, smaller).unwrap();
            arena.place(64, 64).unwrap();
            let second = arena.place(larger, larger).unwrap();
            arena.place(64, 64).unwrap();
            arena.release(first.slot).unwrap();
            arena.release(second.slot).unwrap();
            (arena, first.offset, second.offset)
        };
        // 4 KiB: of a lower class, within SPARE_RATIO of the holes (not negligible), and
        // the larger hole less it is no smaller than the smaller hole.
        let request = 4 << 10;
        assert!(class_of(request) < class_of(smaller) && request * SPARE_RATIO > larger);
        assert!(smaller <= larger - request);
        let (mut arena, first, second) = holes();
        let placed = arena.place(request, request).unwrap();
        assert_eq!(placed.offset, first, "the smaller hole, freed first");
        let whole = arena.place(larger, larger).unwrap();
        assert_eq!(whole.offset, second, "the hole freed last, left whole");
        arena.check(64).unwrap();
        // 8 KiB: the larger hole less it would be smaller than the smaller hole, so the
        // hole freed last is split, as any search of a class's first member.
        let request = 8 << 10;
        assert!(smaller > larger - request);
        let (mut arena, _, second) = holes();
        assert_eq!(arena.place(request, request).unwrap().offset, second);
        arena.check(64).unwrap();
    }

    /// The block just released before a free segment, which merged with it would be
    /// first on a class holding a smaller segment no larger than the merge less the
    /// request, is not taken back in place by a request of its size: the search takes
    /// the smaller segment, as it does after eager coalescing.
    #[test]
    fn a_block_beside_free_space_is_not_taken_back_over_a_cut_segment() {
        let script = |eager: bool| {
            let mut arena = Arena::new(1 << 22);
            let cut = arena.place(65_536, 65_536).unwrap();
            arena.place(64, 64).unwrap();
            let small = arena.place(1_024, 1_024).unwrap();
            let after = arena.place(67_968, 67_968).unwrap();
            arena.place(64, 64).unwrap();
            // The small block last, beside the free space after it (listed, not
            // deferred with it: the cut segment's release came between).
            for slot in [after.slot, cut.slot, small.slot] {
                arena.release(slot).unwrap();
                if eager {
                    arena.flush_deferred();
                }
            }
            let placed = arena.place(1_024, 1_024).unwrap();
            arena.check(64).unwrap();
            (placed.offset, cut.offset)
        };
        let (deferring, cut) = script(false);
        assert_eq!(deferring, script(true).0);
        assert_eq!(
            deferring, cut,
            "the segment no larger than the merge less 1 KiB"
        );
    }

    /// The block just released, before a free segment whose class holds an older
    /// segment too, is not taken back in place by a negligible request: merged with
    /// its neighbour it would be first on that class, and the search that spares the
    /// recent takes the older one, as eager coalescing would.
    #[test]
    fn a_negligible_request_is_not_taken_back_beside_a_recent_hole() {
        let hole = 20 << 10;
        let mut arena = Arena::new(1 << 22);
        let older = arena.place(hole, hole).unwrap();
        arena.place(64, 64).unwrap();
        let tiny = arena.place(64, 64).unwrap();
        let recent = arena.place(hole, hole).unwrap();
        arena.place(64, 64).unwrap();
        // Released between the hole and the tiny block, so that the hole is listed
        // (not deferred beside it) when the tiny block is released.
        let last = arena.place(hole, hole).unwrap();
        arena.release(older.slot).unwrap();
        arena.release(recent.slot).unwrap();
        arena.release(last.slot).unwrap();
        arena.release(tiny.slot).unwrap();
        assert_eq!(
            arena.deferred,
            Link::to(SegmentIndex::stored(tiny.slot.index))
        );
        let again = arena.place(64, 64).unwrap();
        assert_eq!(
            again.offset, older.offset,
            "the older hole, not back in place"
        );
        arena.check(64).unwrap();
    }

    /// A segment entry is 40 bytes, and a handle-less id of a block (what the FIFO
    /// loop of `examples/peer_loops.rs` queues) 12: BENCHMARKS.md's reading of the
    /// FIFO's cache misses (`benches/report.py`) counts the one cold entry a step
    /// reads as 0.63 of a 64-byte line, and the queue's ids as 0.19.
    #[test]
    fn a_segment_entry_is_40_bytes_and_a_slot_ref_12() {
        assert_eq!(std::mem::size_of::<Segment>(), 40);
        assert_eq!(std::mem::size_of::<crate::handle::SlotRef>(), 12);
    }

    /// A place of the extent just released, whose previous neighbour is used and
    /// whose next one is the free rest of the range, takes the released bytes back
    /// (as eager coalescing would place it) and leaves the rest listed.
    #[test]
    fn a_freed_block_before_free_space_is_taken_back_in_place() {
        let mut arena = Arena::new(1 << 20);
        let first = arena.place(256, 256).unwrap();
        let second = arena.place(512, 512).unwrap();
        arena.release(second.slot).unwrap();
        let again = arena.place(512, 512).unwrap();
        assert_eq!((again.offset, again.extent), (second.offset, second.extent));
        assert_eq!(
            again.slot.index, second.slot.index,
            "taken back, not merged and split"
        );
        assert_ne!(
            again.slot, second.slot,
            "under a new generation: the old id is stale"
        );
        assert_eq!(arena.get(second.slot), None);
        assert_eq!(arena.deferred, Link::NONE);
        arena.check(64).unwrap();
        assert_eq!(arena.used(), 2);
        assert_ne!(first.slot, again.slot);
    }
}
