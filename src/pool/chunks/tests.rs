//! The unit tests of the chunks.

use super::table::{grow_table, grow_table_within, name_chunk, GranuleTable, FIRST_ROOM};
use super::trim::TRIM_SPANS;
use super::*;
use crate::pool::bins::index_at;
use crate::storage::{MappingError, StorageId, VirtualMemory, VirtualStorage};

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
/// block of sixteen, counts nothing from a mapped granule, and counts the granules
/// past the table's end (unmapped) up to `to`, from inside the table or past it.
#[test]
fn an_unmapped_run_ends_at_the_first_mapped_granule() {
    const LEN: u64 = 40;
    const PAST: u64 = LEN + 20;
    let mut chunks = Chunks::new(GRANULE);
    for mapped in 0..=LEN {
        chunks.table[0] = GranuleTable {
            chunk: vec![Link::NONE; LEN as usize],
            live: vec![0; LEN as usize],
        };
        // `mapped` of `LEN`: none is.
        let mapped = (mapped < LEN).then_some(mapped);
        if let Some(mapped) = mapped {
            chunks.table[0].chunk[mapped as usize] = Link::to(index_at(7));
        }
        for g in 0..PAST {
            for to in g..=PAST {
                let expected = (g..to).take_while(|&x| Some(x) != mapped).count() as u64;
                assert_eq!(
                    chunks.unmapped_run(0, g, to),
                    expected,
                    "mapped {mapped:?}, from {g} to {to}"
                );
            }
        }
    }
}

/// The table does not grow past the host's available memory: its entries are written
/// at once, and a room the kernel lets through (overcommit) but cannot back would have
/// been filled until the process was killed. Refused, it is as it was.
#[test]
fn the_granule_table_grows_only_within_the_hosts_available_memory() {
    let mut table = GranuleTable::default();
    grow_table_within(&mut table, 10, None).unwrap();
    let before = table.size();
    // Growing to 2 * FIRST_ROOM adds about 2^17 entries of 8 bytes, 1 MiB: a host with
    // 512 KiB refuses them.
    let end = 2 * FIRST_ROOM;
    assert_eq!(grow_table_within(&mut table, end, Some(512 * 1024)), None);
    assert_eq!(table.size(), before, "a refused growth changed the table");
    grow_table_within(&mut table, end, Some(8 * end as u64)).expect("room for the entries");
    assert_eq!(table.len(), end);
    assert!(table.chunk.iter().all(|&chunk| chunk == Link::NONE));
    // One granule past a full room doubles the room, which the table later lengthens
    // into unchecked: the whole new room is what the host must have.
    let full = table.chunk.capacity();
    let before = table.size();
    assert_eq!(grow_table_within(&mut table, full + 1, Some(8 * 2)), None);
    assert_eq!(table.size(), before);
    grow_table_within(&mut table, full + 1, Some(8 * full as u64)).expect("room for the doubling");
}

/// The granule table grows geometrically, from room for [`FIRST_ROOM`] entries:
/// growing it a granule at a time to millions moves it a few times, not once per
/// granule (each move copies the whole table), and every entry it adds is unmapped.
#[test]
fn the_granule_table_grows_geometrically() {
    const END: u64 = 1 << 21;
    let mut table = GranuleTable::default();
    let mut moves = 0;
    let mut capacity = table.chunk.capacity();
    for end in 1..=END {
        grow_table(&mut table, end).expect("room for the table");
        assert_eq!(table.chunk.len() as u64, end);
        assert_eq!(table.live.len() as u64, end);
        if table.chunk.capacity() != capacity {
            capacity = table.chunk.capacity();
            moves += 1;
        }
    }
    assert!(
        moves <= 1 + (END as usize / FIRST_ROOM).ilog2(),
        "{moves} moves"
    );
    assert!(table.chunk.iter().all(|link| link.is_none()));
    assert!(table.live.iter().all(|&live| live == 0));
}

/// A claim of a block past the granule table's end grows the table by nothing, and
/// a map the storage refuses leaves it as it was, its length and its room: whether
/// the block maps nothing (one run, refused) or first maps an edge granule of its
/// own past the table's first room (undone). The claim, undone, leaves the books
/// as they were, and a block that fits is claimed and mapped after, its edge past
/// the table's end counted live once mapped.
#[test]
fn a_refused_block_past_the_tables_end_leaves_the_table_as_it_was() {
    const GRANULES: u64 = 1 << 20;
    let mut storage = VirtualStorage::with_limit(4 * GRANULE).with_granularity(GRANULE);
    let range = storage
        .reserve_range(GRANULE * GRANULES, GRANULE)
        .unwrap()
        .id;
    let mut chunks = Chunks::new(GRANULE);
    let kept = (512, 4096);
    assert!(cover(&mut chunks, &mut storage, range, kept.0, kept.1));
    let before = chunks.table[0].size();
    let past_room = FIRST_ROOM as u64 + 5;
    let refused = [
        // Granules 1 to the range's end but one, wholly covered: one run.
        (GRANULE, (GRANULES - 2) * GRANULE),
        // From inside granule `past_room` (a chunk of its own, which the storage
        // maps) to near the range's end.
        (
            past_room * GRANULE + 512,
            (GRANULES - past_room - 2) * GRANULE,
        ),
    ];
    for (offset, extent) in refused {
        assert!(chunks.claim(0, offset, extent) >= (GRANULES - past_room - 2) * GRANULE);
        assert_eq!(chunks.table[0].size(), before, "the claim grew the table");
        let (calls, _) = chunks.drop_idle(&mut storage, 0, range, offset, extent);
        assert_eq!(calls, Calls::default());
        let refusal = chunks.map_missing(&mut storage, 0, range, offset, extent);
        assert!(matches!(refusal, Err(MappingError::OutOfMemory { .. })));
        assert_eq!(
            chunks.table[0].size(),
            before,
            "the refused map grew the table"
        );
        chunks.unclaim(0, offset, extent);
        chunks.check([&[kept], &[]]).unwrap();
        assert_eq!(chunks.mapped_bytes(), GRANULE);
    }
    // A block that fits, its last edge past the table's end (and its first too).
    let fits = (past_room * GRANULE + 512, 2 * GRANULE);
    assert!(cover(&mut chunks, &mut storage, range, fits.0, fits.1));
    assert_eq!(chunks.table[0].len() as u64, past_room + 3);
    chunks.check([&[kept, fits], &[]]).unwrap();
    chunks.uncover(0, fits.0, fits.1);
    chunks.check([&[kept], &[]]).unwrap();
}

/// Naming a chunk in a run of granules names it in each of them, whatever the
/// run's length, and leaves the granules around the run as they were.
#[test]
fn naming_a_chunk_sets_every_granule_of_the_run_and_nothing_else() {
    for len in 0..40usize {
        let mut links = vec![Link::to(index_at(9)); len + 2];
        name_chunk(&mut links[1..=len], Link::to(index_at(3)));
        for (i, link) in links.iter().enumerate() {
            let inside = (1..=len).contains(&i);
            let expected = if inside { index_at(3) } else { index_at(9) };
            assert_eq!(link.get(), Some(expected), "{len} {i}");
        }
        name_chunk(&mut links[1..=len], Link::NONE);
        for (i, link) in links.iter().enumerate() {
            assert_eq!(link.is_none(), (1..=len).contains(&i), "{len} {i}");
        }
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

/// [`Chunks::enough_alone`] without the spans' bounds: every chunk of each of the
/// [`TRIM_SPANS`] spans idle longest visited (a span too short for `bytes` holds no
/// chunk that suffices, as the search before the bounds skipped it).
fn enough_alone_visiting_every_chunk(chunks: &Chunks, bytes: u64) -> Option<SegmentIndex> {
    let mut cursor = chunks.idle_head;
    for _ in 0..TRIM_SPANS {
        let span = chunks.chunks.linked(cursor)?;
        let mut g = span.start;
        while g < span.span_end {
            let index = chunks.at(span.arena, g).get()?;
            let chunk = chunks.chunk(index);
            if chunk.granules * chunks.granule >= bytes {
                return Some(index);
            }
            g += chunk.granules;
        }
        cursor = span.next;
    }
    None
}

/// [`Chunks::trim`] with each search [`enough_alone_visiting_every_chunk`].
fn trim_reading_the_list_each_time(
    chunks: &mut Chunks,
    storage: &mut VirtualStorage,
    range: StorageId,
    keep: u64,
) -> Calls {
    chunks.list_unlisted();
    let mut calls = Calls::default();
    while chunks.idle_bytes > keep {
        let need = chunks.idle_bytes - keep;
        let Some(index) =
            enough_alone_visiting_every_chunk(chunks, need).or_else(|| chunks.idle_head.get())
        else {
            break;
        };
        if !chunks.unmap(storage, range, index) {
            break;
        }
        calls.unmaps += 1;
    }
    calls
}

/// The chunks of arena 0 as (first granule, granules), in granule order, and the
/// idle list as its spans' (start, end).
fn layout(chunks: &Chunks) -> [Vec<(u64, u64)>; 2] {
    let mut all: Vec<(u64, u64)> = chunks
        .chunks
        .iter()
        .map(|(_, chunk)| (chunk.start, chunk.granules))
        .collect();
    all.sort_unstable();
    let mut spans = Vec::new();
    let mut cursor = chunks.idle_head;
    while let Some(span) = chunks.chunks.linked(cursor) {
        spans.push((span.start, span.span_end));
        cursor = span.next;
    }
    [all, spans]
}

mod spans_bound_their_largest_chunk {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    /// One step: place or free block `block` (of the blocks the case lays out), or
    /// trim to `keep` granules of idle bytes.
    #[derive(Debug, Clone)]
    enum Step {
        Toggle(usize),
        Trim(u64),
    }

    /// Steps over `blocks` blocks, trims keeping fewer than `kept` granules.
    fn step(blocks: usize, kept: u64) -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0..blocks).prop_map(Step::Toggle),
            1 => (0..kept).prop_map(Step::Trim),
        ]
    }

    /// Lays out blocks one after another, each after a gap of `gap` granules (0:
    /// sharing its first granule with the block before) and `granules` long, less a
    /// little so that edges fall inside granules; runs `steps` over them, checking
    /// after each that the search with the spans' bounds finds the chunk the search
    /// that visits every chunk finds for every size asked, that a trim unmaps the
    /// chunks a trim whose searches visit every chunk unmaps, and that each span's
    /// bound holds its largest chunk (`Chunks::check`).
    fn run(sizes: &[(u64, u64)], steps: Vec<Step>) -> Result<(), TestCaseError> {
        let mut blocks = Vec::new();
        let mut offset = 512;
        for &(gap, granules) in sizes {
            offset += gap * GRANULE;
            let extent = granules * GRANULE - 1024;
            blocks.push((offset, extent));
            offset += extent + 512;
        }
        let (mut storage, range) = storage_and_range(offset / GRANULE + 2);
        let mut chunks = Chunks::new(GRANULE);
        let mut live = vec![false; blocks.len()];
        for step in steps {
            match step {
                Step::Toggle(i) => {
                    let (offset, extent) = blocks[i];
                    if live[i] {
                        chunks.uncover(0, offset, extent);
                    } else if chunks.claim(0, offset, extent) > 0 {
                        chunks.drop_idle(&mut storage, 0, range, offset, extent);
                        chunks
                            .map_missing(&mut storage, 0, range, offset, extent)
                            .unwrap();
                    }
                    live[i] = !live[i];
                }
                Step::Trim(keep) => {
                    let (mut before, mut storage_before) = (chunks.clone(), storage.clone());
                    let expected = trim_reading_the_list_each_time(
                        &mut before,
                        &mut storage_before,
                        range,
                        keep * GRANULE,
                    );
                    let calls = chunks.trim(&mut storage, [Some(range), None], keep * GRANULE);
                    prop_assert_eq!(calls, expected);
                    prop_assert_eq!(layout(&chunks), layout(&before));
                    prop_assert_eq!(storage.bytes_mapped(), storage_before.bytes_mapped());
                }
            }
            chunks.list_unlisted();
            for granules in 1..13 {
                let bytes = granules * GRANULE;
                let expected = enough_alone_visiting_every_chunk(&chunks, bytes);
                prop_assert_eq!(
                    chunks.enough_alone(bytes),
                    expected,
                    "{} granules",
                    granules
                );
            }
            let held: Vec<(u64, u64)> = blocks
                .iter()
                .zip(&live)
                .filter(|(_, &live)| live)
                .map(|(&block, _)| block)
                .collect();
            prop_assert_eq!(chunks.check([&held, &[]]), Ok(()));
        }
        Ok(())
    }

    proptest! {
        /// [`run`] over 24 blocks of 1-11 granules, some sharing a granule.
        #[test]
        fn the_bounded_search_finds_what_visiting_every_chunk_finds(
            sizes in prop::collection::vec((0..3u64, 1..12u64), 24),
            steps in prop::collection::vec(step(24, 12), 1..120),
        ) {
            run(&sizes, steps)?;
        }
    }

    proptest! {
        // Each case is hundreds of steps over 200 blocks.
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// [`run`] over 200 blocks of 1-3 granules apart, so that more than
        /// [`TRIM_SPANS`] spans lie idle and the searches stop at the bound.
        #[test]
        fn past_the_spans_searched_a_trim_unmaps_what_visiting_every_chunk_unmaps(
            sizes in prop::collection::vec((1..3u64, 1..4u64), 200),
            steps in prop::collection::vec(step(200, 400), 200..800),
        ) {
            run(&sizes, steps)?;
        }
    }
}
