//! The cache bound of direct pools without `reclaim_at`, and of the persistent pool:
//! sizes that never repeat do not keep every buffer they ever made.

use cubepool::pool::{DirectPool, MemoryPool, PersistentPool};
use cubepool::storage::ComputeStorage;
use cubepool::{
    MemoryAllocationMode, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    VirtualStorage,
};

const ALIGNMENT: u64 = 64;
const MIB: u64 = 1 << 20;

/// Distinct sizes from a small deterministic generator (no two alike, up to 4 MiB).
fn distinct_sizes(count: u64) -> impl Iterator<Item = u64> {
    (1..=count).map(|i| {
        ((i * 2_654_435_761) % (4 * MIB))
            .max(1)
            .next_multiple_of(ALIGNMENT)
            + i * ALIGNMENT
    })
}

/// Reserves and drops each size in turn; returns the largest reservation seen.
fn churn(pool: &mut impl MemoryPool, storage: &mut impl ComputeStorage, count: u64) -> u64 {
    let mut largest = 0;
    for size in distinct_sizes(count) {
        let placement = pool.reserve(storage, size).unwrap();
        largest = largest.max(size);
        pool.release(placement.slot).unwrap();
        pool.check_invariants().unwrap();
        // Nothing is live, and the cache stays within twice the most ever in use (plus
        // the buffer just made).
        assert!(
            pool.usage().bytes_reserved <= 2 * largest + size.next_multiple_of(ALIGNMENT),
            "{} bytes reserved, largest reservation {largest}",
            pool.usage().bytes_reserved
        );
    }
    largest
}

#[test]
fn a_direct_pool_without_reclaim_at_bounds_its_cache() {
    let mut storage = VirtualStorage::new();
    let mut pool = DirectPool::new(u64::MAX, ALIGNMENT, None);
    churn(&mut pool, &mut storage, 5_000);
    assert!(pool.usage().bytes_reserved <= 3 * 4 * MIB + 5_000 * ALIGNMENT);
}

#[test]
fn the_persistent_pool_bounds_its_cache() {
    let mut storage = VirtualStorage::new();
    let mut pool = PersistentPool::new(u64::MAX, ALIGNMENT);
    churn(&mut pool, &mut storage, 5_000);
}

#[test]
fn repeating_sizes_never_meet_the_bound() {
    // A loop over the same sizes reuses its buffers: after the first round no storage
    // is made or released.
    let mut storage = VirtualStorage::new();
    let mut pool = DirectPool::new(u64::MAX, ALIGNMENT, None);
    let sizes: Vec<u64> = distinct_sizes(50).collect();
    for round in 0..20 {
        let slots: Vec<_> = sizes
            .iter()
            .map(|&size| pool.reserve(&mut storage, size).unwrap().slot)
            .collect();
        for slot in slots {
            pool.release(slot).unwrap();
        }
        if round == 0 {
            continue;
        }
        assert_eq!(pool.stats().pages_unmapped, 0, "round {round}");
        assert_eq!(pool.stats().pages, 50, "round {round}");
    }
}

#[test]
fn persistent_mode_through_memory_management_stays_bounded() {
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::default(),
    )
    .unwrap();
    memory.set_mode(MemoryAllocationMode::Persistent);
    for size in distinct_sizes(5_000) {
        let handle = memory.reserve(size).unwrap();
        memory.release(handle);
    }
    let usage = memory.memory_usage();
    assert_eq!(usage.bytes_in_use, 0);
    assert!(
        usage.bytes_reserved <= 3 * 4 * MIB + 5_000 * ALIGNMENT,
        "{usage:?}"
    );
    memory.check_invariants().unwrap();
}
