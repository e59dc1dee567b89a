//! What memory management reports about its bytes.

use std::fmt;

/// Amount of memory in use by an allocator, and how much is reserved and wasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemoryUsage {
    /// The number of live allocations.
    pub number_allocs: u64,
    /// The bytes the live allocations asked for.
    pub bytes_in_use: u64,
    /// The bytes added to live allocations to round them up to the alignment.
    pub bytes_padding: u64,
    /// The bytes held from the storage (pages), used or not.
    pub bytes_reserved: u64,
}

impl MemoryUsage {
    /// The sum of two usages.
    pub fn combine(self, other: MemoryUsage) -> MemoryUsage {
        // Saturating: usages can come from reports read back from data.
        MemoryUsage {
            number_allocs: self.number_allocs.saturating_add(other.number_allocs),
            bytes_in_use: self.bytes_in_use.saturating_add(other.bytes_in_use),
            bytes_padding: self.bytes_padding.saturating_add(other.bytes_padding),
            bytes_reserved: self.bytes_reserved.saturating_add(other.bytes_reserved),
        }
    }

    /// Records one allocation of `size` bytes padded to `extent` (at least `size`).
    ///
    /// Wrapping arithmetic, not checked: the pools' usages are sums over their live
    /// allocations (checked by each pool's `check_invariants` and by
    /// `MemoryManagement::check_invariants`), so no sum passes the bytes of the address
    /// space and no difference goes below zero. The checks the build adds elsewhere
    /// (`overflow-checks`) cost the default layout's reserve + release 30 instructions
    /// of about 750 in the FIFO loop (`examples/peer_loops.rs` under callgrind).
    #[inline]
    pub(crate) fn add(&mut self, size: u64, extent: u64) {
        debug_assert!(extent >= size, "an extent covers its size");
        self.number_allocs = self.number_allocs.wrapping_add(1);
        self.bytes_in_use = self.bytes_in_use.wrapping_add(size);
        self.bytes_padding = self.bytes_padding.wrapping_add(extent.wrapping_sub(size));
    }

    /// Forgets one allocation recorded by [`MemoryUsage::add`] (wrapping, as there).
    ///
    /// The crate's own unit tests assert that the usage holds the allocation. Other
    /// builds do not: a caller can rewrite a pool's usage through the public
    /// [`MemoryPool::books_mut`](crate::pool::MemoryPool::books_mut), and a debug build
    /// of their program must not panic on the release that follows. The pool's
    /// `check_invariants` then names the mismatch (`tests/pool_misuse.rs`,
    /// `a_pool_whose_usage_was_rewritten_releases_without_a_panic`).
    #[inline]
    pub(crate) fn remove(&mut self, size: u64, extent: u64) {
        #[cfg(test)]
        assert!(self.number_allocs > 0 && self.bytes_in_use >= size);
        self.number_allocs = self.number_allocs.wrapping_sub(1);
        self.bytes_in_use = self.bytes_in_use.wrapping_sub(size);
        self.bytes_padding = self.bytes_padding.wrapping_sub(extent.wrapping_sub(size));
    }
}

impl fmt::Display for MemoryUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} allocations, {} bytes in use, {} bytes padding, {} bytes reserved",
            self.number_allocs, self.bytes_in_use, self.bytes_padding, self.bytes_reserved
        )
    }
}
