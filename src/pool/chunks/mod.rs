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
//! the table's links, sixteen a block with no exit inside a block) and a chunk's
//! granules are named in the table with one fill (the links are an array of their
//! own, see `table::GranuleTable`). At GPU scale, where most blocks span hundreds of
//! granules, a step per granule through [`Chunks::at`] was up to half a replay's
//! instructions:
//! with every size of the shared and captured traces multiplied by 128
//! (`virtual_tradeoff.py --scaled-up`'s largest factor) the default's replays run
//! 0.4-54 % fewer instructions, 5 % or more on 17 of the 19 (lstm-train 4.38 M to 2.00
//! M, gpt2-train 5.14 M to 4.22 M; gpt2-generate and kv-generate, of few large blocks,
//! 0.4 %; the `replay` function's, inclusive, callgrind of `replay_ab TRACE compact
//! virtual_pages 0`), the traces as captured 0.1-0.8 % fewer, and the placements,
//! calls and FIFO and steady-state steps of `examples/peer_loops.rs` are unchanged.
//!
//! The granule table grows only over granules the storage has mapped: [`Chunks::map`]
//! grows it after the storage's map, never before, and a claim counts the granules past
//! its end as unmapped without writing an entry (an edge of the block among them is
//! counted live once mapped, see `Pending::booked`). The claim grew it to the block's
//! end granule before the storage was asked: a reservation of 1 TiB less 1 MiB in 4 KiB
//! granules on a storage of 1 MiB filled 2 GiB of entries (1.7 s) and only then failed,
//! keeping them through the cleanup, and one of tens of TiB took hundreds of GiB, for
//! the kernel to kill the process. A map undone part way cuts the table back to the
//! length and room it had ([`GranuleTable::cut_back`]), so a refused block leaves the
//! books as they were, and its claim is undone a run of unmapped granules at a time
//! (`Chunks::each_chunk_inside`; a step per granule would take days over the 2^51
//! granules of 2^62 bytes in 2 KiB granules, which the storage may map and the table
//! then cannot name). Growing at the claim and cutting back after a refusal would still
//! touch the memory for a while, and refusing before growing where the storage cannot
//! hold the block needs a count of its free memory, which [`VirtualMemory`] does not
//! give (CUDA's is stale as soon as read); growing as the storage maps needs neither,
//! and costs the hot paths nothing: the FIFO and steady steps of
//! `examples/peer_loops.rs` ran 433.0 and 1015.2 instructions before, 433.0 and 1014.7
//! after, and the shared traces' replays -0.08 % to +0.0001 % of their instructions
//! before (gpt2-train 2.761 M, vit-train 2.559 M to 2.557 M; the `replay` function's,
//! inclusive, callgrind of `replay_ab TRACE compact default 0`); their placements,
//! storage calls and peaks are the same (`examples/placements.rs`).
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

mod check;
mod claim;
mod idle;
mod map;
mod release;
mod table;
#[cfg(test)]
mod tests;
mod trim;

use super::bins::{Link, SegmentIndex};
use super::Slab;
use crate::storage::RunMap;
#[cfg(doc)]
use crate::storage::VirtualMemory;
use table::GranuleTable;

/// The number of address ranges (arenas) the chunks are kept for.
pub(crate) const ARENAS: usize = 2;

/// The most granules past its first that a block may span and still be claimed,
/// mapped and released chunk by chunk (see the module doc). 4, 8 and 16 cost the
/// shared traces' replays the same; 8 and 16 cost large-tensors' 1.6 % and 8.6 %
/// more of the chunks' and storage's instructions (callgrind, when measured).
const WALKED: u64 = 4;

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
    /// While it heads an idle span: a bound on the granules of its largest chunk,
    /// which [`Chunks::trim`]'s search reads instead of visiting the span's chunks.
    /// Invariant: at least the largest chunk's granules, at most the span's. A bound
    /// rather than the largest itself: a chunk taken out of a span lowers it only to
    /// what is left of the span's length (its other chunks are not visited then).
    span_largest: u64,
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
    /// The length of its arena's granule table at its claim. Its edge granules at or
    /// past it (unmapped, counted by no block) have no entry yet, so the claim
    /// counts them in none: [`Chunks::map_missing`] counts them live once the storage
    /// has mapped them and the table has grown over them
    /// ([`Chunks::count_edges_past`]), and a failed map, which cuts the table back
    /// to this length, leaves them uncounted, as [`Chunks::unclaim`] finds them.
    booked: u64,
}

/// The mapped chunks of every arena of one pool.
#[derive(Debug, Clone)]
pub(crate) struct Chunks {
    /// The bytes of a granule: a power of two, `1 << shift`.
    granule: u64,
    shift: u32,
    /// For each arena, each granule's chunk and live count. Invariant: a chunk named
    /// is a live chunk of that arena spanning the granule, and every granule of a
    /// chunk names it; as long as the highest granule ever mapped (or a map undone
    /// since, see [`GranuleTable::cut_back`]), the granules past its end unmapped
    /// and counted by no live block: it grows only over granules the storage has
    /// just mapped ([`Chunks::map`]), so a block the storage refuses touches no
    /// entry past it (see the module doc).
    table: [GranuleTable; ARENAS],
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
    /// release cost besides their edges, counted so tests can bound it. It wraps: a
    /// claim of a huge block adds a long run, and thousands of those (each failing to
    /// map) passed 2^64, whose overflow check panicked mid-claim (helper-141's find).
    steps: u64,
}

impl Chunks {
    /// No chunk yet, for granules of `granule` bytes: a power of two, or the books
    /// are never used (the virtual pool opens no range with another granule).
    pub(crate) fn new(granule: u64) -> Self {
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

    /// Calls `count` with each chunk holding granules of `[g, end)` of `arena` and
    /// how many of them it holds, in granule order; returns how many are unmapped
    /// plus what the calls return. Visits every chunk: for the cold paths and blocks
    /// of few granules only.
    ///
    /// With `RUNS`, passes each run of unmapped granules in one scan
    /// ([`Chunks::unmapped_run`], which counts those past the table's end without
    /// one): for undoing the claim of a block of any size, where a block the storage
    /// refused may span billions of unmapped granules (2^51 for 2^62 bytes in 2 KiB
    /// granules), days of steps one granule at a time. Without, a step per unmapped
    /// granule: for the blocks of at most [`WALKED`] + 1 granules, whose replays ran
    /// 0.05-0.16 % more instructions with the scan (gpt2-train, transformer-train,
    /// vit-train; the `replay` function's, callgrind of `replay_ab TRACE compact
    /// default 0`).
    fn each_chunk_inside<const RUNS: bool>(
        &mut self,
        arena: usize,
        mut g: u64,
        end: u64,
        mut count: impl FnMut(&mut Self, SegmentIndex, u64) -> u64,
    ) -> u64 {
        let mut unmapped = 0;
        while g < end {
            self.steps = self.steps.wrapping_add(1);
            let Some(index) = self.at(arena, g).get() else {
                let run = if RUNS {
                    self.unmapped_run(arena, g, end)
                } else {
                    1
                };
                unmapped += run;
                g += run;
                continue;
            };
            let chunk = self.chunk(index);
            let stop = end.min(chunk.start + chunk.granules);
            unmapped += count(self, index, stop - g);
            g = stop;
        }
        unmapped
    }
}
