//! Reports, records, measured plans, install_pools and statistics, on the bundled
//! real traces and small scenarios.

use cubepool::handle::SlotRef;
use cubepool::trace::{replay, ReplayOptions, Trace, TraceEvent};
use cubepool::{
    ComputeStorage, InstallMemoryPoolsError, MemoryAllocationMode, MemoryConfiguration,
    MemoryDeviceProperties, MemoryManagement, MemoryReport, VirtualStorage,
};
#[cfg(not(feature = "exclusive-memory-only"))]
use cubepool::{MemoryPoolKind, PoolError, PoolType};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn example(name: &str) -> Trace {
    let path = format!(
        "{}/python/cubepool/examples/data/{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::load(path).unwrap()
}

const TRACES: [&str; 3] = ["gpt2-train", "gpt2-generate", "transformer-train"];

/// What one run of a trace through a memory management did.
struct Run {
    report: MemoryReport,
    peak_reserved: u64,
    failures: u64,
    storage_allocations: u64,
}

/// Reserves and releases per the trace on a fresh memory management.
fn run(trace: &Trace, configuration: &MemoryConfiguration) -> Run {
    let mut mm = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties::default(),
        configuration.clone(),
    )
    .unwrap();
    run_on(&mut mm, trace)
}

/// Reserves and releases per the trace on `mm`, then releases what the trace left
/// live (after taking the report).
fn run_on(mm: &mut MemoryManagement<VirtualStorage>, trace: &Trace) -> Run {
    let mut slots: Vec<Option<SlotRef>> = vec![None; trace.allocations() as usize];
    let (mut peak_after_events, mut failures) = (0, 0);
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => match mm.reserve_slot(size) {
                Ok((slot_ref, _)) => slots[id as usize] = Some(slot_ref),
                Err(_) => failures += 1,
            },
            TraceEvent::Free { id, .. } => {
                if let Some(slot_ref) = slots[id as usize].take() {
                    mm.release_slot(slot_ref).unwrap();
                }
            }
        }
        peak_after_events = peak_after_events.max(mm.storage().bytes_allocated());
    }
    mm.check_invariants().unwrap();
    // The statistics see every page, even one a periodic release frees within the
    // same reserve.
    let stats = mm.memory_stats();
    assert!(stats.reserved_bytes.peak >= peak_after_events);
    let report = mm.memory_report();
    for slot_ref in slots.into_iter().flatten() {
        mm.release_slot(slot_ref).unwrap();
    }
    Run {
        report,
        peak_reserved: stats.reserved_bytes.peak,
        failures,
        storage_allocations: stats.num_device_alloc,
    }
}

fn layouts() -> Vec<MemoryConfiguration> {
    let mut layouts = vec![MemoryConfiguration::ExclusivePages];
    if !cubepool::EXCLUSIVE_MEMORY_ONLY {
        layouts.push(MemoryConfiguration::SubSlices);
        layouts.push(
            MemoryConfiguration::parse(
                "sliced(page=2MiB, max_slice=64KiB); sliced(page=16MiB, max_slice=2MiB, \
                 cap=64MiB); sliced(page=64MiB, max_slice=8MiB); exclusive(max_alloc=2GiB)",
            )
            .unwrap(),
        );
    }
    layouts
}

#[test]
fn a_plan_replays_its_workload_without_errors_and_no_more_memory() {
    for name in TRACES {
        let trace = example(name);
        for layout in layouts() {
            let measured = run(&trace, &layout);
            assert_eq!(measured.failures, 0, "{name} {layout}");
            for headroom in [0.0, 0.25] {
                let plan = measured.report.plan(headroom).unwrap();
                let planned = run(&trace, &plan);
                let what = format!("{name} under {layout} planned as {plan}");
                assert_eq!(planned.failures, 0, "{what}");
                assert!(planned.peak_reserved <= measured.peak_reserved, "{what}");
                // The plan makes the same decisions: the same storage traffic.
                assert_eq!(planned.peak_reserved, measured.peak_reserved, "{what}");
                assert_eq!(
                    planned.storage_allocations, measured.storage_allocations,
                    "{what}"
                );
                // As a hard budget: a device of exactly the measured peak suffices.
                let result = replay(
                    &trace,
                    &plan,
                    MemoryDeviceProperties::default(),
                    ReplayOptions {
                        limit: Some(measured.peak_reserved),
                        ..ReplayOptions::default()
                    },
                )
                .unwrap();
                assert_eq!(result.failed_reserves, 0, "{what}");
                assert!(result.peak_reserved <= measured.peak_reserved, "{what}");
            }
        }
    }
}

#[test]
fn a_plan_installed_on_the_measured_memory_management_runs_the_same() {
    for name in TRACES {
        let trace = example(name);
        for layout in layouts() {
            let mut mm = MemoryManagement::from_configuration(
                VirtualStorage::new(),
                MemoryDeviceProperties::default(),
                layout.clone(),
            )
            .unwrap();
            let measured = run_on(&mut mm, &trace);
            mm.record_memory("measured");
            mm.install_pools(measured.report.plan(0.0).unwrap())
                .unwrap();
            mm.reset_peak_memory_stats();
            mm.reset_accumulated_memory_stats();
            let planned = run_on(&mut mm, &trace);
            let what = format!("{name} under {layout}");
            assert_eq!(planned.failures, 0, "{what}");
            assert_eq!(planned.peak_reserved, measured.peak_reserved, "{what}");
            assert_eq!(
                planned.storage_allocations, measured.storage_allocations,
                "{what}"
            );
            assert_eq!(mm.records().len(), 1);
        }
    }
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn plans_cap_the_sliced_pools_that_served_the_workload() {
    let measured = run(&example("gpt2-train"), &MemoryConfiguration::SubSlices);
    let MemoryConfiguration::Custom { pool_options } = measured.report.plan(0.0).unwrap() else {
        panic!("a plan lists its pools");
    };
    assert_eq!(pool_options.len(), measured.report.dynamic.len());
    for (options, pool) in pool_options.iter().zip(&measured.report.dynamic) {
        match (options.pool_type, pool.kind) {
            (
                PoolType::SlicedPages {
                    page_size,
                    max_pool_size,
                    max_slice_size,
                },
                MemoryPoolKind::Sliced { .. },
            ) => {
                if pool.largest_alloc <= max_slice_size {
                    assert_eq!(max_pool_size, Some(pool.pages_peak.max(1) * page_size));
                } else {
                    assert_eq!(max_pool_size, None, "near-page requests keep it uncapped");
                }
            }
            (pool_type, kind) => assert_eq!(Some(pool_type), kind.pool_type()),
        }
    }
}

fn memory(text: &str) -> MemoryManagement<VirtualStorage> {
    MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties {
            max_page_size: 64 * MIB,
            alignment: 32,
        },
        MemoryConfiguration::parse(text).unwrap(),
    )
    .unwrap()
}

#[test]
fn install_pools_refuses_live_memory_then_rebuilds_and_keeps_the_persistent_pool() {
    let mut mm = memory("exclusive(max_alloc=1MiB); direct()");
    mm.set_mode(MemoryAllocationMode::Persistent);
    let weights = mm.reserve(4000).unwrap();
    mm.set_mode(MemoryAllocationMode::Auto);
    let live = mm.reserve(100).unwrap();
    mm.record_memory("before");
    let new = MemoryConfiguration::parse("exclusive(max_alloc=8MiB)").unwrap();
    assert_eq!(
        mm.install_pools(new.clone()),
        Err(InstallMemoryPoolsError::PoolsInUse { bytes_in_use: 100 })
    );
    assert_eq!(mm.pool_options().len(), 2, "a refusal changes nothing");
    // An invalid layout is refused before anything happens.
    let err = mm
        .install_pools(MemoryConfiguration::Custom {
            pool_options: vec![],
        })
        .unwrap_err();
    assert_eq!(err.kind(), "EmptyPoolList");
    drop(live);
    // A freed page is released by the install's cleanup.
    mm.install_pools(new.clone()).unwrap();
    assert_eq!(mm.configuration(), &new);
    let report = mm.memory_report();
    assert_eq!(report.dynamic.len(), 1);
    assert_eq!(report.dynamic[0].pages_peak, 0, "peaks restart");
    assert_eq!(report.persistent.usage.bytes_in_use, 4000);
    assert_eq!(mm.resource(&weights).unwrap().size, 4000);
    assert_eq!(mm.records().len(), 1, "records survive");
    let again = mm.reserve(2 * MIB).unwrap();
    assert_eq!(mm.resource(&again).unwrap().pool, Some(0));
    mm.check_invariants().unwrap();
}

#[test]
fn records_number_and_time_their_reports() {
    let mut mm = memory("exclusive(max_alloc=1MiB)");
    let first = mm.record_memory("empty");
    let _handle = mm.reserve(1000).unwrap();
    let second = mm.record_memory("one buffer");
    assert_eq!((first.sequence, second.sequence), (0, 1));
    assert!(second.time >= first.time);
    assert_eq!(second.report.usage().bytes_in_use, 1000);
    assert_eq!(second.report.dynamic[0].largest_alloc, 1000);
    assert_eq!(mm.records(), &[first, second.clone()]);
    assert_eq!(mm.take_records().len(), 2);
    assert_eq!(mm.record_memory("later").sequence, 2);
    assert!(second.to_string().starts_with("record 1 \"one buffer\""));
}

#[test]
fn stats_follow_reserves_releases_and_pages() {
    let mut mm = memory("exclusive(max_alloc=4MiB)");
    let small = mm.reserve(100).unwrap();
    let large = mm.reserve(2 * MIB).unwrap();
    let stats = mm.memory_stats();
    assert_eq!(stats.allocation.current, 2);
    assert_eq!(stats.requested_bytes.current, 100 + 2 * MIB);
    assert_eq!(stats.allocated_bytes.current, 128 + 2 * MIB);
    assert_eq!(stats.segment.current, 2);
    assert_eq!(stats.reserved_bytes.current, 128 + 2 * MIB);
    assert_eq!(stats.num_device_alloc, 2);
    assert_eq!(stats.inactive_split_bytes.current, 0);
    drop(large);
    let stats = mm.memory_stats();
    assert_eq!(stats.allocated_bytes.current, 128);
    assert_eq!(stats.allocated_bytes.peak, 128 + 2 * MIB);
    assert_eq!(stats.allocation.freed, 1);
    assert_eq!(
        stats.inactive_split_bytes.current,
        2 * MIB,
        "a cached free page"
    );
    assert_eq!(stats.inactive_split.current, 1);
    mm.cleanup(true);
    let stats = mm.memory_stats();
    assert_eq!((stats.segment.current, stats.num_device_free), (1, 1));
    assert_eq!(stats.inactive_split_bytes.peak, 2 * MIB);
    mm.reset_peak_memory_stats();
    let stats = mm.memory_stats();
    assert_eq!(stats.allocated_bytes.peak, 128);
    assert_eq!(stats.reserved_bytes.peak, 128);
    assert_eq!(stats.inactive_split_bytes.peak, 0);
    mm.reset_accumulated_memory_stats();
    let stats = mm.memory_stats();
    assert_eq!((stats.allocation.allocated, stats.num_device_alloc), (0, 0));
    assert_eq!(stats.allocation.current, 1);
    drop(small);
    mm.check_invariants().unwrap();
    let summary = mm.memory_stats().summary("test");
    assert!(summary.contains("Allocated memory"), "{summary}");
}

#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn stats_count_capacity_errors_and_retries() {
    let mut mm = memory("sliced(page=1MiB, max_slice=1MiB, cap=1MiB)");
    let _full = mm.reserve(MIB).unwrap();
    assert!(matches!(
        mm.reserve(10),
        Err(PoolError::PoolCapacityExceeded { .. })
    ));
    assert_eq!(mm.memory_stats().num_ooms, 1);

    let mut limited = MemoryManagement::from_configuration(
        VirtualStorage::with_limit(2 * MIB),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::parse("exclusive(max_alloc=4MiB)").unwrap(),
    )
    .unwrap();
    drop(limited.reserve(2 * MIB).unwrap());
    // The cached 2 MiB page is not reusable for 1 MiB (too much waste): the storage
    // refuses, the cache is freed, and the retry succeeds.
    let _one = limited.reserve(MIB).unwrap();
    let stats = limited.memory_stats();
    assert_eq!((stats.num_alloc_retries, stats.num_ooms), (1, 0));
    assert!(limited.reserve(2 * MIB).is_err());
    assert_eq!(limited.memory_stats().num_ooms, 1);
    limited.check_invariants().unwrap();
}

#[test]
fn the_report_table_names_every_pool() {
    let mut mm = memory("exclusive(max_alloc=1MiB); direct(reclaim_at=1GiB)");
    let _handle = mm.reserve(5000).unwrap();
    let table = mm.memory_report().to_string();
    assert!(table.contains("exclusive(max_alloc=1MiB)"), "{table}");
    assert!(table.contains("direct(reclaim_at=1GiB)"), "{table}");
    assert!(table.contains("persistent"), "{table}");
    let plan = mm.memory_report().plan(0.0).unwrap();
    assert_eq!(
        plan.to_string(),
        "exclusive(max_alloc=1MiB); direct(reclaim_at=1GiB)"
    );
}
