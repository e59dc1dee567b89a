//! The virtual pool: placement never overlaps and never moves, mapped granules cover
//! every live byte and only those the release policy keeps, the books are exact.

use cubepool::pool::{MemoryPool, Placement, SlotId, VirtualPool};
mod common;

use common::Buffers;
use cubepool::{ComputeStorage, PoolError, VirtualStorage};
#[cfg(not(feature = "exclusive-memory-only"))]
use cubepool::{MemoryConfiguration, MemoryDeviceProperties, MemoryManagement};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GRANULE: u64 = 4 * KIB;

/// One step of a program against a virtual pool.
#[derive(Debug, Clone)]
enum Step {
    Reserve(u64),
    /// Release the live reservation at this index (modulo the live count).
    Release(usize),
    Cleanup,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        // Blocks inside one granule, across a few, and across many (whose inside
        // granules count busy chunk by chunk).
        6 => prop_oneof![
            1u64..=1024,
            1025u64..=64 * KIB,
            64 * KIB + 1..=512 * KIB,
            Just(GRANULE),
            Just(3 * GRANULE),
        ]
        .prop_map(Step::Reserve),
        5 => any::<usize>().prop_map(Step::Release),
        1 => Just(Step::Cleanup),
    ]
}

/// Checks what the pool's own invariants cannot see: live placements never overlap
/// and never move, the storage holds exactly the mapped bytes, and idle mapped bytes
/// stay within `keep`.
fn check_outside(
    pool: &VirtualPool,
    storage: &VirtualStorage,
    live: &[Placement],
    keep: u64,
) -> Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)?;
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|p| (p.storage.address + p.offset, p.size))
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        prop_assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap: {pair:?}");
    }
    for placement in live {
        prop_assert_eq!(
            pool.locate(placement.slot),
            Some(*placement),
            "a block moved"
        );
    }
    prop_assert_eq!(pool.usage().bytes_reserved, storage.bytes_allocated());
    prop_assert!(
        pool.idle_bytes() <= keep,
        "{} idle > keep {keep}",
        pool.idle_bytes()
    );
    Ok(())
}

/// The bytes of the granules that live placements touch.
fn touched_bytes(live: &[Placement]) -> u64 {
    let mut granules: Vec<u64> = live
        .iter()
        .flat_map(|p| {
            let start = p.storage.address + p.offset;
            start / GRANULE..(start + p.size).div_ceil(GRANULE)
        })
        .collect();
    granules.sort_unstable();
    granules.dedup();
    granules.len() as u64 * GRANULE
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any program of reserves, releases and cleanups, eager or keeping some idle
    /// granules: after every step the pool's invariants hold (no overlap, mapped
    /// granules cover every live byte, no unmapped granule holds one, exact books),
    /// no block moved, the storage holds exactly the mapped bytes, placements are
    /// the eager policy's (they do not depend on what is mapped), and idle granules
    /// never raise the peak of mapped bytes.
    #[test]
    fn every_step_keeps_the_invariants(
        steps in prop::collection::vec(step(), 1..200),
        keep in prop_oneof![
            Just(Some(0u64)),
            Just(Some(2 * GRANULE)),
            Just(Some(16 * GRANULE)),
            Just(None),
        ],
        small in prop_oneof![Just(0u64), Just(1024u64)],
    ) {
        let mut storage = VirtualStorage::new().with_granularity(GRANULE);
        let mut pool = VirtualPool::new(GRANULE, 64 * MIB, small, keep, 64);
        // The same program, unmapping eagerly: the same placements.
        let mut eager_storage = VirtualStorage::new().with_granularity(GRANULE);
        let mut eager = VirtualPool::new(GRANULE, 64 * MIB, small, Some(0), 64);
        let mut live: Vec<Placement> = Vec::new();
        let mut touched_peak = 0;
        for step in steps {
            match step {
                Step::Reserve(size) => {
                    let placed = pool.reserve(&mut storage, size).unwrap();
                    let expected = eager.reserve(&mut eager_storage, size).unwrap();
                    prop_assert_eq!((placed.slot, placed.offset), (expected.slot, expected.offset));
                    live.push(placed);
                }
                Step::Release(index) if !live.is_empty() => {
                    let placement = live.swap_remove(index % live.len());
                    let released = pool.release_with(&mut storage, placement.slot).unwrap();
                    prop_assert_eq!(released.size, placement.size);
                    eager.release_with(&mut eager_storage, placement.slot).unwrap();
                }
                Step::Release(_) => {}
                Step::Cleanup => {
                    pool.cleanup(&mut storage, 0, true);
                    eager.cleanup(&mut eager_storage, 0, true);
                }
            }
            check_outside(&pool, &storage, &live, keep.unwrap_or(u64::MAX))?;
            prop_assert_eq!(eager.idle_bytes(), 0);
            // Idle granules never raise the peak: it is the most bytes of chunks
            // that live blocks touch.
            touched_peak = touched_peak.max(pool.usage().bytes_reserved - pool.idle_bytes());
            prop_assert_eq!(pool.stats().bytes_reserved_peak, touched_peak);
            // The chunks live blocks touch are the eager policy's, so the peak of
            // mapped bytes is the eager policy's whatever `keep` is.
            prop_assert_eq!(
                pool.usage().bytes_reserved - pool.idle_bytes(),
                eager.usage().bytes_reserved
            );
            prop_assert_eq!(
                pool.stats().bytes_reserved_peak,
                eager.stats().bytes_reserved_peak
            );
            // And those are exactly the granules live blocks touch.
            prop_assert_eq!(eager.usage().bytes_reserved, touched_bytes(&live));
        }
        for placement in live.drain(..) {
            pool.release_with(&mut storage, placement.slot).unwrap();
        }
        pool.cleanup(&mut storage, 0, true);
        check_outside(&pool, &storage, &live, 0)?;
        prop_assert_eq!(storage.bytes_allocated(), 0, "all memory is given back");
    }
}

#[test]
fn eager_release_unmaps_a_granule_as_soon_as_no_live_byte_is_in_it() {
    let mut storage = VirtualStorage::new().with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(0), 64);
    let a = pool.reserve(&mut storage, 3 * GRANULE).unwrap();
    let b = pool.reserve(&mut storage, GRANULE).unwrap();
    assert_eq!(b.offset, 3 * GRANULE, "placed right after a");
    assert_eq!(storage.bytes_allocated(), 4 * GRANULE);
    pool.release_with(&mut storage, a.slot).unwrap();
    assert_eq!(
        storage.bytes_allocated(),
        GRANULE,
        "a's granules are unmapped at once"
    );
    assert_eq!((storage.allocations(), storage.deallocations()), (2, 1));
    pool.check_invariants().unwrap();
}

#[test]
fn kept_idle_granules_serve_the_next_request_without_a_storage_call() {
    let mut storage = VirtualStorage::new().with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(8 * GRANULE), 64);
    let a = pool.reserve(&mut storage, 4 * GRANULE).unwrap();
    pool.release_with(&mut storage, a.slot).unwrap();
    assert_eq!(pool.idle_bytes(), 4 * GRANULE, "kept: within the bound");
    let again = pool.reserve(&mut storage, 4 * GRANULE).unwrap();
    assert_eq!(again.offset, a.offset);
    assert_eq!(
        (storage.allocations(), storage.deallocations()),
        (1, 0),
        "one map for both"
    );
    // Past the bound, the longest idle go first.
    let b = pool.reserve(&mut storage, 6 * GRANULE).unwrap();
    pool.release_with(&mut storage, again.slot).unwrap();
    pool.release_with(&mut storage, b.slot).unwrap();
    assert_eq!(
        pool.idle_bytes(),
        6 * GRANULE,
        "the older 4 granules were unmapped"
    );
    assert_eq!(storage.deallocations(), 1);
    pool.cleanup(&mut storage, 0, true);
    assert_eq!((pool.idle_bytes(), storage.bytes_allocated()), (0, 0));
    pool.check_invariants().unwrap();
}

/// A pool keeping every idle granule, with a half granule held at offset 0 and a
/// block of 6 granules after it, released: granule 0 (shared), granules 1-5 (one
/// chunk, covered wholly) and granule 6 (one chunk, covered in part) mapped, the last
/// two idle.
fn pool_with_idle_chunks() -> (VirtualPool, VirtualStorage, Placement) {
    let mut storage = VirtualStorage::new().with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, None, 64);
    let held = pool.reserve(&mut storage, GRANULE / 2).unwrap();
    let a = pool.reserve(&mut storage, 6 * GRANULE).unwrap();
    assert_eq!(a.offset, GRANULE / 2);
    pool.release_with(&mut storage, a.slot).unwrap();
    assert_eq!(
        pool.idle_bytes(),
        6 * GRANULE,
        "kept under the high-water mark"
    );
    assert_eq!((storage.allocations(), storage.deallocations()), (3, 0));
    (pool, storage, held)
}

#[test]
fn a_block_on_part_of_an_idle_chunk_does_not_take_it_back_whole() {
    let (mut pool, mut storage, _held) = pool_with_idle_chunks();
    // b touches granules 0-2 and covers only granule 1 wholly: the idle chunk of
    // granules 1-5 goes, and b maps granule 1 (covered) and 2 (in part) alone, as
    // eager unmapping would; granule 6's chunk is still kept.
    let b = pool.reserve(&mut storage, 2 * GRANULE).unwrap();
    assert_eq!(b.offset, GRANULE / 2);
    assert_eq!((storage.allocations(), storage.deallocations()), (5, 1));
    assert_eq!(pool.usage().bytes_reserved - pool.idle_bytes(), 3 * GRANULE);
    assert_eq!(pool.idle_bytes(), GRANULE);
    pool.check_invariants().unwrap();
}

#[test]
fn a_block_takes_back_idle_chunks_it_covers_wholly_or_of_one_granule() {
    let (mut pool, mut storage, _held) = pool_with_idle_chunks();
    // c touches granules 0-8 and covers 1-7 wholly: it takes back both idle chunks
    // (granules 1-5 within what it covers, granule 6 alone) and maps granules 7 and
    // 8 only.
    let c = pool.reserve(&mut storage, 8 * GRANULE).unwrap();
    assert_eq!(c.offset, GRANULE / 2);
    assert_eq!((storage.allocations(), storage.deallocations()), (5, 0));
    assert_eq!(
        (pool.idle_bytes(), pool.usage().bytes_reserved),
        (0, 9 * GRANULE)
    );
    pool.check_invariants().unwrap();
}

#[test]
fn a_trim_unmaps_the_oldest_idle_chunk_that_alone_frees_enough() {
    let mut storage = VirtualStorage::new().with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(5 * GRANULE), 64);
    // Granule-aligned blocks, one chunk each: 1, 4 and 2 granules.
    let blocks: Vec<_> = [1, 4, 2]
        .map(|granules| pool.reserve(&mut storage, granules * GRANULE).unwrap())
        .into();
    for block in &blocks {
        pool.release_with(&mut storage, block.slot).unwrap();
    }
    // 7 idle granules, 2 past the bound: the oldest chunk (1 granule) would not free
    // them alone, the next (4) does, in one call.
    assert_eq!(storage.deallocations(), 1);
    assert_eq!(pool.idle_bytes(), 3 * GRANULE);
    pool.check_invariants().unwrap();
}

#[test]
fn idle_granules_never_raise_the_high_water_mark() {
    let mut storage = VirtualStorage::new().with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(64 * GRANULE), 64);
    let a = pool.reserve(&mut storage, 6 * GRANULE).unwrap();
    let held = pool.reserve(&mut storage, 2 * GRANULE).unwrap();
    pool.release_with(&mut storage, a.slot).unwrap();
    assert_eq!(pool.idle_bytes(), 6 * GRANULE, "kept: within the bound");
    // 7 granules do not fit in the hole a left: they go after `held` and need 7 new
    // granules; kept, a's 6 idle ones would take the mapped bytes to 15 granules,
    // past the 8 mapped at most so far, so they are unmapped first.
    let big = pool.reserve(&mut storage, 7 * GRANULE).unwrap();
    assert_eq!(big.offset, 8 * GRANULE);
    assert_eq!(
        (pool.idle_bytes(), storage.bytes_allocated()),
        (0, 9 * GRANULE)
    );
    assert_eq!(
        pool.stats().bytes_reserved_peak,
        9 * GRANULE,
        "as eager unmapping"
    );
    for placement in [held, big] {
        pool.release_with(&mut storage, placement.slot).unwrap();
    }
    pool.check_invariants().unwrap();
}

#[test]
fn under_a_limit_idle_granules_are_unmapped_and_the_map_retried() {
    let mut storage = VirtualStorage::with_limit(10 * GRANULE).with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(4 * GRANULE), 64);
    let blocks: Vec<_> = (0..3)
        .map(|_| pool.reserve(&mut storage, 2 * GRANULE).unwrap())
        .collect();
    for block in &blocks {
        pool.release_with(&mut storage, block.slot).unwrap();
    }
    assert_eq!(
        pool.idle_bytes(),
        4 * GRANULE,
        "the first block's granules went"
    );
    // Another user of the storage takes what is left: 4 idle + 6 = the limit.
    let other = storage.alloc(6 * GRANULE, 64).unwrap();
    // 2 granules where the first block was: within the high-water mark, but the
    // storage is full until the idle granules are unmapped.
    let again = pool
        .reserve(&mut storage, 2 * GRANULE)
        .expect("the idle granules were unmapped and the map retried");
    assert_eq!(again.offset, 0);
    assert_eq!(
        (pool.idle_bytes(), storage.bytes_allocated()),
        (0, 8 * GRANULE)
    );
    assert_eq!(
        pool.reserve(&mut storage, 3 * GRANULE),
        Err(PoolError::OutOfMemory { size: 3 * GRANULE }),
        "nothing idle is left to unmap"
    );
    pool.check_invariants().unwrap();
    storage.dealloc(other.id);
    pool.release_with(&mut storage, again.slot).unwrap();
    pool.check_invariants().unwrap();
}

#[test]
fn small_requests_live_in_a_range_of_their_own() {
    let mut storage = VirtualStorage::new().with_granularity(GRANULE);
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 1024, Some(0), 64);
    let small = pool.reserve(&mut storage, 100).unwrap();
    let large = pool.reserve(&mut storage, 5000).unwrap();
    let small_too = pool.reserve(&mut storage, 1024).unwrap();
    assert_ne!(small.storage.id, large.storage.id);
    assert_eq!(small.storage.id, small_too.storage.id);
    assert_eq!(small_too.offset, 128, "packed after the first small block");
    pool.check_invariants().unwrap();
}

#[test]
fn sizes_are_bounded_by_the_range_not_by_a_page() {
    let mut storage = VirtualStorage::new();
    let mut pool = VirtualPool::new(2 * MIB, 1 << 40, MIB, Some(0), 64);
    let huge = pool.reserve(&mut storage, 5 << 30).expect("5 GiB");
    assert_eq!(storage.bytes_allocated(), 5 << 30);
    assert!(matches!(
        pool.reserve(&mut storage, (1 << 40) + 1),
        Err(PoolError::BufferTooBig { .. })
    ));
    pool.release_with(&mut storage, huge.slot).unwrap();
    assert_eq!(storage.bytes_allocated(), 0);
}

#[test]
fn sizes_pad_to_the_alignment_up_to_the_last_one_the_range_holds() {
    let too_big = |result: Result<Placement, PoolError>| {
        matches!(result, Err(PoolError::BufferTooBig { .. }))
    };
    // A power of two: the largest size is the range's own, one more is past it, and
    // sizes near the top of `u64` are refused, not wrapped.
    let mut storage = VirtualStorage::new();
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(0), 64);
    assert!(too_big(pool.reserve(&mut storage, 64 * MIB + 1)));
    assert!(too_big(pool.reserve(&mut storage, u64::MAX)));
    assert!(too_big(pool.reserve(&mut storage, u64::MAX - 62)));
    let whole = pool
        .reserve(&mut storage, 64 * MIB)
        .expect("the whole range");
    assert_eq!(pool.books().usage.bytes_padding, 0);
    pool.release_with(&mut storage, whole.slot).unwrap();
    let first = pool.reserve(&mut storage, 100).unwrap();
    let second = pool.reserve(&mut storage, 1).unwrap();
    assert_eq!(second.offset, first.offset + 128, "100 bytes pad to 128");
    assert_eq!(pool.books().usage.bytes_padding, 28 + 63);
    pool.check_invariants().unwrap();

    // Not a power of two: 48-byte multiples, and the range (64 MiB, not one) holds
    // no more than its last multiple.
    let mut storage = VirtualStorage::new();
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(0), 48);
    let last = 64 * MIB / 48 * 48;
    assert!(too_big(pool.reserve(&mut storage, last + 1)));
    assert!(too_big(pool.reserve(&mut storage, u64::MAX)));
    let whole = pool.reserve(&mut storage, last).expect("the last multiple");
    pool.release_with(&mut storage, whole.slot).unwrap();
    let first = pool.reserve(&mut storage, 100).unwrap();
    let second = pool.reserve(&mut storage, 1).unwrap();
    assert_eq!(second.offset, first.offset + 144, "100 bytes pad to 144");
    assert_eq!(pool.books().usage.bytes_padding, 44 + 47);
    pool.check_invariants().unwrap();
}

#[test]
fn a_storage_that_cannot_serve_the_pool_is_a_typed_error() {
    let mut pool = VirtualPool::new(GRANULE, 64 * MIB, 0, Some(0), 64);
    let error = pool
        .reserve(&mut Buffers(VirtualStorage::new()), 10)
        .unwrap_err();
    assert!(
        matches!(&error, PoolError::Storage { reason } if reason.contains("no virtual memory")),
        "{error}"
    );
    let mut coarse = VirtualStorage::new().with_granularity(2 * MIB);
    let error = pool.reserve(&mut coarse, 10).unwrap_err();
    assert!(
        matches!(&error, PoolError::Storage { reason } if reason.contains("granularity")),
        "{error}"
    );
    let _ = SlotId {
        index: 0,
        generation: 0,
    };
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn memory_management_counts_maps_and_unmaps_as_storage_calls() {
    let configuration = MemoryConfiguration::parse("virtual(granule=2MiB)").unwrap();
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new().with_granularity(2 * MIB),
        MemoryDeviceProperties::default(),
        configuration,
    )
    .unwrap();
    let a = memory.reserve(5 * MIB).unwrap();
    let b = memory.reserve(100).unwrap();
    let stats = memory.memory_stats();
    // a covers 2 granules wholly (one chunk) and a third in part (one more); b is
    // in the small range.
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (3, 0));
    assert_eq!(stats.reserved_bytes.current, 8 * MIB, "3 granules and 1");
    memory.release(a);
    let stats = memory.memory_stats();
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (3, 2));
    assert_eq!(memory.memory_usage().bytes_reserved, 2 * MIB);
    let report = memory.memory_report();
    assert_eq!(report.dynamic[0].pages_unmapped, 2);
    memory.check_invariants().unwrap();
    drop(b);
    memory.cleanup(true);
    assert_eq!(memory.memory_usage().bytes_reserved, 0);
    memory.check_invariants().unwrap();
}

#[test]
#[cfg(feature = "exclusive-memory-only")]
fn exclusive_memory_only_builds_refuse_virtual_pools() {
    // Blocks of a virtual pool share granules, as slices share a page.
    let error = cubepool::MemoryConfiguration::parse("virtual(granule=2MiB)").unwrap_err();
    assert_eq!(error.error.kind(), "VirtualPoolsUnavailable");
}

#[test]
fn a_block_of_more_granules_than_the_host_can_book_is_out_of_memory() {
    // 2^62 bytes in 2 KiB granules: the granule table would need 2^51 entries (16 PiB),
    // which no host can allocate. It aborted the process; it is out of memory (the
    // storage, unlimited, maps it, and the map is undone for want of the table's
    // entries), and what was reserved before stays where it was.
    let mut storage = VirtualStorage::new();
    let mut pool = VirtualPool::new(2 * KIB, u64::MAX / 2, 0, Some(0), 64);
    let kept = pool.reserve(&mut storage, 100).unwrap();
    let before = pool.books().usage;
    assert_eq!(
        pool.reserve(&mut storage, 1 << 62),
        Err(PoolError::OutOfMemory { size: 1 << 62 })
    );
    assert_eq!(pool.books().usage, before);
    assert_eq!(pool.locate(kept.slot), Some(kept));
    let next = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(
        next.offset,
        kept.offset + 128,
        "the failed block left no hole"
    );
    pool.check_invariants().unwrap();
    pool.release_with(&mut storage, kept.slot).unwrap();
    pool.release_with(&mut storage, next.slot).unwrap();
    assert_eq!(storage.bytes_allocated(), 0);
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn failed_reserves_of_huge_blocks_leave_the_pool_sound() {
    // Each claim of a block of 2^52 granules counted them in a statistic; two thousand
    // failed reserves passed 2^64 and its overflow check panicked mid-claim, leaving a
    // granule booked live but unmapped (helper-141's find).
    let config = cubepool::MemoryConfiguration::parse("virtual(granule=64B, range=4194304TiB)")
        .expect("the layout validates");
    let mut mm = cubepool::MemoryManagement::from_configuration(
        cubepool::VirtualStorage::new(),
        cubepool::MemoryDeviceProperties::default(),
        config,
    )
    .unwrap();
    let kept = mm.reserve(4 << 20).unwrap();
    for _ in 0..3000 {
        assert!(mm.reserve(1 << 58).is_err());
    }
    mm.check_invariants().unwrap();
    let more = mm.reserve(4 << 20).unwrap();
    drop((kept, more));
}
