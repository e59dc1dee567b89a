//! Pages carved into slices, placed best-fit in O(log n).
//!
//! Every page is a chain of segments ordered by offset (each links to its
//! neighbours); free segments are also kept in size-class bins with a bitmap
//! ([`FreeBins`]), so a reservation finds a fitting free segment in O(1) without
//! scanning pages (exact sizes first, else the smallest non-empty larger class), and a
//! release merges with its neighbours in O(1).
//!
//! Two CubeCL quirks are fixed here: a segment keeps its padded extent, so a freed
//! padded slice fits the same request again; and splitting never drops bytes from
//! the books (`bytes_reserved` is whole pages).

use super::bins::FreeBins;
use super::{ensure, extent_of, AcceptRule, Books, MemoryPool, Placement, Slab, SlotId};
use crate::error::PoolError;
use crate::storage::{ComputeStorage, StorageHandle};
use crate::usage::MemoryUsage;

/// One page of the pool.
#[derive(Debug, Clone)]
struct Page {
    storage: StorageHandle,
    /// The segment at offset 0.
    first: SlotId,
    /// The number of used segments; the page is free when zero.
    used: u32,
}

/// A run of bytes of one page, used by one reservation or free.
#[derive(Debug, Clone)]
struct Segment {
    page: SlotId,
    offset: u64,
    /// The bytes the segment spans; a multiple of the alignment.
    extent: u64,
    /// The bytes asked for, when used.
    size: u64,
    used: bool,
    prev: Option<SlotId>,
    next: Option<SlotId>,
    /// The segment's position in its free bin, when free.
    bin_position: u32,
}

/// A pool of `page_size` pages carved into slices.
#[derive(Debug, Clone)]
pub struct SlicedPool {
    page_size: u64,
    max_slice_size: u64,
    /// The most pages the pool may hold, when capped.
    max_pages: Option<u64>,
    alignment: u64,
    pages: Slab<Page>,
    segments: Slab<Segment>,
    /// Invariant: exactly the free segments, each at its `bin_position`.
    free: FreeBins,
    books: Books,
}

impl SlicedPool {
    /// A pool of `page_size` pages serving slices up to `max_slice_size` (and, when
    /// uncapped, sizes within 20 % of a page), holding at most
    /// `max_pool_size / page_size` pages when capped. Sizes are effective ones (see
    /// `MemoryConfiguration::resolve`).
    pub fn new(
        page_size: u64,
        max_slice_size: u64,
        max_pool_size: Option<u64>,
        alignment: u64,
    ) -> Self {
        Self {
            page_size,
            max_slice_size,
            max_pages: max_pool_size.map(|cap| cap / page_size),
            alignment,
            pages: Slab::default(),
            segments: Slab::default(),
            free: FreeBins::default(),
            books: Books::default(),
        }
    }

    fn segment(&self, id: SlotId) -> &Segment {
        self.segments
            .get(id)
            .expect("segment ids in the pool are live")
    }

    fn segment_mut(&mut self, id: SlotId) -> &mut Segment {
        self.segments
            .get_mut(id)
            .expect("segment ids in the pool are live")
    }

    /// Puts free segment `id` into its bin.
    fn bin(&mut self, id: SlotId) {
        let extent = self.segment(id).extent;
        let position = self.free.insert(id, extent);
        self.segment_mut(id).bin_position = position;
    }

    /// Takes free segment `id` out of its bin.
    fn unbin(&mut self, id: SlotId) {
        let segment = self.segment(id);
        let (extent, position) = (segment.extent, segment.bin_position);
        if let Some(moved) = self.free.remove(extent, position) {
            self.segment_mut(moved).bin_position = position;
        }
    }

    fn map_page(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<SlotId, PoolError> {
        if let Some(max_pages) = self.max_pages {
            if self.pages.len() as u64 >= max_pages {
                return Err(PoolError::PoolCapacityExceeded {
                    size,
                    capacity: max_pages * self.page_size,
                    in_use: self.books.usage.bytes_in_use,
                });
            }
        }
        let handle = storage.alloc(self.page_size, self.alignment)?;
        // The page's id is needed by its first segment and the other way round:
        // insert the page with a placeholder, then link.
        let page = self.pages.insert(Page {
            storage: handle,
            first: SlotId {
                index: u32::MAX,
                generation: 0,
            },
            used: 0,
        });
        let first = self.segments.insert(Segment {
            page,
            offset: 0,
            extent: self.page_size,
            size: 0,
            used: false,
            prev: None,
            next: None,
            bin_position: 0,
        });
        if let Some(page) = self.pages.get_mut(page) {
            page.first = first;
        }
        self.bin(first);
        self.books.usage.bytes_reserved += self.page_size;
        self.books.stats.page_mapped(&self.books.usage);
        Ok(first)
    }

    /// Changes the extent of free segment `id` to `extent` and makes it the most
    /// recently freed member of its bin (as a newly freed segment would be, so the
    /// placement policy does not depend on which segment keeps its id).
    fn resize_free(&mut self, id: SlotId, extent: u64) {
        self.unbin(id);
        self.segment_mut(id).extent = extent;
        self.bin(id);
    }

    /// Points the segment before `segment` (or its page, when it is the first) at
    /// `id` instead.
    fn relink_prev(&mut self, segment: &Segment, id: SlotId) {
        match segment.prev {
            Some(prev) => self.segment_mut(prev).next = Some(id),
            None => {
                if let Some(page) = self.pages.get_mut(segment.page) {
                    page.first = id;
                }
            }
        }
    }

    /// Points the segment after `segment`, if any, back at `id` instead.
    fn relink_next(&mut self, segment: &Segment, id: SlotId) {
        if let Some(next) = segment.next.and_then(|next| self.segments.get_mut(next)) {
            next.prev = Some(id);
        }
    }

    /// Reserves `size` bytes padded to `extent` at the start of free segment `id`.
    /// An exact fit turns the segment used; otherwise the used part becomes a new
    /// segment in front of it, and the free rest keeps its id (and, usually, its bin).
    fn take(&mut self, id: SlotId, size: u64, extent: u64) -> Placement {
        let free = self.segment(id).clone();
        let taken = if free.extent == extent {
            self.unbin(id);
            let segment = self.segment_mut(id);
            segment.used = true;
            segment.size = size;
            id
        } else {
            let taken = self.segments.insert(Segment {
                page: free.page,
                offset: free.offset,
                extent,
                size,
                used: true,
                prev: free.prev,
                next: Some(id),
                bin_position: 0,
            });
            self.relink_prev(&free, taken);
            let rest = self.segment_mut(id);
            rest.offset += extent;
            rest.prev = Some(taken);
            self.resize_free(id, free.extent - extent);
            taken
        };
        let page = self
            .pages
            .get_mut(free.page)
            .expect("segments lie on live pages");
        page.used += 1;
        let storage = page.storage;
        self.books.usage.add(size, extent);
        self.books.stats.allocated(size, &self.books.usage);
        Placement {
            slot: taken,
            storage,
            offset: free.offset,
            size,
        }
    }

    fn is_free(&self, id: Option<SlotId>) -> Option<SlotId> {
        id.filter(|&id| self.segments.get(id).is_some_and(|segment| !segment.used))
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
        debug_assert!(size > 0 && size <= self.page_size);
        let extent = extent_of(size, self.alignment)
            .filter(|&extent| extent <= self.page_size)
            .ok_or(PoolError::BufferTooBig {
                size,
                max_accepted: self.page_size,
            })?;
        let found = self.free.find(extent).map(|(id, _, _)| id);
        let id = match found {
            Some(id) => id,
            None => self.map_page(storage, size)?,
        };
        Ok(self.take(id, size, extent))
    }

    fn release(&mut self, slot: SlotId) -> Result<(), PoolError> {
        let segment = match self.segments.get_mut(slot) {
            Some(segment) if segment.used => segment,
            _ => {
                return Err(PoolError::NotFound {
                    reason: format!("slice {} is not reserved in this sliced pool", slot.index),
                })
            }
        };
        segment.used = false;
        let (size, extent, page, prev, next) = (
            segment.size,
            segment.extent,
            segment.page,
            segment.prev,
            segment.next,
        );
        segment.size = 0;
        self.books.usage.remove(size, extent);
        if let Some(page) = self.pages.get_mut(page) {
            page.used -= 1;
        }
        match (self.is_free(prev), self.is_free(next)) {
            // The free segment before absorbs this one (and the free one after).
            (Some(prev), next) => {
                let freed = self.segments.remove(slot).expect("the slot is live");
                let mut extent = self.segment(prev).extent + freed.extent;
                let mut last = freed;
                if let Some(next) = next {
                    self.unbin(next);
                    last = self.segments.remove(next).expect("neighbours are live");
                    extent += last.extent;
                }
                self.segment_mut(prev).next = last.next;
                self.relink_next(&last, prev);
                self.resize_free(prev, extent);
            }
            // The free segment after absorbs this one, moving back to its offset.
            (None, Some(next)) => {
                let freed = self.segments.remove(slot).expect("the slot is live");
                self.relink_prev(&freed, next);
                let extent = self.segment(next).extent + freed.extent;
                let segment = self.segment_mut(next);
                segment.offset = freed.offset;
                segment.prev = freed.prev;
                self.resize_free(next, extent);
            }
            (None, None) => self.bin(slot),
        }
        Ok(())
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        let segment = self.segments.get(slot).filter(|segment| segment.used)?;
        let page = self.pages.get(segment.page)?;
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
        let free_pages: Vec<(SlotId, Page)> = self
            .pages
            .iter()
            .filter(|(_, page)| page.used == 0)
            .map(|(id, page)| (id, page.clone()))
            .collect();
        for (id, page) in free_pages {
            self.unbin(page.first);
            self.segments.remove(page.first);
            self.pages.remove(id);
            storage.dealloc(page.storage.id);
            self.books.usage.bytes_reserved -= self.page_size;
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
        for (page_id, page) in self.pages.iter() {
            usage.bytes_reserved += self.page_size;
            let mut cursor = Some(page.first);
            let (mut offset, mut used, mut prev, mut prev_free) = (0u64, 0u32, None, false);
            while let Some(id) = cursor {
                let segment = self
                    .segments
                    .get(id)
                    .ok_or_else(|| format!("page {} links to a dead segment", page_id.index))?;
                segments_seen += 1;
                ensure(segment.page == page_id, || {
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
                if segment.used {
                    used += 1;
                    ensure(segment.size <= segment.extent, || {
                        "size beyond extent".into()
                    })?;
                    usage.add(segment.size, segment.extent);
                    prev_free = false;
                } else {
                    ensure(!prev_free, || {
                        "two adjacent free segments were not merged".into()
                    })?;
                    ensure(
                        self.free.holds(id, segment.extent, segment.bin_position),
                        || {
                            format!(
                                "free segment at {offset} of page {} is not in its bin",
                                page_id.index
                            )
                        },
                    )?;
                    free_seen += 1;
                    prev_free = true;
                }
                offset += segment.extent;
                prev = Some(id);
                cursor = segment.next;
            }
            ensure(offset == self.page_size, || {
                format!(
                    "segments of page {} cover {offset} of {} bytes",
                    page_id.index, self.page_size
                )
            })?;
            ensure(used == page.used, || "page used count drifted".into())?;
        }
        ensure(free_seen == self.free.len(), || {
            "free index holds stale entries".into()
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
