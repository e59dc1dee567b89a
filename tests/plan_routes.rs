//! The planner's shortcuts agree with the questions they stand for: where a layout
//! routes sizes, asked in runs (`route_runs`) or size by size (`routes`), and live
//! peaks of groups given as size ranges or as lists of sizes.
// Sliced pools, which exclusive-memory-only builds refuse.
#![cfg(not(feature = "exclusive-memory-only"))]

use cubepool::trace::format::TraceBuilder;
use cubepool::trace::{route_runs, routes, TraceHeader};
use cubepool::{MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions, PoolType};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A pool of the kinds the planner builds layouts of (and a virtual one).
fn pool() -> impl Strategy<Value = PoolType> {
    prop_oneof![
        (1u64..64, 1u64..64, proptest::option::of(1u64..64)).prop_map(|(page, slice, cap)| {
            PoolType::SlicedPages {
                page_size: page * 256 * KIB,
                max_slice_size: slice * 128 * KIB,
                max_pool_size: cap.map(|c| c * MIB),
            }
        }),
        (1u64..4096).prop_map(|m| PoolType::ExclusivePages {
            max_alloc_size: m * MIB
        }),
        Just(PoolType::Direct { reclaim_at: None }),
        Just(PoolType::virtual_pages(2 * MIB)),
    ]
}

/// Ascending distinct sizes, dense near the pools' boundaries and spread over the rest.
fn sizes() -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(
        prop_oneof![0u64..64 * MIB, 0u64..4096 * MIB, 0u64..(1 << 33)],
        0..400,
    )
    .prop_map(|mut sizes| {
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    })
}

fn expanded(config: &MemoryConfiguration, sizes: &[u64]) -> Vec<Option<usize>> {
    let runs = route_runs(config, MemoryDeviceProperties::default(), sizes).unwrap();
    let mut out = Vec::new();
    let mut next = 0;
    for run in runs {
        assert_eq!(run.start, next, "runs are consecutive");
        assert!(run.start < run.end, "runs are not empty");
        out.extend(std::iter::repeat_n(run.route, run.end - run.start));
        next = run.end;
    }
    assert_eq!(next, sizes.len(), "runs cover the sizes");
    out
}

proptest! {
    #[test]
    fn route_runs_answer_what_routes_answers(
        pools in proptest::collection::vec(pool(), 1..4),
        sizes in sizes(),
    ) {
        let config = MemoryConfiguration::Custom {
            pool_options: pools.into_iter().map(MemoryPoolOptions::new).collect(),
        };
        let props = MemoryDeviceProperties::default();
        match routes(&config, props, &sizes) {
            Ok(asked) => prop_assert_eq!(expanded(&config, &sizes), asked),
            // A layout the configuration refuses (a slice larger than its page).
            Err(refused) => prop_assert_eq!(route_runs(&config, props, &sizes), Err(refused)),
        }
    }

    #[test]
    fn range_live_peaks_are_group_live_peaks(
        allocs in proptest::collection::vec((1u64..5000, 0usize..40), 1..200),
        ranges in proptest::collection::vec(
            proptest::collection::vec((0u64..5200, 0u64..5200), 0..4), 0..6),
    ) {
        // Allocation i of size s lives until event i + l (in allocations).
        let mut b = TraceBuilder::new(TraceHeader::default());
        let mut frees: Vec<(usize, u64)> = Vec::new();
        let mut t = 0u64;
        for (id, &(size, life)) in allocs.iter().enumerate() {
            frees.sort_unstable();
            while frees.first().is_some_and(|&(at, _)| at <= id) {
                let (_, gone) = frees.remove(0);
                t += 1;
                b.free(t, gone).unwrap();
            }
            t += 1;
            b.alloc(t, id as u64, size).unwrap();
            frees.push((id + life, id as u64));
        }
        let trace = b.finish().unwrap();
        let listed: Vec<Vec<u64>> = ranges
            .iter()
            .map(|group| {
                let mut sizes: Vec<u64> = trace
                    .distinct_sizes()
                    .into_iter()
                    .filter(|s| group.iter().any(|&(low, high)| low <= *s && *s <= high))
                    .collect();
                sizes.dedup();
                sizes
            })
            .collect();
        prop_assert_eq!(trace.range_live_peaks(&ranges), trace.group_live_peaks(&listed));
    }
}

#[test]
fn route_runs_are_few_where_sizes_are_many() {
    // One sliced pool for sizes up to 1 MiB (and those near its 4 MiB page), the rest
    // to an exclusive tail: 100,000 sizes route in at most five runs.
    let config = MemoryConfiguration::Custom {
        pool_options: vec![
            MemoryPoolOptions::new(PoolType::SlicedPages {
                page_size: 4 * MIB,
                max_slice_size: MIB,
                max_pool_size: None,
            }),
            MemoryPoolOptions::new(PoolType::ExclusivePages {
                max_alloc_size: 1 << 40,
            }),
        ],
    };
    let sizes: Vec<u64> = (0..100_000u64).map(|k| k * 97).collect();
    let runs = route_runs(&config, MemoryDeviceProperties::default(), &sizes).unwrap();
    assert!(runs.len() <= 5, "{runs:?}");
    assert_eq!(
        expanded(&config, &sizes),
        routes(&config, MemoryDeviceProperties::default(), &sizes).unwrap()
    );
}
