//! The model's self-check: [`TorchAllocator::check_invariants`].

use super::{BlockId, BlockState, TorchAllocator, TorchPool, MIN_BLOCK_SIZE};
use crate::usage::MemoryUsage;

impl TorchAllocator {
    /// Checks every invariant of the model: segments linked in address order, no two
    /// free (or unmapped) neighbours, the indexes holding exactly the free and
    /// unmapped blocks, unmapped ranges on granules, and the books equal to the blocks.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reserved = [0u64; 2];
        let mut in_use = [0u64; 2];
        let mut padding = [0u64; 2];
        let mut allocs = [0u64; 2];
        let mut counts = [(0usize, 0usize); 2];
        for (index, block) in self.blocks.iter().enumerate() {
            let id = BlockId(index as u32);
            let pool = block.pool.index();
            match block.state {
                BlockState::Spare => continue,
                BlockState::Allocated => {
                    reserved[pool] += block.size;
                    in_use[pool] += block.requested;
                    padding[pool] += block.size - block.requested;
                    allocs[pool] += 1;
                    if block.requested == 0 || block.requested > block.size {
                        return Err(format!(
                            "{id:?}: request {} in {}",
                            block.requested, block.size
                        ));
                    }
                }
                BlockState::Free => {
                    reserved[pool] += block.size;
                    counts[pool].0 += 1;
                    if self.pools[pool].free.get(&(block.size, block.addr)) != Some(&id) {
                        return Err(format!("free {id:?} is not indexed"));
                    }
                }
                BlockState::Unmapped => {
                    counts[pool].1 += 1;
                    let granule = block.pool.granule();
                    if !self.settings.expandable_segments
                        || block.addr % granule != 0
                        || block.size % granule != 0
                    {
                        return Err(format!("unmapped {id:?} off its granules: {block:?}"));
                    }
                    if self.pools[pool].unmapped.get(&block.addr) != Some(&id) {
                        return Err(format!("unmapped {id:?} is not indexed"));
                    }
                }
            }
            if block.size == 0 || block.size % MIN_BLOCK_SIZE != 0 {
                return Err(format!("{id:?} has size {}", block.size));
            }
            if let Some(next) = block.next {
                let after = self.blocks.get(next.index()).ok_or("dangling next")?;
                if after.prev != Some(id) || after.addr != block.addr + block.size {
                    return Err(format!("{id:?} and its next {next:?} disagree"));
                }
                if after.pool != block.pool {
                    return Err(format!("{id:?} and {next:?} are in different pools"));
                }
                if after.state == block.state && block.state != BlockState::Allocated {
                    return Err(format!("{id:?} and {next:?} should have merged"));
                }
            }
            if let Some(prev) = block.prev {
                let before = self.blocks.get(prev.index()).ok_or("dangling prev")?;
                if before.next != Some(id) {
                    return Err(format!("{id:?} and its prev {prev:?} disagree"));
                }
            }
        }
        for pool in TorchPool::ALL {
            let books = &self.pools[pool.index()];
            let i = pool.index();
            if counts[i] != (books.free.len(), books.unmapped.len()) {
                return Err(format!(
                    "{pool:?}: indexes hold blocks that are not free/unmapped"
                ));
            }
            let expected = MemoryUsage {
                number_allocs: allocs[i],
                bytes_in_use: in_use[i],
                bytes_padding: padding[i],
                bytes_reserved: reserved[i],
            };
            if books.usage != expected {
                return Err(format!(
                    "{pool:?}: books {:?} but blocks {expected:?}",
                    books.usage
                ));
            }
        }
        if self.reserved != reserved[0] + reserved[1] {
            return Err(format!(
                "reserved {} but pools hold {:?}",
                self.reserved, reserved
            ));
        }
        if self.limit.is_some_and(|limit| self.reserved > limit) {
            return Err(format!(
                "reserved {} past the limit {:?}",
                self.reserved, self.limit
            ));
        }
        Ok(())
    }
}
