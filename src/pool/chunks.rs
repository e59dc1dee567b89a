//! Which granules of the virtual pool's address ranges hold memory: runs of granules
//! mapped together (chunks), which granules live blocks touch, and the idle chunks
//! (mapped, touched by none) oldest first, so the release policy unmaps the coldest.
//!
//! A chunk is what one [`VirtualMemory::map`] mapped and one
//! [`VirtualMemory::unmap`] gives back (CUDA unmaps whole mappings only). A block
//! placed over unmapped granules maps each run of them that it covers wholly as one
//! chunk and each edge granule it covers in part (which a neighbour may share) as a
//! chunk of its own. A chunk stays mapped while any live block touches one of its
//! granules, and is idle, ready to be reused or unmapped, when none does. A block
//! takes an idle chunk back only when it is one granule or lies within the granules
//! the block covers wholly ([`Chunks::claim`]), and unmaps any other idle chunk it
//! touches ([`Chunks::drop_idle`]). Invariant: every granule of a busy chunk is
//! touched by a live block, so the mapped bytes less the idle ones are the bytes of
//! the granules live blocks touch, whatever is kept.
//!
//! Blocks are counted per granule, not per chunk, and only in their first and last
//! granules (their edges): the granules between lie wholly inside the block, so no
//! other live block touches them. Most blocks lie in one granule that other live
//! blocks touch too, and then a reservation or release changes one counter, found by
//! a shift of the block's offset, and nothing else. A granule whose count leaves or
//! reaches zero changes its chunk's count of busy granules (and so, maybe, whether
//! the chunk is idle); the granules inside a block count busy chunk by chunk, so a
//! block of many granules costs as many steps as the chunks it spans. A chunk's count
//! of live blocks, which this replaced, needed the chunk looked up through the table
//! on every reservation and release (virtual default on gpt2-train,
//! `examples/replay_ab.rs`: 25.6 to 24.7 ns per event).

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
    /// Its granules that live blocks touch: an edge of one (a live count above
    /// zero) or inside one.
    busy: u64,
    /// Whether it is on the idle list (exactly when `busy` is 0).
    idle: bool,
    /// On the idle list: the chunk idle before it (older).
    idle_prev: Link,
    /// On the idle list: the chunk idle after it (newer).
    idle_next: Link,
}

/// One granule of an arena's range: the chunk mapping it and the live blocks whose
/// edge it is.
#[derive(Debug, Clone, Copy)]
struct Granule {
    /// The chunk holding it ([`Link::NONE`]: unmapped).
    chunk: Link,
    /// The live blocks that start or end in it (the one block a granule lies inside
    /// is not counted). Invariant: zero when unmapped, but while a block that
    /// claimed it waits for [`Chunks::map_missing`].
    live: u32,
}

impl Granule {
    const UNMAPPED: Self = Self {
        chunk: Link::NONE,
        live: 0,
    };
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
    /// For each arena, each granule's chunk and live count; as long as the highest
    /// granule ever claimed. Invariant: a chunk named is a live chunk of that arena
    /// spanning the granule, and every granule of a chunk names it.
    table: [Vec<Granule>; ARENAS],
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
        let mask = self.granule.wrapping_sub(1);
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
            .map_or(Link::NONE, |granule| granule.chunk)
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

    /// Counts a block of `extent` bytes at `offset` of `arena` live in its edge
    /// granules and busy in the granules it touches (a chunk this makes busy leaves
    /// the idle list), and returns the bytes of the granules it touches that are
    /// unmapped: what [`Chunks::map_missing`] will map.
    #[inline(always)]
    pub(crate) fn claim(&mut self, arena: usize, offset: u64, extent: u64) -> u64 {
        let (first, end) = self.span(offset, extent);
        // The common case: the block lies in one granule live blocks touch already.
        if let Some(granule) = self.table[arena].get_mut(first as usize) {
            if granule.live > 0 && end.wrapping_sub(first) == 1 {
                granule.live += 1;
                return 0;
            }
        }
        self.claim_each(arena, offset, extent)
    }

    /// The granules `[first, end)` that `extent` bytes at `offset` cover wholly (no
    /// other block touches them while this one lives); empty where there is none.
    #[inline]
    fn inner(&self, offset: u64, extent: u64) -> (u64, u64) {
        let mask = self.granule - 1;
        let first = (offset + mask) >> self.shift;
        let end = (offset + extent) >> self.shift;
        (first, end.max(first))
    }

    /// [`Chunks::claim`] of the granules `extent` bytes at `offset` touch: its
    /// edges granule by granule, what lies between chunk by chunk.
    #[inline(never)]
    fn claim_each(&mut self, arena: usize, offset: u64, extent: u64) -> u64 {
        let (first, end) = self.span(offset, extent);
        let inner = self.inner(offset, extent);
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return 0;
        };
        let table = &mut self.table[arena];
        if table.len() < end as usize {
            table.resize(end as usize, Granule::UNMAPPED);
        }
        let mut missing = self.claim_edge(arena, first, inner);
        if last > first {
            missing += self.claim_inside(arena, first + 1, last, inner);
            missing += self.claim_edge(arena, last, inner);
        }
        missing
    }

    /// Counts a block in edge granule `g` of `arena` (in the table) of a block
    /// covering granules `inner` wholly; returns the bytes it adds to map (those of
    /// an unmapped granule, or of one in an idle chunk the block cannot take back,
    /// see [`Chunks::takes_back`]).
    #[inline]
    fn claim_edge(&mut self, arena: usize, g: u64, inner: (u64, u64)) -> u64 {
        let granule = &mut self.table[arena][g as usize];
        granule.live += 1;
        if granule.live > 1 {
            return 0;
        }
        match granule.chunk.get() {
            Some(index) if self.takes_back(index, inner) => {
                self.make_busy(index, 1);
                0
            }
            _ => self.granule,
        }
    }

    /// Counts granules `[g, stop)` of `arena` busy inside a block covering granules
    /// `inner` wholly, chunk by chunk; returns the bytes of those to map (unmapped,
    /// or in an idle chunk the block cannot take back).
    #[inline]
    fn claim_inside(&mut self, arena: usize, g: u64, stop: u64, inner: (u64, u64)) -> u64 {
        let missing = self.each_chunk_inside(arena, g, stop, |chunks, index, granules| {
            if chunks.takes_back(index, inner) {
                chunks.make_busy(index, granules);
                0
            } else {
                granules
            }
        });
        self.granule * missing
    }

    /// Whether a block covering granules `inner` wholly (and touching chunk `index`)
    /// counts chunk `index` busy as it is: a busy chunk always, an idle one only when
    /// every granule of it will be touched by a live block for as long as it is busy
    /// again: a chunk of one granule, or one that lies within `inner` (granules no
    /// other block can touch while this one lives). Any other idle chunk the block
    /// touches is unmapped before the block's chunks are mapped
    /// ([`Chunks::drop_idle`]). So a busy chunk holds only granules live blocks touch,
    /// whatever is kept: the eager policy's mapped bytes.
    #[inline]
    fn takes_back(&self, index: SegmentIndex, inner: (u64, u64)) -> bool {
        let chunk = self.chunk(index);
        !chunk.idle
            || chunk.granules == 1
            || (chunk.start >= inner.0 && chunk.start + chunk.granules <= inner.1)
    }

    /// Unmaps the idle chunks that granules `[first, end)` of `arena` (range
    /// `range`) hold: those a block just claimed there could not take back. A chunk
    /// the storage refuses to unmap is taken back whole instead (counted busy in the
    /// granules the block touches). Returns the calls made and the bytes of the
    /// granules of `[first, end)` left unmapped, which [`Chunks::map_missing`] maps.
    pub(crate) fn drop_idle(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> (Calls, u64) {
        let (first, end) = self.span(offset, extent);
        let mut calls = Calls::default();
        let unmapped = self.each_chunk_inside(arena, first, end, |chunks, index, granules| {
            if !chunks.chunk(index).idle {
                return 0;
            }
            if chunks.unmap(memory, range, index) {
                calls.unmaps += 1;
                granules
            } else {
                chunks.make_busy(index, granules);
                0
            }
        });
        (calls, unmapped * self.granule)
    }

    /// Takes back whole every idle chunk that granules of `extent` bytes at `offset`
    /// of `arena` hold (counted busy in those granules), as [`Chunks::claim`] did
    /// before [`Chunks::takes_back`]: for a block whose claim is undone without the
    /// storage at hand, so that [`Chunks::uncover`] finds every chunk it touches
    /// busy.
    pub(crate) fn adopt_idle(&mut self, arena: usize, offset: u64, extent: u64) {
        let (first, end) = self.span(offset, extent);
        self.each_chunk_inside(arena, first, end, |chunks, index, granules| {
            if chunks.chunk(index).idle {
                chunks.make_busy(index, granules);
            }
            0
        });
    }

    /// Calls `count` with each chunk holding granules of `[g, end)` of `arena` and
    /// how many of them it holds, in granule order; returns how many are unmapped
    /// plus what the calls return.
    #[inline]
    fn each_chunk_inside(
        &mut self,
        arena: usize,
        mut g: u64,
        end: u64,
        mut count: impl FnMut(&mut Self, SegmentIndex, u64) -> u64,
    ) -> u64 {
        let mut unmapped = 0;
        while g < end {
            let Some(index) = self.at(arena, g).get() else {
                unmapped += 1;
                g += 1;
                continue;
            };
            let chunk = self.chunk(index);
            let stop = end.min(chunk.start + chunk.granules);
            unmapped += count(self, index, stop - g);
            g = stop;
        }
        unmapped
    }

    /// Adds `granules` to the busy ones of chunk `index`, taking it off the idle
    /// list.
    #[inline]
    fn make_busy(&mut self, index: SegmentIndex, granules: u64) {
        let chunk = self.chunk_mut(index);
        chunk.busy += granules;
        if chunk.idle {
            self.unlink_idle(index);
        }
    }

    /// Maps the unmapped granules that `extent` bytes at `offset` of `arena` (range
    /// `range`) touch, live for the block: each run of those it covers wholly as one
    /// chunk, and each edge granule it covers in part as a chunk of its own. On a failed map,
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
        let (inner_first, inner_end) = self.inner(offset, extent);
        let inside = inner_first..inner_end;
        let mut g = first;
        while g < end {
            if let Some(index) = self.at(arena, g).get() {
                let chunk = self.chunk(index);
                g = chunk.start + chunk.granules;
                continue;
            }
            // The granules the block covers wholly go in runs; an edge granule it
            // covers in part, which a neighbour may share, is a chunk of its own.
            let mut stop = g + 1;
            if inside.contains(&g) {
                while stop < inside.end && self.at(arena, stop).is_none() {
                    stop += 1;
                }
            }
            if let Err(error) = self.map(memory, arena, range, g, stop - g) {
                self.settle_new(first, end, arena, |chunks, index| {
                    chunks.unmap(memory, range, index);
                });
                return Err(error);
            }
            g = stop;
        }
        // Every granule of a new chunk is one the block touches.
        let maps = self.settle_new(first, end, arena, |chunks, index| {
            let chunk = chunks.chunk_mut(index);
            chunk.busy = chunk.granules;
        });
        Ok(Calls { maps, unmaps: 0 })
    }

    /// Calls `settle` on each chunk of granules `[first, end)` of `arena` that
    /// `map_missing` made (no busy granule and not idle: the chunks the block
    /// claimed are busy), and returns how many there were.
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
            let (new, next) = (chunk.busy == 0 && !chunk.idle, chunk.start + chunk.granules);
            if new {
                settle(self, index);
                count += 1;
            }
            g = next;
        }
        count
    }

    /// Undoes [`Chunks::claim`] of a block of `extent` bytes at `offset` of `arena`;
    /// chunks none of whose granules a live block touches any more become idle
    /// (newest last, in granule order). Unmapped granules only lose the count (a
    /// block whose map failed holds none).
    #[inline(always)]
    pub(crate) fn uncover(&mut self, arena: usize, offset: u64, extent: u64) {
        let (first, end) = self.span(offset, extent);
        // The common case: the block lies in one granule another live block touches.
        if let Some(granule) = self.table[arena].get_mut(first as usize) {
            if granule.live > 1 && end.wrapping_sub(first) == 1 {
                granule.live -= 1;
                return;
            }
        }
        self.uncover_each(arena, first, end);
    }

    /// [`Chunks::uncover`] of granules `[first, end)`: its edges granule by granule,
    /// what lies between chunk by chunk, in granule order (the order chunks go
    /// idle in).
    #[inline(never)]
    fn uncover_each(&mut self, arena: usize, first: u64, end: u64) {
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return;
        };
        self.uncover_edge(arena, first);
        if last > first {
            self.uncover_inside(arena, first + 1, last);
            self.uncover_edge(arena, last);
        }
    }

    /// Counts a block gone from edge granule `g` of `arena`.
    #[inline]
    fn uncover_edge(&mut self, arena: usize, g: u64) {
        let Some(granule) = self.table[arena].get_mut(g as usize) else {
            return;
        };
        granule.live -= 1;
        if granule.live == 0 {
            if let Some(index) = granule.chunk.get() {
                self.make_unbusy(index, 1);
            }
        }
    }

    /// Counts granules `[g, end)` of `arena` no longer inside a live block.
    #[inline]
    fn uncover_inside(&mut self, arena: usize, g: u64, end: u64) {
        self.each_chunk_inside(arena, g, end, |chunks, index, granules| {
            chunks.make_unbusy(index, granules);
            0
        });
    }

    /// Takes `granules` from the busy ones of chunk `index`; idle (newest last)
    /// when none is left.
    #[inline]
    fn make_unbusy(&mut self, index: SegmentIndex, granules: u64) {
        let chunk = self.chunk_mut(index);
        chunk.busy -= granules;
        if chunk.busy == 0 {
            self.link_idle(index);
        }
    }

    /// Unmaps idle chunks until at most `keep` idle bytes are left: the longest idle
    /// of those that alone suffice, else the longest idle, and again (one call per
    /// chunk: a chunk that suffices alone frees the bytes in one call, where the
    /// longest idle might take several). `ranges` names each arena's range.
    pub(crate) fn trim(
        &mut self,
        memory: &mut dyn VirtualMemory,
        ranges: [Option<StorageId>; ARENAS],
        keep: u64,
    ) -> Calls {
        let mut calls = Calls::default();
        while self.idle_bytes > keep {
            let Some(index) = self
                .enough_alone(self.idle_bytes - keep)
                .or(self.idle_head.get())
            else {
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

    /// The idle chunk idle longest of those of at least `bytes` bytes, if any.
    fn enough_alone(&self, bytes: u64) -> Option<SegmentIndex> {
        let mut cursor = self.idle_head;
        while let Some(index) = cursor.get() {
            let chunk = self.chunk(index);
            if chunk.granules * self.granule >= bytes {
                return Some(index);
            }
            cursor = chunk.idle_next;
        }
        None
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
                    busy: 0,
                    idle: false,
                    idle_prev: Link::NONE,
                    idle_next: Link::NONE,
                })
                .index,
        );
        let table = &mut self.table[arena];
        let end = (start + granules) as usize;
        if table.len() < end {
            table.resize(end, Granule::UNMAPPED);
        }
        for granule in &mut table[start as usize..end] {
            granule.chunk = Link::to(index);
        }
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
        for granule in &mut self.table[arena][start as usize..(start + granules) as usize] {
            granule.chunk = Link::NONE;
        }
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
    /// granule's live count is the number of live blocks with an edge in it, each
    /// chunk's busy count is the number of its granules they touch, the table and
    /// the chunks agree, the idle list holds exactly the chunks no block touches, and
    /// the byte counts are exact.
    pub(crate) fn check(&self, blocks: [&[(u64, u64)]; ARENAS]) -> Result<(), String> {
        // Per arena: each granule's count of blocks with an edge in it, and whether
        // it lies inside one.
        let mut inside: [Vec<bool>; ARENAS] = Default::default();
        for (arena, blocks) in blocks.iter().enumerate() {
            let table = &self.table[arena];
            let mut edges = vec![0u32; table.len()];
            inside[arena] = vec![false; table.len()];
            for &(offset, extent) in *blocks {
                let (first, end) = self.span(offset, extent);
                for g in first..end {
                    ensure(self.at(arena, g).is_some(), || {
                        format!("granule {g} of arena {arena} holds live bytes but is unmapped")
                    })?;
                    if g == first || g + 1 == end {
                        edges[g as usize] += 1;
                    } else {
                        inside[arena][g as usize] = true;
                    }
                }
            }
            for (g, (granule, &counted)) in table.iter().zip(&edges).enumerate() {
                ensure(granule.live == counted, || {
                    format!(
                        "granule {g} of arena {arena} counts {} live blocks, {counted} have an \
                         edge in it",
                        granule.live
                    )
                })?;
            }
        }
        let (mut mapped, mut idle) = (0u64, 0u64);
        for (id, chunk) in self.chunks.iter() {
            let bytes = chunk.granules * self.granule;
            mapped += bytes;
            ensure(chunk.granules > 0, || "empty chunk".into())?;
            let mut busy = 0u64;
            for g in chunk.start..chunk.start + chunk.granules {
                let granule = self.table[chunk.arena].get(g as usize);
                ensure(
                    granule
                        .and_then(|granule| granule.chunk.get())
                        .map(|index| index.get())
                        == Some(id.index),
                    || format!("granule {g} of a chunk is not mapped to it"),
                )?;
                let inside = inside[chunk.arena].get(g as usize) == Some(&true);
                busy += u64::from(inside || granule.is_some_and(|granule| granule.live > 0));
            }
            ensure(chunk.busy == busy, || {
                format!(
                    "chunk at granule {} counts {} busy granules, live blocks touch {busy}",
                    chunk.start, chunk.busy
                )
            })?;
            ensure(chunk.idle == (chunk.busy == 0), || {
                format!("chunk at granule {} is idle wrongly", chunk.start)
            })?;
            if chunk.idle {
                idle += bytes;
            }
        }
        for (arena, table) in self.table.iter().enumerate() {
            for (g, granule) in table.iter().enumerate() {
                if granule.chunk.is_some() {
                    let chunk = self
                        .chunks
                        .linked(granule.chunk)
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
