//! Tests of the allocator model: each rule through requests and frees, and random
//! requests under random settings keeping every invariant.

use super::*;
use crate::trace::torch_model::MIB;
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
fn roundup_power2_divisions_apply_by_size_interval() {
    // [1:2,2:4,4:8,>:1]: 2 divisions under 2 MiB, 4 in [2, 4) MiB, 8 in [4, 8) MiB, 1
    // (512 B rounding) in [8, 16) MiB, 2^55 from 16 MiB, whose bound of 512 B times it
    // wraps to 0 as PyTorch's size_t does. Each size in a fresh model, by hand:
    let settings = TorchSettings::parse(
        "torch(roundup_power2_divisions=[1:2,2:4,4:8,8:1,>:36028797018963968])",
    )
    .unwrap();
    for (size, rounded) in [
        // Interval 0, 2 divisions: 700 B is under 512 B * 2, so 512 B rounding.
        (700, 1024),
        // 600 KiB + 1 B: steps of 256 KiB in [512 KiB, 1 MiB).
        (600 * KIB + 1, 768 * KIB),
        // 1.5 MiB + 1 B: steps of 512 KiB in [1, 2) MiB.
        (3 * MIB / 2 + 1, 2 * MIB),
        // Interval 1, 4 divisions: steps of 512 KiB in [2, 4) MiB.
        (5 * MIB / 2 + 1, 3 * MIB),
        // Interval 2, 8 divisions: steps of 512 KiB in [4, 8) MiB.
        (5 * MIB + 1, 11 * MIB / 2),
        // Interval 3, 1 division: 512 B rounding.
        (9 * MIB + 1, 9 * MIB + 512),
        // From interval 4, 2^55 divisions: 512 B x 2^55 wraps to 0, the step is 0, so
        // the next power of two.
        (17 * MIB, 32 * MIB),
        ((40 << 30) + 1, 64 << 30),
    ] {
        let mut m = model(settings, None);
        assert_eq!(take(&mut m, size).2, rounded, "{size}");
    }
}

#[test]
fn the_largest_divisions_and_limits_do_not_overflow() {
    // roundup_power2_divisions = 2^63 passes the setter (a power of two): 512 B times
    // it overflowed. As in PyTorch's size_t arithmetic, the bound wraps to 0 (from 2^55
    // divisions on) and a division's step is 0, so every size rounds to the next power
    // of two (it was taken as a bound above every size, 512 B rounding: helper-140).
    for divisions in [1u64 << 55, 1 << 63] {
        let text = format!("torch(roundup_power2_divisions={divisions})");
        let mut m = model(TorchSettings::parse(&text).unwrap(), None);
        assert_eq!(take(&mut m, 3000).2, 4096);
        assert_eq!(take(&mut m, 11 * MIB).2, 16 * MIB);
    }
    // Below 2^55 the bound is 512 B times the divisions, above these sizes.
    let settings = TorchSettings::parse("torch(roundup_power2_divisions=36028797018963968)");
    let mut m = model(
        settings
            .unwrap()
            .with_roundup_power2_divisions(Some(1 << 54))
            .unwrap(),
        None,
    );
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
