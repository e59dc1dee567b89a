//! Pages carved into slices, placed best-fit in O(log n).
//!
//! Every page is a chain of segments ordered by offset (each links to its
//! neighbours); free segments are also on lists by size class, linked through the
//! segments themselves, with the first of each class and a bitmap in [`FreeHeads`];
//! whole free pages are on a list of their own, searched after the classes. So a
//! reservation finds a fitting free segment in O(1) without scanning pages (exact
//! sizes first, else the smallest non-empty larger class), and a release merges with
//! its neighbours in O(1). A search reads the heads (one small array) and then the
//! segment it takes; taking a segment off its list writes its list neighbours and
//! reads nothing more.
//!
//! Coalescing is deferred: the segment released last waits off the lists, unmerged,
//! until the next reserve, release or cleanup. A reserve of its very extent, when it
//! has no free neighbour (a training step that frees and reserves the same shapes,
//! or a FIFO window), takes it back as it is, skipping the merge, the list and the
//! search; anything else first merges and lists it, as the release would have. In
//! both cases the placement is the one eager coalescing makes (the unit tests run
//! both side by side), and the books are exact at every step (the release updates
//! them at once).
//!
//! Two CubeCL quirks are fixed here: a segment keeps its padded extent, so a freed
//! padded slice fits the same request again; and splitting never drops bytes from
//! the books (`bytes_reserved` is whole pages).

use super::bins::{
    check_list, class_of, index_at, push_front, FreeHeads, FreeLinks, FreeSegments, Link,
    SegmentIndex, SegmentState,
};
use super::{
    books_full, ensure, extent_of, unpaddable, zero_size, AcceptRule, Books, MemoryPool, Placement,
    Released, Slab, SlotId,
};
use crate::error::PoolError;
use crate::storage::{ComputeStorage, StorageHandle};
use crate::usage::MemoryUsage;

/// One page of the pool.
#[derive(Debug, Clone)]
struct Page {
    storage: StorageHandle,
    /// The segment at offset 0 ([`Link::NONE`] only while the page is being made).
    first: Link,
}

/// A run of bytes of one page, used by one reservation or free. Links are slab
/// indices without generations: they always name live segments (checked by
/// `check_invariants`); only ids handed out (`SlotId`) carry a generation.
#[derive(Debug, Clone)]
struct Segment {
    offset: u64,
    /// The bytes the segment spans; a multiple of the alignment.
    extent: u64,
    /// The bytes asked for, when used.
    size: u64,
    /// The index of the page in the page arena.
    page: u32,
    /// The segment before this one on the page.
    prev: Link,
    /// The segment after this one on the page.
    next: Link,
    /// When listed: its neighbours on its free list.
    free: FreeLinks,
    /// Used; deferred; or listed, on the list of its class or of whole free pages.
    state: SegmentState,
}

// A slab entry (an `Option` of this and a generation) is 64 bytes, so an index
// becomes an address by a shift rather than a multiply, on every link followed. With
// 56-byte entries the compact layout's replays of gpt2-train, transformer-train and
// mixtral-train measured 2-4 % slower (`replay_ab`, best of 60).
const _: () = assert!(Slab::<Segment>::ENTRY_BYTES == 64);

impl Segment {
    /// Whether a reservation holds the segment.
    #[inline]
    fn used(&self) -> bool {
        self.state == SegmentState::USED
    }
}

impl FreeSegments for Slab<Segment> {
    #[inline(always)]
    fn free_entry(&self, link: Link) -> Option<(u64, SegmentState, FreeLinks)> {
        self.linked(link)
            .map(|segment| (segment.extent, segment.state, segment.free))
    }

    #[inline(always)]
    fn free_entry_mut(&mut self, link: Link) -> Option<(&mut SegmentState, &mut FreeLinks)> {
        self.linked_mut(link)
            .map(|segment| (&mut segment.state, &mut segment.free))
    }
}

/// A pool of `page_size` pages carved into slices, placed best-fit through size
/// classes. A released slice is merged with its free neighbours at the pool's next
/// operation, or taken back in place when that is a reserve of its very extent
/// (deferred coalescing; placements are the same as merging at once).
#[derive(Debug, Clone)]
pub struct SlicedPool {
    page_size: u64,
    max_slice_size: u64,
    /// The most pages the pool may hold, when capped.
    max_pages: Option<u64>,
    alignment: u64,
    pages: Slab<Page>,
    segments: Slab<Segment>,
    /// Invariant: the class lists hold exactly the free segments smaller than a page,
    /// each on the list of its extent's class, most recently freed first.
    free: FreeHeads,
    /// The first whole free page's segment. Invariant:
    /// its list holds exactly the free segments spanning a whole page, most recently
    /// freed first. Kept apart from the classes so that cutting a slice from an empty
    /// page, and freeing it again, moves the page's segment between this list and
    /// one class instead of between two classes; searched after the classes, where
    /// the classes' largest (a page's) would put it.
    free_pages: Link,
    /// The segment released last, when no operation has come since: deferred
    /// coalescing (see the module docs and `takes_back`). Invariant: it is free,
    /// `Deferred`, on no list, and the only free segment that may neighbour another
    /// free one.
    deferred: Link,
    books: Books,
}

impl SlicedPool {
    /// A pool of `page_size` pages serving slices up to `max_slice_size` (and, when
    /// uncapped, sizes within 20 % of a page), holding at most
    /// `max_pool_size / page_size` pages when capped (none, when `page_size` is 0).
    /// Sizes are effective ones (see `MemoryConfiguration::resolve`).
    pub fn new(
        page_size: u64,
        max_slice_size: u64,
        max_pool_size: Option<u64>,
        alignment: u64,
    ) -> Self {
        Self {
            page_size,
            max_slice_size,
            max_pages: max_pool_size.map(|cap| cap.checked_div(page_size).unwrap_or(0)),
            alignment,
            pages: Slab::default(),
            segments: Slab::default(),
            free: FreeHeads::default(),
            free_pages: Link::NONE,
            deferred: Link::NONE,
            books: Books::default(),
        }
    }

    /// The error of a reserve of `size` bytes that no page holds: a size of 0 (which
    /// memory management serves itself, and a pool called directly refuses), any size
    /// where the alignment is 0, or one past a page.
    #[cold]
    fn refused(&self, size: u64) -> PoolError {
        if size == 0 {
            return zero_size();
        }
        unpaddable(size, self.alignment, self.page_size)
    }

    fn segment(&self, index: SegmentIndex) -> &Segment {
        self.segments
            .linked(Link::to(index))
            .expect("linked segments are live")
    }

    fn segment_mut(&mut self, index: SegmentIndex) -> &mut Segment {
        self.segments
            .linked_mut(Link::to(index))
            .expect("linked segments are live")
    }

    /// The free segment `link` names, if it names one on a list (not the deferred
    /// one: it is merged only by `coalesce`).
    #[inline]
    fn listed_at(&self, link: Link) -> Option<SegmentIndex> {
        let segment = self.segments.linked(link)?;
        segment.state.is_listed().then(|| link.followed())
    }

    /// The state of a free segment of `extent` bytes on its list.
    #[inline]
    fn listed_state(&self, extent: u64) -> SegmentState {
        if extent == self.page_size {
            SegmentState::WHOLE_PAGE
        } else {
            SegmentState::listed(class_of(extent))
        }
    }

    /// Puts free segment `index`, on no list, first on the list of its extent's
    /// class (or of whole free pages).
    #[inline(always)]
    fn bin(&mut self, index: SegmentIndex) {
        self.link(index, self.listed_state(self.segment(index).extent));
    }

    /// Puts free segment `index`, on no list, first on the list of `state`.
    #[inline(always)]
    fn link(&mut self, index: SegmentIndex, state: SegmentState) {
        match state.class() {
            Some(class) => self.free.push(&mut self.segments, class, index),
            None => {
                push_front(&mut self.segments, self.free_pages, index, state);
                self.free_pages = Link::to(index);
            }
        }
    }

    /// Takes listed free segment `index` off its list.
    #[inline(always)]
    fn unbin(&mut self, index: SegmentIndex) {
        if let Some(head) = self.free.remove(&mut self.segments, index) {
            self.free_pages = head;
        }
    }

    #[cold]
    fn map_page(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<SegmentIndex, PoolError> {
        if let Some(max_pages) = self.max_pages {
            if self.pages.len() as u64 >= max_pages {
                return Err(PoolError::PoolCapacityExceeded {
                    size,
                    capacity: max_pages * self.page_size,
                    in_use: self.books.usage.bytes_in_use,
                });
            }
        }
        // A page the books cannot count (past `u64::MAX` bytes, which only a storage
        // granting buffers without address space hands out) is refused first.
        let Some(reserved) = self.books.usage.bytes_reserved.checked_add(self.page_size) else {
            return Err(books_full(size, &self.books.usage));
        };
        let handle = storage.alloc(self.page_size, self.alignment)?;
        // The page's index is needed by its first segment and the other way round:
        // insert the page with a placeholder, then link.
        let page = self
            .pages
            .insert(Page {
                storage: handle,
                first: Link::NONE,
            })
            .index;
        let first = index_at(
            self.segments
                .insert(Segment {
                    offset: 0,
                    extent: self.page_size,
                    size: 0,
                    page,
                    prev: Link::NONE,
                    next: Link::NONE,
                    free: FreeLinks::default(),
                    // Listed by `bin` below.
                    state: SegmentState::DEFERRED,
                })
                .index,
        );
        if let Some(page) = self.pages.at_mut(page) {
            page.first = Link::to(first);
        }
        self.bin(first);
        self.books.usage.bytes_reserved = reserved;
        self.books.stats.page_mapped(&self.books.usage);
        Ok(first)
    }

    /// Changes the extent of free segment `index` to `extent`, leaving it first on
    /// its list (in place when it already is and its class stays, else by taking it
    /// off and putting it back).
    #[inline(always)]
    fn resize_free(&mut self, index: SegmentIndex, extent: u64) {
        let state = self.listed_state(extent);
        let segment = self.segment(index);
        let in_place = segment.state == state && segment.free.prev.is_none();
        if !in_place {
            self.unbin(index);
        }
        self.segment_mut(index).extent = extent;
        if !in_place {
            self.link(index, state);
        }
    }

    /// Points the neighbour before a segment (or its page, when it was the first)
    /// at `to`.
    #[inline]
    fn relink_prev(&mut self, prev: Link, page: u32, to: SegmentIndex) {
        match self.segments.linked_mut(prev) {
            Some(prev) => prev.next = Link::to(to),
            None => {
                if let Some(page) = self.pages.at_mut(page) {
                    page.first = Link::to(to);
                }
            }
        }
    }

    /// Reserves `size` bytes padded to `extent` at the start of free segment `index`.
    /// An exact fit turns the segment used; otherwise the used part becomes a new
    /// segment before it and the free rest keeps its index. Either way the free lists
    /// end as if the free segment had been taken out and the rest freed anew.
    fn take(&mut self, index: SegmentIndex, size: u64, extent: u64) -> Placement {
        let free = self.segment(index);
        let (offset, page, free_extent, prev) = (free.offset, free.page, free.extent, free.prev);
        let taken = if free_extent == extent {
            self.unbin(index);
            self.occupy(index, size);
            index
        } else {
            let taken = SegmentIndex::stored(
                self.segments
                    .insert(Segment {
                        offset,
                        extent,
                        size,
                        page,
                        prev,
                        next: Link::to(index),
                        free: FreeLinks::default(),
                        state: SegmentState::USED,
                    })
                    .index,
            );
            self.relink_prev(prev, page, taken);
            let rest = self.segment_mut(index);
            rest.offset += extent;
            rest.prev = Link::to(taken);
            self.resize_free(index, free_extent - extent);
            taken
        };
        self.placed(taken, page, offset, size, extent)
    }

    /// Whether a reserve of `extent` bytes takes the deferred segment `index` back as
    /// it is: when it has that very extent and no free neighbour. Eager coalescing
    /// would then have put it first on its class's list unmerged, where the search
    /// finds it first, so taking it back places exactly as eager coalescing does.
    #[inline]
    fn takes_back(&self, index: SegmentIndex, extent: u64) -> bool {
        let segment = self.segment(index);
        segment.extent == extent
            && self.listed_at(segment.prev).is_none()
            && self.listed_at(segment.next).is_none()
    }

    /// Takes the deferred segment `index` back, whole, for `size` bytes of its
    /// `extent`.
    #[inline]
    fn take_deferred(&mut self, index: SegmentIndex, size: u64, extent: u64) -> Placement {
        let segment = self.segment(index);
        let (offset, page) = (segment.offset, segment.page);
        self.occupy(index, size);
        self.placed(index, page, offset, size, extent)
    }

    /// Marks free segment `index`, already off any list, used for `size` bytes.
    #[inline]
    fn occupy(&mut self, index: SegmentIndex, size: u64) {
        let taken = self.segment_mut(index);
        taken.state = SegmentState::USED;
        taken.size = size;
    }

    /// Books segment `taken` (at `offset` of `page`, `extent` bytes) as reserved for
    /// `size` bytes, and says where it is.
    #[inline(always)]
    fn placed(
        &mut self,
        taken: SegmentIndex,
        page: u32,
        offset: u64,
        size: u64,
        extent: u64,
    ) -> Placement {
        let storage = self
            .pages
            .at(page)
            .expect("segments lie on live pages")
            .storage;
        self.books.usage.add(size, extent);
        self.books.stats.allocated(size, &self.books.usage);
        Placement {
            slot: self
                .segments
                .id_at(taken.get())
                .expect("the taken segment is live"),
            storage,
            offset,
            size,
        }
    }

    /// Merges free segment `index`, on no list, with its listed free neighbours, and
    /// lists what results: what a release does when it is not deferred.
    #[inline(always)]
    fn coalesce(&mut self, index: SegmentIndex) {
        let segment = self.segment(index);
        let (offset, extent, page, prev, next) = (
            segment.offset,
            segment.extent,
            segment.page,
            segment.prev,
            segment.next,
        );
        match (self.listed_at(prev), self.listed_at(next)) {
            // The free segment before absorbs this one (and the free one after).
            (Some(prev), free_next) => {
                self.segments.discard_at(index.get());
                let mut merged = self.segment(prev).extent + extent;
                let mut after = next;
                if let Some(next) = free_next {
                    self.unbin(next);
                    let absorbed = self.segment(next);
                    (merged, after) = (merged + absorbed.extent, absorbed.next);
                    self.segments.discard_at(next.get());
                }
                if let Some(after) = self.segments.linked_mut(after) {
                    after.prev = Link::to(prev);
                }
                self.segment_mut(prev).next = after;
                self.resize_free(prev, merged);
            }
            // The free segment after absorbs this one, moving back to its offset.
            (None, Some(next)) => {
                self.segments.discard_at(index.get());
                self.relink_prev(prev, page, next);
                let merged = self.segment(next).extent + extent;
                let absorbing = self.segment_mut(next);
                absorbing.offset = offset;
                absorbing.prev = prev;
                self.resize_free(next, merged);
            }
            (None, None) => self.bin(index),
        }
    }

    /// Merges and lists the deferred segment, if any.
    #[inline(always)]
    fn flush_deferred(&mut self) {
        if let Some(deferred) = self.deferred.take() {
            self.coalesce(deferred);
        }
    }
}

/// The error of releasing `slot` when it names no reserved slice.
#[cold]
fn not_reserved(slot: SlotId) -> PoolError {
    PoolError::NotFound {
        reason: format!("slice {} is not reserved in this sliced pool", slot.index),
    }
}

impl MemoryPool for SlicedPool {
    fn accept_rule(&self) -> AcceptRule {
        AcceptRule {
            max_size: self.max_slice_size,
            near_page: self.max_pages.is_none().then_some(self.page_size),
        }
    }

    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        let extent = extent_of(size, self.alignment)
            // One compare for 0 < extent <= page: only a size of 0 has an extent of 0,
            // which wraps past every page.
            .filter(|&extent| extent.wrapping_sub(1) < self.page_size)
            .ok_or_else(|| self.refused(size))?;
        if let Some(deferred) = self.deferred.get() {
            if self.takes_back(deferred, extent) {
                self.deferred = Link::NONE;
                return Ok(self.take_deferred(deferred, size, extent));
            }
        }
        self.flush_deferred();
        let found = self
            .free
            .find(&self.segments, extent)
            .or_else(|| self.free_pages.get());
        let index = match found {
            Some(index) => index,
            None => self.map_page(storage, size)?,
        };
        Ok(self.take(index, size, extent))
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        let segment = match self.segments.get_mut(slot) {
            Some(segment) if segment.used() => segment,
            _ => return Err(not_reserved(slot)),
        };
        segment.state = SegmentState::DEFERRED;
        let size = std::mem::take(&mut segment.size);
        let extent = segment.extent;
        self.books.usage.remove(size, extent);
        // The segment released before is merged and listed now; being `Deferred`,
        // this one is no neighbour it merges with.
        self.flush_deferred();
        self.deferred = Link::to(SegmentIndex::stored(slot.index));
        Ok(Released { size, extent })
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        let segment = self.segments.get(slot).filter(|segment| segment.used())?;
        Some(segment.extent)
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        let segment = self.segments.get(slot).filter(|segment| segment.used())?;
        let page = self.pages.at(segment.page)?;
        Some(Placement {
            slot,
            storage: page.storage,
            offset: segment.offset,
            size: segment.size,
        })
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, _reserve_count: u64, explicit: bool) {
        if !explicit {
            return;
        }
        self.flush_deferred();
        // The free pages are those on their list; released in page order.
        let mut free_pages = Vec::new();
        let mut cursor = self.free_pages;
        while let Some(segment) = self.segments.linked(cursor) {
            free_pages.push(segment.page);
            cursor = segment.free.next;
        }
        free_pages.sort_unstable();
        for index in free_pages {
            let (Some(id), Some(page)) = (self.pages.id_at(index), self.pages.at(index).cloned())
            else {
                continue;
            };
            if let Some(first) = page.first.get() {
                self.unbin(first);
                self.segments.discard_at(first.get());
            }
            self.pages.remove(id);
            storage.dealloc(page.storage.id);
            // Saturating: a caller may have rewritten the usage (`books_mut`).
            self.books.usage.bytes_reserved = self
                .books
                .usage
                .bytes_reserved
                .saturating_sub(self.page_size);
            self.books.stats.page_unmapped();
        }
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut usage = MemoryUsage::default();
        let mut free_seen = 0usize;
        let mut segments_seen = 0usize;
        let mut deferred_seen = false;
        for (page_id, page) in self.pages.iter() {
            usage.bytes_reserved += self.page_size;
            let mut cursor = page.first;
            let (mut offset, mut prev, mut prev_free) = (0u64, Link::NONE, false);
            while cursor.is_some() {
                let id = cursor;
                let segment = self
                    .segments
                    .linked(id)
                    .ok_or_else(|| format!("page {} links to a dead segment", page_id.index))?;
                segments_seen += 1;
                ensure(segments_seen <= self.segments.len(), || {
                    format!("the chain of page {} loops", page_id.index)
                })?;
                ensure(segment.page == page_id.index, || {
                    "segment on the wrong page".into()
                })?;
                ensure(segment.offset == offset, || {
                    format!(
                        "gap or overlap at offset {offset} of page {}",
                        page_id.index
                    )
                })?;
                ensure(segment.prev == prev, || "broken back link".into())?;
                ensure(segment.offset % self.alignment == 0, || {
                    "misaligned slice".into()
                })?;
                ensure(
                    segment.extent % self.alignment == 0
                        || segment.offset + segment.extent == self.page_size,
                    || "extent not a multiple of the alignment".into(),
                )?;
                ensure(segment.extent > 0, || "empty segment".into())?;
                if segment.used() {
                    ensure(segment.size <= segment.extent, || {
                        "size beyond extent".into()
                    })?;
                    usage.add(segment.size, segment.extent);
                    prev_free = false;
                } else if id == self.deferred {
                    // Free but not yet merged: it may neighbour a free segment.
                    ensure(segment.state == SegmentState::DEFERRED, || {
                        "the deferred segment is on a list".into()
                    })?;
                    deferred_seen = true;
                    prev_free = false;
                } else {
                    ensure(!prev_free, || {
                        "two adjacent free segments were not merged".into()
                    })?;
                    ensure(segment.state == self.listed_state(segment.extent), || {
                        format!(
                            "free segment at {offset} of page {} is on the wrong list",
                            page_id.index
                        )
                    })?;
                    free_seen += 1;
                    prev_free = true;
                }
                offset += segment.extent;
                prev = id;
                cursor = segment.next;
            }
            ensure(offset == self.page_size, || {
                format!(
                    "segments of page {} cover {offset} of {} bytes",
                    page_id.index, self.page_size
                )
            })?;
        }
        ensure(deferred_seen == self.deferred.is_some(), || {
            "the deferred segment is not a free segment of a page".into()
        })?;
        let most = self.segments.len();
        let listed = self.free.check_lists(&self.segments, most)?
            + check_list(
                &self.segments,
                self.free_pages,
                SegmentState::WHOLE_PAGE,
                most,
            )?;
        ensure(free_seen == listed, || {
            format!("{listed} segments are on the free lists, {free_seen} are free")
        })?;
        self.free.check()?;
        ensure(segments_seen == self.segments.len(), || {
            "orphan segments".into()
        })?;
        ensure(usage == self.books.usage, || {
            format!(
                "usage drifted: books say {:?}, pages say {usage:?}",
                self.books.usage
            )
        })?;
        if let Some(max_pages) = self.max_pages {
            ensure(self.pages.len() as u64 <= max_pages, || {
                "cap exceeded".into()
            })?;
        }
        ensure(self.books.stats.pages == self.pages.len() as u64, || {
            "page count drifted".into()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::VirtualStorage;
    use proptest::prelude::*;

    const KIB: u64 = 1024;

    /// One step of a program against a sliced pool.
    #[derive(Debug, Clone)]
    enum Step {
        Reserve(u64),
        /// Release the live reservation at this index (modulo the live count).
        Release(usize),
        Cleanup,
    }

    /// Sizes of a few neighbouring classes and a whole page, so that released
    /// segments are taken back, merged on both sides, and listed as free pages.
    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => prop::sample::select(vec![1u64, 33, 64, 100, 1000, 1050, 4000, 16 * KIB])
                .prop_map(Step::Reserve),
            5 => any::<usize>().prop_map(Step::Release),
            1 => Just(Step::Cleanup),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The same program against two pools, one deferring coalescing and one
        /// merging at every release: every reservation is placed the same (slot,
        /// page, offset), and the books agree after every step.
        #[test]
        fn deferred_coalescing_places_as_eager_coalescing(
            steps in prop::collection::vec(step(), 1..300),
        ) {
            let (mut deferring, mut eager) = (
                SlicedPool::new(16 * KIB, 16 * KIB, None, 32),
                SlicedPool::new(16 * KIB, 16 * KIB, None, 32),
            );
            let (mut storage_deferring, mut storage_eager) =
                (VirtualStorage::new(), VirtualStorage::new());
            let mut live: Vec<SlotId> = Vec::new();
            for step in steps {
                match step {
                    Step::Reserve(size) => {
                        let placed = deferring.reserve(&mut storage_deferring, size).unwrap();
                        let expected = eager.reserve(&mut storage_eager, size).unwrap();
                        prop_assert_eq!(placed, expected);
                        live.push(placed.slot);
                    }
                    Step::Release(index) if !live.is_empty() => {
                        let slot = live.swap_remove(index % live.len());
                        let released = deferring.release(slot).unwrap();
                        prop_assert_eq!(released, eager.release(slot).unwrap());
                        prop_assert_eq!(deferring.deferred, Link::to(index_at(slot.index)));
                        eager.flush_deferred();
                    }
                    Step::Release(_) => {}
                    Step::Cleanup => {
                        deferring.cleanup(&mut storage_deferring, 0, true);
                        eager.cleanup(&mut storage_eager, 0, true);
                    }
                }
                deferring.check_invariants().map_err(TestCaseError::fail)?;
                eager.check_invariants().map_err(TestCaseError::fail)?;
                prop_assert_eq!(eager.deferred, Link::NONE);
                prop_assert_eq!(deferring.books.usage, eager.books.usage);
            }
        }
    }
}
