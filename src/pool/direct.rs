//! Every allocation its own storage buffer, reused by exact padded size.

use std::collections::BTreeMap;

use super::whole_pages::{padded, WholePages};
use super::{ensure, extent_of, AcceptRule, Books, MemoryPool, Placement, Released, SlotId};
use crate::error::PoolError;
use crate::storage::ComputeStorage;

/// A pool in which every allocation is its own storage buffer; freed buffers are
/// cached by padded size and reused last-in first-out for the same padded size. When
/// the cached bytes pass `reclaim_at`, every cached buffer is released.
///
/// Without `reclaim_at` the cache is still bounded (the *cache bound*): when a new
/// buffer must be made while the cached bytes exceed the most bytes the pool ever had
/// in use at once, the cache is released first. A workload whose sizes repeat never
/// meets the bound (its cache is at most what it uses); one whose sizes never repeat
/// (random sizes reserved and dropped) would otherwise keep every buffer it ever made,
/// and keeps instead at most about twice its peak in use. The persistent pool, a
/// direct pool without `reclaim_at`, is bounded the same way.
#[derive(Debug, Clone)]
pub struct DirectPool {
    max_alloc_size: u64,
    alignment: u64,
    reclaim_at: Option<u64>,
    /// The buffers, each a page of its padded size.
    buffers: WholePages<()>,
    /// Invariant: exactly the free buffers, by padded size, most recently freed last.
    free: BTreeMap<u64, Vec<SlotId>>,
    /// Invariant: the bytes of the buffers in `free`.
    free_bytes: u64,
    /// The most padded bytes in use at once since the pool was made (never reset, unlike
    /// the statistics' peaks): the cache bound when `reclaim_at` is None.
    /// Invariant: at least the padded bytes in use now.
    used_peak: u64,
}

impl DirectPool {
    /// A direct pool for sizes up to `max_alloc_size`.
    pub fn new(max_alloc_size: u64, alignment: u64, reclaim_at: Option<u64>) -> Self {
        Self {
            max_alloc_size,
            alignment,
            reclaim_at,
            buffers: WholePages::default(),
            free: BTreeMap::new(),
            free_bytes: 0,
            used_peak: 0,
        }
    }

    /// Whether a free buffer of exactly `size`'s padded size is cached.
    #[inline]
    pub fn has_free(&self, size: u64) -> bool {
        self.free_bytes > 0
            && extent_of(size, self.alignment)
                .and_then(|extent| self.free.get(&extent))
                .is_some_and(|ids| !ids.is_empty())
    }

    fn release_cached(&mut self, storage: &mut dyn ComputeStorage) {
        for (_, ids) in std::mem::take(&mut self.free) {
            for id in ids {
                self.buffers.give_up(storage, id);
            }
        }
        self.free_bytes = 0;
    }
}

impl MemoryPool for DirectPool {
    fn accept_rule(&self) -> AcceptRule {
        AcceptRule::up_to(self.max_alloc_size)
    }

    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        let extent = padded(size, self.alignment, self.max_alloc_size)?;
        let cached = self.free.get_mut(&extent).and_then(Vec::pop);
        let id = match cached {
            Some(id) => {
                self.free_bytes -= extent;
                if self.free.get(&extent).is_some_and(Vec::is_empty) {
                    self.free.remove(&extent);
                }
                id
            }
            None => {
                // The cache bound: making a buffer while the cache holds more than the
                // pool ever used at once means most of the cache is sizes that do not
                // come back; release it before growing.
                if self.reclaim_at.is_none() && self.free_bytes > self.used_peak {
                    self.release_cached(storage);
                }
                self.buffers.make(storage, size, extent, self.alignment)?
            }
        };
        let placement = self.buffers.hand_out(id, size, extent);
        let used = self.buffers.books.usage.bytes_reserved - self.free_bytes;
        self.used_peak = self.used_peak.max(used);
        Ok(placement)
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        // A buffer is a page of its padded size: its whole size is in use.
        let (released, extent, free) =
            self.buffers
                .take_back(slot, "buffer", "direct pool", |_, buffer_size| buffer_size)?;
        self.free.entry(extent).or_default().push(free);
        self.free_bytes += extent;
        Ok(released)
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        self.buffers.locate(slot)
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        // A buffer counts whole in use, as its release counts it out.
        self.buffers
            .locate(slot)
            .map(|placement| placement.storage.size)
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, _reserve_count: u64, explicit: bool) {
        let over_watermark = self.reclaim_at.is_some_and(|mark| self.free_bytes > mark);
        if explicit || over_watermark {
            self.release_cached(storage);
        }
    }

    fn books(&self) -> &Books {
        &self.buffers.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.buffers.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut free_bytes = 0;
        let mut free = 0;
        for (id, buffer) in self.buffers.iter() {
            let cached = self
                .free
                .get(&buffer.storage.size)
                .is_some_and(|ids| ids.contains(&id));
            ensure(cached != buffer.used, || {
                format!("buffer {} is used and cached, or neither", id.index)
            })?;
            if !buffer.used {
                free_bytes += buffer.storage.size;
                free += 1;
            }
        }
        let indexed: usize = self.free.values().map(Vec::len).sum();
        ensure(indexed == free, || "free index holds stale entries".into())?;
        ensure(free_bytes == self.free_bytes, || {
            "cached bytes drifted".into()
        })?;
        self.buffers
            .check_books("buffer", |_, buffer_size| buffer_size)?;
        let reserved = self.buffers.books.usage.bytes_reserved;
        ensure(reserved - free_bytes <= self.used_peak, || {
            "the peak of bytes in use is below the bytes in use".into()
        })
    }
}
