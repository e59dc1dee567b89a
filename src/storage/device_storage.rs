//! [`DeviceStorage`]: host or CUDA storage, chosen at run time (`device="cpu"` or
//! `device="cuda:N"` from Python), behind the storage traits.

use super::cuda::CudaError;
#[cfg(target_os = "linux")]
use super::cuda::CudaStorage;
use super::{ComputeStorage, HostStorage, StorageHandle, StorageId, VirtualMemory};
use crate::error::PoolError;

/// Where a memory management's bytes live.
pub enum DeviceStorage {
    /// Host memory.
    Host(HostStorage),
    /// Memory of a CUDA device.
    #[cfg(target_os = "linux")]
    Cuda(CudaStorage),
}

impl DeviceStorage {
    /// Host storage.
    pub fn host() -> Self {
        Self::Host(HostStorage::new())
    }

    /// Storage on CUDA device `ordinal` (loads the driver).
    pub fn cuda(ordinal: i32) -> Result<Self, CudaError> {
        #[cfg(target_os = "linux")]
        return CudaStorage::new(ordinal).map(Self::Cuda);
        #[cfg(not(target_os = "linux"))]
        {
            let _ = ordinal;
            Err(CudaError::Unsupported)
        }
    }

    /// The CUDA device ordinal, or `None` for host memory.
    pub fn cuda_ordinal(&self) -> Option<i32> {
        match self {
            Self::Host(_) => None,
            #[cfg(target_os = "linux")]
            Self::Cuda(storage) => Some(storage.ordinal()),
        }
    }
}

/// Calls `$call` on the storage inside, whichever it is.
macro_rules! each {
    ($self:expr, $storage:ident => $call:expr) => {
        match $self {
            DeviceStorage::Host($storage) => $call,
            #[cfg(target_os = "linux")]
            DeviceStorage::Cuda($storage) => $call,
        }
    };
}

impl ComputeStorage for DeviceStorage {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        each!(self, s => s.alloc(size, alignment))
    }

    fn dealloc(&mut self, id: StorageId) {
        each!(self, s => s.dealloc(id))
    }

    fn bytes_allocated(&self) -> u64 {
        each!(self, s => s.bytes_allocated())
    }

    fn allocations(&self) -> u64 {
        each!(self, s => s.allocations())
    }

    fn deallocations(&self) -> u64 {
        each!(self, s => s.deallocations())
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        each!(self, s => s.virtual_memory())
    }

    fn virtual_memory_ref(&self) -> Option<&dyn VirtualMemory> {
        each!(self, s => s.virtual_memory_ref())
    }
}
