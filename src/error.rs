//! Errors of the memory-management core: one enum per family, typed fields.

use thiserror::Error;

/// Why a reservation, a release or a lookup did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PoolError {
    /// Every pool that accepts this size is capped and full.
    #[error(
        "pool capacity exceeded: {size} bytes do not fit; the accepting pools are full \
         ({in_use} of {capacity} bytes in use)"
    )]
    PoolCapacityExceeded {
        /// The requested size in bytes.
        size: u64,
        /// The capacity (bytes) of the accepting pools together.
        capacity: u64,
        /// The bytes in use in those pools.
        in_use: u64,
    },
    /// No pool of the configuration accepts this size.
    #[error("buffer too big: no pool accepts {size} bytes (the largest accepted size is {max_accepted})")]
    BufferTooBig {
        /// The requested size in bytes.
        size: u64,
        /// The largest size any pool accepts.
        max_accepted: u64,
    },
    /// The storage could not provide the bytes.
    #[error("out of memory: the storage could not allocate {size} bytes")]
    OutOfMemory {
        /// The size of the storage allocation that failed.
        size: u64,
    },
    /// The storage cannot serve the pool: it has no virtual memory for a virtual
    /// pool, its granularity does not divide the pool's granule, or it refused a
    /// call for a reason other than memory.
    #[error("storage error: {reason}")]
    Storage {
        /// What the storage could not do.
        reason: String,
    },
    /// A handle or binding does not name live memory of this MemoryManagement.
    #[error("not found: {reason}")]
    NotFound {
        /// What was looked up and why it failed.
        reason: String,
    },
}
