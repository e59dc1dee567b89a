//! The unit tests of the replays.

use super::*;
use crate::config::{MemoryPoolOptions, PoolType};
use crate::trace::format::TraceBuilder;
use crate::trace::torch_model::TorchPool;
use crate::trace::TraceHeader;

const MIB: u64 = 1024 * 1024;

/// A trace whose live bytes rise in a staircase to `steps` MiB, fall back, and rise
/// once more to half of it.
fn staircase(steps: u64) -> Trace {
    let mut b = TraceBuilder::new(TraceHeader::default());
    let mut t = 0;
    let mut tick = || {
        t += 10;
        t
    };
    for id in 0..steps {
        b.alloc(tick(), id, MIB).unwrap();
    }
    for id in 0..steps {
        b.free(tick(), id).unwrap();
    }
    for id in steps..steps + steps / 2 {
        b.alloc(tick(), id, MIB).unwrap();
    }
    b.finish().unwrap()
}

fn custom(pools: Vec<PoolType>) -> MemoryConfiguration {
    MemoryConfiguration::Custom {
        pool_options: pools.into_iter().map(MemoryPoolOptions::new).collect(),
    }
}

fn run(trace: &Trace, config: &MemoryConfiguration, options: ReplayOptions) -> ReplayResult {
    replay(trace, config, MemoryDeviceProperties::default(), options).unwrap()
}

#[test]
fn samples_are_bounded_and_keep_the_exact_peaks() {
    let trace = staircase(1000);
    let config = custom(vec![PoolType::Direct {
        reclaim_at: Some(0),
    }]);
    for samples in [1, 7, 64, 512, 5000] {
        let result = run(
            &trace,
            &config,
            ReplayOptions {
                limit: None,
                samples,
            },
        );
        assert!(result.samples.len() <= samples, "{samples}");
        assert!(!result.samples.is_empty());
        let max = |f: fn(&Sample) -> u64| result.samples.iter().map(f).max().unwrap();
        assert_eq!(max(|s| s.reserved_max), result.peak_reserved, "{samples}");
        assert_eq!(max(|s| s.in_use_max), result.peak_in_use, "{samples}");
        // The runs tile the events in order.
        let mut next = 0;
        for sample in &result.samples {
            assert_eq!(sample.first_event, next);
            assert!(sample.in_use_min <= sample.in_use_end);
            assert!(sample.in_use_end <= sample.in_use_max);
            assert!(sample.reserved_min <= sample.reserved_max);
            assert!(sample.t_start <= sample.t_end);
            next += sample.events;
        }
        assert_eq!(next, trace.len());
        let last = result.samples.last().unwrap();
        assert_eq!(last.in_use_end, result.final_usage.bytes_in_use);
        assert_eq!(last.reserved_end, result.final_usage.bytes_reserved);
    }
    let none = run(
        &trace,
        &config,
        ReplayOptions {
            limit: None,
            samples: 0,
        },
    );
    assert!(none.samples.is_empty());
    assert_eq!(none.peak_reserved, 1000 * MIB);
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn peak_events_and_the_per_pool_breakdown_add_up() {
    let trace = staircase(10);
    let config = custom(vec![
        PoolType::SlicedPages {
            page_size: 4 * MIB,
            max_slice_size: MIB / 2,
            max_pool_size: None,
        },
        PoolType::ExclusivePages {
            max_alloc_size: 64 * MIB,
        },
    ]);
    let result = run(&trace, &config, ReplayOptions::default());
    assert_eq!(result.peak_in_use, 10 * MIB);
    assert_eq!(result.peak_in_use_event, 9);
    assert_eq!(result.peak_reserved_event, 9);
    assert_eq!(result.pools.len(), 2);
    // 1 MiB does not fit half a 4 MiB page, so the exclusive pool serves all.
    assert_eq!(result.pools[0].reservations, 0);
    assert_eq!(result.pools[1].reservations, 15);
    assert_eq!(
        result.pools[1].stats.bytes_reserved_peak,
        result.peak_reserved
    );
    let reserved: u64 = result
        .pools
        .iter()
        .map(|p| p.final_usage.bytes_reserved)
        .sum();
    assert_eq!(reserved, result.final_usage.bytes_reserved);
    for (index, sample) in result.samples.iter().enumerate() {
        let reserved: u64 = result.pools.iter().map(|p| p.reserved_series[index]).sum();
        let in_use: u64 = result.pools.iter().map(|p| p.in_use_series[index]).sum();
        assert_eq!(reserved, sample.reserved_end);
        assert_eq!(in_use, sample.in_use_end);
    }
    assert!((result.fragmentation() - (1.0 - result.utilization)).abs() < 1e-12);
}

#[test]
fn failures_under_a_limit_are_counted_and_located() {
    let trace = staircase(10);
    let config = custom(vec![PoolType::Direct { reclaim_at: None }]);
    let result = run(
        &trace,
        &config,
        ReplayOptions {
            limit: Some(4 * MIB),
            ..ReplayOptions::default()
        },
    );
    assert_eq!(result.failed_reserves, 6 + 1);
    assert_eq!(
        result.failures,
        Failures {
            over_limit: 7,
            ..Failures::default()
        }
    );
    assert_eq!(result.first_failed_event, Some(4));
    assert!(result.peak_reserved <= 4 * MIB);
    assert!(!result.complete());
    assert!(
        result.utilization.is_nan(),
        "no ratio for an incomplete replay"
    );
    let ok = run(&trace, &config, ReplayOptions::default());
    assert_eq!(ok.failed_reserves, 0);
    assert_eq!(ok.first_failed_event, None);
    assert!(ok.complete());
    assert!(ok.utilization <= 1.0);
}

#[test]
fn requests_no_pool_takes_fail_as_too_big_without_any_limit() {
    // The staircase asks for 1 MiB at a time; the only pool takes at most 512 KiB.
    let trace = staircase(3);
    let config = custom(vec![PoolType::ExclusivePages {
        max_alloc_size: MIB / 2,
    }]);
    let result = run(&trace, &config, ReplayOptions::default());
    assert_eq!(result.failures.too_big, result.failed_reserves);
    // Three 1 MiB requests on the way up, one (half of three) on the way back.
    assert_eq!(result.failures.total(), 3 + 1);
    assert_eq!(result.peak_reserved, 0);
    assert!(result.utilization.is_nan());
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn full_capped_pools_are_their_own_cause() {
    let trace = staircase(4);
    let config = custom(vec![PoolType::SlicedPages {
        page_size: 2 * MIB,
        max_slice_size: 2 * MIB,
        max_pool_size: Some(2 * MIB),
    }]);
    let result = run(&trace, &config, ReplayOptions::default());
    assert_eq!(result.failures.pools_full, result.failed_reserves);
    assert!(result.failures.pools_full > 0);
}

#[test]
fn the_torch_model_replays_with_the_same_measurements() {
    // Ten 1 MiB requests (rounded to 1 MiB, the small pool: 2 MiB segments, two
    // each), all freed, then five more served from the cache: 10 MiB in 5 segments.
    let trace = staircase(10);
    let result = replay_torch(&trace, TorchSettings::default(), ReplayOptions::default());
    assert_eq!(
        (result.peak_reserved, result.peak_in_use),
        (10 * MIB, 10 * MIB)
    );
    assert_eq!((result.storage_allocations, result.storage_frees), (5, 0));
    assert_eq!(result.pools.len(), 2);
    assert_eq!(result.pools[0].pool, ReplayedPool::Torch(TorchPool::Small));
    assert_eq!(result.pools[0].reservations, 15);
    assert_eq!(result.pools[0].stats.pages_peak, 5);
    assert_eq!(result.final_usage.bytes_in_use, 5 * MIB);
    for (index, sample) in result.samples.iter().enumerate() {
        let reserved: u64 = result.pools.iter().map(|p| p.reserved_series[index]).sum();
        let in_use: u64 = result.pools.iter().map(|p| p.in_use_series[index]).sum();
        assert_eq!((reserved, in_use), (sample.reserved_end, sample.in_use_end));
    }
    // Under a 4 MiB device, requests 5 to 10 fail (nothing is free to give back);
    // of the last five, four are served from the two cached segments and one fails.
    let limited = replay_torch(
        &trace,
        TorchSettings::default(),
        ReplayOptions {
            limit: Some(4 * MIB),
            ..ReplayOptions::default()
        },
    );
    assert_eq!(limited.failed_reserves, 6 + 1);
    assert_eq!(limited.first_failed_event, Some(4));
    assert_eq!(limited.peak_reserved, 4 * MIB);
}

#[test]
fn a_bounded_replay_stops_where_it_is_out_of_the_running() {
    let trace = staircase(10);
    let config = custom(vec![PoolType::Direct { reclaim_at: None }]);
    let whole = run(&trace, &config, ReplayOptions::default());
    let props = MemoryDeviceProperties::default();
    let (same, stopped) = replay_until(&trace, &config, props, StopWhen::default()).unwrap();
    assert_eq!(stopped, None);
    assert_eq!(
        (same.peak_reserved, same.storage_allocations, same.events),
        (whole.peak_reserved, whole.storage_allocations, whole.events)
    );
    let over = |reserved_above, storage_allocations_above| {
        let stop = StopWhen {
            reserved_above,
            storage_allocations_above,
        };
        replay_until(&trace, &config, props, stop).unwrap()
    };
    // One MiB per allocation: past 3 MiB at the fourth event (index 3).
    let (part, stopped) = over(Some(3 * MIB), None);
    assert_eq!(stopped, Some(3));
    assert_eq!((part.events, part.peak_reserved), (4, 4 * MIB));
    assert!(part.peak_reserved <= whole.peak_reserved);
    let (_, stopped) = over(None, Some(5));
    assert_eq!(stopped, Some(5));
    // A bound at the whole replay's figures is never passed.
    let (_, stopped) = over(Some(whole.peak_reserved), Some(whole.storage_allocations));
    assert_eq!(stopped, None);
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn a_layout_replays_as_the_sum_of_its_pools_on_their_sizes() {
    // 1 MiB allocations, then 2 MiB ones: a sliced pool takes the first, an
    // exclusive pool the rest.
    let mut b = TraceBuilder::new(TraceHeader::default());
    for id in 0..8u64 {
        b.alloc(id, id, (1 + id % 2) * MIB).unwrap();
    }
    for id in 0..4u64 {
        b.free(10 + id, id).unwrap();
    }
    let trace = b.finish().unwrap();
    let sliced = PoolType::SlicedPages {
        page_size: 4 * MIB,
        max_slice_size: MIB,
        max_pool_size: None,
    };
    let exclusive = PoolType::ExclusivePages {
        max_alloc_size: 64 * MIB,
    };
    let props = MemoryDeviceProperties::default();
    let layout = custom(vec![sliced, exclusive]);
    assert_eq!(
        routes(&layout, props, &[0, MIB, 2 * MIB, 128 * MIB]).unwrap(),
        vec![None, Some(0), Some(1), None]
    );
    let (whole, _) = replay_until(&trace, &layout, props, StopWhen::default()).unwrap();
    let part = |pool, size| {
        replay_sizes_until(
            &trace,
            &custom(vec![pool]),
            props,
            &[size],
            StopWhen::default(),
        )
        .unwrap()
        .0
    };
    let (small, large) = (part(sliced, MIB), part(exclusive, 2 * MIB));
    assert_eq!(
        small.peak_reserved + large.peak_reserved,
        whole.peak_reserved
    );
    assert_eq!(
        small.storage_allocations + large.storage_allocations,
        whole.storage_allocations
    );
    assert_eq!(small.pools[0].reservations, whole.pools[0].reservations);
    assert_eq!(large.pools[0].stats, whole.pools[1].stats);
}

#[test]
fn an_empty_trace_replays_to_nothing() {
    let trace = TraceBuilder::new(TraceHeader::default()).finish().unwrap();
    let result = run(
        &trace,
        &MemoryConfiguration::ExclusivePages,
        ReplayOptions::default(),
    );
    assert_eq!(result.events, 0);
    assert!(result.samples.is_empty());
    assert_eq!(result.utilization, 1.0);
    assert_eq!(result.ns_per_event(), 0.0);
}
