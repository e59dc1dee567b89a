//! Device memory of an NVIDIA GPU through the CUDA driver API, loaded at run time
//! (`driver`): [`CudaStorage`] allocates buffers with `cuMemAlloc` / `cuMemFree` and
//! implements [`VirtualMemory`](super::VirtualMemory) call by call with the driver's
//! virtual-memory functions; [`CudaEvents`] records and queries events on streams for
//! stream-safe reuse.
//!
//! On Linux only (the driver is `libcuda.so.1`); elsewhere every constructor returns
//! [`CudaError::Unsupported`].

#[cfg(target_os = "linux")]
mod context;
#[cfg(target_os = "linux")]
mod driver;
#[cfg(target_os = "linux")]
mod events;
#[cfg(target_os = "linux")]
mod storage;

#[cfg(target_os = "linux")]
pub use driver::{library_path, probe_driver};
#[cfg(target_os = "linux")]
pub use events::CudaEvents;
#[cfg(target_os = "linux")]
pub use storage::{device_memory_info, CudaStorage};

use thiserror::Error;

/// Why the CUDA driver could not serve a request. Only asking for a CUDA storage (or
/// events) can produce one: a process that never does never loads the driver.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library could not be opened (no NVIDIA driver installed).
    #[error("CUDA driver not found: could not load {library} ({reason}); a CUDA device needs the NVIDIA driver (set CUBEPOOL_LIBCUDA to its path if it is elsewhere)")]
    DriverNotFound {
        /// The library asked for.
        library: String,
        /// What `dlopen` said.
        reason: String,
    },
    /// The library lacks an entry point cubepool calls (not a CUDA 12 driver).
    #[error("CUDA driver {library} has no {symbol}: cubepool needs a CUDA 12 driver")]
    MissingSymbol {
        /// The missing entry point.
        symbol: &'static str,
        /// The library loaded.
        library: String,
    },
    /// A driver call failed.
    #[error("{call} failed: {name} ({code})")]
    Call {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
        /// The code's name (`cuGetErrorName`).
        name: String,
    },
    /// A device ordinal the driver does not have.
    #[error("no CUDA device {ordinal}: the driver sees {count} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// The devices the driver sees.
        count: i32,
    },
    /// CUDA storage on a platform other than Linux.
    #[error("CUDA storage is supported on Linux only")]
    Unsupported,
}
