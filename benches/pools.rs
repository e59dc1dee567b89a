//! Core benchmarks: FIFO windows of 1 MiB reserves, a steady state of log-uniform
//! sizes, and replay of the bundled real traces.
//!
//! Run: `cargo bench --bench pools` (add `-- --quick` for a smoke run).

use std::collections::VecDeque;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cubepool::trace::{replay, ReplayOptions};
use cubepool::{HostStorage, MemoryConfiguration, VirtualStorage};

mod common;
use common::{example, properties, sub_slices, Rng, FIFO_WINDOWS, MIB, SEED, STEADY_LIVE, TRACES};

fn fifo_window(c: &mut Criterion) {
    let mut group = c.benchmark_group("fifo_window_1mib");
    group.throughput(Throughput::Elements(1));
    for window in FIFO_WINDOWS {
        group.bench_with_input(
            BenchmarkId::new("cubepool", window),
            &window,
            |b, &window| {
                let mut mm = sub_slices(HostStorage::new());
                let mut live = VecDeque::with_capacity(window + 1);
                for _ in 0..window {
                    live.push_back(mm.reserve(MIB).unwrap());
                }
                b.iter(|| {
                    live.push_back(black_box(mm.reserve(black_box(MIB)).unwrap()));
                    drop(live.pop_front());
                });
            },
        );
    }
    group.finish();
}

fn steady_state(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_state_log_uniform");
    group.throughput(Throughput::Elements(1));
    group.bench_function("cubepool", |b| {
        // Virtual storage: 10,000 live log-uniform sizes would need gigabytes of host RAM.
        let mut mm = sub_slices(VirtualStorage::new());
        let mut rng = Rng(SEED);
        let mut live: Vec<_> = (0..STEADY_LIVE)
            .map(|_| mm.reserve(rng.log_uniform_size()).unwrap())
            .collect();
        b.iter(|| {
            let victim = (rng.next() % STEADY_LIVE as u64) as usize;
            live[victim] = black_box(mm.reserve(black_box(rng.log_uniform_size())).unwrap());
        });
    });
    group.finish();
}

fn replay_traces(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    for name in TRACES {
        let trace = example(name);
        group.throughput(Throughput::Elements(trace.len() as u64));
        group.bench_function(BenchmarkId::new("cubepool", name), |b| {
            b.iter(|| {
                black_box(
                    replay(
                        &trace,
                        &MemoryConfiguration::SubSlices,
                        properties(),
                        ReplayOptions::default(),
                    )
                    .unwrap(),
                )
            });
        });
    }
    group.finish();
}

criterion_group!(benches, fifo_window, steady_state, replay_traces);
criterion_main!(benches);
