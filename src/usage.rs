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

    /// Records one allocation of `size` bytes padded to `extent`.
    pub(crate) fn add(&mut self, size: u64, extent: u64) {
        self.number_allocs += 1;
        self.bytes_in_use += size;
        self.bytes_padding += extent - size;
    }

    /// Forgets one allocation recorded by [`MemoryUsage::add`].
    pub(crate) fn remove(&mut self, size: u64, extent: u64) {
        self.number_allocs -= 1;
        self.bytes_in_use -= size;
        self.bytes_padding -= extent - size;
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
