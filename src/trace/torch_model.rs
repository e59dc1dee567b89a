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
//!    with `roundup_power2_divisions` n > 1, a size above 512 B * n is rounded up to the
//!    next of n equal steps between the powers of two around it.
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

use std::collections::BTreeMap;
use std::fmt;

use crate::pool::PoolStats;
use crate::usage::MemoryUsage;

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
/// The device memory an expandable segment's address range is sized for when no limit
/// is given (64 TiB): so large that no trace reaches it.
const UNLIMITED_DEVICE: u64 = 1 << 46;
/// The most device memory an expandable segment's address range is sized for (4 EiB),
/// whatever the limit: the ranges of both pools, an eighth larger each, then fit in
/// 64-bit addresses (a limit near `u64::MAX` overflowed the sum).
const LARGEST_EXPANDABLE_DEVICE: u64 = 1 << 62;

/// The allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TorchSettings {
    /// `expandable_segments:True`: one growing address range per pool.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes: blocks this large are never split (None: no limit,
    /// PyTorch's default).
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` (one value for every size): None or 1 rounds to 512 B.
    pub roundup_power2_divisions: Option<u64>,
}

/// A model name or option that [`TorchSettings::parse`] or the setters refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TorchSettingsError {
    /// A name that is no comparison model.
    #[error("unknown model {name:?}: expected torch or torch_expandable, optionally with options such as torch(max_split_size_mb=128)")]
    UnknownModel {
        /// The name given.
        name: String,
    },
    /// An option the model does not have.
    #[error("unknown option {option:?} of the torch model: expected expandable_segments, max_split_size_mb or roundup_power2_divisions")]
    UnknownOption {
        /// The option given.
        option: String,
    },
    /// An option whose value is not of its kind.
    #[error("{option} takes {expected}, got {value:?}")]
    InvalidValue {
        /// The option.
        option: &'static str,
        /// What it takes.
        expected: &'static str,
        /// The value given.
        value: String,
    },
    /// `max_split_size_mb` of 20 or less (PyTorch refuses those).
    #[error("max_split_size_mb must be more than 20 (as in PyTorch), got {mb}")]
    MaxSplitSizeTooSmall {
        /// The value given, in MiB.
        mb: u64,
    },
    /// `roundup_power2_divisions` that is no power of two (PyTorch refuses those).
    #[error("roundup_power2_divisions must be a power of two, got {divisions}")]
    DivisionsNotPowerOfTwo {
        /// The value given.
        divisions: u64,
    },
    /// Text that is not `NAME` or `NAME(option=value, ...)`.
    #[error("expected {expected} in {text:?}")]
    Syntax {
        /// What was expected.
        expected: &'static str,
        /// The text.
        text: String,
    },
}

impl TorchSettings {
    /// The names of the comparison models [`TorchSettings::parse`] reads.
    pub const NAMES: [&'static str; 2] = ["torch", "torch_expandable"];

    /// PyTorch's defaults with `expandable_segments:True`.
    pub fn expandable() -> Self {
        Self {
            expandable_segments: true,
            ..Self::default()
        }
    }

    /// Sets `max_split_size_mb` (more than 20, as PyTorch requires; None: no limit).
    pub fn with_max_split_size_mb(mut self, mb: Option<u64>) -> Result<Self, TorchSettingsError> {
        self.max_split_size = match mb {
            None => None,
            Some(mb) if mb <= LARGE_BUFFER / MIB => {
                return Err(TorchSettingsError::MaxSplitSizeTooSmall { mb })
            }
            // Sizes past MAX_REQUEST all behave alike: every request is under the limit.
            Some(mb) => Some(mb.saturating_mul(MIB).min(MAX_REQUEST * 2)),
        };
        Ok(self)
    }

    /// Sets `roundup_power2_divisions` (a power of two; None: plain 512 B rounding).
    pub fn with_roundup_power2_divisions(
        mut self,
        divisions: Option<u64>,
    ) -> Result<Self, TorchSettingsError> {
        if let Some(divisions) = divisions {
            if !divisions.is_power_of_two() {
                return Err(TorchSettingsError::DivisionsNotPowerOfTwo { divisions });
            }
        }
        self.roundup_power2_divisions = divisions;
        Ok(self)
    }

    /// Reads a model name: `torch` or `torch_expandable` (case and `-` for `_` are
    /// ignored), optionally followed by options in parentheses, each `key=value` or
    /// `key:value` as `PYTORCH_CUDA_ALLOC_CONF` writes them: `expandable_segments`
    /// (True/False), `max_split_size_mb`, `roundup_power2_divisions`.
    pub fn parse(text: &str) -> Result<Self, TorchSettingsError> {
        let text = text.trim();
        let syntax = |expected| TorchSettingsError::Syntax {
            expected,
            text: text.to_string(),
        };
        let (name, options) = match text.find('(') {
            Some(open) => {
                let inner = text[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| syntax("')' at the end"))?;
                (&text[..open], Some(inner))
            }
            None => (text, None),
        };
        let mut settings = match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "torch" => Self::default(),
            "torch_expandable" => Self::expandable(),
            _ => {
                return Err(TorchSettingsError::UnknownModel {
                    name: name.trim().to_string(),
                })
            }
        };
        for option in options.into_iter().flat_map(|o| o.split(',')) {
            if option.trim().is_empty() {
                continue;
            }
            let (key, value) = option
                .split_once(['=', ':'])
                .ok_or_else(|| syntax("option=value"))?;
            let (key, value) = (key.trim(), value.trim());
            let number = |option: &'static str| {
                value
                    .parse::<u64>()
                    .map_err(|_| TorchSettingsError::InvalidValue {
                        option,
                        expected: "a whole number",
                        value: value.to_string(),
                    })
            };
            match key {
                "expandable_segments" => {
                    settings.expandable_segments = match value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(TorchSettingsError::InvalidValue {
                                option: "expandable_segments",
                                expected: "True or False",
                                value: value.to_string(),
                            })
                        }
                    }
                }
                "max_split_size_mb" => {
                    settings =
                        settings.with_max_split_size_mb(Some(number("max_split_size_mb")?))?
                }
                "roundup_power2_divisions" => {
                    settings = settings
                        .with_roundup_power2_divisions(Some(number("roundup_power2_divisions")?))?
                }
                other => {
                    return Err(TorchSettingsError::UnknownOption {
                        option: other.to_string(),
                    })
                }
            }
        }
        Ok(settings)
    }

    /// `max_split_size_mb` as given (None: no limit).
    pub fn max_split_size_mb(&self) -> Option<u64> {
        self.max_split_size.map(|bytes| bytes / MIB)
    }
}

/// The name [`TorchSettings::parse`] reads back: `torch`, `torch_expandable`, with the
/// options that differ from the defaults, e.g. `torch(max_split_size_mb=128)`.
impl fmt::Display for TorchSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.expandable_segments {
            "torch_expandable"
        } else {
            "torch"
        })?;
        let mut options = Vec::new();
        if let Some(mb) = self.max_split_size_mb() {
            options.push(format!("max_split_size_mb={mb}"));
        }
        if let Some(divisions) = self.roundup_power2_divisions {
            options.push(format!("roundup_power2_divisions={divisions}"));
        }
        if !options.is_empty() {
            write!(f, "({})", options.join(", "))?;
        }
        Ok(())
    }
}

/// One of the allocator's two pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TorchPool {
    /// Rounded requests up to 1 MiB, in 2 MiB segments.
    Small,
    /// Larger requests.
    Large,
}

impl TorchPool {
    /// Both pools, in their index order.
    pub const ALL: [TorchPool; 2] = [TorchPool::Small, TorchPool::Large];

    /// The pool of a rounded request (`get_pool`).
    fn of(size: u64) -> Self {
        if size <= SMALL_SIZE {
            TorchPool::Small
        } else {
            TorchPool::Large
        }
    }

    /// The pool's index (small 0, large 1).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The unit in which an expandable segment of this pool maps memory.
    pub fn granule(self) -> u64 {
        match self {
            TorchPool::Small => SMALL_BUFFER,
            TorchPool::Large => LARGE_BUFFER,
        }
    }
}

/// A block of the model: an index into its arena, valid while the block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(u32);

impl BlockId {
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// A request the model could not serve, even after returning its cached segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: {requested} bytes requested with {reserved} bytes reserved")]
pub struct TorchOutOfMemory {
    /// The bytes asked for.
    pub requested: u64,
    /// The bytes the model held when it gave up.
    pub reserved: u64,
}

/// A block id that names no live allocation of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("block {0:?} is not an allocation of this model")]
pub struct NotAllocated(pub BlockId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    /// Handed out.
    Allocated,
    /// Mapped and free: in its pool's `free` index.
    Free,
    /// An address range of an expandable segment with no memory behind it: in its
    /// pool's `unmapped` index.
    Unmapped,
    /// In the arena's spare list, part of no segment.
    Spare,
}

/// A range of a segment. Invariant: the blocks of a segment are linked through `prev`
/// and `next` in address order, each ending where the next begins; two free blocks, or
/// two unmapped ones, are never neighbours (they merge).
#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    state: BlockState,
    pool: TorchPool,
    /// The bytes the request asked for while allocated, else 0.
    requested: u64,
}

/// One pool's blocks and books.
#[derive(Debug, Default)]
struct Pool {
    /// Free mapped blocks by (size, address): best fit is the first key at or above
    /// the request. Invariant: holds exactly the pool's `Free` blocks.
    free: BTreeMap<(u64, u64), BlockId>,
    /// Unmapped ranges of expandable segments by address. Invariant: holds exactly the
    /// pool's `Unmapped` blocks, each starting and ending on a granule.
    unmapped: BTreeMap<u64, BlockId>,
    /// Live allocations (requested bytes, padding up to the block) and mapped bytes.
    usage: MemoryUsage,
    /// Segments held (pages), their peak, releases, the largest request, the peaks.
    stats: PoolStats,
}

/// The model of PyTorch's caching allocator: see the [module docs](self) for its rules.
#[derive(Debug)]
pub struct TorchAllocator {
    settings: TorchSettings,
    /// The device's memory: mapping past it fails (None: unlimited).
    limit: Option<u64>,
    blocks: Vec<Block>,
    spare: Vec<BlockId>,
    pools: [Pool; 2],
    /// Where the next segment's addresses start (segments never share addresses).
    next_addr: u64,
    /// Bytes mapped. Invariant: the sum of the pools' `usage.bytes_reserved`.
    reserved: u64,
    storage_allocations: u64,
    storage_frees: u64,
}

impl TorchAllocator {
    /// An empty allocator with `settings`, on a device of `limit` bytes (None: unlimited).
    pub fn new(settings: TorchSettings, limit: Option<u64>) -> Self {
        Self {
            settings,
            limit,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            next_addr: LARGE_BUFFER,
            reserved: 0,
            storage_allocations: 0,
            storage_frees: 0,
        }
    }

    /// The settings.
    pub fn settings(&self) -> TorchSettings {
        self.settings
    }

    /// Bytes held from the device (`reserved_bytes.all.current`).
    pub fn bytes_reserved(&self) -> u64 {
        self.reserved
    }

    /// Segments allocated or ranges mapped so far (`num_device_alloc`).
    pub fn storage_allocations(&self) -> u64 {
        self.storage_allocations
    }

    /// Segments freed or ranges unmapped so far (`num_device_free`).
    pub fn storage_frees(&self) -> u64 {
        self.storage_frees
    }

    /// A pool's usage (live requests, their padding to the block, bytes mapped).
    pub fn pool_usage(&self, pool: TorchPool) -> MemoryUsage {
        self.pools[pool.index()].usage
    }

    /// A pool's segments and high-water marks.
    pub fn pool_stats(&self, pool: TorchPool) -> PoolStats {
        self.pools[pool.index()].stats
    }

    /// The pool of a live allocation.
    pub fn pool_of_block(&self, id: BlockId) -> Option<TorchPool> {
        self.blocks
            .get(id.index())
            .filter(|block| block.state == BlockState::Allocated)
            .map(|block| block.pool)
    }

    /// The segments held from the device as `(address, size)`: each a run of
    /// consecutive mapped blocks (allocated or free), so a segment of an expandable
    /// range is each of its mapped stretches. Their sizes add up to
    /// [`TorchAllocator::bytes_reserved`].
    pub fn segments(&self) -> Vec<(u64, u64)> {
        let mapped = |id: Option<BlockId>| {
            id.and_then(|id| self.blocks.get(id.index()))
                .filter(|b| matches!(b.state, BlockState::Allocated | BlockState::Free))
        };
        let mut segments = Vec::new();
        for block in &self.blocks {
            if !matches!(block.state, BlockState::Allocated | BlockState::Free)
                || mapped(block.prev).is_some()
            {
                continue;
            }
            let mut size = block.size;
            let mut next = mapped(block.next);
            while let Some(following) = next {
                size += following.size;
                next = mapped(following.next);
            }
            segments.push((block.addr, size));
        }
        segments
    }

    /// The address and size of a live allocation.
    pub fn block(&self, id: BlockId) -> Result<(u64, u64), NotAllocated> {
        match self.blocks.get(id.index()) {
            Some(block) if block.state == BlockState::Allocated => Ok((block.addr, block.size)),
            _ => Err(NotAllocated(id)),
        }
    }

    /// Serves a request of `size` bytes (`DeviceCachingAllocator::malloc`): the block,
    /// or None for zero bytes.
    pub fn malloc(&mut self, requested: u64) -> Result<Option<BlockId>, TorchOutOfMemory> {
        if requested == 0 {
            return Ok(None);
        }
        let out_of_memory = TorchOutOfMemory {
            requested,
            reserved: self.reserved,
        };
        if requested > MAX_REQUEST {
            return Err(out_of_memory);
        }
        let size = self.round_size(requested);
        let pool = TorchPool::of(size);
        let block = match self.get_free_block(pool, size) {
            Some(block) => block,
            None => self
                .alloc_block(pool, size)
                .or_else(|| {
                    self.release_available_cached_blocks(pool, size)
                        .then(|| self.alloc_block(pool, size))
                        .flatten()
                })
                .or_else(|| {
                    self.release_cached_blocks();
                    self.alloc_block(pool, size)
                })
                .ok_or(TorchOutOfMemory {
                    reserved: self.reserved,
                    ..out_of_memory
                })?,
        };
        Ok(Some(self.alloc_found_block(block, size, requested)))
    }

    /// Frees a live allocation (`free_block`): it merges with free neighbours and
    /// stays cached.
    pub fn free(&mut self, id: BlockId) -> Result<(), NotAllocated> {
        let block = match self.blocks.get_mut(id.index()) {
            Some(block) if block.state == BlockState::Allocated => block,
            _ => return Err(NotAllocated(id)),
        };
        let (pool, requested, size) = (block.pool, block.requested, block.size);
        let (prev, next) = (block.prev, block.next);
        block.state = BlockState::Free;
        block.requested = 0;
        let usage = &mut self.pools[pool.index()].usage;
        usage.number_allocs -= 1;
        usage.bytes_in_use -= requested;
        usage.bytes_padding -= size - requested;
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_free(id);
        Ok(())
    }

    // ------------------------------------------------------------------ the rules

    /// Rule 1 (`round_size`). `size` is at most [`MAX_REQUEST`], so nothing overflows.
    fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        match self.settings.roundup_power2_divisions {
            // A bound past 64 bits (divisions up to 2^63 pass the setters) is above
            // every size.
            Some(divisions)
                if divisions > 1
                    && MIN_BLOCK_SIZE
                        .checked_mul(divisions)
                        .is_some_and(|bound| size > bound) =>
            {
                roundup_power2_next_division(size, divisions)
            }
            _ => size.next_multiple_of(MIN_BLOCK_SIZE),
        }
    }

    /// Rule 4 (`get_allocation_size`): the segment a miss of `size` allocates.
    fn allocation_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.next_multiple_of(ROUND_LARGE)
        }
    }

    /// Rule 3 (`get_free_block`): takes the best-fitting free block out of the index.
    fn get_free_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        let free = &self.pools[pool.index()].free;
        let mut candidates = free.range((size, 0)..).map(|(_, &id)| id);
        let mut chosen = candidates.next()?;
        if self.settings.expandable_segments {
            let mut chosen_size = self.expandable_size(chosen);
            for next in candidates {
                let next_size = self.expandable_size(next);
                if next_size >= chosen_size {
                    break;
                }
                (chosen, chosen_size) = (next, next_size);
            }
        }
        let found = self.blocks[chosen.index()].size;
        if let Some(max_split) = self.settings.max_split_size {
            if size < max_split && found >= max_split {
                return None;
            }
            if size >= max_split && found >= size + LARGE_BUFFER {
                return None;
            }
        }
        self.unindex(chosen);
        Some(chosen)
    }

    /// A free block's size plus the unmapped range right after it (what it can grow to).
    fn expandable_size(&self, id: BlockId) -> u64 {
        let block = &self.blocks[id.index()];
        let after = block
            .next
            .map(|next| &self.blocks[next.index()])
            .filter(|next| next.state == BlockState::Unmapped)
            .map_or(0, |next| next.size);
        block.size + after
    }

    /// Rule 4 (`alloc_block`): a new segment, or with expandable segments newly mapped
    /// memory; the block is out of the free index. None when the device is full.
    fn alloc_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(pool, size);
        }
        let bytes = Self::allocation_size(size);
        if !self.fits(bytes) {
            return None;
        }
        let addr = self.take_addresses(bytes)?;
        let id = self.new_block(Block {
            addr,
            size: bytes,
            prev: None,
            next: None,
            state: BlockState::Free,
            pool,
            requested: 0,
        });
        self.mapped(pool, bytes);
        let books = &mut self.pools[pool.index()];
        books.stats.page_mapped(&books.usage);
        Some(id)
    }

    /// Rule 5 (`should_split`).
    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let block = &self.blocks[id.index()];
        let remaining = block.size - size;
        if block.pool == TorchPool::Small || self.settings.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.settings.max_split_size.unwrap_or(u64::MAX) && remaining > SMALL_SIZE
        }
    }

    /// Rule 5 (`alloc_found_block`): hands out `id` (out of the free index), split when
    /// the rule says so: the request at the low end, the rest back in the index.
    fn alloc_found_block(&mut self, id: BlockId, size: u64, requested: u64) -> BlockId {
        let allocated = if self.should_split(id, size) {
            let rest = self.blocks[id.index()];
            let front = self.new_block(Block {
                addr: rest.addr,
                size,
                prev: rest.prev,
                next: Some(id),
                state: BlockState::Allocated,
                pool: rest.pool,
                requested,
            });
            if let Some(prev) = rest.prev {
                self.blocks[prev.index()].next = Some(front);
            }
            let rest = &mut self.blocks[id.index()];
            rest.prev = Some(front);
            rest.addr += size;
            rest.size -= size;
            self.index_free(id);
            front
        } else {
            id
        };
        let block = &mut self.blocks[allocated.index()];
        block.state = BlockState::Allocated;
        block.requested = requested;
        let (pool, size) = (block.pool, block.size);
        let books = &mut self.pools[pool.index()];
        books.usage.number_allocs += 1;
        books.usage.bytes_in_use += requested;
        books.usage.bytes_padding += size - requested;
        books.stats.allocated(requested, &books.usage);
        allocated
    }

    /// Rule 6 (`try_merge_blocks`): merges `src` into `dst` when both are free or both
    /// unmapped; `dst` must be out of the indexes (its key changes).
    fn try_merge(&mut self, dst: BlockId, src: Option<BlockId>) {
        let Some(src) = src else { return };
        let source = self.blocks[src.index()];
        if source.state == BlockState::Allocated || source.state != self.blocks[dst.index()].state {
            return;
        }
        self.unindex(src);
        if self.blocks[dst.index()].prev == Some(src) {
            let target = &mut self.blocks[dst.index()];
            target.addr = source.addr;
            target.prev = source.prev;
            if let Some(prev) = source.prev {
                self.blocks[prev.index()].next = Some(dst);
            }
        } else {
            self.blocks[dst.index()].next = source.next;
            if let Some(next) = source.next {
                self.blocks[next.index()].prev = Some(dst);
            }
        }
        self.blocks[dst.index()].size += source.size;
        self.recycle(src);
    }

    /// Rule 7 (`release_available_cached_blocks`): with `max_split_size` only, frees
    /// the smallest whole oversize segment that holds the request, else oversize ones
    /// from the largest down until as much is freed. Whether anything was.
    fn release_available_cached_blocks(&mut self, pool: TorchPool, size: u64) -> bool {
        let Some(max_split) = self.settings.max_split_size else {
            return false;
        };
        if self.settings.expandable_segments {
            // Expandable blocks are never released one by one.
            return false;
        }
        let key = size.max(max_split);
        let free = &self.pools[pool.index()].free;
        if let Some((_, &id)) = free.range((key, 0)..).next() {
            self.release_block(id);
            return true;
        }
        let oversize: Vec<BlockId> = free
            .range(..(key, 0))
            .rev()
            .take_while(|((size, _), _)| *size >= max_split)
            .map(|(_, &id)| id)
            .collect();
        let mut released = 0;
        for id in oversize {
            if released >= key {
                break;
            }
            released += self.blocks[id.index()].size;
            self.release_block(id);
        }
        released >= key
    }

    /// Rule 7 (`release_cached_blocks`): returns every free whole segment of both
    /// pools; with expandable segments, unmaps the whole granules of free blocks.
    fn release_cached_blocks(&mut self) {
        for pool in [TorchPool::Large, TorchPool::Small] {
            let free: Vec<BlockId> = self.pools[pool.index()].free.values().copied().collect();
            for id in free {
                if self.settings.expandable_segments {
                    self.unmap_block(id);
                    let block = &self.blocks[id.index()];
                    if block.state == BlockState::Unmapped
                        && block.prev.is_none()
                        && block.next.is_none()
                    {
                        self.release_expandable_segment(id);
                    }
                } else {
                    let block = &self.blocks[id.index()];
                    if block.prev.is_none() && block.next.is_none() {
                        self.release_block(id);
                    }
                }
            }
        }
    }

    /// `release_block`: gives a free whole segment back (a `cudaFree`).
    fn release_block(&mut self, id: BlockId) {
        let block = self.blocks[id.index()];
        debug_assert!(
            block.state == BlockState::Free && block.prev.is_none() && block.next.is_none()
        );
        self.unindex(id);
        self.reserved -= block.size;
        self.storage_frees += 1;
        let books = &mut self.pools[block.pool.index()];
        books.usage.bytes_reserved -= block.size;
        books.stats.page_unmapped();
        self.recycle(id);
    }

    /// `release_expandable_segment`: drops an expandable segment with nothing mapped.
    fn release_expandable_segment(&mut self, id: BlockId) {
        let pool = self.blocks[id.index()].pool;
        self.unindex(id);
        self.pools[pool.index()].stats.page_unmapped();
        self.recycle(id);
    }

    // ------------------------------------------------------- expandable segments

    /// Rule 8 (`try_allocate_expandable_block`): maps room for `size` at the lowest
    /// address that has it, and takes the block out of the free index.
    fn try_allocate_expandable_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, size)?;
        let block = self.blocks[candidate.index()];
        if block.state == BlockState::Unmapped && !self.map_block(candidate, block.size.min(size)) {
            return None;
        }
        // Invariant of the walk: a free block, then an unmapped range, then any.
        while self.blocks[candidate.index()].size < size {
            let remaining = size - self.blocks[candidate.index()].size;
            let next = self.blocks[candidate.index()].next?;
            let next_size = self.blocks[next.index()].size;
            if !self.map_block(next, remaining.min(next_size)) {
                return None;
            }
            candidate = next;
        }
        self.unindex(candidate);
        Some(candidate)
    }

    /// `find_expandable_block`: the lowest unmapped range (with the free block just
    /// before it) that has `size` bytes of free or unmapped room, else a new segment's
    /// range. None when no segment can ever hold `size`.
    fn find_expandable_block(&mut self, pool: TorchPool, size: u64) -> Option<BlockId> {
        let found = self.pools[pool.index()].unmapped.values().find_map(|&id| {
            let start = match self.blocks[id.index()].prev {
                Some(prev) if self.blocks[prev.index()].state == BlockState::Free => prev,
                _ => id,
            };
            self.has_room(start, size).then_some(start)
        });
        if found.is_some() {
            return found;
        }
        let granule = pool.granule();
        let device = self
            .limit
            .unwrap_or(UNLIMITED_DEVICE)
            .min(LARGEST_EXPANDABLE_DEVICE);
        let range = (device + device / 8).div_ceil(granule) * granule;
        if range < size {
            return None;
        }
        let addr = self.take_addresses(range)?;
        let id = self.new_block(Block {
            addr,
            size: range,
            prev: None,
            next: None,
            state: BlockState::Unmapped,
            pool,
            requested: 0,
        });
        self.index_unmapped(id);
        let books = &mut self.pools[pool.index()];
        books.stats.page_mapped(&books.usage);
        Some(id)
    }

    /// Whether the free and unmapped blocks from `start` on add up to `size` bytes.
    fn has_room(&self, start: BlockId, size: u64) -> bool {
        let mut bytes = 0;
        let mut at = Some(start);
        while let Some(id) = at {
            let block = &self.blocks[id.index()];
            if bytes >= size || block.state == BlockState::Allocated {
                break;
            }
            bytes += block.size;
            at = block.next;
        }
        bytes >= size
    }

    /// `map_block`: maps whole granules for the first `size` bytes of the unmapped
    /// range `id`, which becomes a free block merged with free neighbours (in the free
    /// index); the rest of the range stays unmapped. False when the device is full.
    fn map_block(&mut self, id: BlockId, size: u64) -> bool {
        let block = self.blocks[id.index()];
        if block.state != BlockState::Unmapped || size == 0 || size > block.size {
            debug_assert!(false, "map_block on {block:?} for {size}");
            return false;
        }
        let mapped = size.next_multiple_of(block.pool.granule());
        if !self.fits(mapped) {
            return false;
        }
        self.unindex(id);
        if mapped < block.size {
            let rest = self.new_block(Block {
                addr: block.addr + mapped,
                size: block.size - mapped,
                prev: Some(id),
                next: block.next,
                state: BlockState::Unmapped,
                pool: block.pool,
                requested: 0,
            });
            if let Some(next) = block.next {
                self.blocks[next.index()].prev = Some(rest);
            }
            self.blocks[id.index()].next = Some(rest);
            self.index_unmapped(rest);
        }
        let target = &mut self.blocks[id.index()];
        target.size = mapped;
        target.state = BlockState::Free;
        let (prev, next) = (target.prev, target.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_free(id);
        self.mapped(block.pool, mapped);
        true
    }

    /// `unmap_block`: unmaps the whole granules inside the free block `id`; what is
    /// left on either side stays free as blocks of their own.
    fn unmap_block(&mut self, id: BlockId) {
        let block = self.blocks[id.index()];
        let granule = block.pool.granule();
        let end = block.addr + block.size;
        let (first, last) = (
            block.addr.next_multiple_of(granule),
            end / granule * granule,
        );
        if last <= first {
            return;
        }
        self.unindex(id);
        if first > block.addr {
            let before = self.new_block(Block {
                addr: block.addr,
                size: first - block.addr,
                prev: block.prev,
                next: Some(id),
                state: BlockState::Free,
                pool: block.pool,
                requested: 0,
            });
            if let Some(prev) = block.prev {
                self.blocks[prev.index()].next = Some(before);
            }
            self.blocks[id.index()].prev = Some(before);
            self.index_free(before);
        }
        if last < end {
            let after = self.new_block(Block {
                addr: last,
                size: end - last,
                prev: Some(id),
                next: block.next,
                state: BlockState::Free,
                pool: block.pool,
                requested: 0,
            });
            if let Some(next) = block.next {
                self.blocks[next.index()].prev = Some(after);
            }
            self.blocks[id.index()].next = Some(after);
            self.index_free(after);
        }
        let target = &mut self.blocks[id.index()];
        target.addr = first;
        target.size = last - first;
        target.state = BlockState::Unmapped;
        let (prev, next) = (target.prev, target.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.index_unmapped(id);
        self.reserved -= last - first;
        self.storage_frees += 1;
        self.pools[block.pool.index()].usage.bytes_reserved -= last - first;
    }

    // ------------------------------------------------------------------ plumbing

    /// Whether `bytes` more fit on the device.
    fn fits(&self, bytes: u64) -> bool {
        match self.limit {
            None => true,
            Some(limit) => self
                .reserved
                .checked_add(bytes)
                .is_some_and(|sum| sum <= limit),
        }
    }

    /// Counts `bytes` newly mapped in `pool` (a `cudaMalloc` or a map).
    fn mapped(&mut self, pool: TorchPool, bytes: u64) {
        self.reserved += bytes;
        self.storage_allocations += 1;
        let books = &mut self.pools[pool.index()];
        books.usage.bytes_reserved += bytes;
        books.stats.bytes_reserved_peak = books
            .stats
            .bytes_reserved_peak
            .max(books.usage.bytes_reserved);
    }

    /// Addresses for a new segment of `bytes`, aligned to both granules; None when the
    /// address space is spent (then the segment cannot be had).
    fn take_addresses(&mut self, bytes: u64) -> Option<u64> {
        let addr = self.next_addr.checked_next_multiple_of(LARGE_BUFFER)?;
        self.next_addr = addr.checked_add(bytes)?;
        Some(addr)
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        match self.spare.pop() {
            Some(id) => {
                self.blocks[id.index()] = block;
                id
            }
            None => {
                // Each block holds at least 512 B of a range under 2^64, and ranges
                // are never reused, so fewer than 2^55 blocks ever live; the arena of a
                // replay is bounded by its events, far below u32::MAX.
                let id = BlockId(u32::try_from(self.blocks.len()).unwrap_or(u32::MAX));
                self.blocks.push(block);
                id
            }
        }
    }

    fn recycle(&mut self, id: BlockId) {
        self.blocks[id.index()].state = BlockState::Spare;
        self.spare.push(id);
    }

    fn index_free(&mut self, id: BlockId) {
        let block = &self.blocks[id.index()];
        debug_assert_eq!(block.state, BlockState::Free);
        let previous = self.pools[block.pool.index()]
            .free
            .insert((block.size, block.addr), id);
        debug_assert!(previous.is_none());
    }

    fn index_unmapped(&mut self, id: BlockId) {
        let block = &self.blocks[id.index()];
        debug_assert_eq!(block.state, BlockState::Unmapped);
        let previous = self.pools[block.pool.index()]
            .unmapped
            .insert(block.addr, id);
        debug_assert!(previous.is_none());
    }

    /// Takes a free or unmapped block out of its index.
    fn unindex(&mut self, id: BlockId) {
        let block = &self.blocks[id.index()];
        let pool = &mut self.pools[block.pool.index()];
        let removed = match block.state {
            BlockState::Free => pool.free.remove(&(block.size, block.addr)),
            BlockState::Unmapped => pool.unmapped.remove(&block.addr),
            BlockState::Allocated | BlockState::Spare => None,
        };
        debug_assert_eq!(removed, Some(id));
    }

    /// Checks every invariant of the model: segments linked in address order, no two
    /// free (or unmapped) neighbours, the indexes holding exactly the free and
    /// unmapped blocks, unmapped ranges on granules, and the books equal to the blocks.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reserved = [0u64; 2];
        let mut in_use = [0u64; 2];
        let mut padding = [0u64; 2];
        let mut allocs = [0u64; 2];
        let mut counts = [(0usize, 0usize); 2];
        for (index, block) in self.blocks.iter().enumerate() {
            let id = BlockId(index as u32);
            let pool = block.pool.index();
            match block.state {
                BlockState::Spare => continue,
                BlockState::Allocated => {
                    reserved[pool] += block.size;
                    in_use[pool] += block.requested;
                    padding[pool] += block.size - block.requested;
                    allocs[pool] += 1;
                    if block.requested == 0 || block.requested > block.size {
                        return Err(format!(
                            "{id:?}: request {} in {}",
                            block.requested, block.size
                        ));
                    }
                }
                BlockState::Free => {
                    reserved[pool] += block.size;
                    counts[pool].0 += 1;
                    if self.pools[pool].free.get(&(block.size, block.addr)) != Some(&id) {
                        return Err(format!("free {id:?} is not indexed"));
                    }
                }
                BlockState::Unmapped => {
                    counts[pool].1 += 1;
                    let granule = block.pool.granule();
                    if !self.settings.expandable_segments
                        || block.addr % granule != 0
                        || block.size % granule != 0
                    {
                        return Err(format!("unmapped {id:?} off its granules: {block:?}"));
                    }
                    if self.pools[pool].unmapped.get(&block.addr) != Some(&id) {
                        return Err(format!("unmapped {id:?} is not indexed"));
                    }
                }
            }
            if block.size == 0 || block.size % MIN_BLOCK_SIZE != 0 {
                return Err(format!("{id:?} has size {}", block.size));
            }
            if let Some(next) = block.next {
                let after = self.blocks.get(next.index()).ok_or("dangling next")?;
                if after.prev != Some(id) || after.addr != block.addr + block.size {
                    return Err(format!("{id:?} and its next {next:?} disagree"));
                }
                if after.pool != block.pool {
                    return Err(format!("{id:?} and {next:?} are in different pools"));
                }
                if after.state == block.state && block.state != BlockState::Allocated {
                    return Err(format!("{id:?} and {next:?} should have merged"));
                }
            }
            if let Some(prev) = block.prev {
                let before = self.blocks.get(prev.index()).ok_or("dangling prev")?;
                if before.next != Some(id) {
                    return Err(format!("{id:?} and its prev {prev:?} disagree"));
                }
            }
        }
        for pool in TorchPool::ALL {
            let books = &self.pools[pool.index()];
            let i = pool.index();
            if counts[i] != (books.free.len(), books.unmapped.len()) {
                return Err(format!(
                    "{pool:?}: indexes hold blocks that are not free/unmapped"
                ));
            }
            let expected = MemoryUsage {
                number_allocs: allocs[i],
                bytes_in_use: in_use[i],
                bytes_padding: padding[i],
                bytes_reserved: reserved[i],
            };
            if books.usage != expected {
                return Err(format!(
                    "{pool:?}: books {:?} but blocks {expected:?}",
                    books.usage
                ));
            }
        }
        if self.reserved != reserved[0] + reserved[1] {
            return Err(format!(
                "reserved {} but pools hold {:?}",
                self.reserved, reserved
            ));
        }
        if self.limit.is_some_and(|limit| self.reserved > limit) {
            return Err(format!(
                "reserved {} past the limit {:?}",
                self.reserved, self.limit
            ));
        }
        Ok(())
    }
}

/// `roundup_power2_next_division`: `size` rounded up to the next of `divisions` equal
/// steps between the powers of two around it (a power of two stays).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << size.ilog2();
    let step = floor >> divisions.ilog2();
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down + step
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1024;

    fn model(settings: TorchSettings, limit: Option<u64>) -> TorchAllocator {
        TorchAllocator::new(settings, limit)
    }

    /// Serves `size` and checks every invariant; the block's (address, size).
    fn take(m: &mut TorchAllocator, size: u64) -> (BlockId, u64, u64) {
        let id = m.malloc(size).expect("fits").expect("a block");
        m.check_invariants().unwrap();
        let (addr, size) = m.block(id).unwrap();
        (id, addr, size)
    }

    fn give(m: &mut TorchAllocator, id: BlockId) {
        m.free(id).unwrap();
        m.check_invariants().unwrap();
    }

    fn free_blocks(m: &TorchAllocator, pool: TorchPool) -> Vec<(u64, u64)> {
        m.pools[pool.index()].free.keys().copied().collect()
    }

    #[test]
    fn requests_round_up_to_512_bytes() {
        // 1 B -> 512 B, 513 B -> 1 KiB, 512 B -> 512 B, packed from the start of one
        // 2 MiB small segment: at 0, 512 and 1536 past its start.
        let mut m = model(TorchSettings::default(), None);
        let (_, a, a_size) = take(&mut m, 1);
        let (_, b, b_size) = take(&mut m, 513);
        let (_, c, c_size) = take(&mut m, 512);
        assert_eq!((a_size, b_size, c_size), (512, 1024, 512));
        assert_eq!((b - a, c - a), (512, 1536));
        assert_eq!(m.bytes_reserved(), SMALL_BUFFER);
        assert_eq!(m.storage_allocations(), 1);
        assert_eq!(m.pool_usage(TorchPool::Small).bytes_padding, 511 + 511);
    }

    #[test]
    fn small_and_large_pools_never_lend_each_other_blocks() {
        // 1 MiB is small (2 MiB segment), 1 MiB + 1 B is large (a 20 MiB segment).
        let mut m = model(TorchSettings::default(), None);
        let (_, _, _) = take(&mut m, MIB);
        let (large, _, _) = take(&mut m, MIB + 1);
        assert_eq!(m.pool_usage(TorchPool::Small).bytes_reserved, 2 * MIB);
        assert_eq!(m.pool_usage(TorchPool::Large).bytes_reserved, 20 * MIB);
        // The small segment is full after a second 1 MiB; with the whole 20 MiB of the
        // large pool free, a third 1 MiB still needs a new small segment: 24 MiB.
        take(&mut m, MIB);
        give(&mut m, large);
        take(&mut m, MIB);
        assert_eq!(m.pool_usage(TorchPool::Small).bytes_reserved, 4 * MIB);
        assert_eq!(m.bytes_reserved(), 24 * MIB);
        assert_eq!(m.pool_stats(TorchPool::Small).pages, 2);
    }

    #[test]
    fn a_miss_allocates_2_mib_20_mib_or_the_request_rounded_to_2_mib() {
        // 10 MiB gets a 10 MiB segment; 11 MiB + 1 B (rounded to 11 MiB + 512 B) a
        // 12 MiB one, handed out whole (1 MiB - 512 B left is not more than 1 MiB);
        // 5 MiB finds no free block and gets 20 MiB: 42 MiB in 3 segments.
        let mut m = model(TorchSettings::default(), None);
        let (_, _, ten) = take(&mut m, 10 * MIB);
        let (_, _, eleven) = take(&mut m, 11 * MIB + 1);
        let (_, _, five) = take(&mut m, 5 * MIB);
        assert_eq!((ten, eleven, five), (10 * MIB, 12 * MIB, 5 * MIB));
        assert_eq!(m.bytes_reserved(), 42 * MIB);
        assert_eq!(m.storage_allocations(), 3);
        // The 20 MiB segment keeps its 15 MiB rest free.
        assert_eq!(free_blocks(&m, TorchPool::Large).len(), 1);
        assert_eq!(free_blocks(&m, TorchPool::Large)[0].0, 15 * MIB);
    }

    #[test]
    fn best_fit_takes_the_smallest_block_then_the_lowest_address() {
        // Three segments of 12, 14 and 12 MiB (at rising addresses), all freed. Three
        // 11 MiB requests take the first 12 MiB one, then the second (equal size, higher
        // address), both whole (1 MiB left); then the 14 MiB one, split (3 MiB left).
        let mut m = model(TorchSettings::default(), None);
        let (a, a_addr, _) = take(&mut m, 12 * MIB);
        let (b, b_addr, _) = take(&mut m, 14 * MIB);
        let (c, c_addr, _) = take(&mut m, 12 * MIB);
        assert!(a_addr < b_addr && b_addr < c_addr);
        for id in [a, b, c] {
            give(&mut m, id);
        }
        let first = take(&mut m, 11 * MIB);
        let second = take(&mut m, 11 * MIB);
        let third = take(&mut m, 11 * MIB);
        assert_eq!((first.1, first.2), (a_addr, 12 * MIB));
        assert_eq!((second.1, second.2), (c_addr, 12 * MIB));
        assert_eq!((third.1, third.2), (b_addr, 11 * MIB));
        assert_eq!(
            free_blocks(&m, TorchPool::Large),
            vec![(3 * MIB, b_addr + 11 * MIB)]
        );
        assert_eq!(m.bytes_reserved(), 38 * MIB);
    }

    #[test]
    fn the_large_pool_splits_past_1_mib_and_the_small_pool_from_512_bytes() {
        // 19 MiB of a 20 MiB segment leaves 1 MiB: not split, the block is 20 MiB.
        let mut m = model(TorchSettings::default(), None);
        let (a, _, size) = take(&mut m, 19 * MIB);
        assert_eq!(size, 20 * MIB);
        give(&mut m, a);
        // 18 MiB leaves 2 MiB: split.
        let (_, addr, size) = take(&mut m, 18 * MIB);
        assert_eq!(size, 18 * MIB);
        assert_eq!(
            free_blocks(&m, TorchPool::Large),
            vec![(2 * MIB, addr + 18 * MIB)]
        );
        // Small pool: 1 MiB, then 1 MiB - 512 B leaves exactly 512 B: split, and a
        // 512 B request takes that rest without a new segment.
        take(&mut m, MIB);
        let (_, _, size) = take(&mut m, MIB - 512);
        assert_eq!(size, MIB - 512);
        take(&mut m, 512);
        assert_eq!(m.pool_usage(TorchPool::Small).bytes_reserved, 2 * MIB);
        assert!(free_blocks(&m, TorchPool::Small).is_empty());
    }

    #[test]
    fn frees_merge_with_free_neighbours_of_their_segment() {
        // Three 512 KiB blocks and a 512 KiB rest in one small segment. Freeing the
        // first and third gives two free blocks (the third merged with the rest); the
        // second then joins both into the whole 2 MiB segment.
        let mut m = model(TorchSettings::default(), None);
        let (a, base, _) = take(&mut m, 512 * KIB);
        let (b, _, _) = take(&mut m, 512 * KIB);
        let (c, _, _) = take(&mut m, 512 * KIB);
        give(&mut m, a);
        give(&mut m, c);
        assert_eq!(
            free_blocks(&m, TorchPool::Small),
            vec![(512 * KIB, base), (MIB, base + MIB)]
        );
        give(&mut m, b);
        assert_eq!(free_blocks(&m, TorchPool::Small), vec![(2 * MIB, base)]);
        // Segments are kept: nothing went back to the device.
        assert_eq!((m.bytes_reserved(), m.storage_frees()), (2 * MIB, 0));
    }

    #[test]
    fn under_a_limit_cached_segments_are_freed_and_the_request_retried() {
        // Device of 40 MiB. A 12 MiB segment is cached after its free; 30 MiB does not
        // fit beside it (42 MiB), so the cached segment goes back and 30 MiB is retried.
        let mut m = model(TorchSettings::default(), Some(40 * MIB));
        let (a, _, _) = take(&mut m, 12 * MIB);
        give(&mut m, a);
        take(&mut m, 30 * MIB);
        assert_eq!((m.bytes_reserved(), m.storage_frees()), (30 * MIB, 1));
        // Nothing is cached now: 12 MiB more fails, and the state is unchanged.
        let error = m.malloc(12 * MIB).unwrap_err();
        assert_eq!((error.requested, error.reserved), (12 * MIB, 30 * MIB));
        m.check_invariants().unwrap();
        // A segment that is partly in use is not freed: 5 MiB of a 20 MiB segment...
        let mut m = model(TorchSettings::default(), Some(40 * MIB));
        take(&mut m, 5 * MIB);
        // ... leaves 15 MiB free in it, and 30 MiB cannot have them (20 + 30 > 40).
        assert!(m.malloc(30 * MIB).is_err());
        assert_eq!((m.bytes_reserved(), m.storage_frees()), (20 * MIB, 0));
    }

    #[test]
    fn expandable_segments_map_granules_at_the_top_of_one_range() {
        // 5 MiB maps one 20 MiB granule and splits it (5 MiB taken, 15 MiB free).
        // 30 MiB does not fit the 15 MiB: a second granule is mapped at the top, joins
        // the free 15 MiB (35 MiB), and 30 MiB is cut from it: 40 MiB mapped, where
        // separate segments would hold 20 + 30 = 50 MiB.
        let mut m = model(TorchSettings::expandable(), None);
        let (_, base, _) = take(&mut m, 5 * MIB);
        let (_, addr, size) = take(&mut m, 30 * MIB);
        assert_eq!((addr - base, size), (5 * MIB, 30 * MIB));
        assert_eq!(m.bytes_reserved(), 40 * MIB);
        assert_eq!(m.storage_allocations(), 2);
        assert_eq!(m.pool_stats(TorchPool::Large).pages, 1);
        let mut plain = model(TorchSettings::default(), None);
        take(&mut plain, 5 * MIB);
        take(&mut plain, 30 * MIB);
        assert_eq!(plain.bytes_reserved(), 50 * MIB);
        // The small pool maps 2 MiB granules: three 1 MiB requests map 4 MiB, one range.
        for _ in 0..3 {
            take(&mut m, MIB);
        }
        assert_eq!(m.pool_usage(TorchPool::Small).bytes_reserved, 4 * MIB);
        assert_eq!(m.pool_stats(TorchPool::Small).pages, 1);
    }

    #[test]
    fn expandable_segments_split_whenever_512_bytes_are_left() {
        // 19 MiB of a 20 MiB granule leaves 1 MiB: split (the plain large pool would
        // hand out all 20 MiB).
        let mut m = model(TorchSettings::expandable(), None);
        let (_, _, size) = take(&mut m, 19 * MIB);
        assert_eq!(size, 19 * MIB);
        assert_eq!(free_blocks(&m, TorchPool::Large)[0].0, MIB);
    }

    #[test]
    fn expandable_best_fit_passes_over_the_block_that_can_grow() {
        // One 20 MiB granule cut into 6, 2, 6 and 2 MiB, leaving 4 MiB free at the top.
        // With the first 6 MiB freed, a 4 MiB request fits the top block (4 MiB, the
        // smaller) and the freed one (6 MiB); the top can grow into the unmapped range,
        // so it counts as larger and the freed block at the bottom is taken.
        let mut m = model(TorchSettings::expandable(), None);
        let (a, base, _) = take(&mut m, 6 * MIB);
        take(&mut m, 2 * MIB);
        take(&mut m, 6 * MIB);
        take(&mut m, 2 * MIB);
        give(&mut m, a);
        let (_, addr, _) = take(&mut m, 4 * MIB);
        assert_eq!(addr, base);
        // Plain segments take the smaller block.
        let mut plain = model(TorchSettings::default(), None);
        let (a, _, _) = take(&mut plain, 6 * MIB);
        take(&mut plain, 2 * MIB);
        take(&mut plain, 6 * MIB);
        let (_, top, _) = take(&mut plain, 2 * MIB);
        give(&mut plain, a);
        let (_, addr, _) = take(&mut plain, 4 * MIB);
        assert_eq!(addr, top + 2 * MIB);
    }

    #[test]
    fn expandable_segments_unmap_free_granules_at_the_limit() {
        // Device of 60 MiB: the large range is 60 + 7.5 MiB rounded up to granules,
        // 80 MiB. 30 MiB maps [0, 40) and leaves [30, 40) free; 15 MiB maps [40, 60),
        // taking [30, 45). Freeing the 30 MiB leaves [0, 30) and [45, 60) free.
        let limit = 60 * MIB;
        let mut m = model(TorchSettings::expandable(), Some(limit));
        let (a, base, _) = take(&mut m, 30 * MIB);
        let (_, b, _) = take(&mut m, 15 * MIB);
        assert_eq!(b - base, 30 * MIB);
        give(&mut m, a);
        assert_eq!((m.bytes_reserved(), m.storage_allocations()), (limit, 2));
        // 35 MiB fits no free block, and mapping [60, 80) would pass the limit; so the
        // free granule [0, 20) is unmapped (the rest of each free block stays mapped),
        // and the retry maps [60, 80) to join [45, 60): 35 MiB at 45.
        let (_, addr, size) = take(&mut m, 35 * MIB);
        assert_eq!((addr - base, size), (45 * MIB, 35 * MIB));
        assert_eq!(m.bytes_reserved(), limit);
        assert_eq!((m.storage_allocations(), m.storage_frees()), (3, 1));
        assert_eq!(
            free_blocks(&m, TorchPool::Large),
            vec![(10 * MIB, base + 20 * MIB)]
        );
        let unmapped: Vec<u64> = m.pools[1].unmapped.keys().copied().collect();
        assert_eq!(unmapped, vec![base]);
    }

    #[test]
    fn an_unused_expandable_range_is_released_at_the_limit() {
        // A small range maps 2 MiB for 1 MiB; freed, its whole range is free. At the
        // limit (20 MiB device) a 19 MiB request unmaps it, and the range, with nothing
        // mapped, is dropped: one small segment before, none after.
        let mut m = model(TorchSettings::expandable(), Some(20 * MIB));
        let (a, _, _) = take(&mut m, MIB);
        give(&mut m, a);
        assert_eq!(m.pool_stats(TorchPool::Small).pages, 1);
        take(&mut m, 19 * MIB);
        assert_eq!(m.pool_stats(TorchPool::Small).pages, 0);
        assert_eq!(m.pool_stats(TorchPool::Small).pages_unmapped, 1);
        assert_eq!(m.bytes_reserved(), 20 * MIB);
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_whole() {
        // max_split_size_mb=32. A freed 40 MiB segment is not given to an 8 MiB request
        // (under the limit), which gets a 20 MiB segment; a 33 MiB request takes it
        // whole (less than 33 + 20 MiB).
        let settings = TorchSettings::parse("torch(max_split_size_mb=32)").unwrap();
        let mut m = model(settings, None);
        let (a, a_addr, _) = take(&mut m, 40 * MIB);
        give(&mut m, a);
        take(&mut m, 8 * MIB);
        assert_eq!(m.bytes_reserved(), 60 * MIB);
        let (_, addr, size) = take(&mut m, 33 * MIB);
        assert_eq!((addr, size), (a_addr, 40 * MIB));
        assert_eq!(m.bytes_reserved(), 60 * MIB);
        // A 54 MiB request may not take a 40 MiB block, but a freed 80 MiB one is too
        // large for it (54 + 20 MiB or more): a new 54 MiB segment.
        let (big, big_addr, _) = take(&mut m, 80 * MIB);
        give(&mut m, big);
        let (_, addr, _) = take(&mut m, 54 * MIB);
        assert_ne!(addr, big_addr);
        assert_eq!(m.bytes_reserved(), (60 + 80 + 54) * MIB);
    }

    #[test]
    fn max_split_size_frees_one_oversize_segment_before_all() {
        // Device of 70 MiB, max_split_size_mb=32: the cached 40 MiB segment cannot
        // serve 30 MiB (under the limit), and 20 + 40 + 30 MiB is too much; the smallest
        // cached oversize segment of at least 32 MiB (the 40 MiB one) is freed and 30 MiB
        // retried: 20 + 30 = 50 MiB.
        let settings = TorchSettings::parse("torch(max_split_size_mb=32)").unwrap();
        let mut m = model(settings, Some(70 * MIB));
        let (a, _, _) = take(&mut m, 40 * MIB);
        give(&mut m, a);
        take(&mut m, 8 * MIB);
        take(&mut m, 30 * MIB);
        assert_eq!((m.bytes_reserved(), m.storage_frees()), (50 * MIB, 1));
    }

    #[test]
    fn roundup_power2_divisions_rounds_to_steps_between_powers_of_two() {
        // PyTorch's own example: 1200 B in 4 divisions of [1024, 2048) is 1280 B.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(4096, 4), 4096);
        // Through the model: 3000 B (more than 512 B * 4) -> 3072 B; 5 MiB + 1 B ->
        // 6 MiB (steps of 1 MiB in [4, 8) MiB); 1200 B is under 512 B * 4, so 1536 B.
        let settings = TorchSettings::parse("torch(roundup_power2_divisions=4)").unwrap();
        let mut m = model(settings, None);
        assert_eq!(take(&mut m, 3000).2, 3072);
        assert_eq!(take(&mut m, 5 * MIB + 1).2, 6 * MIB);
        assert_eq!(take(&mut m, 1200).2, 1536);
    }

    #[test]
    fn the_largest_divisions_and_limits_do_not_overflow() {
        // roundup_power2_divisions = 2^63 passes the setter (a power of two): 512 B
        // times it overflowed. Every size is under that bound: plain 512 B rounding.
        let settings =
            TorchSettings::parse("torch(roundup_power2_divisions=9223372036854775808)").unwrap();
        let mut m = model(settings, None);
        assert_eq!(take(&mut m, 3000).2, 3072);
        // A limit near u64::MAX overflowed the expandable range's size (an eighth more
        // than the device).
        let mut m = model(TorchSettings::expandable(), Some(u64::MAX));
        let (_, _, size) = take(&mut m, 3000);
        assert!(size >= 3000);
        let (_, _, size) = take(&mut m, 30 * MIB);
        assert!(size >= 30 * MIB);
    }

    #[test]
    fn zero_byte_requests_take_no_block() {
        let mut m = model(TorchSettings::default(), None);
        assert_eq!(m.malloc(0), Ok(None));
        assert_eq!(m.bytes_reserved(), 0);
        assert!(m.malloc(MAX_REQUEST + 1).is_err());
    }

    #[test]
    fn freeing_what_is_not_allocated_is_an_error() {
        let mut m = model(TorchSettings::default(), None);
        let (a, _, _) = take(&mut m, 4096);
        give(&mut m, a);
        assert_eq!(m.free(a), Err(NotAllocated(a)));
        assert_eq!(m.free(BlockId(999)), Err(NotAllocated(BlockId(999))));
        assert_eq!(m.block(a), Err(NotAllocated(a)));
    }

    #[test]
    fn settings_read_pytorch_spelling_and_print_back() {
        let parse = |text: &str| TorchSettings::parse(text);
        assert_eq!(parse("torch"), Ok(TorchSettings::default()));
        assert_eq!(parse(" Torch-Expandable "), Ok(TorchSettings::expandable()));
        assert_eq!(
            parse("torch(expandable_segments:True)"),
            Ok(TorchSettings::expandable())
        );
        let full =
            parse("torch_expandable(max_split_size_mb=128, roundup_power2_divisions:8)").unwrap();
        assert_eq!(full.max_split_size, Some(128 * MIB));
        assert_eq!(full.roundup_power2_divisions, Some(8));
        assert_eq!(
            full.to_string(),
            "torch_expandable(max_split_size_mb=128, roundup_power2_divisions=8)"
        );
        assert_eq!(parse(&full.to_string()), Ok(full));
        assert!(matches!(
            parse("tensorflow"),
            Err(TorchSettingsError::UnknownModel { .. })
        ));
        assert!(matches!(
            parse("torch(foo=1)"),
            Err(TorchSettingsError::UnknownOption { .. })
        ));
        assert!(matches!(
            parse("torch(max_split_size_mb=20)"),
            Err(TorchSettingsError::MaxSplitSizeTooSmall { mb: 20 })
        ));
        assert!(matches!(
            parse("torch(roundup_power2_divisions=3)"),
            Err(TorchSettingsError::DivisionsNotPowerOfTwo { divisions: 3 })
        ));
        assert!(matches!(
            parse("torch(max_split_size_mb=x)"),
            Err(TorchSettingsError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse("torch(expandable_segments=yes)"),
            Err(TorchSettingsError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse("torch(max_split_size_mb=64"),
            Err(TorchSettingsError::Syntax { .. })
        ));
        assert!(matches!(
            parse("torch(64)"),
            Err(TorchSettingsError::Syntax { .. })
        ));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Malloc(u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..2 * MIB).prop_map(Op::Malloc),
            2 => (1u64..64 * MIB).prop_map(Op::Malloc),
            4 => any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random requests and frees under random settings and limits: after every
        /// step the invariants hold, live blocks hold their requests and never overlap,
        /// and after freeing everything nothing is in use.
        #[test]
        fn random_requests_keep_every_invariant(
            expandable in any::<bool>(),
            max_split in prop::option::of(21u64..80),
            divisions in prop::option::of(prop::sample::select(vec![1u64, 2, 4, 8])),
            limit in prop::option::of(40u64..400),
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let settings = TorchSettings { expandable_segments: expandable, ..TorchSettings::default() }
                .with_max_split_size_mb(max_split).unwrap()
                .with_roundup_power2_divisions(divisions).unwrap();
            let mut m = TorchAllocator::new(settings, limit.map(|l| l * MIB));
            let mut live: Vec<(BlockId, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Malloc(size) => {
                        if let Ok(Some(id)) = m.malloc(size) {
                            let (_, block) = m.block(id).unwrap();
                            prop_assert!(block >= size);
                            live.push((id, size));
                        }
                    }
                    Op::Free(index) if !live.is_empty() => {
                        let (id, _) = live.swap_remove(index % live.len());
                        m.free(id).unwrap();
                    }
                    Op::Free(_) => {}
                }
                m.check_invariants().map_err(TestCaseError::fail)?;
                let mut ranges: Vec<(u64, u64)> = live.iter().map(|&(id, _)| m.block(id).unwrap()).collect();
                ranges.sort_unstable();
                for pair in ranges.windows(2) {
                    prop_assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap {:?}", pair);
                }
            }
            for (id, _) in live.drain(..) {
                m.free(id).unwrap();
            }
            m.check_invariants().map_err(TestCaseError::fail)?;
            for pool in TorchPool::ALL {
                prop_assert_eq!(m.pool_usage(pool).number_allocs, 0);
                prop_assert_eq!(m.pool_usage(pool).bytes_in_use, 0);
            }
        }
    }
}
