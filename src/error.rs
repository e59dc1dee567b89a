//! Errors of the memory-management core: one enum per family, typed fields.

use thiserror::Error;

use crate::report::human_size;

/// A request's size in a message: in a unit people read, and exact (`12.0 MiB
/// (12582912 bytes)`), since the caller may need the byte it missed by.
fn exact_size(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{} ({bytes} bytes)", human_size(bytes))
    }
}

/// Why a reservation, a release or a lookup did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Every pool that accepts this size is capped and full.
    #[error(
        "pool capacity exceeded: {} do not fit; the accepting pools are full ({} of {} in use)",
        exact_size(*.size), human_size(*.in_use), human_size(*.capacity)
    )]
    PoolCapacityExceeded {
        /// The requested size in bytes.
        size: u64,
        /// The capacity (bytes) of the accepting pools together (at most `u64::MAX`:
        /// the sum saturates).
        capacity: u64,
        /// The bytes in use in those pools (saturating, as `capacity`).
        in_use: u64,
    },
    /// No pool of the configuration accepts this size.
    #[error(
        "buffer too big: no pool accepts {} (the largest accepted size is {})",
        exact_size(*.size), human_size(*.max_accepted)
    )]
    BufferTooBig {
        /// The requested size in bytes.
        size: u64,
        /// The largest size any pool accepts.
        max_accepted: u64,
    },
    /// The storage could not provide the bytes.
    #[error("out of memory: the storage could not allocate {}", exact_size(*.size))]
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
    /// An argument a pool cannot serve, handed to it directly (memory management
    /// checks its configuration and serves 0-byte reservations itself): a size of 0,
    /// or a pool built with a parameter it cannot work with, such as a granule that is
    /// not a power of two.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What was wrong, naming the argument.
        reason: String,
    },
    /// A handle or binding does not name live memory of this MemoryManagement.
    #[error("not found: {reason}")]
    NotFound {
        /// What was looked up and why it failed.
        reason: String,
    },
}
