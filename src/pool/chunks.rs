//! Which granules of the virtual pool's address ranges hold memory: runs of granules
//! mapped together (chunks), how many live blocks touch each, and the idle ones
//! (mapped, touched by none) oldest first, so the release policy unmaps the coldest.
//!
//! A chunk is what one [`VirtualMemory::map`] mapped and one
//! [`VirtualMemory::unmap`] gives back (CUDA unmaps whole mappings only). A block
//! placed over unmapped granules maps each run of them that it needs as one chunk;
//! a chunk stays mapped while any live block touches one of its granules, and is
//! idle, ready to be reused or unmapped, when none does.

use super::bins::{index_at, Link, SegmentIndex};
use super::{ensure, Slab};
use crate::storage::{MappingError, StorageId, VirtualMemory};

/// The number of address ranges (arenas) the chunks are kept for.
pub(crate) const ARENAS: usize = 2;

/// One mapped run of granules.
#[derive(Debug, Clone)]
struct Chunk {
    /// The arena whose range holds it.
    arena: usize,
    /// Its first granule.
    start: u64,
    /// Its number of granules.
    granules: u64,
    /// The live blocks that touch it.
    live: u32,
    /// Whether it is on the idle list (exactly when `live` is 0).
    idle: bool,
    /// On the idle list: the chunk idle before it (older).
    idle_prev: Link,
    /// On the idle list: the chunk idle after it (newer).
    idle_next: Link,
}

/// What a call changed in the mapping, for the pool's books.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    /// Chunks mapped.
    pub(crate) maps: u64,
    /// Chunks unmapped.
    pub(crate) unmaps: u64,
}

/// The mapped chunks of every arena of one pool.
#[derive(Debug, Clone)]
pub(crate) struct Chunks {
    /// The bytes of a granule: a power of two, `1 << shift`.
    granule: u64,
    shift: u32,
    /// For each arena, the chunk holding each granule, `Link::NONE` where unmapped; as
    /// long as the highest granule ever mapped. Invariant: an entry names a live
    /// chunk of that arena spanning the granule, and every granule of a chunk names
    /// it.
    table: [Vec<Link>; ARENAS],
    chunks: Slab<Chunk>,
    /// The chunk idle longest.
    idle_head: Link,
    /// The chunk idle last.
    idle_tail: Link,
    /// Invariant: the bytes of the idle chunks.
    idle_bytes: u64,
    /// Invariant: the bytes of every chunk.
    mapped_bytes: u64,
}

impl Chunks {
    /// No chunk yet, for granules of `granule` bytes.
    pub(crate) fn new(granule: u64) -> Self {
        debug_assert!(granule.is_power_of_two());
        Self {
            granule,
            shift: granule.trailing_zeros(),
            table: Default::default(),
            chunks: Slab::default(),
            idle_head: Link::NONE,
            idle_tail: Link::NONE,
            idle_bytes: 0,
            mapped_bytes: 0,
        }
    }

    /// The bytes of every chunk.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes
    }

    /// The bytes of the idle chunks.
    pub(crate) fn idle_bytes(&self) -> u64 {
        self.idle_bytes
    }

    /// The number of chunks of `arena`.
    pub(crate) fn count_in(&self, arena: usize) -> usize {
        self.chunks
            .iter()
            .filter(|(_, chunk)| chunk.arena == arena)
            .count()
    }

    /// The granules `[first, end)` that `extent` bytes at `offset` touch.
    /// Blocks lie in a range of address space, so `offset + extent + granule` is far
    /// below `u64::MAX` and the sums need no overflow check.
    #[inline]
    fn span(&self, offset: u64, extent: u64) -> (u64, u64) {
        let mask = self.granule - 1;
        debug_assert!(offset
            .checked_add(extent)
            .and_then(|end| end.checked_add(mask))
            .is_some());
        let end = offset.wrapping_add(extent).wrapping_add(mask);
        (offset >> self.shift, end >> self.shift)
    }

    /// The chunk holding granule `g` of `arena` ([`Link::NONE`] where unmapped).
    #[inline]
    fn at(&self, arena: usize, g: u64) -> Link {
        self.table[arena]
            .get(g as usize)
            .copied()
            .unwrap_or(Link::NONE)
    }

    #[inline]
    fn chunk(&self, index: SegmentIndex) -> &Chunk {
        self.chunks
            .linked(Link::to(index))
            .expect("the table names live chunks")
    }

    #[inline]
    fn chunk_mut(&mut self, index: SegmentIndex) -> &mut Chunk {
        self.chunks
            .linked_mut(Link::to(index))
            .expect("the table names live chunks")
    }

    /// Counts a block of `extent` bytes at `offset` of `arena` as live in each
    /// mapped chunk it touches (taking idle ones off the idle list), and returns the
    /// bytes of the granules it touches that are unmapped: what
    /// [`Chunks::map_missing`] will map.
    #[inline(always)]
    pub(crate) fn claim(&mut self, arena: usize, offset: u64, extent: u64) -> u64 {
        let (first, end) = self.span(offset, extent);
        // The common case: one chunk, live already, spans the block.
        if let Some(chunk) = self.chunks.linked_mut(self.at(arena, first)) {
            if chunk.live > 0 && chunk.start + chunk.granules >= end {
                chunk.live += 1;
                return 0;
            }
        }
        self.claim_each(arena, first, end)
    }

    /// [`Chunks::claim`] of granules `[first, end)`, chunk by chunk.
    #[inline(never)]
    fn claim_each(&mut self, arena: usize, first: u64, end: u64) -> u64 {
        let (mut g, mut missing) = (first, 0u64);
        while g < end {
            let Some(index) = self.at(arena, g).get() else {
                missing += self.granule;
                g += 1;
                continue;
            };
            let chunk = self.chunk_mut(index);
            chunk.live += 1;
            g = chunk.start + chunk.granules;
            if chunk.idle {
                self.unlink_idle(index);
            }
        }
        missing
    }

    /// Maps each run of unmapped granules that `extent` bytes at `offset` of `arena`
    /// (range `range`) touch as one chunk, live for the block. On a failed map,
    /// unmaps what this call mapped and changes nothing more.
    pub(crate) fn map_missing(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> Result<Calls, MappingError> {
        let (first, end) = self.span(offset, extent);
        let mut g = first;
        while g < end {
            if let Some(index) = self.at(arena, g).get() {
                let chunk = self.chunk(index);
                g = chunk.start + chunk.granules;
                continue;
            }
            let mut stop = g + 1;
            while stop < end && self.at(arena, stop).is_none() {
                stop += 1;
            }
            if let Err(error) = self.map(memory, arena, range, g, stop - g) {
                self.settle_new(first, end, arena, |chunks, index| {
                    chunks.unmap(memory, range, index);
                });
                return Err(error);
            }
            g = stop;
        }
        let maps = self.settle_new(first, end, arena, |chunks, index| {
            chunks.chunk_mut(index).live = 1;
        });
        Ok(Calls { maps, unmaps: 0 })
    }

    /// Calls `settle` on each chunk of granules `[first, end)` of `arena` that
    /// `map_missing` made (live in no block and not idle: the chunks the block
    /// claimed are live), and returns how many there were.
    fn settle_new(
        &mut self,
        first: u64,
        end: u64,
        arena: usize,
        mut settle: impl FnMut(&mut Self, SegmentIndex),
    ) -> u64 {
        let (mut g, mut count) = (first, 0);
        while g < end {
            let Some(index) = self.at(arena, g).get() else {
                g += 1;
                continue;
            };
            let chunk = self.chunk(index);
            let (new, next) = (chunk.live == 0 && !chunk.idle, chunk.start + chunk.granules);
            if new {
                settle(self, index);
                count += 1;
            }
            g = next;
        }
        count
    }

    /// Counts a block of `extent` bytes at `offset` of `arena` as gone from each
    /// chunk it touches; chunks that no live block touches any more become idle
    /// (newest last).
    /// Unmapped granules are skipped (a block whose map failed holds none).
    #[inline(always)]
    pub(crate) fn uncover(&mut self, arena: usize, offset: u64, extent: u64) {
        let (first, end) = self.span(offset, extent);
        // The common case: one chunk spans the block and stays live.
        if let Some(chunk) = self.chunks.linked_mut(self.at(arena, first)) {
            if chunk.live > 1 && chunk.start + chunk.granules >= end {
                chunk.live -= 1;
                return;
            }
        }
        self.uncover_each(arena, first, end);
    }

    /// [`Chunks::uncover`] of granules `[first, end)`, chunk by chunk.
    #[inline(never)]
    fn uncover_each(&mut self, arena: usize, first: u64, end: u64) {
        let mut g = first;
        while g < end {
            let Some(index) = self.at(arena, g).get() else {
                g += 1;
                continue;
            };
            let chunk = self.chunk_mut(index);
            chunk.live -= 1;
            g = chunk.start + chunk.granules;
            if chunk.live == 0 {
                self.link_idle(index);
            }
        }
    }

    /// Unmaps idle chunks, longest idle first, until at most `keep` idle bytes are
    /// left. `ranges` names each arena's range.
    pub(crate) fn trim(
        &mut self,
        memory: &mut dyn VirtualMemory,
        ranges: [Option<StorageId>; ARENAS],
        keep: u64,
    ) -> Calls {
        let mut calls = Calls::default();
        while self.idle_bytes > keep {
            let Some(index) = self.idle_head.get() else {
                break;
            };
            let Some(range) = ranges[self.chunk(index).arena] else {
                break;
            };
            if !self.unmap(memory, range, index) {
                break;
            }
            calls.unmaps += 1;
        }
        calls
    }

    /// Maps `granules` granules of `arena` from `start` as a new chunk (not live,
    /// not idle).
    fn map(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        start: u64,
        granules: u64,
    ) -> Result<SegmentIndex, MappingError> {
        let bytes = granules * self.granule;
        memory.map(range, start * self.granule, bytes)?;
        let index = index_at(
            self.chunks
                .insert(Chunk {
                    arena,
                    start,
                    granules,
                    live: 0,
                    idle: false,
                    idle_prev: Link::NONE,
                    idle_next: Link::NONE,
                })
                .index,
        );
        let table = &mut self.table[arena];
        let end = (start + granules) as usize;
        if table.len() < end {
            table.resize(end, Link::NONE);
        }
        table[start as usize..end].fill(Link::to(index));
        self.mapped_bytes += bytes;
        Ok(index)
    }

    /// Unmaps chunk `index` (taking it off the idle list); false, changing nothing,
    /// when the storage refuses.
    fn unmap(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageId,
        index: SegmentIndex,
    ) -> bool {
        let chunk = self.chunk(index);
        let (arena, start, granules, idle) = (chunk.arena, chunk.start, chunk.granules, chunk.idle);
        let bytes = granules * self.granule;
        if memory.unmap(range, start * self.granule, bytes).is_err() {
            return false;
        }
        if idle {
            self.unlink_idle(index);
        }
        self.table[arena][start as usize..(start + granules) as usize].fill(Link::NONE);
        self.chunks.discard_at(index.get());
        self.mapped_bytes -= bytes;
        true
    }

    /// Puts chunk `index` last on the idle list.
    fn link_idle(&mut self, index: SegmentIndex) {
        let tail = self.idle_tail;
        let bytes = self.chunk(index).granules * self.granule;
        let chunk = self.chunk_mut(index);
        chunk.idle = true;
        chunk.idle_prev = tail;
        chunk.idle_next = Link::NONE;
        match self.chunks.linked_mut(tail) {
            Some(tail) => tail.idle_next = Link::to(index),
            None => self.idle_head = Link::to(index),
        }
        self.idle_tail = Link::to(index);
        self.idle_bytes += bytes;
    }

    /// Takes chunk `index` off the idle list.
    fn unlink_idle(&mut self, index: SegmentIndex) {
        let chunk = self.chunk_mut(index);
        chunk.idle = false;
        let (before, after) = (chunk.idle_prev, chunk.idle_next);
        let bytes = chunk.granules * self.granule;
        match self.chunks.linked_mut(before) {
            Some(before) => before.idle_next = after,
            None => self.idle_head = after,
        }
        match self.chunks.linked_mut(after) {
            Some(after) => after.idle_prev = before,
            None => self.idle_tail = before,
        }
        self.idle_bytes -= bytes;
    }

    /// Checks the chunks against the live blocks of each arena (`blocks[a]`: offset
    /// and extent of each): every granule a live block touches is mapped, each
    /// chunk's live count is the number of live blocks touching it, the table and
    /// the chunks agree, the idle list holds exactly the chunks no block touches, and
    /// the byte counts are exact.
    pub(crate) fn check(&self, blocks: [&[(u64, u64)]; ARENAS]) -> Result<(), String> {
        let mut touches = vec![0u32; self.chunks.capacity()];
        for (arena, blocks) in blocks.iter().enumerate() {
            for &(offset, extent) in *blocks {
                let (first, end) = self.span(offset, extent);
                let mut last = None;
                for g in first..end {
                    let index = self.at(arena, g).get().ok_or_else(|| {
                        format!("granule {g} of arena {arena} holds live bytes but is unmapped")
                    })?;
                    if Some(index) != last {
                        touches[index.get() as usize] += 1;
                        last = Some(index);
                    }
                }
            }
        }
        let (mut mapped, mut idle) = (0u64, 0u64);
        for (id, chunk) in self.chunks.iter() {
            let bytes = chunk.granules * self.granule;
            mapped += bytes;
            ensure(chunk.granules > 0, || "empty chunk".into())?;
            for g in chunk.start..chunk.start + chunk.granules {
                ensure(
                    self.at(chunk.arena, g).get().map(|index| index.get()) == Some(id.index),
                    || format!("granule {g} of a chunk is not mapped to it"),
                )?;
            }
            ensure(chunk.live == touches[id.index as usize], || {
                format!(
                    "chunk at granule {} counts {} live blocks, {} touch it",
                    chunk.start, chunk.live, touches[id.index as usize]
                )
            })?;
            ensure(chunk.idle == (chunk.live == 0), || {
                format!("chunk at granule {} is idle wrongly", chunk.start)
            })?;
            if chunk.idle {
                idle += bytes;
            }
        }
        for (arena, table) in self.table.iter().enumerate() {
            for (g, &index) in table.iter().enumerate() {
                if index.is_some() {
                    let chunk = self
                        .chunks
                        .linked(index)
                        .ok_or_else(|| format!("granule {g} names a dead chunk"))?;
                    ensure(
                        chunk.arena == arena
                            && chunk.start <= g as u64
                            && (g as u64) < chunk.start + chunk.granules,
                        || format!("granule {g} of arena {arena} names a chunk not over it"),
                    )?;
                }
            }
        }
        let (mut cursor, mut before, mut listed) = (self.idle_head, Link::NONE, 0u64);
        while cursor.is_some() {
            let chunk = self
                .chunks
                .linked(cursor)
                .ok_or("the idle list names a dead chunk")?;
            ensure(chunk.idle && chunk.idle_prev == before, || {
                "broken idle list".into()
            })?;
            listed += chunk.granules * self.granule;
            ensure(listed <= mapped, || "the idle list loops".into())?;
            (before, cursor) = (cursor, chunk.idle_next);
        }
        ensure(before == self.idle_tail, || {
            "the idle list's tail is wrong".into()
        })?;
        ensure(listed == idle && idle == self.idle_bytes, || {
            format!(
                "idle bytes drifted: {} counted, {idle} idle, {listed} listed",
                self.idle_bytes
            )
        })?;
        ensure(mapped == self.mapped_bytes, || {
            format!(
                "mapped bytes drifted: {} counted, chunks hold {mapped}",
                self.mapped_bytes
            )
        })
    }
}
