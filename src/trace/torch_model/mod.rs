//! A model of PyTorch's CUDA caching allocator, to compare layouts with what PyTorch
//! users run today.
//!
//! [`TorchAllocator`] follows the rules of `DeviceCachingAllocator` in PyTorch's
//! `c10/cuda/CUDACachingAllocator.cpp`, for one device and one stream, with the default
//! settings or with `expandable_segments:True` ([`TorchSettings`]). It holds no memory,
//! only the sizes and addresses of its blocks: it is a model for comparing replays, not
//! a pool to allocate from. [`replay_torch`](super::replay::replay_torch) replays a
//! trace through it.
//!
//! The rules, each with the function of the real allocator it comes from:
//!
//! 1. `round_size`: a request is rounded up to a multiple of 512 B (`kMinBlockSize`);
//!    with `roundup_power2_divisions` n > 1 for the size's interval (16 intervals:
//!    [2^i, 2^(i+1)) MiB, the first every size under 2 MiB, the last every size
//!    from 32 GiB), a size above 512 B * n is rounded up to the next of n equal steps
//!    between the powers of two around it.
//! 2. `get_pool`: rounded sizes up to 1 MiB (`kSmallSize`) go to the small pool, larger
//!    ones to the large pool; the pools never lend each other blocks.
//! 3. `get_free_block`: best fit, the pool's free block with the smallest (size,
//!    address) that holds the request. With `max_split_size`, a request under it never
//!    takes a block at or over it, and a request at or over it only a block less than
//!    20 MiB (`kLargeBuffer`) larger. With expandable segments the walk compares a
//!    block's size plus the unmapped range right after it, so the block at a segment's
//!    top (which can grow) comes after a block of the same size that cannot.
//! 4. `get_allocation_size`, `alloc_block`: on a miss, a new segment (a `cudaMalloc`):
//!    2 MiB (`kSmallBuffer`) for the small pool, 20 MiB (`kLargeBuffer`) for requests
//!    under 10 MiB (`kMinLargeAlloc`), else the request rounded up to 2 MiB
//!    (`kRoundLarge`).
//! 5. `should_split`, `alloc_found_block`: the request takes the low end of the block
//!    found, and the rest stays free as its own block when it is at least 512 B (small
//!    pool, or any pool with expandable segments) or more than 1 MiB (large pool, and
//!    only for requests under `max_split_size`); otherwise the whole block is handed out.
//! 6. `free_block`, `try_merge_blocks`: a freed block merges with the free blocks next
//!    to it in its segment.
//! 7. Segments are kept (no `empty_cache`). When a new segment does not fit under the
//!    device's memory: `release_available_cached_blocks` (only with `max_split_size`:
//!    free the smallest whole oversize segment that holds the request, else oversize
//!    ones from the largest down until enough is freed), retry; then
//!    `release_cached_blocks` (every free whole segment of both pools goes back; with
//!    expandable segments every whole granule inside a free block is unmapped, and a
//!    segment left with nothing mapped is released), retry once more; then the request
//!    fails (PyTorch's out-of-memory error).
//! 8. Expandable segments (`find_expandable_block`, `map_block`,
//!    `try_allocate_expandable_block`): each pool has one address range of 9/8 of the
//!    device's memory; a miss maps granules of 2 MiB (small pool) or 20 MiB (large
//!    pool) at the lowest address with room, joined with the free block just below: at
//!    the segment's top, or in a gap an earlier out-of-memory unmapped.
//!
//! Left out: streams (a trace is one stream), CUDA graphs' private pools, events of
//! cross-stream use, `garbage_collection_threshold` and the per-process memory
//! fraction. A zero-byte request takes no block (PyTorch returns a null pointer). New
//! segments get increasing addresses (the driver picks real ones); addresses only break
//! ties between free blocks of one size, and order the unmapped ranges.

mod allocator;
mod settings;

pub use allocator::{BlockId, NotAllocated, TorchAllocator, TorchOutOfMemory, TorchPool};
pub use settings::{roundup_interval, TorchSettings, TorchSettingsError, ROUNDUP_INTERVALS};

const MIB: u64 = 1024 * 1024;

/// Requests are rounded up to a multiple of this (`kMinBlockSize`); the smallest split
/// remainder of the small pool.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// The largest request of the small pool (`kSmallSize`); the large pool splits only
/// when more than this is left.
pub const SMALL_SIZE: u64 = MIB;
/// The small pool's segment, and its granule with expandable segments (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// The segment of large requests under [`MIN_LARGE_ALLOC`], and the large pool's
/// granule with expandable segments (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Large requests from this size get a segment of their own size (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Segments of large requests are rounded up to a multiple of this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// The largest request the model serves (4 PiB): larger ones fail as out of memory, so
/// no sum of sizes can overflow.
pub const MAX_REQUEST: u64 = 1 << 52;
