//! Each pool kind on its own: a release says exactly what it freed.

use cubepool::pool::{
    DirectPool, ExclusivePool, MemoryPool, PersistentPool, Released, SlicedPool, SlotId,
};
use cubepool::storage::ComputeStorage;
use cubepool::{HostStorage, MemoryUsage, PoolError, VirtualStorage};
use proptest::prelude::*;

const KIB: u64 = 1024;
const ALIGNMENT: u64 = 32;

/// Reserves `sizes`, then releases them in reverse, checking each release against
/// the pool's usage: `Released` is the bytes asked for and the padded extent, and
/// the usage loses exactly those.
fn releases_report_what_they_free(pool: &mut impl MemoryPool, sizes: &[u64]) {
    let mut storage = HostStorage::new();
    let slots: Vec<(SlotId, u64)> = sizes
        .iter()
        .map(|&size| (pool.reserve(&mut storage, size).unwrap().slot, size))
        .collect();
    for (slot, size) in slots.into_iter().rev() {
        let before: MemoryUsage = pool.usage();
        let released = pool.release(slot).unwrap();
        let after = pool.usage();
        assert_eq!(
            released,
            Released {
                size,
                extent: size.next_multiple_of(ALIGNMENT),
            }
        );
        assert_eq!(before.number_allocs - after.number_allocs, 1);
        assert_eq!(before.bytes_in_use - after.bytes_in_use, released.size);
        assert_eq!(
            before.bytes_padding - after.bytes_padding,
            released.extent - released.size
        );
        pool.check_invariants().unwrap();
    }
    assert_eq!(pool.usage().number_allocs, 0);
}

const SIZES: [u64; 5] = [1, 100, 4 * KIB, 4 * KIB + 1, 33];

#[test]
fn sliced_pool_release_reports_size_and_extent() {
    releases_report_what_they_free(
        &mut SlicedPool::new(64 * KIB, 64 * KIB, None, ALIGNMENT),
        &SIZES,
    );
}

#[test]
fn exclusive_pool_release_reports_size_and_extent() {
    releases_report_what_they_free(&mut ExclusivePool::new(64 * KIB, ALIGNMENT, None), &SIZES);
}

#[test]
fn direct_pool_release_reports_size_and_extent() {
    releases_report_what_they_free(&mut DirectPool::new(64 * KIB, ALIGNMENT, None), &SIZES);
}

#[test]
fn persistent_pool_release_reports_size_and_extent() {
    releases_report_what_they_free(&mut PersistentPool::new(64 * KIB, ALIGNMENT), &SIZES);
}

#[test]
fn releasing_twice_is_not_found_and_changes_nothing() {
    let mut storage = HostStorage::new();
    let mut pool = SlicedPool::new(64 * KIB, 64 * KIB, None, ALIGNMENT);
    let kept = pool.reserve(&mut storage, 100).unwrap();
    let slot = pool.reserve(&mut storage, 200).unwrap().slot;
    pool.release(slot).unwrap();
    let usage = pool.usage();
    assert!(matches!(
        pool.release(slot),
        Err(PoolError::NotFound { .. })
    ));
    assert_eq!(pool.usage(), usage);
    assert_eq!(pool.locate(kept.slot).unwrap().size, 100);
    pool.check_invariants().unwrap();
}

#[test]
fn a_reserve_of_the_released_extent_takes_the_segment_back_in_place() {
    let mut storage = HostStorage::new();
    let mut pool = SlicedPool::new(64 * KIB, 64 * KIB, None, ALIGNMENT);
    let _before = pool.reserve(&mut storage, 4 * KIB).unwrap();
    let middle = pool.reserve(&mut storage, 4 * KIB).unwrap();
    let _after = pool.reserve(&mut storage, 4 * KIB).unwrap();
    pool.release(middle.slot).unwrap();
    pool.check_invariants().unwrap();
    assert!(
        pool.locate(middle.slot).is_none(),
        "a released slice is not live"
    );
    // 4 KiB - 10 bytes pads to the same extent: the middle segment, in place.
    let again = pool.reserve(&mut storage, 4 * KIB - 10).unwrap();
    assert_eq!(
        (again.slot, again.offset, again.storage.id, again.size),
        (middle.slot, middle.offset, middle.storage.id, 4 * KIB - 10)
    );
    assert_eq!(pool.usage().bytes_in_use, 3 * 4 * KIB - 10);
    pool.check_invariants().unwrap();
}

#[test]
fn a_deferred_segment_merges_before_a_reserve_of_another_extent() {
    let mut storage = HostStorage::new();
    let mut pool = SlicedPool::new(16 * KIB, 16 * KIB, None, ALIGNMENT);
    let first = pool.reserve(&mut storage, 4 * KIB).unwrap();
    let second = pool.reserve(&mut storage, 4 * KIB).unwrap();
    let _rest = pool.reserve(&mut storage, 8 * KIB).unwrap();
    pool.release(first.slot).unwrap();
    pool.release(second.slot).unwrap();
    // 8 KiB fits only in the two freed slices merged: no new page.
    let merged = pool.reserve(&mut storage, 8 * KIB).unwrap();
    assert_eq!(merged.offset, 0);
    assert_eq!(merged.storage.id, first.storage.id);
    assert_eq!(pool.usage().bytes_reserved, 16 * KIB);
    pool.check_invariants().unwrap();
}

#[test]
fn cleanup_frees_a_page_whose_last_slice_was_deferred() {
    let mut storage = HostStorage::new();
    let mut pool = SlicedPool::new(16 * KIB, 16 * KIB, None, ALIGNMENT);
    let only = pool.reserve(&mut storage, 100).unwrap();
    pool.release(only.slot).unwrap();
    pool.cleanup(&mut storage, 0, true);
    assert_eq!(pool.usage().bytes_reserved, 0);
    assert_eq!(
        storage.bytes_allocated(),
        0,
        "the storage got the page back"
    );
    pool.check_invariants().unwrap();
}

/// One step of a program against a single sliced pool.
#[derive(Debug, Clone)]
enum Step {
    Reserve(u64),
    /// Release the live reservation at this index (modulo the live count).
    Release(usize),
}

/// Sizes from a few neighbouring classes, so that several free segments share a
/// class and leave its list from the middle, the front and the back.
fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => prop::sample::select(vec![1u64, 33, 64, 90, 100, 128, 1000, 1050, 1100, 4000])
            .prop_map(Step::Reserve),
        2 => any::<usize>().prop_map(Step::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random reserves and releases in one sliced pool keep its invariants after every
    /// step (the page chains, and the free lists: every free segment on the list of
    /// its class exactly once, linked both ways); then everything is released and
    /// the pages are whole again.
    #[test]
    fn sliced_pool_keeps_its_free_lists_linked(steps in prop::collection::vec(step(), 1..400)) {
        let mut storage = VirtualStorage::new();
        let mut pool = SlicedPool::new(16 * KIB, 16 * KIB, None, ALIGNMENT);
        let mut live: Vec<SlotId> = Vec::new();
        for step in steps {
            match step {
                Step::Reserve(size) => live.push(pool.reserve(&mut storage, size).unwrap().slot),
                Step::Release(index) if !live.is_empty() => {
                    let slot = live.swap_remove(index % live.len());
                    pool.release(slot).unwrap();
                }
                Step::Release(_) => {}
            }
            pool.check_invariants().map_err(TestCaseError::fail)?;
        }
        for slot in live {
            pool.release(slot).unwrap();
        }
        pool.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(pool.usage().number_allocs, 0);
        pool.cleanup(&mut storage, 0, true);
        prop_assert_eq!(pool.usage().bytes_reserved, 0, "every page was whole again");
    }
}

#[test]
fn exclusive_pool_reuse_test_does_not_overflow_on_huge_free_pages() {
    // A free page of 2^62 bytes and a request of 64: the reuse test computed the
    // unused bytes times 8, which overflowed (a panic with overflow checks). The page
    // wastes more than an eighth, so a new page is made, and the free one stays.
    let mut storage = VirtualStorage::new();
    let mut pool = ExclusivePool::new(u64::MAX, 64, None);
    let huge = pool.reserve(&mut storage, 1 << 62).unwrap();
    pool.release(huge.slot).unwrap();
    let small = pool.reserve(&mut storage, 64).unwrap();
    assert_eq!(small.storage.size, 64);
    assert_ne!(small.storage.id, huge.storage.id);
    // A request within an eighth of the free page still reuses it.
    let again = pool.reserve(&mut storage, (1 << 62) - (1 << 58)).unwrap();
    assert_eq!(again.storage.id, huge.storage.id);
    pool.check_invariants().unwrap();
}
