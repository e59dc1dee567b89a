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
//! the chunk is idle). A chunk's count of live blocks, which this replaced, needed
//! the chunk looked up through the table on every reservation and release (virtual
//! default on gpt2-train, `examples/replay_ab.rs`: 25.6 to 24.7 ns per event).
//!
//! The chunks wholly between a block's edge granules (its interior chunks) belong to
//! it alone, so they are never counted one by one: idle chunks are listed as idle
//! spans (runs of whole idle chunks, in the order they went idle, each in granule
//! order), a block's claim takes the spans' pieces over its interior back, and its
//! release lists its interior as one span. A block costs as many steps as the idle
//! spans it lands on and the unmapped granules it maps (which the map writes into the
//! table one by one anyway), not as the chunks it spans: chunks never merge
//! (one map, one unmap), so a range where large blocks come and go fills with small
//! chunks, and counting them one by one made a replay of the synthetic large-tensors
//! trace (`benches/python/virtual_tradeoff.py`) cost 14.4x `compact`'s time per event,
//! about 87 chunks visited per claim or release (issue 28). With spans it costs 3.1x
//! (`virtual_tradeoff.py --timing 15`; what is left is its 121 storage calls per 100
//! allocations, `compact`'s 4, each a run-map update in the replay's storage, and the
//! chunks' upkeep around them): these books and
//! the storage's took 4.4 million instructions of that replay, 30.7 million before
//! (callgrind of `examples/replay_ab.rs`), and 0.03-4.4 % more of the shared traces'
//! replays (a span's upkeep where the old list set a flag).
//!
//! The unmapped granules a claim meets are counted a run at a time (one tight scan of
//! the table, eight granules a block with no exit inside a block) and a chunk's
//! granules are named in the table four at a time. At GPU scale, where most blocks span hundreds of granules, a
//! step per granule through [`Chunks::at`] was up to half a replay's instructions:
//! with every size of the shared and captured traces multiplied by 128
//! (`virtual_tradeoff.py --scaled-up`'s largest factor) the default's replays run
//! 0.4-54 % fewer instructions, 5 % or more on 17 of the 19 (lstm-train 4.38 M to 2.00
//! M, gpt2-train 5.14 M to 4.22 M; gpt2-generate and kv-generate, of few large blocks,
//! 0.4 %; the `replay` function's, inclusive, callgrind of `replay_ab TRACE compact
//! virtual_pages 0`), the traces as captured 0.1-0.8 % fewer, and the placements,
//! calls and FIFO and steady-state steps of `examples/peer_loops.rs` are unchanged.
//!
//! The shared traces' blocks are mostly of one to a few granules, so they have fast
//! paths: a block of at most [`WALKED`] + 1 granules is claimed, mapped and released
//! chunk by chunk (no search for its interior's ends), its chunks after its first
//! edge's go idle as spans of their own (so it is claimed again in place without
//! cutting a span's front, which moves the span's head), a chunk going idle alone is
//! listed without looking it up again, and one taken back that is a span by itself is
//! unlisted without a split. With the simulated storage's single search per call
//! (`storage::run_map`), the replays' instructions (the `replay` function's,
//! inclusive, callgrind of `replay_ab TRACE compact virtual_pages 0`) are 0-1.1 %
//! above those before the spans (gpt2-train 3.330 M against 3.301 M, mixtral-train
//! 3.458 against 3.422, transformer-train 5.346 against 5.304, vit-train 3.117
//! against 3.109; 0.5-4.5 % above before these paths), and the large-tensors
//! replay's 8.04 M (34.5 M before the spans).
//!
//! A block alone in its granule has a fast path too: released, its granule's chunk
//! goes idle without being listed ([`Chunks::unlisted`], listed by the next path
//! that reads or changes the idle list, in the place it would have had), and a
//! block placed again where it was takes it back with no list to change. That is
//! the reserve + drop of a block in a pool that holds nothing else in its granule
//! (a Python loop of 4 KiB reserves: 2,013 to 1,850 instructions a step with the
//! arena's `list_first`, `bench_reserve.py --loop default`, callgrind), and the
//! storage calls and the utilization of every shared and captured trace's replay are
//! unchanged (as captured and x128); the shared traces' and large-tensors' replays
//! run -0.25 % to +0.07 % of the instructions they ran before (the `replay`
//! function's, inclusive, callgrind of `replay_ab TRACE compact virtual_pages 0`).

use super::bins::{index_at, Link, SegmentIndex};
use super::{ensure, Slab};
use crate::storage::{MappingError, RunMap, StorageId, VirtualMemory};

/// The number of address ranges (arenas) the chunks are kept for.
pub(crate) const ARENAS: usize = 2;

/// The most granules past its first that a block may span and still be claimed,
/// mapped and released chunk by chunk (see the module doc). 4, 8 and 16 cost the
/// shared traces' replays the same; 8 and 16 cost large-tensors' 1.6 % and 8.6 %
/// more of the chunks' and storage's instructions (callgrind, when measured).
const WALKED: u64 = 4;

/// The idle spans, longest idle first, in which a trim looks for a chunk that frees
/// the bytes it must free alone (one call, where unmapping the longest idle chunks
/// might take several); past them it unmaps the longest idle. The bound keeps a trim's
/// cost constant: unbounded, the search walked 127 spans a call on average in the
/// steady state of `examples/peer_loops.rs` (each span a chunk elsewhere in memory),
/// and bounded at 64 the step on storage without bytes took 270 against 379 ns (best
/// of 6, interleaved) and 1,044 against 1,074 instructions, with the same storage
/// calls there (28.78 per 100 steps, `examples/default_calls.rs -- steady`) and on
/// every shared and captured trace, as captured and with every size x128
/// (`examples/default_calls.rs TRACE...`). The traces' calls were the same with a
/// bound of 16 or 32 too; the steady state made 29.25 calls per 100 steps at 16.
const TRIM_SPANS: u64 = 64;

/// One mapped run of granules.
///
/// Idle chunks lie in idle spans: runs of whole idle chunks of one arena, on the
/// idle list, whose chunks went idle in granule order, after those of the spans
/// before and before those of the spans after. A span is kept in its first chunk
/// (its head), and named by the head's index.
#[derive(Debug, Clone)]
struct Chunk {
    /// The arena whose range holds it.
    arena: usize,
    /// Its first granule.
    start: u64,
    /// Its number of granules.
    granules: u64,
    /// While busy (in no idle span): its granules that live blocks touch, an edge of
    /// one (a live count above zero) or inside one. While idle: its number of
    /// granules, the count it has when a block takes it back whole.
    busy: u64,
    /// The head of the idle span it went into when it went idle alone: a hint, good
    /// while that span still holds it. Invariant: an idle chunk that heads no span
    /// and whose hint is not good is in an indexed span (the chunks after the head
    /// of an interior, and of a span's later part when it is split).
    span: Link,
    /// While it heads an idle span: the span's end granule; else 0.
    span_end: u64,
    /// While it heads an idle span: whether `Chunks::span_starts` finds the span. A
    /// span of chunks that went idle alone, whose hints name it, is not indexed, so
    /// that the common release (a block's chunk of one granule going idle) and
    /// reuse cost no search.
    indexed: bool,
    /// While it heads an idle span: the span idle before it (older).
    prev: Link,
    /// While it heads an idle span: the span idle after it (newer).
    next: Link,
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

/// Names `chunk` in every one of `granules` (their live counts unchanged): four at a
/// time, which took the write of a run of hundreds of granules from 4 instructions a
/// granule to under 2 (a map's and an unmap's, `examples/replay_ab.rs` of traces at
/// GPU scale, callgrind).
#[inline]
fn name_chunk(granules: &mut [Granule], chunk: Link) {
    let mut quads = granules.chunks_exact_mut(4);
    for quad in &mut quads {
        for granule in quad {
            granule.chunk = chunk;
        }
    }
    for granule in quads.into_remainder() {
        granule.chunk = chunk;
    }
}

/// What [`Chunks::claim`] returns where the host has no memory for the table's entries
/// of a block's granules: no count of bytes to map can be (they lie in a range of
/// address space, below `u64::MAX`).
pub(crate) const NO_ROOM: u64 = u64::MAX;

/// The entries the granule table first makes room for: 128 GiB of 2 MiB granules in
/// 512 KiB of the host's address space, which the host backs only as entries are
/// written (the table's length follows the highest granule claimed), so that a range
/// up to that size never copies its table.
const FIRST_ROOM: usize = 1 << 16;

/// Grows `table` to `end` granules, all unmapped; `None`, leaving it as it was, where
/// the host has no memory for them (or `end` entries exceed the address space). A
/// block of a range of many granules (a 2 PiB request in granules of 2 KiB) would
/// otherwise abort the process on the allocation of its entries.
///
/// The room grows as `Vec`'s does (at least doubling), from [`FIRST_ROOM`] entries.
/// Reserved exactly, as it was in stop 62, every block past the table's end copied
/// the whole table: 12 % of a replay's instructions at GPU scale (lstm-train x128, the
/// `replay` function's, callgrind of `examples/replay_ab.rs`; 2.06 M, 2.02 M doubling
/// from empty, 1.87 M from [`FIRST_ROOM`]; the shared traces' 0.04-1.6 % fewer).
#[cold]
#[inline(never)]
fn grow_table(table: &mut Vec<Granule>, end: u64) -> Option<()> {
    let end = usize::try_from(end).ok()?;
    table.try_reserve(end.max(FIRST_ROOM) - table.len()).ok()?;
    table.resize(end, Granule::UNMAPPED);
    Some(())
}

/// What a call changed in the mapping, for the pool's books.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    /// Chunks mapped.
    pub(crate) maps: u64,
    /// Chunks unmapped.
    pub(crate) unmaps: u64,
}

/// The chunk over a block's first granule and the one over its last, each with the
/// number of granules between the two edges it holds, where it holds any.
type EdgeChunks = [Option<(SegmentIndex, u64)>; 2];

/// The block whose claim [`Chunks::claim`] left granules to map: what
/// [`Chunks::drop_idle`] and [`Chunks::map_missing`] read instead of visiting its
/// chunks again.
#[derive(Debug, Clone, Default)]
struct Pending {
    /// Its arena, first granule and end granule.
    arena: usize,
    first: u64,
    end: u64,
    /// The pieces `[start, end)` of idle spans its interior took back, by granule.
    taken: Vec<(u64, u64)>,
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
    /// Invariant: the idle spans do not overlap, each holds whole chunks, and a
    /// chunk is idle (no live block touches it) exactly when a span holds it.
    chunks: Slab<Chunk>,
    /// For each arena, the heads of its indexed idle spans by first granule.
    span_starts: [RunMap<SegmentIndex>; ARENAS],
    /// The span idle longest (its head).
    idle_head: Link,
    /// The span idle last.
    idle_tail: Link,
    /// The chunk that went idle last, when a block alone in one of its granules was
    /// released ([`Chunks::uncover`]'s second fast path) and the idle list has not
    /// changed since: idle (counted in `idle_bytes`, all its granules busy) but not
    /// yet listed, so that a block placed again where it was takes it back with
    /// no list to change. Every path that reads or changes the idle list but those
    /// two fast paths lists it first ([`Chunks::list_unlisted`]), last, as it would
    /// have been listed when it went idle: nothing came onto the list after it.
    /// Invariant: [`Link::NONE`], or an idle chunk in no span.
    unlisted: Link,
    /// Invariant: the bytes of the idle chunks.
    idle_bytes: u64,
    /// Invariant: the bytes of every chunk.
    mapped_bytes: u64,
    /// The last claim that left granules to map (see [`Pending`]).
    pending: Pending,
    /// The chunks [`Chunks::map_missing`] mapped in its current call.
    fresh: Vec<SegmentIndex>,
    /// The steps taken so far by the walks over a block's granules (one per idle
    /// span, chunk, unmapped granule or run mapped): what a claim, a map and a
    /// release cost besides their edges, counted so tests can bound it.
    steps: u64,
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
            span_starts: Default::default(),
            idle_head: Link::NONE,
            idle_tail: Link::NONE,
            unlisted: Link::NONE,
            idle_bytes: 0,
            mapped_bytes: 0,
            pending: Pending::default(),
            fresh: Vec::new(),
            steps: 0,
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

    /// The number of idle spans: at most the idle chunks.
    #[cfg(test)]
    pub(crate) fn idle_spans(&self) -> usize {
        // The unlisted chunk counted as it will be listed (maybe joining a span).
        let mut listed = self.clone();
        listed.list_unlisted();
        let (mut cursor, mut count) = (listed.idle_head, 0);
        while let Some(head) = listed.chunks.linked(cursor) {
            (cursor, count) = (head.next, count + 1);
        }
        count
    }

    /// The steps the walks over blocks' granules took so far (see `Chunks::steps`).
    #[cfg(test)]
    pub(crate) fn steps(&self) -> u64 {
        self.steps
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

    /// The head of idle span `index`.
    #[inline]
    fn idle_span(&self, index: SegmentIndex) -> &Chunk {
        self.chunk(index)
    }

    /// The head of idle span `index`.
    #[inline]
    fn idle_span_mut(&mut self, index: SegmentIndex) -> &mut Chunk {
        self.chunk_mut(index)
    }

    /// The indexed idle span holding granule `g` of `arena`, if any.
    #[inline]
    fn span_at(&self, arena: usize, g: u64) -> Option<SegmentIndex> {
        let (_, index) = self.span_starts[arena].last_before(g + 1)?;
        (self.idle_span(index).span_end > g).then_some(index)
    }

    /// The idle span holding chunk `index`, if it is idle: none where it counts fewer
    /// busy granules than it has (an idle chunk counts them all), its hint where that
    /// span holds it, else the span over its first granule.
    #[inline]
    fn span_of(&self, index: SegmentIndex) -> Option<SegmentIndex> {
        let chunk = self.chunk(index);
        if chunk.busy < chunk.granules {
            return None;
        }
        if chunk.span_end > 0 {
            return Some(index);
        }
        if let Some(head) = self.chunks.linked(chunk.span) {
            if head.arena == chunk.arena && head.start <= chunk.start && chunk.start < head.span_end
            {
                return chunk.span.get();
            }
        }
        self.span_at(chunk.arena, chunk.start)
    }

    /// Counts a block of `extent` bytes at `offset` of `arena` live in its edge
    /// granules and busy in the granules it touches (a chunk this makes busy leaves
    /// the idle list), and returns the bytes of the granules it touches that are
    /// unmapped: what [`Chunks::map_missing`] will map. [`NO_ROOM`], changing nothing
    /// (but listing the [`Chunks::unlisted`] chunk), where the host has no memory for
    /// the table's entries of the granules the block touches (a block of billions of
    /// granules). A sentinel rather than an `Option`: the caller tests it only where
    /// the count is not 0, and the FIFO step of `examples/peer_loops.rs` ran 3
    /// instructions more with the `Option` (callgrind).
    #[inline(always)]
    pub(crate) fn claim(&mut self, arena: usize, offset: u64, extent: u64) -> u64 {
        // The common case: the block lies in one granule live blocks touch already.
        if let Some(g) = self.sole_granule(offset, extent) {
            if let Some(granule) = self.table[arena].get_mut(g as usize) {
                if granule.live > 0 {
                    granule.live += 1;
                    return 0;
                }
                if let Some(index) = granule.chunk.get() {
                    if self.claim_alone(arena, g, index, self.inner(offset, extent)) {
                        return 0;
                    }
                }
            }
        }
        self.claim_each(arena, offset, extent).unwrap_or(NO_ROOM)
    }

    /// [`Chunks::claim`] of a block that lies in granule `g` of `arena`, mapped by
    /// chunk `index`, which no live block touches (a block freed and placed again
    /// where it was, alone in its granule), covering granules `inner` wholly: takes
    /// the chunk back as [`Chunks::claim_each`] would, without the books a claim that
    /// maps keeps for [`Chunks::drop_idle`] and [`Chunks::map_missing`]. False,
    /// changing nothing but listing the [`Chunks::unlisted`] chunk, where the chunk
    /// cannot be taken back (see [`Chunks::take`]).
    #[inline]
    fn claim_alone(
        &mut self,
        arena: usize,
        g: u64,
        index: SegmentIndex,
        inner: (u64, u64),
    ) -> bool {
        if self.unlisted != Link::to(index) {
            self.list_unlisted();
        }
        if !self.take(index, inner, 1) {
            return false;
        }
        self.table[arena][g as usize].live = 1;
        true
    }

    /// The granule `extent` bytes at `offset` lie in when they lie in one, as
    /// [`Chunks::span`] finds it (its granules `[first, end)` with `end = first + 1`),
    /// in fewer instructions: the granules of the first and the last byte, compared.
    /// For `extent = 0`, `span` gives one granule exactly when `offset` is inside a
    /// granule, not at its start, and so does this (the "last byte" is the one
    /// before `offset`, in the same granule then, in the one before at a start, or
    /// wrapped to the top of the address space at 0). Shifts by `shift` (below 64,
    /// the granule being a power of two) need no check; with the checks the build
    /// adds (`overflow-checks`) and the span's end, the fast paths of
    /// [`Chunks::claim`] and [`Chunks::uncover`] ran 5 instructions more, both
    /// together (the FIFO step of `examples/peer_loops.rs`, callgrind).
    #[inline(always)]
    fn sole_granule(&self, offset: u64, extent: u64) -> Option<u64> {
        let first = offset.wrapping_shr(self.shift);
        let last = offset
            .wrapping_add(extent)
            .wrapping_sub(1)
            .wrapping_shr(self.shift);
        (first == last).then_some(first)
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
    /// edges granule by granule, the chunks over them, and its interior span by span.
    #[inline(never)]
    fn claim_each(&mut self, arena: usize, offset: u64, extent: u64) -> Option<u64> {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        let inner = self.inner(offset, extent);
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return Some(0);
        };
        let table = &mut self.table[arena];
        if table.len() < end as usize {
            grow_table(table, end)?;
        }
        self.pending.arena = arena;
        self.pending.first = first;
        self.pending.end = end;
        self.pending.taken.clear();
        let mut missing = self.claim_edge(arena, first, inner);
        if last > first {
            if last > first + WALKED {
                missing += self.claim_inside(arena, first, last, inner);
            } else if last > first + 1 {
                missing += self.claim_walk(arena, first, last, inner);
            }
            missing += self.claim_edge(arena, last, inner);
        }
        Some(missing)
    }

    /// Counts a block in edge granule `g` of `arena` (in the table) of a block
    /// covering granules `inner` wholly; returns the bytes it adds to map (those of
    /// an unmapped granule, or of one in an idle chunk the block cannot take back,
    /// see [`Chunks::take`]).
    #[inline]
    fn claim_edge(&mut self, arena: usize, g: u64, inner: (u64, u64)) -> u64 {
        let granule = &mut self.table[arena][g as usize];
        granule.live += 1;
        if granule.live > 1 {
            return 0;
        }
        match granule.chunk.get() {
            Some(index) if self.take(index, inner, 1) => 0,
            _ => self.granule,
        }
    }

    /// Counts granules `(first, last)` of `arena` busy inside a block covering
    /// granules `inner` wholly; returns the bytes of those to map (unmapped, or in an
    /// idle chunk the block cannot take back). The chunks over the edges `first` and
    /// `last` may reach inside and are counted as the edges are; the chunks between
    /// them (the interior) lie wholly inside the block, so no other live block
    /// touches them: each is idle, and taken back with the idle spans' pieces over
    /// the interior (recorded for [`Chunks::map_missing`]), or unmapped.
    #[inline]
    fn claim_inside(&mut self, arena: usize, first: u64, last: u64, inner: (u64, u64)) -> u64 {
        let (interior, ends) = self.interior(arena, first, last);
        let mut missing = 0;
        for (index, granules) in ends.into_iter().flatten() {
            if !self.take(index, inner, granules) {
                missing += granules;
            }
        }
        let (from, to) = interior;
        let mut g = from;
        while g < to {
            let Some(index) = self.at(arena, g).get() else {
                let run = self.unmapped_run(arena, g, to);
                self.steps += run;
                missing += run;
                g += run;
                continue;
            };
            self.steps += 1;
            // The idle span over the chunk holds the chunks after it up to its end.
            let stop = match self.span_of(index) {
                Some(span) => {
                    let stop = self.idle_span(span).span_end.min(to);
                    self.shrink(span, g, stop);
                    stop
                }
                None => {
                    debug_assert!(false, "a busy chunk inside a block being claimed");
                    let chunk = self.chunk(index);
                    (chunk.start + chunk.granules).min(to)
                }
            };
            self.pending.taken.push((g, stop));
            g = stop;
        }
        missing * self.granule
    }

    /// The number of unmapped granules of `arena` from `g` (unmapped, below `to`, in
    /// the table) up to the first mapped one or `to`: one tight scan of the table,
    /// where a step per granule through [`Chunks::at`] made the claim of a block of
    /// hundreds of fresh granules most of a replay's instructions at GPU scale.
    #[inline]
    fn unmapped_run(&self, arena: usize, g: u64, to: u64) -> u64 {
        let granules = &self.table[arena][g as usize..to as usize];
        // Eight granules at a time with no exit inside a block (a tighter loop than
        // a test per granule: the scan of lstm-train x128's claims took 335 thousand
        // instructions fewer than `position` alone), then one by one in the first
        // block that holds a mapped one.
        let blocks = granules.chunks_exact(8);
        let whole = blocks
            .take_while(|block| block.iter().fold(true, |all, g| all & g.chunk.is_none()))
            .count()
            * 8;
        let rest = &granules[whole..];
        (whole
            + rest
                .iter()
                .position(|granule| granule.chunk.is_some())
                .unwrap_or(rest.len())) as u64
    }

    /// [`Chunks::claim_inside`] of a block of few granules (at most [`WALKED`] + 1),
    /// chunk by chunk: each chunk of `(first, last)` is taken back with
    /// [`Chunks::take`] (recorded for [`Chunks::map_missing`] where it lies between
    /// the edges' chunks) or left to map, as the chunks over the edges are. A step per
    /// chunk, and no search for the interior's ends.
    #[inline]
    fn claim_walk(&mut self, arena: usize, first: u64, last: u64, inner: (u64, u64)) -> u64 {
        let missing = self.each_chunk_inside(arena, first + 1, last, |chunks, index, granules| {
            let chunk = chunks.chunk(index);
            let (start, stop) = (chunk.start, chunk.start + chunk.granules);
            if !chunks.take(index, inner, granules) {
                return granules;
            }
            if start > first && stop <= last {
                chunks.pending.taken.push((start, stop));
            }
            0
        });
        missing * self.granule
    }

    /// Splits granules `(first, last)` of `arena`, inside a block with edges `first`
    /// and `last`: the interior `[from, to)` (the granules no chunk over an edge
    /// holds), and the chunk over `first` and the one over `last`, each with the
    /// number of granules of `(first, last)` it holds, where it holds any.
    ///
    /// Inlined always: called, its result came back through memory and was read with
    /// 16-byte loads right after the 8-byte stores that wrote it, a store-forwarding
    /// stall at 13 % of `claim_each`'s samples in bert-dynamic x128's replay (`perf
    /// annotate`); inlined, the replays at GPU scale ran 1-7 % faster
    /// (`examples/replay_ab.rs`, builds in turn).
    #[inline(always)]
    fn interior(&self, arena: usize, first: u64, last: u64) -> ((u64, u64), EdgeChunks) {
        let (mut from, mut to) = (first + 1, last);
        let mut ends = [None, None];
        if from >= to {
            return ((from, from), ends);
        }
        if let Some(index) = self.at(arena, first).get() {
            let chunk = self.chunk(index);
            let reach = (chunk.start + chunk.granules).min(to);
            if reach > from {
                ends[0] = Some((index, reach - from));
                from = reach;
            }
        }
        if from < to {
            if let Some(index) = self.at(arena, to - 1).get() {
                let chunk = self.chunk(index);
                if chunk.start + chunk.granules > to {
                    // It holds `last` too, and holds no granule before `from`: those
                    // are in the chunk over `first` or unmapped.
                    debug_assert!(chunk.start >= from);
                    let start = chunk.start.max(from);
                    ends[1] = Some((index, to - start));
                    to = start;
                }
            }
        }
        ((from, to.max(from)), ends)
    }

    /// Counts `granules` more granules of chunk `index` busy for a block covering
    /// granules `inner` wholly, if the block counts the chunk busy as it is: a busy
    /// chunk always, an idle one only when every granule of it will be touched by a
    /// live block for as long as it is busy again: a chunk of one granule, or one
    /// that lies within `inner` (granules no other block can touch while this one
    /// lives). Returns false, changing nothing, for any other idle chunk, which is
    /// unmapped before the block's chunks are mapped ([`Chunks::drop_idle`]). So a
    /// busy chunk holds only granules live blocks touch, whatever is kept: the eager
    /// policy's mapped bytes.
    #[inline]
    fn take(&mut self, index: SegmentIndex, inner: (u64, u64), granules: u64) -> bool {
        let unlisted = self.unlisted == Link::to(index);
        let chunk = self.chunk_mut(index);
        let (start, count) = (chunk.start, chunk.granules);
        if chunk.busy < count {
            // Busy (an idle chunk counts all its granules busy): counted, no more.
            chunk.busy += granules;
            return true;
        }
        if count > 1 && (start < inner.0 || start + count > inner.1) {
            debug_assert!(unlisted || self.span_of(index).is_some());
            return false;
        }
        if unlisted {
            // Idle on no list yet: nothing to take it off.
            self.unlisted = Link::NONE;
            self.idle_bytes -= count * self.granule;
        } else if chunk.span_end == start + count {
            // It heads an idle span of itself alone (as a chunk that went idle alone
            // and no neighbour followed does): off the list, no split.
            self.unlist(index);
            self.idle_bytes -= count * self.granule;
        } else if let Some(span) = self.span_of(index) {
            self.shrink(span, start, start + count);
        } else {
            // Busy in every granule: never so while a block claims one of them.
            debug_assert!(false, "a chunk busy in all its granules claimed again");
            self.chunk_mut(index).busy += granules;
            return true;
        }
        self.chunk_mut(index).busy = granules;
        true
    }

    /// The parts of granules `[first, end)` of `arena` that the chunks over its
    /// first and its last granule hold (one part when one chunk holds both).
    fn mapped_ends(&self, arena: usize, first: u64, end: u64) -> [Option<(u64, u64)>; 2] {
        let part = |g: u64| {
            self.at(arena, g).get().map(|index| {
                let chunk = self.chunk(index);
                (
                    chunk.start.max(first),
                    (chunk.start + chunk.granules).min(end),
                )
            })
        };
        let head = part(first);
        let tail = part(end - 1).filter(|&tail| Some(tail) != head);
        [head, tail]
    }

    /// Whether the pending claim is the block of granules `[first, end)` of `arena`.
    fn is_pending(&self, arena: usize, first: u64, end: u64) -> bool {
        (self.pending.arena, self.pending.first, self.pending.end) == (arena, first, end)
    }

    /// Unmaps the idle chunks that granules of `extent` bytes at `offset` of `arena`
    /// (range `range`) hold: those the block just claimed there
    /// ([`Chunks::claim`], the last claim) could not take back, which hold its first
    /// or its last granule. A chunk the storage refuses to unmap is taken back whole
    /// instead (counted busy in the granules the block touches). Returns the calls
    /// made and the bytes of the granules the block touches left unmapped, which
    /// [`Chunks::map_missing`] maps.
    pub(crate) fn drop_idle(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> (Calls, u64) {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        debug_assert!(self.is_pending(arena, first, end));
        let mut calls = Calls::default();
        for g in [first, end - 1] {
            let Some(index) = self.at(arena, g).get() else {
                continue;
            };
            let chunk = self.chunk(index);
            let (start, stop) = (chunk.start, chunk.start + chunk.granules);
            let Some(span) = self.span_of(index) else {
                continue;
            };
            if self.unmap(memory, range, index) {
                calls.unmaps += 1;
            } else {
                self.shrink(span, start, stop);
                self.chunk_mut(index).busy = stop.min(end) - start.max(first);
            }
        }
        let mapped: u64 = self
            .mapped_ends(arena, first, end)
            .into_iter()
            .flatten()
            .chain(self.pending.taken.iter().copied())
            .map(|(lo, hi)| hi - lo)
            .sum();
        (calls, (end - first - mapped) * self.granule)
    }

    /// Takes back whole every idle chunk that granules of `extent` bytes at `offset`
    /// of `arena` hold (counted busy in those granules), as [`Chunks::claim`] did
    /// before [`Chunks::take`]: for a block whose claim is undone without the
    /// storage at hand, so that [`Chunks::unclaim`] finds every chunk it touches
    /// busy.
    pub(crate) fn adopt_idle(&mut self, arena: usize, offset: u64, extent: u64) {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        self.each_chunk_inside(arena, first, end, |chunks, index, granules| {
            let start = chunks.chunk(index).start;
            if let Some(span) = chunks.span_of(index) {
                let stop = start + chunks.chunk(index).granules;
                chunks.shrink(span, start, stop);
                chunks.chunk_mut(index).busy = granules;
            }
            0
        });
    }

    /// Calls `count` with each chunk holding granules of `[g, end)` of `arena` and
    /// how many of them it holds, in granule order; returns how many are unmapped
    /// plus what the calls return. Visits every chunk: for the cold paths and blocks
    /// of few granules only.
    fn each_chunk_inside(
        &mut self,
        arena: usize,
        mut g: u64,
        end: u64,
        mut count: impl FnMut(&mut Self, SegmentIndex, u64) -> u64,
    ) -> u64 {
        let mut unmapped = 0;
        while g < end {
            self.steps += 1;
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

    /// Maps the unmapped granules that `extent` bytes at `offset` of `arena` (range
    /// `range`) touch, live for the block (the last claimed, after
    /// [`Chunks::drop_idle`]): each run of those it covers wholly as one chunk, and
    /// each edge granule it covers in part as a chunk of its own. The runs are the
    /// gaps between the chunks over its edges and the pieces its interior took back,
    /// the only chunks it holds. On a failed map, unmaps what this call mapped and
    /// changes nothing more.
    pub(crate) fn map_missing(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> Result<Calls, MappingError> {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        debug_assert!(self.is_pending(arena, first, end));
        let (inner_first, inner_end) = self.inner(offset, extent);
        self.fresh.clear();
        let result = if end - first <= WALKED + 1 {
            self.map_walk(memory, arena, range, (first, end), (inner_first, inner_end))
        } else {
            self.map_parts(memory, arena, range, (first, end), (inner_first, inner_end))
        };
        let fresh = std::mem::take(&mut self.fresh);
        let outcome = match result {
            Ok(()) => {
                // Every granule of a new chunk is one the block touches.
                for &index in &fresh {
                    let chunk = self.chunk_mut(index);
                    chunk.busy = chunk.granules;
                }
                Ok(Calls {
                    maps: fresh.len() as u64,
                    unmaps: 0,
                })
            }
            Err(error) => {
                for &index in &fresh {
                    self.unmap(memory, range, index);
                }
                Err(error)
            }
        };
        self.fresh = fresh;
        outcome
    }

    /// [`Chunks::map_missing`]'s maps for the block of granules `[first, end)`
    /// covering `inner` wholly: the gaps between the chunks over its edges and the
    /// pieces its interior took back, each run of granules it covers wholly as one
    /// chunk, each edge granule it covers in part as one. Each chunk mapped goes on
    /// `fresh`; stops at the first failed map.
    fn map_parts(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        (first, end): (u64, u64),
        (inner_first, inner_end): (u64, u64),
    ) -> Result<(), MappingError> {
        let [head, tail] = self.mapped_ends(arena, first, end);
        let taken = std::mem::take(&mut self.pending.taken);
        let mut result = Ok(());
        let mut g = first;
        let parts = head
            .into_iter()
            .chain(taken.iter().copied())
            .chain(tail)
            .chain([(end, end)]);
        'parts: for (lo, hi) in parts {
            while g < lo {
                self.steps += 1;
                // The granules the block covers wholly go in runs; an edge granule it
                // covers in part, which a neighbour may share, is a chunk of its own.
                let stop = if (inner_first..inner_end).contains(&g) {
                    lo.min(inner_end)
                } else {
                    g + 1
                };
                match self.map(memory, arena, range, g, stop - g) {
                    Ok(index) => self.fresh.push(index),
                    Err(error) => {
                        result = Err(error);
                        break 'parts;
                    }
                }
                g = stop;
            }
            g = g.max(hi);
        }
        self.pending.taken = taken;
        result
    }

    /// [`Chunks::map_parts`] for a block of few granules (at most [`WALKED`] + 1):
    /// the same chunks mapped, found by walking its granules through the table (a
    /// step per chunk or run) instead of from the pieces its claim recorded.
    fn map_walk(
        &mut self,
        memory: &mut dyn VirtualMemory,
        arena: usize,
        range: StorageId,
        (first, end): (u64, u64),
        (inner_first, inner_end): (u64, u64),
    ) -> Result<(), MappingError> {
        let mut g = first;
        while g < end {
            self.steps += 1;
            if let Some(index) = self.at(arena, g).get() {
                let chunk = self.chunk(index);
                g = chunk.start + chunk.granules;
                continue;
            }
            let mut stop = g + 1;
            if (inner_first..inner_end).contains(&g) {
                while stop < inner_end && self.at(arena, stop).is_none() {
                    stop += 1;
                }
            }
            let index = self.map(memory, arena, range, g, stop - g)?;
            self.fresh.push(index);
            g = stop;
        }
        Ok(())
    }

    /// Undoes [`Chunks::claim`] of a live block of `extent` bytes at `offset` of
    /// `arena`, every granule of which is mapped; chunks none of whose granules a live
    /// block touches any more become idle (newest last, in granule order: the chunk
    /// over its first granule, its interior as one span, the chunk over its last
    /// granule).
    #[inline(always)]
    pub(crate) fn uncover(&mut self, arena: usize, offset: u64, extent: u64) {
        // The common case: the block lies in one granule another live block touches;
        // the next, in one granule it alone touches (as `uncover_each` of one edge).
        if let Some(g) = self.sole_granule(offset, extent) {
            if let Some(granule) = self.table[arena].get_mut(g as usize) {
                if granule.live > 1 {
                    granule.live -= 1;
                    return;
                }
                if granule.live == 1 {
                    self.uncover_alone(arena, g);
                    return;
                }
            }
        }
        let (first, end) = self.span(offset, extent);
        self.uncover_each(arena, first, end);
    }

    /// [`Chunks::uncover`] of the one live block that touches granule `g` of
    /// `arena` and lies in it: [`Chunks::uncover_each`] of one edge, without
    /// finding the block's granules again.
    #[inline]
    fn uncover_alone(&mut self, arena: usize, g: u64) {
        let granule = &mut self.table[arena][g as usize];
        granule.live = 0;
        let Some(index) = granule.chunk.get() else {
            return;
        };
        let chunk = self.chunk_mut(index);
        chunk.busy -= 1;
        if chunk.busy == 0 {
            // Idle: counted now, listed when the list is next read or changed
            // (`unlisted`), unless a block takes it back first.
            self.list_unlisted();
            self.count_idle(index);
            self.unlisted = Link::to(index);
        }
    }

    /// Lists the [`Chunks::unlisted`] chunk, if any, last on the idle list (joining
    /// the newest span where it follows on from it), as it would have been listed
    /// when it went idle.
    #[inline]
    fn list_unlisted(&mut self) {
        if let Some(index) = self.unlisted.take() {
            self.list_idle(index, true);
        }
    }

    /// [`Chunks::uncover`] of granules `[first, end)`: its edges granule by granule,
    /// the chunks over them, and its interior as one span, in granule order (the
    /// order chunks go idle in).
    #[inline(never)]
    fn uncover_each(&mut self, arena: usize, first: u64, end: u64) {
        self.list_unlisted();
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return;
        };
        self.uncover_edge(arena, first, true);
        // A block of few granules: its chunks after the first edge's go idle as spans
        // of their own, so that a block claimed again in its place unlists each
        // without a split (the list's order, and so the trim's, is the same).
        let few = last <= first + WALKED;
        if last > first + 1 && few {
            self.each_chunk_inside(arena, first + 1, last, |chunks, index, granules| {
                chunks.make_unbusy(index, granules, false);
                0
            });
        } else if last > first + 1 {
            let ((from, to), [head, tail]) = self.interior(arena, first, last);
            if let Some((index, granules)) = head {
                self.make_unbusy(index, granules, true);
            }
            if from < to {
                // Every chunk of the interior is the block's alone, busy in all its
                // granules (the count it keeps while idle). An interior of one chunk
                // (as mapped for the block) is hinted, as a chunk going idle alone is.
                let first_chunk = self.at(arena, from).get();
                let alone = first_chunk.filter(|&index| {
                    let chunk = self.chunk(index);
                    chunk.start + chunk.granules == to
                });
                let span = self.append_idle(arena, from, to, alone.is_some());
                if let Some(index) = alone {
                    self.chunk_mut(index).span = Link::to(span);
                }
            }
            if let Some((index, granules)) = tail {
                self.make_unbusy(index, granules, true);
            }
        }
        if last > first {
            self.uncover_edge(arena, last, !few);
        }
    }

    /// Undoes [`Chunks::claim`] of a block of `extent` bytes at `offset` of `arena`
    /// whose granules were not all mapped (a map failed, or the storage has no
    /// virtual memory), chunk by chunk: unmapped granules only lose the count (a
    /// block whose map failed holds none).
    #[cold]
    pub(crate) fn unclaim(&mut self, arena: usize, offset: u64, extent: u64) {
        self.list_unlisted();
        let (first, end) = self.span(offset, extent);
        let Some(last) = end.checked_sub(1).filter(|&last| last >= first) else {
            return;
        };
        self.uncover_edge(arena, first, true);
        if last > first {
            self.each_chunk_inside(arena, first + 1, last, |chunks, index, granules| {
                chunks.make_unbusy(index, granules, true);
                0
            });
            self.uncover_edge(arena, last, true);
        }
    }

    /// Counts a block gone from edge granule `g` of `arena` (a chunk this makes idle
    /// joins the newest span if `join`, see [`Chunks::idle_alone`]).
    #[inline]
    fn uncover_edge(&mut self, arena: usize, g: u64, join: bool) {
        let Some(granule) = self.table[arena].get_mut(g as usize) else {
            return;
        };
        granule.live -= 1;
        if granule.live == 0 {
            if let Some(index) = granule.chunk.get() {
                self.make_unbusy(index, 1, join);
            }
        }
    }

    /// Takes `granules` from the busy ones of chunk `index`; idle (newest last)
    /// when none is left (joining the newest span if `join`).
    #[inline]
    fn make_unbusy(&mut self, index: SegmentIndex, granules: u64, join: bool) {
        let chunk = self.chunk_mut(index);
        chunk.busy -= granules;
        if chunk.busy == 0 {
            self.idle_alone(index, join);
        }
    }

    /// Lists chunk `index`, which no live block touches any more, last on the idle
    /// list, hinted: at the end of the newest span where it follows on from it and
    /// `join`, else as a span of its own (unindexed). What [`Chunks::append_idle`]
    /// does for one chunk, without looking the chunk up again through the table.
    /// Either way the chunks on the list keep their order (spans in the order they
    /// went idle, each in granule order), which is all [`Chunks::trim`] reads.
    #[inline]
    fn idle_alone(&mut self, index: SegmentIndex, join: bool) {
        self.count_idle(index);
        self.list_idle(index, join);
    }

    /// Counts chunk `index`, which no live block touches any more, idle: all its
    /// granules busy (the count a chunk keeps while idle) and its bytes idle.
    #[inline]
    fn count_idle(&mut self, index: SegmentIndex) {
        let chunk = self.chunk_mut(index);
        chunk.busy = chunk.granules;
        let bytes = chunk.granules * self.granule;
        self.idle_bytes += bytes;
    }

    /// The listing of [`Chunks::idle_alone`]: chunk `index`, counted idle, last on
    /// the idle list.
    #[inline]
    fn list_idle(&mut self, index: SegmentIndex, join: bool) {
        let tail = self.idle_tail;
        let link = Link::to(index);
        let chunk = self
            .chunks
            .linked(link)
            .expect("the table names live chunks");
        let (arena, start, end) = (chunk.arena, chunk.start, chunk.start + chunk.granules);
        if let Some(head) = self.chunks.linked_mut(tail) {
            if join && head.arena == arena && head.span_end == start {
                head.span_end = end;
                self.chunk_mut(index).span = tail;
                return;
            }
            head.next = link;
        } else {
            self.idle_head = link;
        }
        self.idle_tail = link;
        let chunk = self.chunk_mut(index);
        chunk.span = link;
        chunk.span_end = end;
        chunk.indexed = false;
        chunk.prev = tail;
        chunk.next = Link::NONE;
    }

    /// Lists granules `[start, end)` of `arena` (whole chunks just gone idle, in
    /// granule order) last on the idle list: as the newest span, or as the end of it
    /// where they follow on from it. Returns the span they are in, indexed unless
    /// they are one chunk whose hint the caller sets (`hinted`).
    fn append_idle(&mut self, arena: usize, start: u64, end: u64, hinted: bool) -> SegmentIndex {
        self.idle_bytes += (end - start) * self.granule;
        let tail = self.idle_tail;
        if let Some(head) = self.chunks.linked_mut(tail) {
            if head.arena == arena && head.span_end == start {
                head.span_end = end;
                if !hinted && !head.indexed {
                    head.indexed = true;
                    let first = head.start;
                    self.span_starts[arena].insert(first, tail.followed());
                }
                return tail.followed();
            }
        }
        self.insert_span(arena, start, end, tail, !hinted)
    }

    /// Lists a span of granules `[start, end)` of `arena` (whole idle chunks) right
    /// after span `after` (first where `after` is none), `indexed` or not, headed by
    /// the chunk at `start`. The caller counts its bytes.
    fn insert_span(
        &mut self,
        arena: usize,
        start: u64,
        end: u64,
        after: Link,
        indexed: bool,
    ) -> SegmentIndex {
        let index = self
            .at(arena, start)
            .get()
            .expect("an idle span holds whole mapped chunks");
        let next = match self.chunks.linked(after) {
            Some(head) => head.next,
            None => self.idle_head,
        };
        self.head_at(index, end, indexed, after, next);
        if indexed {
            self.span_starts[arena].insert(start, index);
        }
        index
    }

    /// Makes chunk `index` the head of an idle span up to granule `end`, between
    /// spans `prev` and `next` on the idle list.
    fn head_at(&mut self, index: SegmentIndex, end: u64, indexed: bool, prev: Link, next: Link) {
        let head = self.chunk_mut(index);
        head.span_end = end;
        head.indexed = indexed;
        head.prev = prev;
        head.next = next;
        match self.chunks.linked_mut(prev) {
            Some(before) => before.next = Link::to(index),
            None => self.idle_head = Link::to(index),
        }
        match self.chunks.linked_mut(next) {
            Some(after) => after.prev = Link::to(index),
            None => self.idle_tail = Link::to(index),
        }
    }

    /// Takes granules `[lo, hi)` (whole chunks) out of idle span `index`: what is
    /// left before them keeps the span's place on the idle list, and what is left
    /// after them follows it (indexed: its chunks' hints name this one).
    fn shrink(&mut self, index: SegmentIndex, lo: u64, hi: u64) {
        let span = self.idle_span(index);
        let (arena, start, end) = (span.arena, span.start, span.span_end);
        let (indexed, prev, next) = (span.indexed, span.prev, span.next);
        debug_assert!(start <= lo && lo < hi && hi <= end);
        self.idle_bytes -= (hi - lo) * self.granule;
        match (lo > start, hi < end) {
            (true, true) => {
                self.idle_span_mut(index).span_end = lo;
                self.insert_span(arena, hi, end, Link::to(index), true);
            }
            (true, false) => self.idle_span_mut(index).span_end = lo,
            (false, true) => {
                // The chunk at `hi` heads the rest, in the span's place. The hints of
                // the chunks after it named the old head: the rest is indexed unless
                // the new head is all of it.
                self.idle_span_mut(index).span_end = 0;
                let head = self
                    .at(arena, hi)
                    .get()
                    .expect("an idle span holds whole mapped chunks");
                let alone = hi + self.chunk(head).granules == end;
                self.head_at(head, end, indexed || !alone, prev, next);
                if indexed {
                    self.span_starts[arena].move_start(start, hi, head);
                } else if !alone {
                    self.span_starts[arena].insert(hi, head);
                }
            }
            (false, false) => self.unlist(index),
        }
    }

    /// Takes idle span `index` off the idle list (and the index) whole; the caller
    /// counts its bytes.
    #[inline]
    fn unlist(&mut self, index: SegmentIndex) {
        let span = self.idle_span_mut(index);
        let (arena, start) = (span.arena, span.start);
        let (indexed, prev, next) = (span.indexed, span.prev, span.next);
        span.span_end = 0;
        match self.chunks.linked_mut(prev) {
            Some(before) => before.next = next,
            None => self.idle_head = next,
        }
        match self.chunks.linked_mut(next) {
            Some(after) => after.prev = prev,
            None => self.idle_tail = prev,
        }
        if indexed {
            self.span_starts[arena].remove(start);
        }
    }

    /// Unmaps idle chunks until at most `keep` idle bytes are left: the longest idle
    /// of those that alone suffice (in the [`TRIM_SPANS`] spans idle longest), else
    /// the longest idle, and again (one call per
    /// chunk: a chunk that suffices alone frees the bytes in one call, where the
    /// longest idle might take several). `ranges` names each arena's range.
    pub(crate) fn trim(
        &mut self,
        memory: &mut dyn VirtualMemory,
        ranges: [Option<StorageId>; ARENAS],
        keep: u64,
    ) -> Calls {
        self.list_unlisted();
        let mut calls = Calls::default();
        while self.idle_bytes > keep {
            let Some(index) = self
                .enough_alone(self.idle_bytes - keep)
                .or_else(|| self.longest_idle())
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

    /// The chunk idle longest: the head of the oldest span.
    fn longest_idle(&self) -> Option<SegmentIndex> {
        self.idle_head.get()
    }

    /// The idle chunk idle longest of those of at least `bytes` bytes in the
    /// [`TRIM_SPANS`] spans idle longest, if any (a span smaller than that holds none).
    fn enough_alone(&self, bytes: u64) -> Option<SegmentIndex> {
        let mut cursor = self.idle_head;
        let mut spans = 0;
        while let Some(span) = self.chunks.linked(cursor) {
            spans += 1;
            if spans > TRIM_SPANS {
                return None;
            }
            if (span.span_end - span.start) * self.granule >= bytes {
                let mut g = span.start;
                while g < span.span_end {
                    let index = self.at(span.arena, g).get()?;
                    let chunk = self.chunk(index);
                    if chunk.granules * self.granule >= bytes {
                        return Some(index);
                    }
                    g += chunk.granules;
                }
            }
            cursor = span.next;
        }
        None
    }

    /// Maps `granules` granules of `arena` from `start` as a new chunk (busy in
    /// none, and on no idle span, until the caller counts it).
    #[inline(always)]
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
                    span: Link::NONE,
                    span_end: 0,
                    indexed: false,
                    prev: Link::NONE,
                    next: Link::NONE,
                })
                .index,
        );
        let table = &mut self.table[arena];
        let end = (start + granules) as usize;
        if table.len() < end {
            table.resize(end, Granule::UNMAPPED);
        }
        name_chunk(&mut table[start as usize..end], Link::to(index));
        self.mapped_bytes += bytes;
        Ok(index)
    }

    /// Unmaps chunk `index` (taking it out of its idle span); false, changing
    /// nothing, when the storage refuses.
    fn unmap(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageId,
        index: SegmentIndex,
    ) -> bool {
        let chunk = self.chunk(index);
        let (arena, start, granules) = (chunk.arena, chunk.start, chunk.granules);
        let bytes = granules * self.granule;
        if memory.unmap(range, start * self.granule, bytes).is_err() {
            return false;
        }
        if let Some(span) = self.span_of(index) {
            self.shrink(span, start, start + granules);
        }
        name_chunk(
            &mut self.table[arena][start as usize..(start + granules) as usize],
            Link::NONE,
        );
        self.chunks.discard_at(index.get());
        self.mapped_bytes -= bytes;
        true
    }

    /// Checks the chunks against the live blocks of each arena (`blocks[a]`: offset
    /// and extent of each): every granule a live block touches is mapped, each
    /// granule's live count is the number of live blocks with an edge in it, each
    /// busy chunk's count is the number of its granules they touch, the table and
    /// the chunks agree, the idle spans hold whole chunks and exactly the chunks no
    /// block touches, each idle chunk is found in its span (by its hint or the
    /// index), and the byte counts are exact.
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
        let members = self.check_spans()?;
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
            let member = members.get(&id.index).copied();
            let unlisted = self.unlisted == Link::to(index_at(id.index));
            ensure(!(unlisted && member.is_some()), || {
                format!("the unlisted chunk at granule {} is listed", chunk.start)
            })?;
            if member.is_some() || unlisted {
                idle += bytes;
            }
            let expected = if member.is_some() || unlisted {
                chunk.granules
            } else {
                busy
            };
            ensure(
                (busy == 0) == (member.is_some() || unlisted) && chunk.busy == expected,
                || {
                    format!(
                        "chunk at granule {} counts {} busy granules, live blocks touch {busy}, \
                         idle: {}",
                        chunk.start,
                        chunk.busy,
                        member.is_some()
                    )
                },
            )?;
            ensure(self.span_of(index_at(id.index)) == member, || {
                format!(
                    "chunk at granule {} is not found in its idle span",
                    chunk.start
                )
            })?;
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
        let unlisted = self
            .chunks
            .linked(self.unlisted)
            .map_or(0, |chunk| chunk.granules * self.granule);
        ensure(self.unlisted.is_none() || unlisted > 0, || {
            "the unlisted chunk is dead".into()
        })?;
        let listed: u64 = members
            .keys()
            .filter_map(|&index| self.chunks.at(index))
            .map(|chunk| chunk.granules * self.granule)
            .sum::<u64>()
            + unlisted;
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

    /// Checks the idle list (each span listed once, holding whole chunks from its
    /// start to its end), that spans do not overlap, and that exactly the indexed
    /// ones are found by start; returns the span holding each idle chunk, by the
    /// chunk's index.
    fn check_spans(&self) -> Result<std::collections::HashMap<u32, SegmentIndex>, String> {
        let mut members = std::collections::HashMap::new();
        let mut bounds: [Vec<(u64, u64)>; ARENAS] = Default::default();
        let (mut cursor, mut before, mut indexed) = (self.idle_head, Link::NONE, 0usize);
        while let Some(index) = cursor.get() {
            let span = self
                .chunks
                .linked(cursor)
                .ok_or("the idle list names a dead chunk")?;
            ensure(
                span.prev == before && span.start < span.span_end && span.arena < ARENAS,
                || "broken idle list".into(),
            )?;
            let found = self.span_starts[span.arena].get(span.start) == Some(index);
            ensure(found == span.indexed, || {
                format!(
                    "the idle span at granule {} is indexed: {}, found by start: {found}",
                    span.start, span.indexed
                )
            })?;
            indexed += usize::from(span.indexed);
            let mut g = span.start;
            while g < span.span_end {
                let link = self.at(span.arena, g);
                let chunk = self
                    .chunks
                    .linked(link)
                    .ok_or_else(|| format!("idle span over unmapped granule {g}"))?;
                ensure(chunk.start == g, || {
                    format!("idle span splits the chunk at granule {}", chunk.start)
                })?;
                ensure(g == span.start || chunk.span_end == 0, || {
                    format!("the chunk at granule {g} heads a span inside another")
                })?;
                ensure(
                    members.insert(link.followed().get(), index).is_none(),
                    || "the idle list loops or spans overlap".into(),
                )?;
                g += chunk.granules;
            }
            ensure(g == span.span_end, || {
                format!("idle span ends inside a chunk at granule {}", span.span_end)
            })?;
            bounds[span.arena].push((span.start, span.span_end));
            (before, cursor) = (cursor, span.next);
        }
        ensure(before == self.idle_tail, || {
            "the idle list's tail is wrong".into()
        })?;
        let listed: usize = bounds.iter().map(Vec::len).sum();
        ensure(
            listed
                == self
                    .chunks
                    .iter()
                    .filter(|(_, chunk)| chunk.span_end > 0)
                    .count()
                && indexed == self.span_starts.iter().map(RunMap::len).sum::<usize>(),
            || "idle spans drifted from the list".into(),
        )?;
        for bounds in &mut bounds {
            bounds.sort_unstable();
            ensure(bounds.windows(2).all(|pair| pair[0].1 <= pair[1].0), || {
                "idle spans overlap".into()
            })?;
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::VirtualStorage;

    const GRANULE: u64 = 1 << 21;

    /// A storage of `GRANULE` granules and a range of `granules` of them in it.
    fn storage_and_range(granules: u64) -> (VirtualStorage, StorageId) {
        let mut storage = VirtualStorage::new().with_granularity(GRANULE);
        let range = storage
            .reserve_range(GRANULE * granules, GRANULE)
            .unwrap()
            .id;
        (storage, range)
    }

    /// Claims a block of `extent` bytes at `offset` of arena 0 of `range` and maps the
    /// granules it touches that are unmapped, on no idle chunk it would unmap; whether
    /// it mapped any.
    fn cover(
        chunks: &mut Chunks,
        storage: &mut VirtualStorage,
        range: StorageId,
        offset: u64,
        extent: u64,
    ) -> bool {
        if chunks.claim(0, offset, extent) == 0 {
            return false;
        }
        let (calls, _) = chunks.drop_idle(storage, 0, range, offset, extent);
        assert_eq!(calls, Calls::default());
        chunks
            .map_missing(storage, 0, range, offset, extent)
            .unwrap();
        true
    }

    /// A block alone in its granule, freed and claimed again in place, takes its idle
    /// chunk of one granule back with no map; one that lands alone in a granule of
    /// an idle chunk of several granules (which it cannot take back) is left to map,
    /// the chunk unmapped first, as any claim.
    #[test]
    fn a_block_alone_in_its_granule_takes_its_chunk_back_in_place() {
        let (mut storage, range) = storage_and_range(8);
        let mut chunks = Chunks::new(GRANULE);
        let lone = (512, 4096);
        assert!(cover(&mut chunks, &mut storage, range, lone.0, lone.1));
        for _ in 0..3 {
            chunks.uncover(0, lone.0, lone.1);
            assert_eq!((chunks.idle_bytes(), chunks.idle_spans()), (GRANULE, 1));
            chunks.check([&[], &[]]).unwrap();
            assert_eq!(chunks.claim(0, lone.0, lone.1), 0);
            assert_eq!((chunks.idle_bytes(), chunks.idle_spans()), (0, 0));
            chunks.check([&[(lone.0, lone.1)], &[]]).unwrap();
        }
        // A chunk of three granules, idle; a small block in its middle granule.
        let wide = (2 * GRANULE, 3 * GRANULE);
        assert!(cover(&mut chunks, &mut storage, range, wide.0, wide.1));
        chunks.uncover(0, wide.0, wide.1);
        let small = (3 * GRANULE + 512, 4096);
        assert_eq!(chunks.claim(0, small.0, small.1), GRANULE);
        let (calls, missing) = chunks.drop_idle(&mut storage, 0, range, small.0, small.1);
        assert_eq!((calls.unmaps, missing), (1, GRANULE));
        chunks
            .map_missing(&mut storage, 0, range, small.0, small.1)
            .unwrap();
        chunks
            .check([&[(lone.0, lone.1), (small.0, small.1)], &[]])
            .unwrap();
        assert_eq!(chunks.mapped_bytes(), 2 * GRANULE);
    }

    /// A trim frees the bytes it must free with one chunk that suffices alone when
    /// one lies in the [`TRIM_SPANS`] spans idle longest, and past them unmaps the
    /// longest idle chunks instead, one by one.
    #[test]
    fn a_trim_looks_for_a_chunk_that_suffices_alone_in_the_spans_idle_longest() {
        for singles in [3, TRIM_SPANS + 1] {
            let big = 2 * singles + 1;
            let (mut storage, range) = storage_and_range(big + 8);
            let mut chunks = Chunks::new(GRANULE);
            // One-granule chunks at every other granule, then a chunk of three
            // granules; released in that order, each is an idle span of its own.
            let blocks: Vec<(u64, u64)> = (0..singles)
                .map(|i| (2 * i * GRANULE + 512, 1024))
                .chain([(big * GRANULE, 3 * GRANULE)])
                .collect();
            for &(offset, extent) in &blocks {
                assert!(cover(&mut chunks, &mut storage, range, offset, extent));
            }
            for &(offset, extent) in &blocks {
                chunks.uncover(0, offset, extent);
            }
            assert_eq!(chunks.idle_spans(), singles as usize + 1);
            let idle = chunks.idle_bytes();
            let calls = chunks.trim(&mut storage, [Some(range), None], idle - 2 * GRANULE);
            chunks.check([&[], &[]]).unwrap();
            if singles <= TRIM_SPANS {
                // The chunk of three granules frees the two alone.
                assert_eq!(calls.unmaps, 1);
                assert_eq!(chunks.idle_bytes(), idle - 3 * GRANULE);
                assert!(chunks.at(0, big).is_none());
            } else {
                // Past the bound: the two idle longest, one granule each.
                assert_eq!(calls.unmaps, 2);
                assert_eq!(chunks.idle_bytes(), idle - 2 * GRANULE);
                assert!(chunks.at(0, 0).is_none() && chunks.at(0, 2).is_none());
                assert!(chunks.at(0, big).is_some() && chunks.at(0, 4).is_some());
            }
        }
    }

    /// The scan for a run of unmapped granules stops at the first mapped granule or
    /// at `to`, whichever comes first, wherever the mapped one lies in or after a
    /// block of eight, and counts nothing from a mapped granule.
    #[test]
    fn an_unmapped_run_ends_at_the_first_mapped_granule() {
        const LEN: u64 = 40;
        let mut chunks = Chunks::new(GRANULE);
        for mapped in 0..=LEN {
            chunks.table[0] = vec![Granule::UNMAPPED; LEN as usize];
            if mapped < LEN {
                chunks.table[0][mapped as usize].chunk = Link::to(index_at(7));
            }
            for g in 0..LEN {
                for to in g..=LEN {
                    let expected = (g..to).take_while(|&x| x != mapped).count() as u64;
                    assert_eq!(
                        chunks.unmapped_run(0, g, to),
                        expected,
                        "mapped {mapped}, from {g} to {to}"
                    );
                }
            }
        }
    }

    /// The granule table grows geometrically, from room for [`FIRST_ROOM`] entries:
    /// growing it a granule at a time to millions moves it a few times, not once per
    /// granule (each move copies the whole table), and every entry it adds is unmapped.
    #[test]
    fn the_granule_table_grows_geometrically() {
        const END: u64 = 1 << 21;
        let mut table = Vec::new();
        let mut moves = 0;
        let mut capacity = table.capacity();
        for end in 1..=END {
            grow_table(&mut table, end).expect("room for the table");
            assert_eq!(table.len() as u64, end);
            if table.capacity() != capacity {
                capacity = table.capacity();
                moves += 1;
            }
        }
        assert!(
            moves <= 1 + (END as usize / FIRST_ROOM).ilog2(),
            "{moves} moves"
        );
        assert!(table
            .iter()
            .all(|granule| granule.chunk.is_none() && granule.live == 0));
    }

    /// Naming a chunk in a run of granules names it in each of them, whatever the
    /// run's length (the blocks of four and the rest), and leaves their live counts
    /// and the granules around the run as they were.
    #[test]
    fn naming_a_chunk_sets_every_granule_of_the_run_and_nothing_else() {
        for len in 0..11usize {
            let mut granules: Vec<Granule> = (0..len + 2)
                .map(|i| Granule {
                    chunk: Link::NONE,
                    live: i as u32,
                })
                .collect();
            name_chunk(&mut granules[1..=len], Link::to(index_at(3)));
            for (i, granule) in granules.iter().enumerate() {
                assert_eq!(granule.live, i as u32);
                let inside = (1..=len).contains(&i);
                assert_eq!(
                    granule.chunk.get(),
                    inside.then_some(index_at(3)),
                    "{len} {i}"
                );
            }
            name_chunk(&mut granules[1..=len], Link::NONE);
            assert!(granules.iter().all(|granule| granule.chunk.is_none()));
        }
    }

    /// The fast paths' test for a block in one granule agrees with the granules
    /// `span` finds, at and around granule edges, for empty extents too, and at the
    /// top of the address space.
    #[test]
    fn sole_granule_is_the_span_of_one_granule() {
        let chunks = Chunks::new(GRANULE);
        let edges = [0, 1, GRANULE - 1, GRANULE, GRANULE + 1, 5 * GRANULE - 1];
        let extents = [
            0,
            1,
            2,
            GRANULE / 2,
            GRANULE - 1,
            GRANULE,
            GRANULE + 1,
            3 * GRANULE,
        ];
        let mut alone = 0;
        for offset in edges.into_iter().chain([u64::MAX / 2 - GRANULE]) {
            for extent in extents {
                let (first, end) = chunks.span(offset, extent);
                let expected = (end == first + 1).then_some(first);
                assert_eq!(
                    chunks.sole_granule(offset, extent),
                    expected,
                    "offset {offset}, extent {extent}"
                );
                alone += usize::from(expected.is_some());
            }
        }
        // Both answers occur, the empty extent's among them.
        assert!(alone > 0 && alone < 7 * extents.len());
        assert_eq!(chunks.sole_granule(GRANULE + 1, 0), Some(1));
        assert_eq!(chunks.sole_granule(GRANULE, 0), None);
    }

    /// A block over many idle chunks is claimed, mapped and released in a few steps
    /// (one per idle span it lands on), not one per chunk or granule: the cost that
    /// made the large-tensors replay 14.5x `compact`'s (issue 28). Counted, not
    /// timed: the old walk took a step per chunk, over 200 here.
    #[test]
    fn a_block_over_many_idle_chunks_costs_steps_per_span() {
        const CHUNKS: u64 = 200;
        let (mut storage, range) = storage_and_range(CHUNKS + 8);
        let mut chunks = Chunks::new(GRANULE);
        // One small block per granule, each mapping a chunk of one granule, then
        // all released in granule order: one idle span of 200 chunks.
        for g in 0..CHUNKS {
            cover(&mut chunks, &mut storage, range, g * GRANULE + 512, 1024);
        }
        for g in 0..CHUNKS {
            chunks.uncover(0, g * GRANULE + 512, 1024);
        }
        assert_eq!(
            (chunks.idle_spans(), chunks.count_in(0)),
            (1, CHUNKS as usize)
        );
        // A block over granules 0..CHUNKS takes all 200 chunks back, a granule
        // more (unmapped) is mapped, and its release lists one span again.
        let before = chunks.steps();
        let extent = (CHUNKS + 1) * GRANULE - 4096;
        cover(&mut chunks, &mut storage, range, 0, extent);
        chunks.check([&[(0, extent)], &[]]).unwrap();
        chunks.uncover(0, 0, extent);
        chunks.check([&[], &[]]).unwrap();
        let steps = chunks.steps() - before;
        assert!(steps <= 4, "{steps} steps");
        assert_eq!(chunks.idle_spans(), 1);
        assert_eq!(chunks.idle_bytes(), (CHUNKS + 1) * GRANULE);
        assert_eq!(chunks.count_in(0), CHUNKS as usize + 1);
    }

    /// A block of few granules (mapped by walking its granules) whose map fails
    /// part way unmaps what it mapped, and its claim is undone with the books exact.
    #[test]
    fn a_small_block_whose_map_fails_is_undone() {
        let mut storage = VirtualStorage::with_limit(2 * GRANULE).with_granularity(GRANULE);
        let range = storage.reserve_range(GRANULE * 16, GRANULE).unwrap().id;
        let mut chunks = Chunks::new(GRANULE);
        // Granules 1 to 3: an edge, one inside, an edge; the third map fails.
        let (offset, extent) = (GRANULE + 512, 3 * GRANULE - 1024);
        assert_eq!(chunks.claim(0, offset, extent), 3 * GRANULE);
        let (calls, missing) = chunks.drop_idle(&mut storage, 0, range, offset, extent);
        assert_eq!((calls, missing), (Calls::default(), 3 * GRANULE));
        let failed = chunks.map_missing(&mut storage, 0, range, offset, extent);
        assert!(matches!(failed, Err(MappingError::OutOfMemory { .. })));
        chunks.unclaim(0, offset, extent);
        chunks.check([&[], &[]]).unwrap();
        assert_eq!((chunks.mapped_bytes(), storage.bytes_mapped()), (0, 0));
        // With room, the same block maps three chunks and releases them idle.
        let mut storage = VirtualStorage::new().with_granularity(GRANULE);
        let range = storage.reserve_range(GRANULE * 16, GRANULE).unwrap().id;
        assert_eq!(chunks.claim(0, offset, extent), 3 * GRANULE);
        chunks.drop_idle(&mut storage, 0, range, offset, extent);
        let calls = chunks.map_missing(&mut storage, 0, range, offset, extent);
        assert_eq!(calls.unwrap().maps, 3);
        chunks.check([&[(offset, extent)], &[]]).unwrap();
        chunks.uncover(0, offset, extent);
        chunks.check([&[], &[]]).unwrap();
        assert_eq!(chunks.idle_bytes(), 3 * GRANULE);
    }

    /// A claim whose map fails (the storage is full) is undone chunk by chunk: the
    /// idle chunks it took back are idle again, what it mapped is unmapped, and the
    /// books hold (checked against no live block).
    #[test]
    fn a_claim_whose_map_fails_is_undone() {
        let mut storage = VirtualStorage::with_limit(6 * GRANULE).with_granularity(GRANULE);
        let range = storage.reserve_range(GRANULE * 64, GRANULE).unwrap().id;
        let mut chunks = Chunks::new(GRANULE);
        // Three chunks of one granule, idle, then a block over them and eight more
        // granules, which the storage cannot hold.
        for g in [1, 2, 3] {
            let offset = g * GRANULE + 512;
            assert_ne!(chunks.claim(0, offset, 1024), 0);
            chunks
                .map_missing(&mut storage, 0, range, offset, 1024)
                .unwrap();
        }
        for g in [1, 2, 3] {
            chunks.uncover(0, g * GRANULE + 512, 1024);
        }
        let (offset, extent) = (GRANULE, 11 * GRANULE);
        assert_ne!(chunks.claim(0, offset, extent), 0);
        let (calls, missing) = chunks.drop_idle(&mut storage, 0, range, offset, extent);
        assert_eq!((calls, missing), (Calls::default(), 8 * GRANULE));
        let failed = chunks.map_missing(&mut storage, 0, range, offset, extent);
        assert!(matches!(failed, Err(MappingError::OutOfMemory { .. })));
        chunks.unclaim(0, offset, extent);
        chunks.check([&[], &[]]).unwrap();
        assert_eq!(chunks.idle_bytes(), 3 * GRANULE);
        assert_eq!(chunks.mapped_bytes(), 3 * GRANULE);
        assert_eq!(storage.bytes_mapped(), 3 * GRANULE);
    }
}
