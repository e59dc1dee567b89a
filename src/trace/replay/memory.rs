//! What a replay drives: the [`Replayable`] trait, for a memory management on virtual
//! storage and for the model of PyTorch's caching allocator.

use super::failures::Failure;
use super::ReplayedPool;
use crate::handle::{PoolRef, SlotRef};
use crate::management::MemoryManagement;
use crate::pool::PoolStats;
use crate::storage::{ComputeStorage, VirtualStorage};
use crate::trace::at_peak::Place;
use crate::trace::torch_model::{BlockId, TorchAllocator, TorchPool};
use crate::usage::MemoryUsage;

/// What a replay drives: an allocator that serves requests by size from its pools and
/// says what it holds.
pub(super) trait Replayable {
    /// Where a live request is, to free it.
    type Slot: Copy;
    /// Serves `size` bytes: where, or why the request failed.
    fn reserve(&mut self, size: u64) -> Result<Self::Slot, Failure>;
    /// The index of the pool that holds a live slot (None: no pool of the breakdown).
    fn pool_of(&self, slot: Self::Slot) -> Option<u8>;
    /// Frees a slot `reserve` gave.
    fn release(&mut self, slot: Self::Slot);
    /// Bytes held from the device.
    fn bytes_reserved(&self) -> u64;
    /// Whether a reserve may give bytes back before it returns (a periodic cleanup
    /// after it): then [`Replayable::reserved_within_reserve`] is read after each.
    fn may_hold_within_reserve(&self) -> bool {
        false
    }
    /// The bytes the last reserve held at its most, where it gave some back before
    /// returning (a periodic cleanup after it); 0 where nothing is given back within
    /// a reserve. A replay's peak counts them: the device held them for a while.
    fn reserved_within_reserve(&self) -> u64 {
        0
    }
    /// Keeps the next reserves from giving bytes back within them, so that
    /// [`Replayable::segments`] shows what the last one held at its most (the view at
    /// a peak reached within a reserve). Nothing, where no reserve gives bytes back.
    fn hold_within_reserve(&mut self) {}
    /// Storage allocations and frees so far.
    fn storage_counts(&self) -> (u64, u64);
    /// The number of pools of the breakdown.
    fn pool_count(&self) -> usize;
    /// A step boundary of the trace (a phase starts): the planned pool's requests
    /// follow its plan's next phase. Nothing, for an allocator without steps.
    fn step_boundary(&mut self) {}
    /// Each pool's bytes reserved, into `out` (one per pool).
    fn pool_reserved(&mut self, out: &mut [u64]);
    /// Each pool with its usage and statistics, and the usage of all.
    fn pool_summaries(&mut self) -> (Vec<(ReplayedPool, MemoryUsage, PoolStats)>, MemoryUsage);
    /// What is held from the device, as `(place, size)` segments.
    fn segments(&self) -> Vec<(Place, u64)>;
    /// Where a live slot's block is and the bytes it spans, its request with whatever
    /// its pool or allocator rounds it to (`None`: it holds no bytes).
    fn place_of(&self, slot: Self::Slot) -> Option<(Place, u64)>;
}

impl Replayable for MemoryManagement<VirtualStorage> {
    type Slot = SlotRef;

    fn step_boundary(&mut self) {
        self.step();
    }

    #[inline(always)]
    fn reserve(&mut self, size: u64) -> Result<SlotRef, Failure> {
        self.reserve_slot_ref(size).map_err(Failure::from)
    }

    #[inline(always)]
    fn pool_of(&self, slot: SlotRef) -> Option<u8> {
        match slot.pool {
            PoolRef::Dynamic(pool) => Some(pool),
            PoolRef::Persistent | PoolRef::Empty => None,
        }
    }

    #[inline(always)]
    fn release(&mut self, slot: SlotRef) {
        // The slot came from this replay's reserve, so it is live.
        let _ = self.release_slot(slot);
    }

    #[inline(always)]
    fn bytes_reserved(&self) -> u64 {
        self.storage().bytes_allocated()
    }

    fn may_hold_within_reserve(&self) -> bool {
        self.periodic()
    }

    fn reserved_within_reserve(&self) -> u64 {
        MemoryManagement::reserved_within_reserve(self)
    }

    fn hold_within_reserve(&mut self) {
        self.pause_periodic_cleanup();
    }

    fn storage_counts(&self) -> (u64, u64) {
        (self.storage().allocations(), self.storage().deallocations())
    }

    fn pool_count(&self) -> usize {
        self.pool_options().len()
    }

    fn pool_reserved(&mut self, out: &mut [u64]) {
        let (pools, _) = self.pool_states();
        for (slot, (usage, _)) in out.iter_mut().zip(pools) {
            *slot = usage.bytes_reserved;
        }
    }

    fn pool_summaries(&mut self) -> (Vec<(ReplayedPool, MemoryUsage, PoolStats)>, MemoryUsage) {
        let (states, _) = self.pool_states();
        let pools = self
            .pool_options()
            .iter()
            .zip(states)
            .map(|(options, (usage, stats))| (ReplayedPool::Layout(*options), usage, stats))
            .collect();
        (pools, self.memory_usage())
    }

    fn segments(&self) -> Vec<(Place, u64)> {
        self.storage()
            .held()
            .into_iter()
            .map(|(id, offset, size)| {
                let place = Place {
                    group: id.0,
                    start: offset,
                };
                (place, size)
            })
            .collect()
    }

    fn place_of(&self, slot: SlotRef) -> Option<(Place, u64)> {
        let resource = self.locate(slot).ok()?;
        let group = resource.storage_id?;
        let place = Place {
            group,
            start: resource.offset,
        };
        // The bytes it spans, as its pool books them: what they hold beyond the request
        // (alignment, a size class, a buffer held whole) is rounding, not free bytes.
        Some((place, self.extent_at(slot)?))
    }
}

impl Replayable for TorchAllocator {
    /// None for a zero-byte request, which takes no block.
    type Slot = Option<BlockId>;

    #[inline(always)]
    fn reserve(&mut self, size: u64) -> Result<Option<BlockId>, Failure> {
        // The model takes any size; it fails only when the device's memory runs out.
        self.malloc(size).map_err(|_| Failure::OverLimit)
    }

    #[inline(always)]
    fn pool_of(&self, slot: Option<BlockId>) -> Option<u8> {
        slot.and_then(|block| self.pool_of_block(block))
            .map(|pool| pool.index() as u8)
    }

    #[inline(always)]
    fn release(&mut self, slot: Option<BlockId>) {
        if let Some(block) = slot {
            // The block came from this replay's malloc, so it is live.
            let _ = self.free(block);
        }
    }

    #[inline(always)]
    fn bytes_reserved(&self) -> u64 {
        TorchAllocator::bytes_reserved(self)
    }

    fn storage_counts(&self) -> (u64, u64) {
        (self.storage_allocations(), self.storage_frees())
    }

    fn pool_count(&self) -> usize {
        TorchPool::ALL.len()
    }

    fn pool_reserved(&mut self, out: &mut [u64]) {
        for (slot, pool) in out.iter_mut().zip(TorchPool::ALL) {
            *slot = self.pool_usage(pool).bytes_reserved;
        }
    }

    fn pool_summaries(&mut self) -> (Vec<(ReplayedPool, MemoryUsage, PoolStats)>, MemoryUsage) {
        let pools: Vec<_> = TorchPool::ALL
            .iter()
            .map(|&pool| {
                (
                    ReplayedPool::Torch(pool),
                    self.pool_usage(pool),
                    self.pool_stats(pool),
                )
            })
            .collect();
        let total = pools
            .iter()
            .fold(MemoryUsage::default(), |total, (_, usage, _)| {
                total.combine(*usage)
            });
        (pools, total)
    }

    fn segments(&self) -> Vec<(Place, u64)> {
        TorchAllocator::segments(self)
            .into_iter()
            .map(|(address, size)| {
                let place = Place {
                    group: 0,
                    start: address,
                };
                (place, size)
            })
            .collect()
    }

    fn place_of(&self, slot: Option<BlockId>) -> Option<(Place, u64)> {
        let (address, size) = self.block(slot?).ok()?;
        let place = Place {
            group: 0,
            start: address,
        };
        Some((place, size))
    }
}
