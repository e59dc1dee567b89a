//! Core benchmarks: FIFO windows of 1 MiB reserves, a steady state of log-uniform
//! sizes, and replay of the bundled real traces; each with the `SubSlices` preset
//! (sliced pools, `cubepool`) and with the default layout, the `virtual_pages` preset
//! (one virtual pool of 2 MiB granules, `virtual`); replays also with the default before
//! it (`compact`).
//!
//! Run: `cargo bench --bench pools` (add `-- --quick` for a smoke run).

use std::collections::VecDeque;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cubepool::trace::{replay, ReplayOptions};
use cubepool::{
    ComputeStorage, HostStorage, MemoryConfiguration, MemoryManagement, VirtualStorage,
};

mod common;
use common::{
    example, properties, sub_slices, virtual_pages, Rng, FIFO_WINDOWS, MIB, SEED, STEADY_LIVE,
    TRACES,
};

/// Builds a memory management over a storage.
type Build<S> = fn(S) -> MemoryManagement<S>;

/// The memory managements each workload runs on: the `SubSlices` preset and the
/// virtual pool.
fn layouts<S: ComputeStorage>() -> [(&'static str, Build<S>); 2] {
    [("cubepool", sub_slices), ("virtual", virtual_pages)]
}

/// Storage calls (maps and unmaps, or page allocations and releases) per operation,
/// printed beside the times: `operations` more of `step` after the warm-up.
fn report_calls<S: ComputeStorage>(
    what: &str,
    mm: &mut MemoryManagement<S>,
    operations: u64,
    mut step: impl FnMut(&mut MemoryManagement<S>),
) {
    let before = mm.memory_stats();
    for _ in 0..operations {
        step(mm);
    }
    let after = mm.memory_stats();
    let calls = (after.num_device_alloc + after.num_device_free)
        - (before.num_device_alloc + before.num_device_free);
    println!(
        "{what}: {:.4} storage calls per operation",
        calls as f64 / operations as f64
    );
}

fn fifo_window(c: &mut Criterion) {
    let mut group = c.benchmark_group("fifo_window_1mib");
    group.throughput(Throughput::Elements(1));
    for (name, build) in layouts::<HostStorage>() {
        for window in FIFO_WINDOWS {
            group.bench_with_input(BenchmarkId::new(name, window), &window, |b, &window| {
                let mut mm = build(HostStorage::new());
                let mut live = VecDeque::with_capacity(window + 1);
                for _ in 0..window {
                    live.push_back(mm.reserve(MIB).unwrap());
                }
                let mut step = |mm: &mut MemoryManagement<HostStorage>| {
                    live.push_back(black_box(mm.reserve(black_box(MIB)).unwrap()));
                    drop(live.pop_front());
                };
                report_calls(
                    &format!("fifo {name} W={window}"),
                    &mut mm,
                    10_000,
                    &mut step,
                );
                b.iter(|| step(&mut mm));
            });
        }
    }
    group.finish();
}

fn steady_state(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_state_log_uniform");
    group.throughput(Throughput::Elements(1));
    for (name, build) in layouts::<VirtualStorage>() {
        group.bench_function(name, |b| {
            // Virtual storage: 10,000 live log-uniform sizes would need gigabytes of
            // host RAM.
            let mut mm = build(VirtualStorage::new());
            let mut rng = Rng(SEED);
            let mut live: Vec<_> = (0..STEADY_LIVE)
                .map(|_| mm.reserve(rng.log_uniform_size()).unwrap())
                .collect();
            let mut step = |mm: &mut MemoryManagement<VirtualStorage>| {
                let victim = (rng.next() % STEADY_LIVE as u64) as usize;
                live[victim] = black_box(mm.reserve(black_box(rng.log_uniform_size())).unwrap());
            };
            report_calls(&format!("steady state {name}"), &mut mm, 100_000, &mut step);
            b.iter(|| step(&mut mm));
        });
    }
    group.finish();
}

fn replay_traces(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    let layouts = [
        ("cubepool", MemoryConfiguration::SubSlices),
        ("compact", MemoryConfiguration::Compact),
        ("virtual", MemoryConfiguration::VirtualPages),
    ];
    for name in TRACES {
        let trace = example(name);
        group.throughput(Throughput::Elements(trace.len() as u64));
        for (layout_name, layout) in &layouts {
            let result = replay(&trace, layout, properties(), ReplayOptions::default()).unwrap();
            println!(
                "replay {layout_name} {name}: {} storage calls, utilization {:.3}",
                result.storage_allocations + result.storage_frees,
                result.utilization
            );
            group.bench_function(BenchmarkId::new(*layout_name, name), |b| {
                b.iter(|| {
                    black_box(
                        replay(&trace, layout, properties(), ReplayOptions::default()).unwrap(),
                    )
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, fifo_window, steady_state, replay_traces);
criterion_main!(benches);
