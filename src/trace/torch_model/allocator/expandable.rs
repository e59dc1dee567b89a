//! Rule 8: expandable segments, one growing address range per pool, mapped and
//! unmapped in granules.

use super::{Block, BlockId, BlockState, TorchAllocator, TorchPool};

/// The device memory an expandable segment's address range is sized for when no limit
/// is given (64 TiB): so large that no trace reaches it.
const UNLIMITED_DEVICE: u64 = 1 << 46;
/// The most device memory an expandable segment's address range is sized for (4 EiB),
/// whatever the limit: the ranges of both pools, an eighth larger each, then fit in
/// 64-bit addresses (a limit near `u64::MAX` overflowed the sum).
const LARGEST_EXPANDABLE_DEVICE: u64 = 1 << 62;

impl TorchAllocator {
    /// Rule 8 (`try_allocate_expandable_block`): maps room for `size` at the lowest
    /// address that has it, and takes the block out of the free index.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: TorchPool,
        size: u64,
    ) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, size)?;
        let block = self.blocks[candidate.index()];
        if block.state == BlockState::Unmapped && !self.map_block(candidate, block.size.min(size)) {
            return None;
        }
        // Invariant of the walk: a free block, then an unmapped range, then any.
        while self.blocks[candidate.index()].size < size {
            let remaining = size - self.blocks[candidate.index()].size;
            let next = self.blocks[candidate.index()].next?;
            let next_size = self.blocks[next.index()].size;
            if !self.map_block(next, remaining.min(next_size)) {
                return None;
            }
            candidate = next;
        }
        self.unindex(candidate);
        Some(candidate)
    }

    /// `find_expandable_block`: the lowest unmapped range (with the free block just
    /// before it) that has `size` bytes of free or unmapped room, else a new segment's
    /// range. None when no segment can ever hold `size`.
    fn find_expandable_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        let found = self.pools[pool.index()].unmapped.values().find_map(|&id| {
            let start = match self.blocks[id.index()].prev {
                Some(prev) if self.blocks[prev.index()].state == BlockState::Free => prev,
                _ => id,
            };
            self.has_room(start, size).then_some(start)
        });
        if found.is_some() {
            return found;
        }
        let granule = pool.granule();
        let device = self
            .limit
            .unwrap_or(UNLIMITED_DEVICE)
            .min(LARGEST_EXPANDABLE_DEVICE);
        let range = (device + device / 8).div_ceil(granule) * granule;
        if range < size {
            return None;
        }
        let addr = self.take_addresses(range)?;
        let id = self.new_block(Block {
            addr,
            size: range,
            prev: None,
            next: None,
            state: BlockState::Unmapped,
            pool,
            requested: 0,
        });
        self.index_unmapped(id);
        let books = &mut self.pools[pool.index()];
        books.stats.page_mapped(&books.usage);
        Some(id)
    }

    /// Whether the free and unmapped blocks from `start` on add up to `size` bytes.
    fn has_room(&self, start: BlockId, size: u64) -> bool {
        let mut bytes = 0;
        let mut at = Some(start);
        while let Some(id) = at {
            let block = &self.blocks[id.index()];
            if bytes >= size || block.state == BlockState::Allocated {
                break;
            }
            bytes += block.size;
            at = block.next;
        }
        bytes >= size
    }

    /// `map_block`: maps whole granules for the first `size` bytes of the unmapped
    /// range `id`, which becomes a free block merged with free neighbours (in the free
    /// index); the rest of the range stays unmapped. False when the device is full.
    fn map_block(&mut self, id: BlockId, size: u64) -> bool {
        let block = self.blocks[id.index()];
        if block.state != BlockState::Unmapped || size == 0 || size > block.size {
            debug_assert!(false, "map_block on {block:?} for {size}");
            return false;
        }
        let mapped = size.next_multiple_of(block.pool.granule());
        if !self.fits(mapped) {
            return false;
        }
        self.unindex(id);
        if mapped < block.size {
            let rest = self.new_block(Block {
                addr: block.addr + mapped,
                size: block.size - mapped,
                prev: Some(id),
                next: block.next,
                state: BlockState::Unmapped,
                pool: block.pool,
                requested: 0,
            });
            if let Some(next) = block.next {
                self.blocks[next.index()].prev = Some(rest);
            }
            self.blocks[id.index()].next = Some(rest);
            self.index_unmapped(rest);
        }
        let target = &mut self.blocks[id.index()];
        target.size = mapped;
        target.state = BlockState::Free;
        let (prev, next) = (target.prev, target.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_free(id);
        self.mapped(block.pool, mapped);
        true
    }

    /// `unmap_block`: unmaps the whole granules inside the free block `id`; what is
    /// left on either side stays free as blocks of their own.
    pub(super) fn unmap_block(&mut self, id: BlockId) {
        let block = self.blocks[id.index()];
        let granule = block.pool.granule();
        let end = block.addr + block.size;
        let (first, last) = (
            block.addr.next_multiple_of(granule),
            end / granule * granule,
        );
        if last <= first {
            return;
        }
        self.unindex(id);
        if first > block.addr {
            let before = self.new_block(Block {
                addr: block.addr,
                size: first - block.addr,
                prev: block.prev,
                next: Some(id),
                state: BlockState::Free,
                pool: block.pool,
                requested: 0,
            });
            if let Some(prev) = block.prev {
                self.blocks[prev.index()].next = Some(before);
            }
            self.blocks[id.index()].prev = Some(before);
            self.index_free(before);
        }
        if last < end {
            let after = self.new_block(Block {
                addr: last,
                size: end - last,
                prev: Some(id),
                next: block.next,
                state: BlockState::Free,
                pool: block.pool,
                requested: 0,
            });
            if let Some(next) = block.next {
                self.blocks[next.index()].prev = Some(after);
            }
            self.blocks[id.index()].next = Some(after);
            self.index_free(after);
        }
        let target = &mut self.blocks[id.index()];
        target.addr = first;
        target.size = last - first;
        target.state = BlockState::Unmapped;
        let (prev, next) = (target.prev, target.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_unmapped(id);
        self.reserved -= last - first;
        self.storage_frees += 1;
        self.pools[block.pool.index()].usage.bytes_reserved -= last - first;
    }
}
