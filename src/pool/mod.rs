//! The pools: sliced, exclusive, persistent, direct, virtual and planned, one file each, behind one
//! [`MemoryPool`] trait that memory management routes through (by the pools'
//! [`AcceptRule`]s, looked up per size class in `routing`). The exclusive and direct
//! pools keep their pages, one reservation each, through `whole_pages`.

mod arena;
mod bins;
mod chunks;
mod direct;
mod exclusive;
mod persistent;
mod planned;
mod routing;
mod slab;
mod sliced;
mod virtual_pages;
mod whole_pages;

pub use direct::DirectPool;
pub use exclusive::ExclusivePool;
pub use persistent::PersistentPool;
pub use planned::{PlannedPool, PlannedStats};
pub use slab::SlotId;
pub use sliced::SlicedPool;
pub use virtual_pages::VirtualPool;

pub(crate) use routing::{Route, RouteTable};
pub(crate) use slab::Slab;

use crate::error::PoolError;
use crate::storage::{ComputeStorage, StorageHandle};
use crate::usage::MemoryUsage;

/// Where one reservation's bytes are, as its pool sees them: its slot, the storage
/// buffer (page) and the offset in it. Pool-local: it does not say which pool holds it.
/// Memory management names the reservation by a [`SlotRef`](crate::handle::SlotRef)
/// and reports its bytes to callers as a [`Resource`](crate::Resource).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The reservation's id inside its pool.
    pub slot: SlotId,
    /// The storage buffer (page) holding it.
    pub storage: StorageHandle,
    /// The offset of its first byte in the page; a multiple of the alignment.
    pub offset: u64,
    /// The bytes asked for.
    pub size: u64,
}

/// What a release freed, for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The bytes the reservation asked for.
    pub size: u64,
    /// The bytes it spanned (`size` padded to the alignment, or the buffer it held).
    pub extent: u64,
}

/// Which sizes a pool serves: a plain function of the size, fixed when the pool is
/// built (routing reads it per size class, from a table built from every pool's rule,
/// and evaluates it for the classes the table leaves open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptRule {
    /// Every size up to this is served.
    pub max_size: u64,
    /// An uncapped sliced pool's page size: sizes within 20 % of a page are served
    /// too (CubeCL's near-page rule).
    pub near_page: Option<u64>,
}

impl AcceptRule {
    /// Every size up to `max_size`, and no other.
    pub fn up_to(max_size: u64) -> Self {
        Self {
            max_size,
            near_page: None,
        }
    }

    /// Whether the rule serves `size` bytes.
    #[inline]
    pub fn accepts(&self, size: u64) -> bool {
        size <= self.max_size
            || self.near_page.is_some_and(|page| {
                page.checked_sub(size)
                    .is_some_and(|rest| rest.saturating_mul(5) < page)
            })
    }

    /// Whether the rule answers alike for every size of `low..=high`: when true, it
    /// serves all of them or none. Cautious: it may answer false for a range served
    /// alike, where the rule's two runs overlap or touch.
    pub(crate) fn is_uniform_on(&self, low: u64, high: u64) -> bool {
        // The sizes at which the answer may change: just past `max_size`, and at both
        // ends of the near-page run `page - (page - 1) / 5 ..= page` (the sizes whose
        // distance to the page, times 5, stays below the page).
        let mut changes = [self.max_size.checked_add(1), None, None];
        if let Some(page) = self.near_page.filter(|&page| page > 0) {
            changes[1] = Some(page - (page - 1) / 5);
            changes[2] = page.checked_add(1);
        }
        !changes
            .into_iter()
            .flatten()
            .any(|change| low < change && change <= high)
    }
}

/// High-water marks and page counts of one pool, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Pages (storage buffers) currently held.
    pub pages: u64,
    /// The most pages held at once since the last reset.
    pub pages_peak: u64,
    /// Pages released back to the storage so far.
    pub pages_unmapped: u64,
    /// The largest allocation served since the last reset.
    pub largest_alloc: u64,
    /// The most bytes reserved at once since the last reset.
    pub bytes_reserved_peak: u64,
    /// The most bytes in use at once since the last reset.
    pub bytes_in_use_peak: u64,
}

impl PoolStats {
    /// Records a new page.
    pub(crate) fn page_mapped(&mut self, usage: &MemoryUsage) {
        self.pages += 1;
        self.pages_peak = self.pages_peak.max(self.pages);
        self.bytes_reserved_peak = self.bytes_reserved_peak.max(usage.bytes_reserved);
    }

    /// Records a released page. Saturating: `books_mut` is public, and a caller that
    /// zeroed the statistics while pages were held must not make a release panic.
    pub(crate) fn page_unmapped(&mut self) {
        self.pages = self.pages.saturating_sub(1);
        self.pages_unmapped += 1;
    }

    /// Records a served allocation. Branches, not `max`: the marks rarely move, and a
    /// store they do not need cost the FIFO step of `examples/peer_loops.rs` 2
    /// instructions each (callgrind).
    #[inline]
    pub(crate) fn allocated(&mut self, size: u64, usage: &MemoryUsage) {
        if size > self.largest_alloc {
            self.largest_alloc = size;
        }
        if usage.bytes_in_use > self.bytes_in_use_peak {
            self.bytes_in_use_peak = usage.bytes_in_use;
        }
    }

    /// Restarts the high-water marks from the current state.
    pub(crate) fn reset_peaks(&mut self, usage: &MemoryUsage) {
        self.pages_peak = self.pages;
        self.largest_alloc = 0;
        self.bytes_reserved_peak = usage.bytes_reserved;
        self.bytes_in_use_peak = usage.bytes_in_use;
    }
}

/// A pool's usage and statistics, kept together so every pool reports them the same
/// way. Invariant (checked by each pool's `check_invariants`): `usage` equals the sum
/// over the pool's live allocations and pages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Books {
    /// The pool's current usage.
    pub usage: MemoryUsage,
    /// The pool's page counts and high-water marks.
    pub stats: PoolStats,
}

/// One pool of memory management.
///
/// Memory management serves zero-byte reservations itself and hands a pool positive
/// sizes only; a pool called directly refuses a size of 0 with
/// [`PoolError::InvalidArgument`].
pub trait MemoryPool {
    /// Which sizes this pool serves.
    fn accept_rule(&self) -> AcceptRule;

    /// Whether this pool serves `size` bytes (routing takes the first that does).
    fn accept(&self, size: u64) -> bool {
        self.accept_rule().accepts(size)
    }

    /// Reserves `size` bytes: reuses free space, else maps a new page.
    ///
    /// A capped pool that is full answers [`PoolError::PoolCapacityExceeded`] and
    /// reserves nothing.
    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError>;

    /// Frees a reservation and says how many bytes it freed. An id this pool does
    /// not hold is [`PoolError::NotFound`].
    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError>;

    /// [`MemoryPool::release`] with the storage at hand, so a pool that gives memory
    /// back as reservations go (the virtual pool) can do it at once; memory
    /// management releases through this. By default the same as `release`.
    fn release_with(
        &mut self,
        storage: &mut dyn ComputeStorage,
        slot: SlotId,
    ) -> Result<Released, PoolError> {
        let _ = storage;
        self.release(slot)
    }

    /// Where a live reservation is.
    fn locate(&self, slot: SlotId) -> Option<Placement>;

    /// The bytes a live reservation spans: what its release counts out of use
    /// ([`Released::extent`]), so the pool's padding is the sum of its live
    /// reservations' extents less their sizes. `None` for an id the pool does not hold.
    fn extent_of(&self, slot: SlotId) -> Option<u64>;

    /// Releases pages: every fully free page when `explicit`, otherwise those the
    /// pool's periodic policy says have stayed free long enough.
    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool);

    /// The pool's usage and statistics.
    fn books(&self) -> &Books;

    /// The pool's usage and statistics, to update.
    fn books_mut(&mut self) -> &mut Books;

    /// The pool's current usage.
    fn usage(&self) -> MemoryUsage {
        self.books().usage
    }

    /// The pool's page counts and high-water marks.
    fn stats(&self) -> PoolStats {
        self.books().stats
    }

    /// Restarts the high-water marks.
    fn reset_peaks(&mut self) {
        let books = self.books_mut();
        books.stats.reset_peaks(&books.usage);
    }

    /// Checks every invariant of the pool's bookkeeping; the first broken one is
    /// described in the error.
    fn check_invariants(&self) -> Result<(), String>;
}

/// One dynamic pool of memory management, of any kind. Routing goes through this
/// enum rather than a trait object, so the hot paths of each pool inline into
/// memory management's.
// The virtual pool is the largest variant (two address ranges with their free
// lists inline): a memory management holds a few pools for its whole life, and boxing
// it would add a dependent load to every reserve and release.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum DynamicPool {
    /// A pool of pages carved into slices.
    Sliced(SlicedPool),
    /// A pool of pages holding one reservation each.
    Exclusive(ExclusivePool),
    /// A pool of exact-size buffers.
    Direct(DirectPool),
    /// A pool of blocks in reserved address ranges, mapped in granules on demand.
    Virtual(VirtualPool),
    /// A placement followed at run time, with a virtual pool beside it.
    Planned(PlannedPool),
}

impl DynamicPool {
    /// Whether the pool holds one reservation per page (every kind but a sliced
    /// or virtual pool), for the statistics.
    #[inline]
    pub fn holds_whole_pages(&self) -> bool {
        !matches!(self, Self::Sliced(_) | Self::Virtual(_) | Self::Planned(_))
    }

    /// Marks a step boundary (only a planned pool follows steps).
    pub fn step(&mut self) {
        if let Self::Planned(pool) = self {
            pool.step();
        }
    }

    /// A planned pool's hits and misses; `None` for other pools.
    pub fn planned_stats(&self) -> Option<PlannedStats> {
        match self {
            Self::Planned(pool) => Some(pool.planned_stats()),
            _ => None,
        }
    }
}

/// Evaluates `$call` with `$inner` bound to the pool inside a [`DynamicPool`].
macro_rules! each_pool {
    ($pool:expr, $inner:ident => $call:expr) => {
        match $pool {
            DynamicPool::Sliced($inner) => $call,
            DynamicPool::Exclusive($inner) => $call,
            DynamicPool::Direct($inner) => $call,
            DynamicPool::Virtual($inner) => $call,
            DynamicPool::Planned($inner) => $call,
        }
    };
}

impl MemoryPool for DynamicPool {
    #[inline]
    fn accept_rule(&self) -> AcceptRule {
        each_pool!(self, pool => pool.accept_rule())
    }

    #[inline(always)]
    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        each_pool!(self, pool => pool.reserve(storage, size))
    }

    #[inline]
    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        each_pool!(self, pool => pool.release(slot))
    }

    #[inline(always)]
    fn release_with(
        &mut self,
        storage: &mut dyn ComputeStorage,
        slot: SlotId,
    ) -> Result<Released, PoolError> {
        each_pool!(self, pool => pool.release_with(storage, slot))
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        each_pool!(self, pool => pool.locate(slot))
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        each_pool!(self, pool => pool.extent_of(slot))
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool) {
        each_pool!(self, pool => pool.cleanup(storage, reserve_count, explicit))
    }

    #[inline]
    fn books(&self) -> &Books {
        each_pool!(self, pool => pool.books())
    }

    #[inline]
    fn books_mut(&mut self) -> &mut Books {
        each_pool!(self, pool => pool.books_mut())
    }

    fn check_invariants(&self) -> Result<(), String> {
        each_pool!(self, pool => pool.check_invariants())
    }
}

/// Rounds `size` up to a multiple of `alignment`; `None` when that overflows or the
/// alignment is zero.
///
/// Memory management's alignments are powers of two (validated with the device
/// properties), rounded with a mask; any other alignment a pool was built with
/// directly takes the division.
#[inline]
pub(crate) fn extent_of(size: u64, alignment: u64) -> Option<u64> {
    if alignment.is_power_of_two() {
        let mask = alignment - 1;
        size.checked_add(mask).map(|padded| padded & !mask)
    } else {
        size.checked_next_multiple_of(alignment)
    }
}

/// The error of a reserve of 0 bytes handed to a pool directly: pools place at least
/// one byte (memory management serves 0-byte reservations without a pool).
#[cold]
pub(crate) fn zero_size() -> PoolError {
    PoolError::InvalidArgument {
        reason: "size 0: a pool reserves at least 1 byte (MemoryManagement serves \
                 0-byte reservations itself)"
            .into(),
    }
}

/// The error of a reserve of `size` bytes that needs a new page the pool's books
/// cannot count: its bytes reserved would pass `u64::MAX`. Only a storage that grants
/// buffers without address space (a caller's [`ComputeStorage`]) gets a pool there.
#[cold]
pub(crate) fn books_full(size: u64, usage: &MemoryUsage) -> PoolError {
    PoolError::PoolCapacityExceeded {
        size,
        capacity: u64::MAX,
        in_use: usage.bytes_in_use,
    }
}

/// The error of a reserve of `size` bytes whose extent cannot be found: for an
/// alignment of 0 (no size pads to a multiple of 0) [`PoolError::InvalidArgument`]
/// naming it, else (the padded size passes `u64::MAX`) [`PoolError::BufferTooBig`]
/// against `max_accepted`. Memory management validates its alignments, so only a pool
/// built directly can be given 0.
#[cold]
pub(crate) fn unpaddable(size: u64, alignment: u64, max_accepted: u64) -> PoolError {
    if alignment == 0 {
        PoolError::InvalidArgument {
            reason: "alignment 0: a pool pads every size to a multiple of its alignment, \
                     which must be at least 1"
                .into(),
        }
    } else {
        PoolError::BufferTooBig { size, max_accepted }
    }
}

/// Checks a condition of `check_invariants`.
pub(crate) fn ensure(condition: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(what())
    }
}

#[cfg(test)]
mod tests {
    use super::extent_of;

    #[test]
    fn extents_round_up_to_any_alignment_and_refuse_overflow() {
        for alignment in [1u64, 2, 32, 4096, 3, 24, 1000] {
            for size in [1u64, 2, 31, 32, 33, 999, 1000, 1001, 4097] {
                let extent = extent_of(size, alignment).expect("no overflow");
                assert_eq!(extent % alignment, 0, "{size} at {alignment}");
                assert!(
                    extent >= size && extent - size < alignment,
                    "{size} at {alignment}"
                );
            }
        }
        assert_eq!(extent_of(0, 32), Some(0));
        assert_eq!(extent_of(5, 0), None, "zero alignment");
        assert_eq!(extent_of(u64::MAX - 3, 32), None, "past u64::MAX");
        assert_eq!(extent_of(u64::MAX - 3, 1000), None, "past u64::MAX");
        assert_eq!(extent_of(u64::MAX, 1), Some(u64::MAX));
    }
}
