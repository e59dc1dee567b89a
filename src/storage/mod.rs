//! Where bytes come from: a storage hands out aligned buffers (pages) and takes them
//! back. [`HostStorage`] allocates real host memory; [`VirtualStorage`] hands out
//! address ranges without bytes, so a trace recorded on a large GPU replays anywhere.
//! Both also offer virtual memory ([`VirtualMemory`]): an address range reserved
//! without memory, with memory mapped into it and unmapped again in granules (the
//! model of CUDA's `cuMemAddressReserve` / `cuMemMap`; host memory on Linux).
//! [`cuda::CudaStorage`] holds device memory of an NVIDIA GPU through the same traits,
//! with the driver loaded at run time.

pub mod cuda;
mod device_storage;
mod host;
#[cfg(target_os = "linux")]
mod os_mapping;
mod run_map;
mod virtual_memory;
mod virtual_storage;
mod writable_runs;

pub use device_storage::DeviceStorage;
pub use host::{HostStorage, HUGE_PAGE_SIZE};
pub(crate) use run_map::RunMap;
pub use virtual_memory::{MappingError, VirtualMemory};
pub use virtual_storage::VirtualStorage;

use crate::error::PoolError;

/// Identifies one buffer of a storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageId(pub u64);

/// One buffer handed out by a storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageHandle {
    /// The buffer's id, used to release it.
    pub id: StorageId,
    /// The address of the buffer's first byte (real for host storage, synthetic for
    /// virtual storage). A storage hands out buffers whose `address + size` fits in 64
    /// bits; of one that does not, memory management computes the addresses of the
    /// reservations inside wrapping, and never panics on it.
    pub address: u64,
    /// The buffer's size in bytes.
    pub size: u64,
}

/// A source of aligned buffers.
pub trait ComputeStorage: Send {
    /// Allocates `size` bytes aligned to `alignment` (0 is taken as 1).
    ///
    /// Failing to provide the bytes is [`PoolError::OutOfMemory`], never an abort; an
    /// alignment a storage cannot give is [`PoolError::InvalidArgument`] naming it
    /// (cubepool's storages of real memory refuse one that is not a power of two; the
    /// simulated one gives any).
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError>;

    /// Releases a buffer. Releasing an unknown id does nothing.
    fn dealloc(&mut self, id: StorageId);

    /// The number of bytes currently allocated (buffers, and runs mapped through
    /// [`VirtualMemory`]).
    fn bytes_allocated(&self) -> u64;

    /// The number of storage allocations made so far (each a `cudaMalloc` on a GPU),
    /// maps of [`VirtualMemory`] included.
    fn allocations(&self) -> u64;

    /// The number of storage releases made so far (each a `cudaFree` on a GPU),
    /// unmaps of [`VirtualMemory`] included.
    fn deallocations(&self) -> u64;

    /// The storage's virtual memory, when it has one (`None` by default).
    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        None
    }

    /// The storage's virtual memory, to read (`None` by default; `Some` exactly when
    /// [`ComputeStorage::virtual_memory`] is).
    fn virtual_memory_ref(&self) -> Option<&dyn VirtualMemory> {
        None
    }
}

/// `alignment` as a storage of real memory takes it (0 as 1), or `InvalidArgument`
/// naming it where it is not a power of two: the host's allocator and the device's
/// align to powers of two only, and a storage must not call that a want of memory. (The
/// simulated storage, whose addresses are arithmetic, aligns to any.)
pub(crate) fn checked_alignment(alignment: u64) -> Result<u64, PoolError> {
    let alignment = alignment.max(1);
    if alignment.is_power_of_two() {
        Ok(alignment)
    } else {
        Err(PoolError::InvalidArgument {
            reason: format!("alignment {alignment} is not a power of two"),
        })
    }
}
