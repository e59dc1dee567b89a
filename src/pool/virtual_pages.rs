//! The virtual pool: blocks placed best-fit over one large address range per size
//! group, with memory mapped in granules only where live blocks are, and given back
//! by a release policy.
//!
//! Each pool reserves address space from a storage with [`VirtualMemory`] (lazily,
//! at its first reservation): one range for small requests (up to `small_max`
//! bytes) and one for the rest, so that small, long-lived blocks do not pin granules
//! all over the range large blocks come and go in. Each range is carved by an
//! [`Arena`] (best fit with coalescing, O(1) through the sliced pool's size
//! classes); the granules a block touches are mapped before it is handed out
//! ([`Chunks`]): each run of unmapped granules it covers wholly (no other block can
//! touch them while it lives) as one chunk, and each edge granule it covers in part,
//! which a neighbour may share, as a chunk of its own. A block never moves, so views
//! of its bytes stay valid while other blocks come and go.
//!
//! Release policy: a chunk no live block touches is idle. Idle chunks stay mapped,
//! for reuse without a storage call, while their bytes are at most `keep` and while
//! they do not raise the high-water mark of mapped bytes: when a block needs new
//! granules that would take the mapped bytes past the most mapped so far, the
//! longest idle chunks are unmapped first. A block takes an idle chunk back only
//! when the chunk can never hold a granule no live block touches while it is busy:
//! a chunk of one granule, or one within the granules the block covers wholly. Any
//! other idle chunk it touches is unmapped and the granules mapped as above. (Taking
//! back a whole idle chunk a block lands on part of was the defect issue 28 reported:
//! the untouched rest stayed mapped and raised the peak above eager unmapping's.)
//! Placement does not depend on what is mapped either, so, whatever `keep` is:
//!
//! - a chunk live blocks touch holds only granules they touch, so the bytes of those
//!   chunks are, after every operation, the bytes of the granules live blocks touch,
//!   which are the eager policy's (`keep = 0`) mapped bytes;
//! - so the peak of mapped bytes is the eager policy's, the peak of the granules
//!   live blocks touch (checked by a property test against an eager pool on every
//!   step, `tests/virtual_pool.rs`). Idle bytes only fill the room under that peak.
//!
//! `keep` only trades the memory held between peaks against storage calls (`keep =
//! 0` unmaps eagerly). A storage that refuses an unmap (which the storages here do
//! only for a call that breaks their rules) leaves the bound: the chunk is then taken
//! back whole. An explicit cleanup unmaps every idle chunk, and a map that fails for
//! memory unmaps every idle chunk and tries once more before failing. The bytes the
//! pool reserves are its mapped bytes; each map and unmap is a storage call.

use super::arena::{Arena, Block};
use super::chunks::{Calls, Chunks, ARENAS};
use super::{
    ensure, extent_of, unpaddable, zero_size, AcceptRule, Books, MemoryPool, Placement, Released,
    SlotId,
};
use crate::error::PoolError;
use crate::storage::{ComputeStorage, MappingError, StorageHandle, VirtualMemory};

/// The arena of small requests.
const SMALL: usize = 0;
/// The arena of large requests.
const LARGE: usize = 1;
/// The fewest granules a range shrinks to when the storage refuses the address space
/// asked for (see `VirtualPool::reserve_range`): with 2 MiB granules, 128 MiB.
const MIN_RANGE_GRANULES: u64 = 64;

/// Slot ids carry their arena in this bit of the index.
const ARENA_BIT: u32 = 31;
// Every arena's number fits in the bits from `ARENA_BIT` up.
const _: () = assert!(ARENAS <= 1 << (32 - ARENA_BIT));

/// The bits that name arena `arena` in a slot index (from `ARENA_BIT` up).
const fn arena_tag(arena: usize) -> u32 {
    (arena as u32) << ARENA_BIT
}

/// One address range and its placement, made at the pool's first reservation in it.
#[derive(Debug, Clone)]
struct Range {
    storage: StorageHandle,
    arena: Arena,
    /// [`arena_tag`] of the range's arena: read with the range, where finding the
    /// arena again from the size took 5 more instructions of the FIFO step of
    /// `examples/peer_loops.rs` (callgrind).
    slot_tag: u32,
}

/// A pool of blocks in reserved address ranges, backed by granules mapped on
/// demand.
///
/// Blocks are placed best-fit with coalescing (O(1) through size classes) in one
/// range for requests up to `small_max` bytes and one for the rest; the granules a
/// block touches are mapped before it is handed out, each run of unmapped ones as
/// one storage call, and a block never moves. Idle mapped granules (touched by no
/// live block) are kept while they are at most `keep` bytes and do not raise the
/// high-water mark of mapped bytes; an explicit cleanup unmaps them all, and a map
/// that fails for memory unmaps them and tries once more. The pool's reserved bytes
/// are its mapped bytes.
#[derive(Debug, Clone)]
pub struct VirtualPool {
    granule: u64,
    alignment: u64,
    /// `alignment - 1` when the alignment is a power of two, else 0.
    align_mask: u64,
    /// The largest size whose extent is found by the mask: the range's size rounded
    /// down to the alignment when that is a power of two, else 0 (every size takes
    /// [`extent_of`]). Invariant: a size up to it pads to an extent of at most the
    /// range's size without overflow, and a larger one pads past the range (or
    /// overflows), so one compare replaces `extent_of` and the range check.
    max_masked: u64,
    /// Requests up to this size go to the small range (0: none do).
    small_max: u64,
    /// The most idle mapped bytes kept for reuse. Invariant (after every operation
    /// that has the storage at hand): the idle bytes are at most this.
    keep: u64,
    /// The bytes of address space of each range.
    range_size: u64,
    ranges: [Option<Range>; ARENAS],
    chunks: Chunks,
    /// The most bytes mapped at once (since the last explicit cleanup): idle chunks
    /// are kept only while they do not raise it.
    high_water: u64,
    books: Books,
}

impl VirtualPool {
    /// A pool of `granule`-byte granules (a power of two, a multiple of the
    /// storage's granularity; with another granule every reserve is
    /// [`PoolError::InvalidArgument`]), ranges of `range_size` bytes of address space,
    /// requests up to `small_max` in a range of their own, and at most `keep` idle
    /// mapped bytes kept for reuse. Sizes are effective ones (see
    /// `MemoryConfiguration::resolve`).
    /// `keep` of `None` bounds idle bytes only by the high-water mark.
    pub fn new(
        granule: u64,
        range_size: u64,
        small_max: u64,
        keep: Option<u64>,
        alignment: u64,
    ) -> Self {
        let (align_mask, max_masked) = if alignment.is_power_of_two() {
            (alignment - 1, range_size & !(alignment - 1))
        } else {
            (0, 0)
        };
        Self {
            granule,
            alignment,
            align_mask,
            max_masked,
            small_max,
            keep: keep.unwrap_or(u64::MAX),
            range_size,
            ranges: [None, None],
            chunks: Chunks::new(granule),
            high_water: 0,
            books: Books::default(),
        }
    }

    /// The bytes mapped but touched by no live block, kept for reuse.
    pub fn idle_bytes(&self) -> u64 {
        self.chunks.idle_bytes()
    }

    /// The arena of a request of `size` bytes.
    fn arena_for(&self, size: u64) -> usize {
        if size <= self.small_max {
            SMALL
        } else {
            LARGE
        }
    }

    /// The arena's range, reserving it from the storage's virtual memory at first.
    fn range(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
    ) -> Result<&mut Range, PoolError> {
        if self.ranges[arena].is_none() {
            // The granule books shift by the granule's bits: no range without a
            // granule they can book.
            if !self.granule.is_power_of_two() {
                return Err(PoolError::InvalidArgument {
                    reason: format!(
                        "the virtual pool's granule ({} bytes) is not a power of two",
                        self.granule
                    ),
                });
            }
            let granularity = memory.granularity();
            if granularity == 0 || self.granule % granularity != 0 {
                return Err(PoolError::Storage {
                    reason: format!(
                        "the pool's granule ({} bytes) is not a multiple of the storage's \
                         granularity ({granularity} bytes)",
                        self.granule
                    ),
                });
            }
            let storage = self.reserve_range(memory)?;
            self.ranges[arena] = Some(Range {
                storage,
                arena: Arena::new(storage.size),
                slot_tag: arena_tag(arena),
            });
        }
        Ok(self.ranges[arena].as_mut().expect("made above"))
    }

    /// Reserves an address range of `range_size` bytes or, where the storage has not
    /// that much address space (a host under an address-space limit, `ulimit -v`), of
    /// the largest half, quarter, ... of it the storage grants, down to
    /// [`MIN_RANGE_GRANULES`] granules. Sizes past the range granted then fail as
    /// over capacity, as they would past any range.
    #[cold]
    fn reserve_range(&self, memory: &mut dyn VirtualMemory) -> Result<StorageHandle, PoolError> {
        let floor = self.granule.saturating_mul(MIN_RANGE_GRANULES);
        let mut size = self.range_size;
        loop {
            match memory.reserve_range(size, self.granule) {
                Ok(storage) => return Ok(storage),
                Err(MappingError::OutOfMemory { .. }) if size / 2 >= floor => {
                    size = size / 2 / self.granule * self.granule;
                }
                Err(error) => return Err(storage_error(error, self.range_size)),
            }
        }
    }

    /// Each arena's range id, for unmapping.
    fn range_ids(&self) -> [Option<crate::storage::StorageId>; ARENAS] {
        [0, 1].map(|arena| self.ranges[arena].as_ref().map(|range| range.storage.id))
    }

    /// Unmaps idle chunks past `keep` bytes, longest idle first.
    fn trim(&mut self, memory: &mut dyn VirtualMemory, keep: u64) {
        let calls = self.chunks.trim(memory, self.range_ids(), keep);
        self.booked(calls);
    }

    /// Books what a call changed in the mapping.
    fn booked(&mut self, calls: Calls) {
        self.books.usage.bytes_reserved = self.chunks.mapped_bytes();
        for _ in 0..calls.maps {
            self.books.stats.page_mapped(&self.books.usage);
        }
        for _ in 0..calls.unmaps {
            self.books.stats.page_unmapped();
        }
    }

    /// Maps the granules a block just placed in `arena` (and claimed in the chunks)
    /// touches that are unmapped or in an idle chunk it could not take back. Idle chunks never raise the high-water
    /// mark of mapped bytes: when the new granules would take the mapped bytes past
    /// it, idle chunks are unmapped first (longest idle first), as many as that
    /// takes. On a lack of memory (of the storage, or of the host for the chunks'
    /// books of the granules mapped), unmaps every idle chunk and tries once more; on
    /// failure the block is released again and holds no chunk, and the books are
    /// as long as before: a request the storage refuses costs no host memory in
    /// proportion to its size.
    #[cold]
    #[inline(never)]
    fn cover_missing(
        &mut self,
        storage: &mut dyn ComputeStorage,
        arena: usize,
        block: Block,
    ) -> Result<(), PoolError> {
        let result = match storage.virtual_memory() {
            Some(memory) => self
                .map_missing(memory, arena, block)
                .map_err(|error| storage_error(error, block.size)),
            None => {
                self.chunks.adopt_idle(arena, block.offset, block.extent);
                self.chunks.unclaim(arena, block.offset, block.extent);
                Err(no_virtual_memory())
            }
        };
        if result.is_err() {
            if let Some(range) = self.ranges[arena].as_mut() {
                range.arena.release(block.slot);
            }
        }
        result
    }

    /// Unmaps idle chunks past `keep` bytes, when the storage has virtual memory.
    #[cold]
    #[inline(never)]
    fn trim_with(&mut self, storage: &mut dyn ComputeStorage) {
        if let Some(memory) = storage.virtual_memory() {
            self.trim(memory, self.keep);
        }
    }

    /// Reserves the address range of `arena` from the storage's virtual memory.
    #[cold]
    #[inline(never)]
    fn open_range(
        &mut self,
        storage: &mut dyn ComputeStorage,
        arena: usize,
    ) -> Result<(), PoolError> {
        let memory = storage.virtual_memory().ok_or_else(no_virtual_memory)?;
        self.range(memory, arena).map(|_| ())
    }

    /// The extent of `size` bytes where the mask does not give it (see `max_masked`):
    /// a size past the range, or any size when the alignment is not a power of two.
    #[cold]
    #[inline(never)]
    fn extent_past_mask(&self, size: u64) -> Result<u64, PoolError> {
        if size == 0 {
            return Err(zero_size());
        }
        match extent_of(size, self.alignment) {
            Some(extent) if extent <= self.range_size => Ok(extent),
            Some(_) => Err(self.too_big(size)),
            None => Err(unpaddable(size, self.alignment, self.range_size)),
        }
    }

    /// The error of a request of `size` bytes past the range.
    #[cold]
    fn too_big(&self, size: u64) -> PoolError {
        PoolError::BufferTooBig {
            size,
            max_accepted: self.range_size,
        }
    }

    /// The error of a request of `size` bytes no free space of its range fits. The
    /// capacity quoted is the address space the storage granted the range, which under
    /// an address-space limit is less than the `range_size` asked for.
    #[cold]
    fn over_capacity(&self, arena: usize, size: u64) -> PoolError {
        let granted = self.ranges[arena].as_ref().map(|range| range.storage.size);
        PoolError::PoolCapacityExceeded {
            size,
            capacity: granted.unwrap_or(self.range_size),
            in_use: self.books.usage.bytes_in_use,
        }
    }

    /// Maps the granules that `block` touches and that are unmapped, after
    /// unmapping the idle chunks it touches but could not take back (see
    /// [`VirtualPool::cover_missing`]).
    #[cold]
    fn map_missing(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        block: Block,
    ) -> Result<(), MappingError> {
        let range = self.ranges[arena]
            .as_ref()
            .expect("placed in it")
            .storage
            .id;
        // Idle chunks the block touches but cannot take back go first: the chunks
        // live blocks touch stay the eager policy's.
        let (calls, missing) =
            self.chunks
                .drop_idle(memory, arena, range, block.offset, block.extent);
        self.booked(calls);
        let wanted = self.chunks.mapped_bytes() + missing;
        if wanted > self.high_water {
            let excess = wanted - self.high_water;
            self.trim(memory, self.chunks.idle_bytes().saturating_sub(excess));
        }
        let mut result = self
            .chunks
            .map_missing(memory, arena, range, block.offset, block.extent);
        if matches!(result, Err(MappingError::OutOfMemory { .. })) && self.idle_bytes() > 0 {
            self.trim(memory, 0);
            result = self
                .chunks
                .map_missing(memory, arena, range, block.offset, block.extent);
        }
        match result {
            Ok(calls) => {
                self.booked(calls);
                self.high_water = self.high_water.max(self.chunks.mapped_bytes());
                Ok(())
            }
            Err(error) => {
                self.chunks.unclaim(arena, block.offset, block.extent);
                self.trim(memory, self.keep);
                Err(error)
            }
        }
    }

    /// The arena a slot id names, and the id inside it.
    fn split_slot(slot: SlotId) -> (usize, SlotId) {
        let arena = (slot.index >> ARENA_BIT) as usize;
        let index = slot.index & !(1 << ARENA_BIT);
        (arena, SlotId { index, ..slot })
    }

    /// The pool's id of block `slot` of `arena`.
    fn join_slot(arena: usize, slot: SlotId) -> SlotId {
        SlotId {
            index: slot.index | arena_tag(arena),
            ..slot
        }
    }

    /// The placement of `block` in `arena`.
    fn placement(&self, arena: usize, block: Block) -> Option<Placement> {
        let range = self.ranges[arena].as_ref()?;
        Some(Placement {
            slot: Self::join_slot(arena, block.slot),
            storage: range.storage,
            offset: block.offset,
            size: block.size,
        })
    }

    /// Frees block `slot` and books it; the idle chunks it leaves are trimmed by the
    /// caller.
    #[inline(always)]
    fn free_block(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        let (arena, inner) = Self::split_slot(slot);
        let block = self
            .ranges
            .get_mut(arena)
            .and_then(Option::as_mut)
            .and_then(|range| range.arena.release(inner))
            .ok_or_else(|| PoolError::NotFound {
                reason: format!("block {} is not reserved in this virtual pool", slot.index),
            })?;
        self.chunks.uncover(arena, block.offset, block.extent);
        self.books.usage.remove(block.size, block.extent);
        Ok(Released {
            size: block.size,
            extent: block.extent,
        })
    }
}

/// The pool error of a storage call that failed for `size` bytes.
fn storage_error(error: MappingError, size: u64) -> PoolError {
    match error {
        MappingError::OutOfMemory { .. } => PoolError::OutOfMemory { size },
        other => PoolError::Storage {
            reason: other.to_string(),
        },
    }
}

/// The error of a storage without virtual memory.
fn no_virtual_memory() -> PoolError {
    PoolError::Storage {
        reason: "the storage has no virtual memory (virtual pools need one: \
                 VirtualStorage, or HostStorage on Linux)"
            .into(),
    }
}

impl MemoryPool for VirtualPool {
    fn accept_rule(&self) -> AcceptRule {
        AcceptRule::up_to(self.range_size)
    }

    #[inline(always)]
    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        // Idle chunks left by releases made without the storage at hand.
        if self.chunks.idle_bytes() > self.keep {
            self.trim_with(storage);
        }
        // The mask for every size the range can hold (see `max_masked`): about 20
        // instructions less than `extent_of` and its check on the FIFO step of
        // `examples/peer_loops.rs` (callgrind).
        // `size - 1 < max_masked` is `0 < size <= max_masked` in one compare: a size
        // of 0 wraps past it to `extent_past_mask`, which refuses it (one instruction
        // more a step than `size <= max_masked`: FIFO 434 -> 435, callgrind).
        let extent = if size.wrapping_sub(1) < self.max_masked {
            size.wrapping_add(self.align_mask) & !self.align_mask
        } else {
            self.extent_past_mask(size)?
        };
        let arena = self.arena_for(size);
        if self.ranges[arena].is_none() {
            self.open_range(storage, arena)?;
        }
        let Some(range) = self.ranges[arena].as_mut() else {
            return Err(no_virtual_memory());
        };
        let (range_storage, slot_tag) = (range.storage, range.slot_tag);
        let Some(block) = range.arena.place(size, extent) else {
            return Err(self.over_capacity(arena, size));
        };
        // The common case: every granule the block touches is mapped already.
        let missing = self.chunks.claim(arena, block.offset, block.extent);
        if missing != 0 {
            self.cover_missing(storage, arena, block)?;
        }
        self.books.usage.add(size, extent);
        self.books.stats.allocated(size, &self.books.usage);
        Ok(Placement {
            slot: SlotId {
                index: block.slot.index | slot_tag,
                ..block.slot
            },
            storage: range_storage,
            offset: block.offset,
            size: block.size,
        })
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        self.free_block(slot)
    }

    #[inline(always)]
    fn release_with(
        &mut self,
        storage: &mut dyn ComputeStorage,
        slot: SlotId,
    ) -> Result<Released, PoolError> {
        let released = self.free_block(slot)?;
        if self.chunks.idle_bytes() > self.keep {
            self.trim_with(storage);
        }
        Ok(released)
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        let (arena, inner) = Self::split_slot(slot);
        let block = self.ranges.get(arena)?.as_ref()?.arena.get(inner)?;
        self.placement(arena, block)
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        let (arena, inner) = Self::split_slot(slot);
        let block = self.ranges.get(arena)?.as_ref()?.arena.get(inner)?;
        Some(block.extent)
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, _reserve_count: u64, explicit: bool) {
        let Some(memory) = storage.virtual_memory() else {
            return;
        };
        if !explicit {
            if self.chunks.idle_bytes() > self.keep {
                self.trim(memory, self.keep);
            }
            return;
        }
        self.trim(memory, 0);
        self.high_water = self.chunks.mapped_bytes();
        // A range with no live block holds no chunk now: give its address space back.
        for arena in 0..ARENAS {
            let empty = self.ranges[arena]
                .as_ref()
                .is_some_and(|range| range.arena.used() == 0 && self.chunks.count_in(arena) == 0);
            if empty {
                if let Some(range) = self.ranges[arena].take() {
                    memory.free_range(range.storage.id);
                }
            }
        }
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut usage = crate::usage::MemoryUsage::default();
        let mut blocks: [Vec<(u64, u64)>; ARENAS] = Default::default();
        for (arena, range) in self.ranges.iter().enumerate() {
            let Some(range) = range else { continue };
            range
                .arena
                .check(self.alignment)
                .map_err(|problem| format!("range {arena}: {problem}"))?;
            for block in range.arena.blocks() {
                usage.add(block.size, block.extent);
                ensure((arena == SMALL) == (block.size <= self.small_max), || {
                    format!("a block of {} bytes is in the wrong range", block.size)
                })?;
                blocks[arena].push((block.offset, block.extent));
            }
        }
        self.chunks.check([&blocks[SMALL], &blocks[LARGE]])?;
        usage.bytes_reserved = self.chunks.mapped_bytes();
        ensure(usage == self.books.usage, || {
            format!(
                "usage drifted: books say {:?}, blocks and chunks say {usage:?}",
                self.books.usage
            )
        })?;
        ensure(
            self.books.stats.pages
                == (0..ARENAS)
                    .map(|a| self.chunks.count_in(a) as u64)
                    .sum::<u64>(),
            || "chunk count drifted".into(),
        )
    }
}
