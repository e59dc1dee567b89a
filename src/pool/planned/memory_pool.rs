//! The pool's [`MemoryPool`] implementation: reserve (the plan's placement, else the
//! virtual pool beside), release, locate, cleanup, books and the invariant check.

use super::{Home, PlannedPool};
use crate::error::PoolError;
use crate::pool::{
    ensure, extent_of, unpaddable, zero_size, AcceptRule, Books, MemoryPool, Placement, Released,
    SlotId,
};
use crate::storage::ComputeStorage;
use crate::usage::MemoryUsage;

impl MemoryPool for PlannedPool {
    fn accept_rule(&self) -> AcceptRule {
        self.beside.accept_rule()
    }

    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        // Before the plan is read, a refused request is neither a hit nor a miss: a
        // size of 0 (the only one whose extent is 0; a plan built by hand may hold
        // entries of 0 bytes, which it would take beside a live block at the same
        // offset), and one no extent holds (an alignment of 0, or padding past
        // `u64::MAX`), which the virtual pool beside, of the same alignment, refuses too.
        let Some(extent) = extent_of(size, self.alignment).filter(|&extent| extent != 0) else {
            return Err(self.refused(size));
        };
        let placed = self.place_planned(storage, size, extent)?;
        let placement = match placed {
            Some(placement) => placement,
            None => {
                self.make_room_beside(storage, size);
                let inner = self.beside.reserve(storage, size);
                let inner = match inner {
                    Ok(inner) => inner,
                    Err(error) => {
                        self.rebook();
                        return Err(error);
                    }
                };
                Placement {
                    slot: self.homes.insert(Home::Beside(inner.slot)),
                    ..inner
                }
            }
        };
        self.rebook();
        self.books.stats.largest_alloc = self.books.stats.largest_alloc.max(size);
        Ok(placement)
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        let home = self.homes.remove(slot).ok_or_else(|| PoolError::NotFound {
            reason: format!("block {} is not reserved in this planned pool", slot.index),
        })?;
        let released = match home {
            Home::Arena {
                offset,
                size,
                extent,
            } => {
                self.live.remove(&offset);
                self.granules.untouch(offset, extent);
                self.arena_usage.remove(size, extent);
                Released { size, extent }
            }
            Home::Beside(inner) => self.beside.release(inner)?,
        };
        self.rebook();
        Ok(released)
    }

    fn release_with(
        &mut self,
        storage: &mut dyn ComputeStorage,
        slot: SlotId,
    ) -> Result<Released, PoolError> {
        match self.homes.get(slot).copied() {
            Some(Home::Beside(inner)) => {
                self.homes.remove(slot);
                let released = self.beside.release_with(storage, inner)?;
                self.rebook();
                Ok(released)
            }
            _ => self.release(slot),
        }
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        match *self.homes.get(slot)? {
            Home::Arena { offset, size, .. } => Some(Placement {
                slot,
                storage: self.range?,
                offset,
                size,
            }),
            Home::Beside(inner) => Some(Placement {
                slot,
                ..self.beside.locate(inner)?
            }),
        }
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        match *self.homes.get(slot)? {
            Home::Arena { extent, .. } => Some(extent),
            Home::Beside(inner) => self.beside.extent_of(inner),
        }
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool) {
        self.beside.cleanup(storage, reserve_count, explicit);
        if explicit {
            if let Some(memory) = storage.virtual_memory() {
                self.unmap_idle(memory, 0);
                self.high_water = self.granules.mapped_bytes + self.beside.usage().bytes_reserved;
                // An arena with no live block holds no run now: its address space goes
                // back, as the virtual pool's empty ranges do, and the next arena block
                // reserves it again. Kept, each `install_pools` (which cleans up the
                // pools it replaces) leaked the arena's range, a TiB for a plan that
                // high, until the process had no address space left (helper-135).
                if self.live.is_empty() && self.granules.mapped_bytes == 0 {
                    if let Some(range) = self.range.take() {
                        memory.free_range(range.id);
                    }
                }
            }
        }
        self.rebook();
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.beside.check_invariants()?;
        let mut blocks = Vec::new();
        let mut usage = MemoryUsage::default();
        for (_, home) in self.homes.iter() {
            if let Home::Arena {
                offset,
                size,
                extent,
            } = *home
            {
                ensure(self.live.get(&offset) == Some(&(offset + extent)), || {
                    format!("block at {offset} is not booked live")
                })?;
                blocks.push((offset, extent));
                usage.add(size, extent);
            }
        }
        ensure(blocks.len() == self.live.len(), || {
            "live blocks drifted".into()
        })?;
        let mut previous_end = 0;
        for (&offset, &end) in &self.live {
            ensure(offset >= previous_end, || {
                format!("two live blocks overlap at offset {offset}")
            })?;
            ensure(end <= self.arena_size, || {
                format!("block at {offset} ends past the arena")
            })?;
            previous_end = end;
        }
        self.granules.check(&blocks)?;
        usage.bytes_reserved = self.granules.mapped_bytes;
        ensure(usage == self.arena_usage, || {
            format!(
                "arena usage drifted: {:?} booked, {usage:?} found",
                self.arena_usage
            )
        })?;
        ensure(
            self.books.usage == self.arena_usage.combine(self.beside.usage()),
            || "the pool's usage is not the arena's plus the virtual pool's".into(),
        )
    }
}

impl PlannedPool {
    /// The error of a reserve the pool refuses before it reads its plan: a size of 0,
    /// or one no extent holds ([`unpaddable`]).
    #[cold]
    fn refused(&self, size: u64) -> PoolError {
        if size == 0 {
            zero_size()
        } else {
            unpaddable(size, self.alignment, self.accept_rule().max_size)
        }
    }
}
