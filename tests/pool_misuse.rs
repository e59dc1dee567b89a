//! The raw pools are public: built with any `u64` parameters and driven by random
//! sequences of their public calls (reserves of any size, releases of reservations
//! made, made up or released before, locates and cleanups with any reserve count),
//! they answer with a result or a typed error, never a panic, and keep their books
//! consistent. Memory management checks its layout and serves 0-byte reservations
//! itself; a pool built or called directly has to refuse what it cannot serve
//! ([`PoolError::InvalidArgument`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

use cubepool::plan_file::{intern_plan, Plan, PlanId, PlanPhase};
use cubepool::pool::{
    DirectPool, ExclusivePool, MemoryPool, PersistentPool, PlannedPool, SlicedPool, SlotId,
    VirtualPool,
};
use cubepool::storage::VirtualMemory;
use cubepool::{PoolError, VirtualStorage};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// A plan of one phase whose requests are `(size, offset)`.
fn plan_of(requests: Vec<(u64, u64)>) -> PlanId {
    let height = requests.iter().map(|&(size, offset)| size + offset).max();
    let plan = Plan {
        height: height.unwrap_or(0),
        phases: vec![PlanPhase {
            name: "p".into(),
            ends: (0..requests.len()).collect(),
            optional: Vec::new(),
            requests,
        }],
        kept: Vec::new(),
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    intern_plan("pool_misuse", plan)
}

/// One pool of each kind, sensibly built, by name.
fn every_kind() -> Vec<(&'static str, Box<dyn MemoryPool>)> {
    every_kind_aligned_to(64)
}

/// One pool of each kind, sensibly built but for `alignment`, by name.
fn every_kind_aligned_to(alignment: u64) -> Vec<(&'static str, Box<dyn MemoryPool>)> {
    vec![
        (
            "sliced",
            Box::new(SlicedPool::new(MIB, 64 * 1024, None, alignment)),
        ),
        (
            "exclusive",
            Box::new(ExclusivePool::new(1 << 30, alignment, None)),
        ),
        (
            "direct",
            Box::new(DirectPool::new(1 << 30, alignment, None)),
        ),
        (
            "persistent",
            Box::new(PersistentPool::new(1 << 30, alignment)),
        ),
        (
            "virtual",
            Box::new(VirtualPool::new(2 * MIB, 1 << 30, MIB, None, alignment)),
        ),
        (
            "planned",
            Box::new(PlannedPool::new(
                plan_of(vec![(4096, 0)]),
                2 * MIB,
                1 << 30,
                alignment,
            )),
        ),
    ]
}

fn is_invalid_argument(result: Result<impl std::fmt::Debug, PoolError>, naming: &str) -> bool {
    matches!(result, Err(PoolError::InvalidArgument { ref reason }) if reason.contains(naming))
}

#[test]
fn every_pool_kind_refuses_a_reserve_of_zero_bytes_and_keeps_what_it_holds() {
    let mut storage = VirtualStorage::new();
    for (kind, mut pool) in every_kind() {
        let held = pool.reserve(&mut storage, 100).expect(kind);
        let usage = pool.usage();
        let refused = pool.reserve(&mut storage, 0);
        assert!(is_invalid_argument(refused, "size 0"), "{kind}");
        assert_eq!(pool.usage(), usage, "{kind}: the refusal changed the books");
        assert_eq!(pool.locate(held.slot), Some(held), "{kind}");
        pool.check_invariants().expect(kind);
        let next = pool.reserve(&mut storage, 200).expect(kind);
        assert_ne!(next.slot, held.slot, "{kind}");
        pool.release_with(&mut storage, held.slot).expect(kind);
        pool.release_with(&mut storage, next.slot).expect(kind);
        pool.check_invariants().expect(kind);
    }
}

#[test]
fn a_stale_id_never_names_the_next_reservation_of_its_place() {
    // A reservation released, then one of the same size (which a cached page, or a
    // segment freed and taken again in place, serves): the first id is stale, and its
    // release must free nothing. It freed the new reservation in the exclusive, direct,
    // persistent and virtual pools, whose bytes the next reserve was then handed again.
    let mut storage = VirtualStorage::new();
    for (kind, mut pool) in every_kind() {
        let first = pool.reserve(&mut storage, 100).expect(kind);
        pool.release_with(&mut storage, first.slot).expect(kind);
        let again = pool.reserve(&mut storage, 100).expect(kind);
        assert_ne!(
            again.slot, first.slot,
            "{kind}: a fresh id for a fresh reservation"
        );
        assert!(
            matches!(
                pool.release_with(&mut storage, first.slot),
                Err(PoolError::NotFound { .. })
            ),
            "{kind}: the stale id was taken for the live reservation"
        );
        assert_eq!(pool.locate(first.slot), None, "{kind}");
        assert_eq!(pool.locate(again.slot), Some(again), "{kind}");
        let next = pool.reserve(&mut storage, 100).expect(kind);
        let (start, end) = (again.offset, again.offset + again.size);
        assert!(
            next.storage != again.storage || next.offset >= end || next.offset + next.size <= start,
            "{kind}: a live reservation's bytes were handed out again"
        );
        pool.check_invariants().expect(kind);
    }
}

#[test]
fn a_planned_pool_refuses_a_request_near_2_64_beside_an_idle_arena() {
    // One planned block reserved and freed leaves an idle arena granule; a request
    // beside the plan of nearly 2^64 bytes overflowed the sum of the mapped bytes.
    let mut pool = PlannedPool::new(plan_of(vec![(64, 0)]), 4096, u64::MAX, 64);
    let mut storage = VirtualStorage::new();
    let planned = pool.reserve(&mut storage, 64).unwrap();
    pool.release_with(&mut storage, planned.slot).unwrap();
    let refused = catch_unwind(AssertUnwindSafe(|| {
        pool.reserve(&mut storage, u64::MAX - 4096)
    }))
    .expect("no panic");
    assert!(refused.is_err(), "{refused:?}");
    pool.check_invariants().unwrap();
    let again = pool.reserve(&mut storage, 64).unwrap();
    pool.release_with(&mut storage, again.slot).unwrap();
}

#[test]
fn every_pool_kind_of_alignment_zero_refuses_every_reserve_naming_the_alignment() {
    let mut storage = VirtualStorage::new();
    for (kind, mut pool) in every_kind_aligned_to(0) {
        // 4096 is the planned pool's planned size; 4 MiB lies past the sliced pool's
        // pages and in the virtual pool's large range.
        for size in [1, 100, 4096, 4 * MIB] {
            let refused = pool.reserve(&mut storage, size);
            assert!(
                is_invalid_argument(refused, "alignment 0"),
                "{kind}: {size} bytes"
            );
        }
        assert_eq!(pool.usage().bytes_in_use, 0, "{kind}");
        pool.check_invariants().expect(kind);
    }
    assert_eq!(
        storage.bytes_mapped(),
        0,
        "nothing mapped for a refused reserve"
    );
}

#[test]
fn a_virtual_pool_refuses_a_granule_that_is_not_a_power_of_two_naming_it() {
    let mut storage = VirtualStorage::new();
    for granule in [0, 3, 1000, 3 * MIB] {
        let mut pool = VirtualPool::new(granule, 1 << 30, MIB, None, 64);
        for size in [100, 4 * MIB] {
            let refused = pool.reserve(&mut storage, size);
            let named = format!("granule ({granule} bytes) is not a power of two");
            assert!(is_invalid_argument(refused, &named), "granule {granule}");
        }
        pool.check_invariants().expect("no range opened");
        assert_eq!(storage.ranges_reserved(), 0, "granule {granule}");
    }
}

#[test]
fn a_planned_pool_of_a_granule_of_zero_bytes_is_built_and_refuses_every_reserve() {
    let mut storage = VirtualStorage::new();
    let mut pool = PlannedPool::new(plan_of(vec![(4096, 0), (100, 8192)]), 0, 1 << 30, 64);
    for size in [100, 4096] {
        let refused = pool.reserve(&mut storage, size);
        assert!(is_invalid_argument(refused, "granule (0 bytes)"), "{size}");
    }
    pool.check_invariants().expect("nothing placed");
}

#[test]
fn a_capped_sliced_pool_of_pages_of_zero_bytes_is_built_and_refuses_every_reserve() {
    let mut storage = VirtualStorage::new();
    let mut pool = SlicedPool::new(0, 0, Some(MIB), 64);
    for size in [1, 64, MIB] {
        assert!(matches!(
            pool.reserve(&mut storage, size),
            Err(PoolError::BufferTooBig {
                max_accepted: 0,
                ..
            })
        ));
    }
    assert_eq!(pool.usage().bytes_reserved, 0);
    pool.check_invariants().expect("no page");
}

#[test]
fn a_planned_pool_of_alignment_zero_counts_its_refusals_as_neither_hits_nor_misses() {
    let mut storage = VirtualStorage::new();
    let mut pool = PlannedPool::new(plan_of(vec![(4096, 0)]), 2 * MIB, 1 << 30, 0);
    let stats = pool.planned_stats();
    for size in [4096, 100] {
        let refused = pool.reserve(&mut storage, size);
        assert!(is_invalid_argument(refused, "alignment 0"), "{size} bytes");
    }
    assert_eq!(pool.planned_stats(), stats);
    assert_eq!(storage.bytes_mapped(), 0);
}

#[test]
fn a_planned_pool_refuses_a_size_whose_padding_passes_u64_max_as_neither_hit_nor_miss() {
    let mut storage = VirtualStorage::new();
    let mut pool = PlannedPool::new(plan_of(vec![(4096, 0)]), 2 * MIB, 1 << 30, 64);
    let stats = pool.planned_stats();
    let refused = pool.reserve(&mut storage, u64::MAX - 1);
    assert!(
        matches!(refused, Err(PoolError::BufferTooBig { size, .. }) if size == u64::MAX - 1),
        "{refused:?}"
    );
    assert_eq!(pool.planned_stats(), stats);
    // The request was not counted: the plan's first request still takes its entry.
    let placed = pool.reserve(&mut storage, 4096).expect("planned");
    assert_eq!(pool.planned_stats().hits, 1);
    pool.release_with(&mut storage, placed.slot)
        .expect("release");
}

#[test]
fn a_planned_pool_refuses_a_reserve_of_zero_bytes_even_where_its_plan_holds_one() {
    let mut storage = VirtualStorage::new();
    let plan = plan_of(vec![(4096, 0), (0, 0), (0, 4096)]);
    let mut pool = PlannedPool::new(plan, 4096, 1 << 30, 64);
    let held = pool.reserve(&mut storage, 4096).expect("planned");
    let (stats, usage) = (pool.planned_stats(), pool.usage());
    for _ in 0..2 {
        let refused = pool.reserve(&mut storage, 0);
        assert!(is_invalid_argument(refused, "size 0"));
    }
    // Neither a hit nor a miss, and the block it holds is still its own.
    assert_eq!(pool.planned_stats(), stats);
    assert_eq!(pool.usage(), usage);
    assert_eq!(pool.locate(held.slot), Some(held));
    pool.check_invariants().expect("books");
    pool.step();
    let next = pool.reserve(&mut storage, 4096).expect("beside");
    assert!(next.storage != held.storage || next.offset >= held.offset + 4096);
}

#[test]
fn an_exclusive_pool_counts_reserves_between_its_checks_across_the_wrap() {
    // Checks every 10 reserves (`dealloc_period` 50 / 5); a page free at five checks
    // goes back to the storage.
    let mut storage = VirtualStorage::new();
    let mut pool = ExclusivePool::new(1 << 30, 64, Some(50));
    let slot = pool.reserve(&mut storage, 100).unwrap().slot;
    pool.release(slot).unwrap();
    // Reserve counts: 9 reserves after a check are none, 10 are one, through
    // u64::MAX and on from 0 as memory management's count wraps. Checks at u64::MAX - 4,
    // 5, 15 and 25; none at 4, 14 and 34.
    for count in [u64::MAX - 4, 4, 5, 14, 15, 25, 34] {
        pool.cleanup(&mut storage, count, false);
        assert_eq!(
            pool.usage().bytes_reserved,
            128,
            "at {count}: four checks at most"
        );
    }
    pool.cleanup(&mut storage, 35, false);
    assert_eq!(pool.usage().bytes_reserved, 0, "the fifth check");
    pool.check_invariants().expect("books");
}

/// A value of every kind a parameter or size can be: 0, small, odd, granule-sized,
/// near the top of `u64`, or any up to 10 MB.
fn any_amount() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(3),
        Just(32),
        Just(64),
        Just(1000),
        Just(4096),
        Just(MIB),
        Just(2 * MIB),
        Just(1 << 40),
        Just(1 << 63),
        Just(u64::MAX / 2),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        0u64..10_000_000,
    ]
}

/// The address range of a pool that books memory in granules, at most 2^20 of its
/// granules: these pools book one entry per granule a block touches, so a block of
/// 2^40 bytes in 4 KiB granules books 2^28 (2 GiB of books, minutes in a debug build:
/// a cost of tiny granules, not a fault, which the test keeps out of its time).
fn bounded_range(range: u64, granule: u64) -> u64 {
    range.min(granule.saturating_mul(1 << 20))
}

/// One public call on a pool.
#[derive(Debug, Clone)]
enum Call {
    Reserve(u64),
    /// Releases the reservation at this index (modulo those made), maybe again.
    Release(usize),
    /// The same, with the storage at hand.
    ReleaseWith(usize),
    /// Releases an id the pool may never have made.
    ReleaseMadeUp(u32, u32),
    Locate(usize),
    /// A cleanup given this reserve count, explicit or periodic.
    Cleanup(u64, bool),
}

fn calls() -> impl Strategy<Value = Vec<Call>> {
    let call = prop_oneof![
        any_amount().prop_map(Call::Reserve),
        (0usize..20).prop_map(Call::Release),
        (0usize..20).prop_map(Call::ReleaseWith),
        (any::<u32>(), any::<u32>())
            .prop_map(|(index, generation)| Call::ReleaseMadeUp(index, generation)),
        (0usize..20).prop_map(Call::Locate),
        (any_amount(), any::<bool>()).prop_map(|(count, explicit)| Call::Cleanup(count, explicit)),
    ];
    prop::collection::vec(call, 0..30)
}

/// The reservation at `k` (modulo those made), if any was made.
fn pick(made: &[SlotId], k: usize) -> Option<SlotId> {
    made.get(k % made.len().max(1)).copied()
}

/// Makes `calls` on the pool `build` makes (the build too may not panic), checking
/// the pool's invariants after each.
fn survives(build: impl FnOnce() -> Box<dyn MemoryPool>, calls: &[Call]) -> Result<(), String> {
    let mut pool = catch_unwind(AssertUnwindSafe(build)).map_err(|_| "the build panicked")?;
    let mut storage = VirtualStorage::new();
    let mut made: Vec<SlotId> = Vec::new();
    for (at, call) in calls.iter().enumerate() {
        let outcome = catch_unwind(AssertUnwindSafe(|| match call {
            Call::Reserve(size) => {
                if let Ok(placement) = pool.reserve(&mut storage, *size) {
                    made.push(placement.slot);
                }
            }
            Call::Release(k) => {
                if let Some(slot) = pick(&made, *k) {
                    let _ = pool.release(slot);
                }
            }
            Call::ReleaseWith(k) => {
                if let Some(slot) = pick(&made, *k) {
                    let _ = pool.release_with(&mut storage, slot);
                }
            }
            Call::ReleaseMadeUp(index, generation) => {
                let slot = SlotId {
                    index: *index,
                    generation: *generation,
                };
                let _ = pool.release(slot);
            }
            Call::Locate(k) => {
                if let Some(slot) = pick(&made, *k) {
                    let _ = pool.locate(slot);
                }
            }
            Call::Cleanup(count, explicit) => pool.cleanup(&mut storage, *count, *explicit),
        }));
        outcome.map_err(|_| format!("call {at} ({call:?}) panicked"))?;
        match catch_unwind(AssertUnwindSafe(|| pool.check_invariants())) {
            Ok(Ok(())) => {}
            Ok(Err(broken)) => return Err(format!("after call {at} ({call:?}): {broken}")),
            Err(_) => return Err(format!("the check after call {at} ({call:?}) panicked")),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn a_sliced_pool_of_any_parameters_survives_any_calls(
        page in any_amount(),
        slice in any_amount(),
        cap in prop::option::of(any_amount()),
        alignment in any_amount(),
        calls in calls(),
    ) {
        let build = || Box::new(SlicedPool::new(page, slice, cap, alignment)) as Box<dyn MemoryPool>;
        survives(build, &calls).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn an_exclusive_pool_of_any_parameters_survives_any_calls(
        max in any_amount(),
        alignment in any_amount(),
        period in prop::option::of(any_amount()),
        calls in calls(),
    ) {
        let build = || Box::new(ExclusivePool::new(max, alignment, period)) as Box<dyn MemoryPool>;
        survives(build, &calls).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn a_direct_pool_of_any_parameters_survives_any_calls(
        max in any_amount(),
        alignment in any_amount(),
        reclaim in prop::option::of(any_amount()),
        calls in calls(),
    ) {
        let build = || Box::new(DirectPool::new(max, alignment, reclaim)) as Box<dyn MemoryPool>;
        survives(build, &calls).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn a_persistent_pool_of_any_parameters_survives_any_calls(
        max in any_amount(),
        alignment in any_amount(),
        calls in calls(),
    ) {
        let build = || Box::new(PersistentPool::new(max, alignment)) as Box<dyn MemoryPool>;
        survives(build, &calls).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn a_virtual_pool_of_any_parameters_survives_any_calls(
        granule in any_amount(),
        range in any_amount(),
        small in any_amount(),
        keep in prop::option::of(any_amount()),
        alignment in any_amount(),
        calls in calls(),
    ) {
        let build = || {
            let range = bounded_range(range, granule);
            Box::new(VirtualPool::new(granule, range, small, keep, alignment)) as Box<dyn MemoryPool>
        };
        survives(build, &calls).map_err(TestCaseError::fail)?;
    }

}

proptest! {
    // Fewer cases: each builds a plan's granule books and a virtual pool beside them
    // (about 0.7 s a case in a debug build).
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_planned_pool_of_any_parameters_survives_any_calls(
        granule in any_amount(),
        range in any_amount(),
        alignment in any_amount(),
        requests in prop::collection::vec((prop_oneof![Just(0u64), 1u64..5000], 0u64..64), 0..10),
        calls in calls(),
    ) {
        let plan = plan_of(requests.iter().map(|&(size, slot)| (size, slot * 256)).collect());
        let range = bounded_range(range, granule);
        let build = || Box::new(PlannedPool::new(plan, granule, range, alignment)) as Box<dyn MemoryPool>;
        survives(build, &calls).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn a_pool_whose_usage_was_rewritten_releases_without_a_panic() {
    // `books_mut` is public: a caller can zero a pool's usage, its statistics or both
    // while it holds reservations. The release and the cleanup that follow must not
    // panic in this (debug) build (the statistics' page count and a page's reserved
    // bytes were subtracted unchecked), and the release still frees the reservation.
    type Rewrite = fn(&mut cubepool::pool::Books);
    let rewrites: [(&str, Rewrite); 3] = [
        ("usage", |books| books.usage = Default::default()),
        ("stats", |books| books.stats = Default::default()),
        ("books", |books| *books = Default::default()),
    ];
    for (what, rewrite) in rewrites {
        let mut storage = VirtualStorage::new();
        for (kind, mut pool) in every_kind() {
            let held = pool.reserve(&mut storage, 100).expect(kind);
            rewrite(pool.books_mut());
            let released = catch_unwind(AssertUnwindSafe(|| {
                let released = pool.release_with(&mut storage, held.slot);
                pool.cleanup(&mut storage, 0, true);
                released
            }));
            let released =
                released.unwrap_or_else(|_| panic!("{kind}, {what}: the release panicked"));
            assert!(released.is_ok(), "{kind}, {what}: {released:?}");
            assert_eq!(
                pool.locate(held.slot),
                None,
                "{kind}, {what}: the slot is still live"
            );
            // A pool that derives its usage from its parts (the planned pool) has it
            // right again; the others name the drift.
            match pool.check_invariants() {
                Ok(()) => assert_eq!(pool.usage().number_allocs, 0, "{kind}: unnoticed drift"),
                Err(reason) => assert!(
                    reason.contains("usage") || reason.contains("page"),
                    "{kind}, {what}: {reason}"
                ),
            }
        }
    }
}
