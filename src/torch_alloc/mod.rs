//! cubepool as PyTorch's CUDA allocator: C entry points with the signatures of
//! `torch.cuda.memory.CUDAPluggableAllocator` (`entry`), served by a memory
//! management that hands blocks out by address with stream-safe reuse
//! (`allocator`, `gate`) over events on streams (`events`).
//!
//! Stream semantics: a block is freed on the stream it was allocated on (PyTorch's
//! pluggable allocator passes that stream to `free`). It goes back to the pools at
//! once; the same stream may reuse its bytes at once (stream order), and another stream
//! gets them only after the event recorded at the free has completed (waited for
//! when it has not). Memory is given back to the device (unmapped or freed) only after
//! the device finished its queued work.

mod allocator;
mod entry;
mod events;
mod gate;

pub use allocator::{AllocError, DeviceAllocator, StreamAllocator};
pub use entry::{
    cubepool_torch_alloc, cubepool_torch_free, error_counts, install, last_error, with_allocator,
};
pub use events::{HostEvents, ManualEvents, Stream, StreamEvents};
pub use gate::StreamGate;
