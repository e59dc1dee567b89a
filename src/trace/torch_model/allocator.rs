//! The allocator model: [`TorchAllocator`] with its blocks, pools and books, and the
//! rules of the classic allocator (the expandable segments' in [`expandable`]).

use std::collections::BTreeMap;

use super::{
    TorchSettings, LARGE_BUFFER, MAX_REQUEST, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE,
    SMALL_BUFFER, SMALL_SIZE,
};
use crate::pool::PoolStats;
use crate::usage::MemoryUsage;

mod expandable;
mod invariants;

/// One of the allocator's two pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TorchPool {
    /// Rounded requests up to 1 MiB, in 2 MiB segments.
    Small,
    /// Larger requests.
    Large,
}

impl TorchPool {
    /// Both pools, in their index order.
    pub const ALL: [TorchPool; 2] = [TorchPool::Small, TorchPool::Large];

    /// The pool of a rounded request (`get_pool`).
    fn of(size: u64) -> Self {
        if size <= SMALL_SIZE {
            TorchPool::Small
        } else {
            TorchPool::Large
        }
    }

    /// The pool's index (small 0, large 1).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The unit in which an expandable segment of this pool maps memory.
    pub fn granule(self) -> u64 {
        match self {
            TorchPool::Small => SMALL_BUFFER,
            TorchPool::Large => LARGE_BUFFER,
        }
    }
}

/// A block of the model: an index into its arena, valid while the block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(u32);

impl BlockId {
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// A request the model could not serve, even after returning its cached segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: {requested} bytes requested with {reserved} bytes reserved")]
pub struct TorchOutOfMemory {
    /// The bytes asked for.
    pub requested: u64,
    /// The bytes the model held when it gave up.
    pub reserved: u64,
}

/// A block id that names no live allocation of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("block {0:?} is not an allocation of this model")]
pub struct NotAllocated(pub BlockId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    /// Handed out.
    Allocated,
    /// Mapped and free: in its pool's `free` index.
    Free,
    /// An address range of an expandable segment with no memory behind it: in its
    /// pool's `unmapped` index.
    Unmapped,
    /// In the arena's spare list, part of no segment.
    Spare,
}

/// A range of a segment. Invariant: the blocks of a segment are linked through `prev`
/// and `next` in address order, each ending where the next begins; two free blocks, or
/// two unmapped ones, are never neighbours (they merge).
#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    state: BlockState,
    pool: TorchPool,
    /// The bytes the request asked for while allocated, else 0.
    requested: u64,
}

/// One pool's blocks and books.
#[derive(Debug, Default)]
struct Pool {
    /// Free mapped blocks by (size, address): best fit is the first key at or above
    /// the request. Invariant: holds exactly the pool's `Free` blocks.
    free: BTreeMap<(u64, u64), BlockId>,
    /// Unmapped ranges of expandable segments by address. Invariant: holds exactly the
    /// pool's `Unmapped` blocks, each starting and ending on a granule.
    unmapped: BTreeMap<u64, BlockId>,
    /// Live allocations (requested bytes, padding up to the block) and mapped bytes.
    usage: MemoryUsage,
    /// Segments held (pages), their peak, releases, the largest request, the peaks.
    stats: PoolStats,
}

/// The model of PyTorch's caching allocator: see the [module docs](super) for its rules.
#[derive(Debug)]
pub struct TorchAllocator {
    settings: TorchSettings,
    /// The device's memory: mapping past it fails (None: unlimited).
    limit: Option<u64>,
    blocks: Vec<Block>,
    spare: Vec<BlockId>,
    pools: [Pool; 2],
    /// Where the next segment's addresses start (segments never share addresses).
    next_addr: u64,
    /// Bytes mapped. Invariant: the sum of the pools' `usage.bytes_reserved`.
    reserved: u64,
    storage_allocations: u64,
    storage_frees: u64,
}

impl TorchAllocator {
    /// An empty allocator with `settings`, on a device of `limit` bytes (None: unlimited).
    pub fn new(settings: TorchSettings, limit: Option<u64>) -> Self {
        Self {
            settings,
            limit,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            next_addr: LARGE_BUFFER,
            reserved: 0,
            storage_allocations: 0,
            storage_frees: 0,
        }
    }

    /// The settings.
    pub fn settings(&self) -> TorchSettings {
        self.settings
    }

    /// Bytes held from the device (`reserved_bytes.all.current`).
    pub fn bytes_reserved(&self) -> u64 {
        self.reserved
    }

    /// Segments allocated or ranges mapped so far (`num_device_alloc`).
    pub fn storage_allocations(&self) -> u64 {
        self.storage_allocations
    }

    /// Segments freed or ranges unmapped so far (`num_device_free`).
    pub fn storage_frees(&self) -> u64 {
        self.storage_frees
    }

    /// A pool's usage (live requests, their padding to the block, bytes mapped).
    pub fn pool_usage(&self, pool: TorchPool) -> MemoryUsage {
        self.pools[pool.index()].usage
    }

    /// A pool's segments and high-water marks.
    pub fn pool_stats(&self, pool: TorchPool) -> PoolStats {
        self.pools[pool.index()].stats
    }

    /// The pool of a live allocation.
    pub fn pool_of_block(&self, id: BlockId) -> Option<TorchPool> {
        self.blocks
            .get(id.index())
            .filter(|block| block.state == BlockState::Allocated)
            .map(|block| block.pool)
    }

    /// The segments held from the device as `(address, size)`: each a run of
    /// consecutive mapped blocks (allocated or free), so a segment of an expandable
    /// range is each of its mapped stretches. Their sizes add up to
    /// [`TorchAllocator::bytes_reserved`].
    pub fn segments(&self) -> Vec<(u64, u64)> {
        let mapped = |id: Option<BlockId>| {
            id.and_then(|id| self.blocks.get(id.index()))
                .filter(|b| matches!(b.state, BlockState::Allocated | BlockState::Free))
        };
        let mut segments = Vec::new();
        for block in &self.blocks {
            if !matches!(block.state, BlockState::Allocated | BlockState::Free)
                || mapped(block.prev).is_some()
            {
                continue;
            }
            let mut size = block.size;
            let mut next = mapped(block.next);
            while let Some(following) = next {
                size += following.size;
                next = mapped(following.next);
            }
            segments.push((block.addr, size));
        }
        segments
    }

    /// The address and size of a live allocation.
    pub fn block(&self, id: BlockId) -> Result<(u64, u64), NotAllocated> {
        match self.blocks.get(id.index()) {
            Some(block) if block.state == BlockState::Allocated => Ok((block.addr, block.size)),
            _ => Err(NotAllocated(id)),
        }
    }

    /// Serves a request of `size` bytes (`DeviceCachingAllocator::malloc`): the block,
    /// or None for zero bytes.
    pub fn malloc(&mut self, requested: u64) -> Result<Option<BlockId>, TorchOutOfMemory> {
        if requested == 0 {
            return Ok(None);
        }
        let out_of_memory = TorchOutOfMemory {
            requested,
            reserved: self.reserved,
        };
        if requested > MAX_REQUEST {
            return Err(out_of_memory);
        }
        let size = self.round_size(requested);
        let pool = TorchPool::of(size);
        let block = match self.get_free_block(pool, size) {
            Some(block) => block,
            None => self
                .alloc_block(pool, size)
                .or_else(|| {
                    self.release_available_cached_blocks(pool, size)
                        .then(|| self.alloc_block(pool, size))
                        .flatten()
                })
                .or_else(|| {
                    self.release_cached_blocks();
                    self.alloc_block(pool, size)
                })
                .ok_or(TorchOutOfMemory {
                    reserved: self.reserved,
                    ..out_of_memory
                })?,
        };
        Ok(Some(self.alloc_found_block(block, size, requested)))
    }

    /// Frees a live allocation (`free_block`): it merges with free neighbours and
    /// stays cached.
    pub fn free(&mut self, id: BlockId) -> Result<(), NotAllocated> {
        let block = match self.blocks.get_mut(id.index()) {
            Some(block) if block.state == BlockState::Allocated => block,
            _ => return Err(NotAllocated(id)),
        };
        let (pool, requested, size) = (block.pool, block.requested, block.size);
        let (prev, next) = (block.prev, block.next);
        block.state = BlockState::Free;
        block.requested = 0;
        let usage = &mut self.pools[pool.index()].usage;
        usage.number_allocs -= 1;
        usage.bytes_in_use -= requested;
        usage.bytes_padding -= size - requested;
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_free(id);
        Ok(())
    }

    // ------------------------------------------------------------------ the rules

    /// Rule 1 (`round_size`). `size` is at most [`MAX_REQUEST`], so nothing overflows.
    fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        // The divisions of the size's interval (PyTorch's `roundup_power2_divisions(size)`:
        // 16 intervals from 1 MiB, see `roundup_interval`).
        let divisions = self.settings.roundup_power2_divisions_for(size);
        // PyTorch's `size > kMinBlockSize * divisions` in `size_t`, which wraps: from
        // 2^55 divisions the bound is 0 and every size takes the power-of-two rounding
        // (to the next power of two, as its step is 0). Treated as a bound above every
        // size, those settings rounded to 512 B (helper-140's find).
        if divisions > 1 && size > MIN_BLOCK_SIZE.wrapping_mul(divisions) {
            roundup_power2_next_division(size, divisions)
        } else {
            size.next_multiple_of(MIN_BLOCK_SIZE)
        }
    }

    /// Rule 4 (`get_allocation_size`): the segment a miss of `size` allocates.
    fn allocation_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.next_multiple_of(ROUND_LARGE)
        }
    }

    /// Rule 3 (`get_free_block`): takes the best-fitting free block out of the index.
    fn get_free_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        let free = &self.pools[pool.index()].free;
        let mut candidates = free.range((size, 0)..).map(|(_, &id)| id);
        let mut chosen = candidates.next()?;
        if self.settings.expandable_segments {
            let mut chosen_size = self.expandable_size(chosen);
            for next in candidates {
                let next_size = self.expandable_size(next);
                if next_size >= chosen_size {
                    break;
                }
                (chosen, chosen_size) = (next, next_size);
            }
        }
        let found = self.blocks[chosen.index()].size;
        if let Some(max_split) = self.settings.max_split_size {
            if size < max_split && found >= max_split {
                return None;
            }
            if size >= max_split && found >= size + LARGE_BUFFER {
                return None;
            }
        }
        self.unindex(chosen);
        Some(chosen)
    }

    /// A free block's size plus the unmapped range right after it (what it can grow to).
    fn expandable_size(&self, id: BlockId) -> u64 {
        let block = &self.blocks[id.index()];
        let after = block
            .next
            .map(|next| &self.blocks[next.index()])
            .filter(|next| next.state == BlockState::Unmapped)
            .map_or(0, |next| next.size);
        block.size + after
    }

    /// Rule 4 (`alloc_block`): a new segment, or with expandable segments newly mapped
    /// memory; the block is out of the free index. None when the device is full.
    fn alloc_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(pool, size);
        }
        let bytes = Self::allocation_size(size);
        if !self.fits(bytes) {
            return None;
        }
        let addr = self.take_addresses(bytes)?;
        let id = self.new_block(Block {
            addr,
            size: bytes,
            prev: None,
            next: None,
            state: BlockState::Free,
            pool,
            requested: 0,
        });
        self.mapped(pool, bytes);
        let books = &mut self.pools[pool.index()];
        books.stats.page_mapped(&books.usage);
        Some(id)
    }

    /// Rule 5 (`should_split`).
    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let block = &self.blocks[id.index()];
        let remaining = block.size - size;
        if block.pool == TorchPool::Small || self.settings.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.settings.max_split_size.unwrap_or(u64::MAX) && remaining > SMALL_SIZE
        }
    }

    /// Rule 5 (`alloc_found_block`): hands out `id` (out of the free index), split when
    /// the rule says so: the request at the low end, the rest back in the index.
    fn alloc_found_block(&mut self, id: BlockId, size: u64, requested: u64) -> BlockId {
        let allocated = if self.should_split(id, size) {
            let rest = self.blocks[id.index()];
            let front = self.new_block(Block {
                addr: rest.addr,
                size,
                prev: rest.prev,
                next: Some(id),
                state: BlockState::Allocated,
                pool: rest.pool,
                requested,
            });
            if let Some(prev) = rest.prev {
                self.blocks[prev.index()].next = Some(front);
            }
            let rest = &mut self.blocks[id.index()];
            rest.prev = Some(front);
            rest.addr += size;
            rest.size -= size;
            self.index_free(id);
            front
        } else {
            id
        };
        let block = &mut self.blocks[allocated.index()];
        block.state = BlockState::Allocated;
        block.requested = requested;
        let (pool, size) = (block.pool, block.size);
        let books = &mut self.pools[pool.index()];
        books.usage.number_allocs += 1;
        books.usage.bytes_in_use += requested;
        books.usage.bytes_padding += size - requested;
        books.stats.allocated(requested, &books.usage);
        allocated
    }

    /// Rule 6 (`try_merge_blocks`): merges `src` into `dst` when both are free or both
    /// unmapped; `dst` must be out of the indexes (its key changes).
    fn try_merge(&mut self, dst: BlockId, src: Option<BlockId>) {
        let Some(src) = src else { return };
        let source = self.blocks[src.index()];
        if source.state == BlockState::Allocated || source.state != self.blocks[dst.index()].state {
            return;
        }
        self.unindex(src);
        if self.blocks[dst.index()].prev == Some(src) {
            let target = &mut self.blocks[dst.index()];
            target.addr = source.addr;
            target.prev = source.prev;
            if let Some(prev) = source.prev {
                self.blocks[prev.index()].next = Some(dst);
            }
        } else {
            self.blocks[dst.index()].next = source.next;
            if let Some(next) = source.next {
                self.blocks[next.index()].prev = Some(dst);
            }
        }
        self.blocks[dst.index()].size += source.size;
        self.recycle(src);
    }

    /// Rule 7 (`release_available_cached_blocks`): with `max_split_size` only, frees
    /// the smallest whole oversize segment that holds the request, else oversize ones
    /// from the largest down until as much is freed. Whether anything was.
    fn release_available_cached_blocks(&mut self, pool: TorchPool, size: u64) -> bool {
        let Some(max_split) = self.settings.max_split_size else {
            return false;
        };
        if self.settings.expandable_segments {
            // Expandable blocks are never released one by one.
            return false;
        }
        let key = size.max(max_split);
        let free = &self.pools[pool.index()].free;
        if let Some((_, &id)) = free.range((key, 0)..).next() {
            self.release_block(id);
            return true;
        }
        let oversize: Vec<BlockId> = free
            .range(..(key, 0))
            .rev()
            .take_while(|((size, _), _)| *size >= max_split)
            .map(|(_, &id)| id)
            .collect();
        let mut released = 0;
        for id in oversize {
            if released >= key {
                break;
            }
            released += self.blocks[id.index()].size;
            self.release_block(id);
        }
        released >= key
    }

    /// Rule 7 (`release_cached_blocks`): returns every free whole segment of both
    /// pools; with expandable segments, unmaps the whole granules of free blocks.
    fn release_cached_blocks(&mut self) {
        for pool in [TorchPool::Large, TorchPool::Small] {
            let free: Vec<BlockId> = self.pools[pool.index()].free.values().copied().collect();
            for id in free {
                if self.settings.expandable_segments {
                    self.unmap_block(id);
                    let block = &self.blocks[id.index()];
                    if block.state == BlockState::Unmapped
                        && block.prev.is_none()
                        && block.next.is_none()
                    {
                        self.release_expandable_segment(id);
                    }
                } else {
                    let block = &self.blocks[id.index()];
                    if block.prev.is_none() && block.next.is_none() {
                        self.release_block(id);
                    }
                }
            }
        }
    }

    /// `release_block`: gives a free whole segment back (a `cudaFree`).
    fn release_block(&mut self, id: BlockId) {
        let block = self.blocks[id.index()];
        debug_assert!(
            block.state == BlockState::Free && block.prev.is_none() && block.next.is_none()
        );
        self.unindex(id);
        self.reserved -= block.size;
        self.storage_frees += 1;
        let books = &mut self.pools[block.pool.index()];
        books.usage.bytes_reserved -= block.size;
        books.stats.page_unmapped();
        self.recycle(id);
    }

    /// `release_expandable_segment`: drops an expandable segment with nothing mapped.
    fn release_expandable_segment(&mut self, id: BlockId) {
        let pool = self.blocks[id.index()].pool;
        self.unindex(id);
        self.pools[pool.index()].stats.page_unmapped();
        self.recycle(id);
    }

    // ------------------------------------------------------------------ plumbing

    /// Whether `bytes` more fit on the device.
    fn fits(&self, bytes: u64) -> bool {
        match self.limit {
            None => true,
            Some(limit) => self
                .reserved
                .checked_add(bytes)
                .is_some_and(|sum| sum <= limit),
        }
    }

    /// Counts `bytes` newly mapped in `pool` (a `cudaMalloc` or a map).
    fn mapped(&mut self, pool: TorchPool, bytes: u64) {
        self.reserved += bytes;
        self.storage_allocations += 1;
        let books = &mut self.pools[pool.index()];
        books.usage.bytes_reserved += bytes;
        books.stats.bytes_reserved_peak = books
            .stats
            .bytes_reserved_peak
            .max(books.usage.bytes_reserved);
    }

    /// Addresses for a new segment of `bytes`, aligned to both granules; None when the
    /// address space is spent (then the segment cannot be had).
    fn take_addresses(&mut self, bytes: u64) -> Option<u64> {
        let addr = self.next_addr.checked_next_multiple_of(LARGE_BUFFER)?;
        self.next_addr = addr.checked_add(bytes)?;
        Some(addr)
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        match self.spare.pop() {
            Some(id) => {
                self.blocks[id.index()] = block;
                id
            }
            None => {
                // Each block holds at least 512 B of a range under 2^64, and ranges
                // are never reused, so fewer than 2^55 blocks ever live; the arena of a
                // replay is bounded by its events, far below u32::MAX.
                let id = BlockId(u32::try_from(self.blocks.len()).unwrap_or(u32::MAX));
                self.blocks.push(block);
                id
            }
        }
    }

    fn recycle(&mut self, id: BlockId) {
        self.blocks[id.index()].state = BlockState::Spare;
        self.spare.push(id);
    }

    fn index_free(&mut self, id: BlockId) {
        let block = &self.blocks[id.index()];
        debug_assert_eq!(block.state, BlockState::Free);
        let previous = self.pools[block.pool.index()]
            .free
            .insert((block.size, block.addr), id);
        debug_assert!(previous.is_none());
    }

    fn index_unmapped(&mut self, id: BlockId) {
        let block = &self.blocks[id.index()];
        debug_assert_eq!(block.state, BlockState::Unmapped);
        let previous = self.pools[block.pool.index()]
            .unmapped
            .insert(block.addr, id);
        debug_assert!(previous.is_none());
    }

    /// Takes a free or unmapped block out of its index.
    fn unindex(&mut self, id: BlockId) {
        let block = &self.blocks[id.index()];
        let pool = &mut self.pools[block.pool.index()];
        let removed = match block.state {
            BlockState::Free => pool.free.remove(&(block.size, block.addr)),
            BlockState::Unmapped => pool.unmapped.remove(&block.addr),
            BlockState::Allocated | BlockState::Spare => None,
        };
        debug_assert_eq!(removed, Some(id));
    }
}

/// `roundup_power2_next_division`: `size` rounded up to the next of `divisions` equal
/// steps between the powers of two around it (a power of two stays).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << size.ilog2();
    let step = floor >> divisions.ilog2();
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down + step
    }
}

#[cfg(test)]
mod tests;
