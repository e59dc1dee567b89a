//! Placement in the arena: a block put at an offset, mapping the granules it touches, and
//! the arena's books (storage calls, high-water mark, idle runs unmapped).

use super::{granules::Calls, Home, PlannedPool};
use crate::error::PoolError;
use crate::pool::{MemoryPool, Placement};
use crate::storage::{ComputeStorage, VirtualMemory};

impl PlannedPool {
    /// Whether a live arena block overlaps `offset..end`.
    pub(super) fn held(&self, offset: u64, end: u64) -> bool {
        self.live
            .range(..end)
            .next_back()
            .is_some_and(|(_, &live_end)| live_end > offset)
    }

    /// Places a block of `size` bytes at `offset` of the arena, mapping what it
    /// touches; `Ok(None)` when the bytes are held or the mapping cannot be made for
    /// memory (the request then goes beside).
    pub(super) fn place_in_arena(
        &mut self,
        storage: &mut dyn ComputeStorage,
        offset: u64,
        size: u64,
        extent: u64,
    ) -> Result<Option<Placement>, PoolError> {
        // A plan file's offset near u64::MAX (a crafted file) overflows: it goes beside.
        let Some(end) = offset.checked_add(extent) else {
            return Ok(None);
        };
        if end > self.arena_size || self.held(offset, end) {
            return Ok(None);
        }
        let Some(memory) = storage.virtual_memory() else {
            return Ok(None);
        };
        let range = match self.range {
            Some(range) => range,
            None => {
                let granularity = memory.granularity();
                if granularity == 0 || self.granules.granule % granularity != 0 {
                    return Err(PoolError::Storage {
                        reason: format!(
                            "the planned pool's granule ({} bytes) is not a multiple of the \
                             storage's granularity ({granularity} bytes)",
                            self.granules.granule
                        ),
                    });
                }
                match memory.reserve_range(self.arena_size, self.granules.granule) {
                    Ok(range) => *self.range.insert(range),
                    Err(_) => return Ok(None),
                }
            }
        };
        let missing = self.granules.touch(offset, extent);
        if !missing.is_empty() {
            let mut calls = Calls::default();
            let limit = self
                .water()
                .saturating_sub(self.beside.usage().bytes_reserved);
            let mapped = self
                .granules
                .map(memory, range, &missing, limit, &mut calls);
            self.booked(calls);
            if mapped.is_err() {
                self.granules.untouch(offset, extent);
                return Ok(None);
            }
        }
        self.live.insert(offset, end);
        self.arena_usage.add(size, extent);
        let slot = self.homes.insert(Home::Arena {
            offset,
            size,
            extent,
        });
        Ok(Some(Placement {
            slot,
            storage: range,
            offset,
            size,
        }))
    }

    /// Books the storage calls of a change of the arena's mapping.
    fn booked(&mut self, calls: Calls) {
        self.arena_calls.maps += calls.maps;
        self.arena_calls.unmaps += calls.unmaps;
        self.arena_usage.bytes_reserved = self.granules.mapped_bytes;
    }

    /// Unmaps idle arena runs where a block of `size` bytes mapped beside would take
    /// the mapped bytes past the high-water mark.
    pub(super) fn make_room_beside(&mut self, storage: &mut dyn ComputeStorage, size: u64) {
        if self.granules.idle.is_empty() {
            return;
        }
        let granule = self.granules.granule;
        let wanted = size.div_ceil(granule).saturating_mul(granule);
        let beside = self.beside.usage().bytes_reserved;
        // Saturating: a request near 2^64 bytes is refused later, not overflowed here.
        let after = beside.saturating_add(wanted);
        if self.granules.mapped_bytes.saturating_add(after) > self.water() {
            if let Some(memory) = storage.virtual_memory() {
                let goal = self.water().saturating_sub(after);
                self.unmap_idle(memory, goal);
            }
        }
    }

    /// What idle arena runs are kept under: the high-water mark, or the plan's own peak
    /// while the run has followed the plan without a miss (it maps that much anyway, so
    /// idle runs are not unmapped and mapped again as it grows). Once a request misses,
    /// the run has left the plan, and granules kept for planned blocks could end up
    /// partly touched by others (a run partly touched is not idle): the mark alone.
    fn water(&self) -> u64 {
        if self.stats.misses() == 0 {
            self.high_water.max(self.plan_peak)
        } else {
            self.high_water
        }
    }

    /// Recomputes the pool's books from the arena's and the virtual pool's.
    pub(super) fn rebook(&mut self) {
        let beside = self.beside.books();
        let usage = self.arena_usage.combine(beside.usage);
        self.high_water = self.high_water.max(usage.bytes_reserved);
        let stats = &mut self.books.stats;
        stats.pages = self.arena_calls.maps - self.arena_calls.unmaps + beside.stats.pages;
        stats.pages_peak = stats.pages_peak.max(stats.pages);
        stats.pages_unmapped = self.arena_calls.unmaps + beside.stats.pages_unmapped;
        stats.bytes_reserved_peak = stats.bytes_reserved_peak.max(usage.bytes_reserved);
        stats.bytes_in_use_peak = stats.bytes_in_use_peak.max(usage.bytes_in_use);
        self.books.usage = usage;
    }

    /// Unmaps every idle run of the arena.
    pub(super) fn unmap_idle(&mut self, memory: &mut dyn VirtualMemory, goal: u64) {
        if let Some(range) = self.range {
            let calls = self.granules.unmap_idle(memory, range, goal);
            self.booked(calls);
        }
    }
}
