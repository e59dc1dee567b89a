//! Model-based test: random reserve / drop / clone / cleanup / mode programs against a
//! shadow model of live ranges that fails on overlap, misalignment or accounting drift.

use std::collections::BTreeMap;

use cubepool::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryDeviceProperties,
    MemoryManagement, MemoryPoolOptions, PoolError, PoolType, VirtualStorage,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Drop(usize),
    /// Give a handle back with `MemoryManagement::release`.
    Release(usize),
    Clone(usize),
    Cleanup(bool),
    Mode(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..=20_000).prop_map(Op::Reserve),
        4 => any::<usize>().prop_map(Op::Drop),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Clone),
        1 => any::<bool>().prop_map(Op::Cleanup),
        1 => any::<bool>().prop_map(Op::Mode),
    ]
}

fn pool() -> impl Strategy<Value = MemoryPoolOptions> {
    let sliced_weight = if cubepool::EXCLUSIVE_MEMORY_ONLY {
        0
    } else {
        1
    };
    prop_oneof![
        sliced_weight =>
        (1u64..=8, 1u64..=8, prop::option::of(1u64..=4)).prop_map(|(page, slice, cap)| {
            let page_size = page * 4096;
            MemoryPoolOptions::new(PoolType::SlicedPages {
                page_size,
                max_slice_size: (slice * 512).min(page_size),
                max_pool_size: cap.map(|pages| pages * page_size),
            })
        }),
        1 => (0u64..=32_768, prop::option::of(1u64..=50)).prop_map(|(max, period)| {
            MemoryPoolOptions {
                pool_type: PoolType::ExclusivePages {
                    max_alloc_size: max,
                },
                dealloc_period: period,
            }
        }),
        1 => prop::option::of(0u64..=65_536)
            .prop_map(|reclaim_at| MemoryPoolOptions::new(PoolType::Direct { reclaim_at })),
    ]
}

fn configuration() -> impl Strategy<Value = MemoryConfiguration> {
    let sub_slices_weight = if cubepool::EXCLUSIVE_MEMORY_ONLY {
        0
    } else {
        1
    };
    prop_oneof![
        sub_slices_weight => Just(MemoryConfiguration::SubSlices),
        1 => Just(MemoryConfiguration::ExclusivePages),
        1 => prop::collection::vec(pool(), 1..5)
            .prop_map(|pool_options| MemoryConfiguration::Custom { pool_options }),
    ]
}

fn run(
    configuration: MemoryConfiguration,
    alignment: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let properties = MemoryDeviceProperties {
        max_page_size: 64 * 1024 * 1024,
        alignment,
    };
    let mut mm =
        MemoryManagement::from_configuration(VirtualStorage::new(), properties, configuration)
            .map_err(|e| TestCaseError::reject(e.to_string()))?;
    let mut live: Vec<ManagedMemoryHandle> = Vec::new();
    for op in ops {
        match op {
            Op::Reserve(size) => match mm.reserve(size) {
                Ok(handle) => {
                    prop_assert_eq!(handle.size(), size);
                    live.push(handle);
                }
                Err(PoolError::PoolCapacityExceeded { .. } | PoolError::BufferTooBig { .. }) => {}
                Err(other) => return Err(TestCaseError::fail(format!("{other}"))),
            },
            Op::Drop(index) if !live.is_empty() => {
                live.swap_remove(index % live.len());
            }
            Op::Release(index) if !live.is_empty() => {
                mm.release(live.swap_remove(index % live.len()));
            }
            Op::Clone(index) if !live.is_empty() => {
                let clone = live[index % live.len()].clone();
                live.push(clone);
            }
            Op::Cleanup(explicit) => mm.cleanup(explicit),
            Op::Mode(persistent) => mm.set_mode(if persistent {
                MemoryAllocationMode::Persistent
            } else {
                MemoryAllocationMode::Auto
            }),
            _ => {}
        }
        // The shadow model: one range per distinct reservation.
        let mut ranges: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mut expected_bytes = 0;
        for handle in &live {
            let resource = mm
                .resource(handle)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(resource.size, handle.size());
            if resource.size == 0 {
                continue;
            }
            prop_assert_eq!(resource.address % alignment, 0, "misaligned");
            let end = resource.address + resource.size;
            if let Some(&(other_end, other_id)) = ranges.get(&resource.address) {
                prop_assert_eq!(other_id, handle.id().0, "two reservations at one address");
                prop_assert_eq!(other_end, end);
                continue;
            }
            ranges.insert(resource.address, (end, handle.id().0));
            expected_bytes += resource.size;
        }
        let mut previous_end = 0;
        for (&start, &(end, _)) in &ranges {
            prop_assert!(start >= previous_end, "overlap at {start}");
            previous_end = end;
        }
        let usage = mm.memory_usage();
        prop_assert_eq!(usage.bytes_in_use, expected_bytes, "bytes in use drifted");
        prop_assert_eq!(
            usage.number_allocs as usize,
            ranges.len(),
            "allocation count drifted"
        );
        prop_assert!(usage.bytes_reserved >= usage.bytes_in_use + usage.bytes_padding);
        mm.check_invariants().map_err(TestCaseError::fail)?;
    }
    // Free everything, clean up, and the pools are empty.
    live.clear();
    mm.cleanup(true);
    let usage = mm.memory_usage();
    prop_assert_eq!(usage.bytes_reserved, 0);
    prop_assert_eq!(usage.number_allocs, 0);
    mm.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pools_never_overlap_or_drift(
        configuration in configuration(),
        alignment in prop::sample::select(vec![1u64, 32, 64, 256]),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run(configuration, alignment, ops)?;
    }
}

#[test]
fn placement_is_deterministic() {
    let configuration = MemoryConfiguration::default();
    let offsets = || {
        let mut mm = MemoryManagement::from_configuration(
            VirtualStorage::new(),
            MemoryDeviceProperties::default(),
            configuration.clone(),
        )
        .unwrap();
        let mut live = Vec::new();
        let mut seen = Vec::new();
        for i in 0..500u64 {
            let handle = mm.reserve((i * 7919) % 100_000 + 1).unwrap();
            seen.push(mm.resource(&handle).unwrap());
            live.push(handle);
            if i % 3 == 0 {
                live.swap_remove((i as usize * 31) % live.len());
            }
        }
        seen
    };
    assert_eq!(offsets(), offsets());
}
