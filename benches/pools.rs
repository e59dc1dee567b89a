//! Core benchmarks: FIFO windows of 1 MiB reserves, a steady state of log-uniform
//! sizes, and replay of the bundled real traces.
//!
//! Run: `cargo bench --bench pools` (add `-- --quick` for a smoke run).

use std::collections::VecDeque;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cubepool::trace::{replay, ReplayOptions, Trace};
use cubepool::{
    HostStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, VirtualStorage,
};

const MIB: u64 = 1024 * 1024;

fn properties() -> MemoryDeviceProperties {
    MemoryDeviceProperties {
        max_page_size: 2048 * MIB,
        alignment: 32,
    }
}

/// A small deterministic generator (xorshift64*), so runs are comparable.
pub struct Rng(u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A log-uniform size in `[8, 32 MiB]`.
    pub fn log_uniform_size(&mut self) -> u64 {
        let exponent = 3.0 + (self.next_u64() % 10_000) as f64 / 10_000.0 * 22.0;
        2f64.powf(exponent) as u64
    }
}

fn fifo_window(c: &mut Criterion) {
    let mut group = c.benchmark_group("fifo_window_1mib");
    group.throughput(Throughput::Elements(1));
    for window in [40usize, 400, 4000] {
        group.bench_with_input(
            BenchmarkId::new("cubepool", window),
            &window,
            |b, &window| {
                let mut mm = MemoryManagement::from_configuration(
                    HostStorage::new(),
                    properties(),
                    MemoryConfiguration::SubSlices,
                )
                .unwrap();
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
    const LIVE: usize = 10_000;
    let mut group = c.benchmark_group("steady_state_log_uniform");
    group.throughput(Throughput::Elements(1));
    group.bench_function("cubepool", |b| {
        // Virtual storage: 10,000 live log-uniform sizes would need gigabytes of host RAM.
        let mut mm = MemoryManagement::from_configuration(
            VirtualStorage::new(),
            properties(),
            MemoryConfiguration::SubSlices,
        )
        .unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut live: Vec<_> = (0..LIVE)
            .map(|_| mm.reserve(rng.log_uniform_size()).unwrap())
            .collect();
        b.iter(|| {
            let victim = (rng.next_u64() % LIVE as u64) as usize;
            live[victim] = black_box(mm.reserve(black_box(rng.log_uniform_size())).unwrap());
        });
    });
    group.finish();
}

fn example(name: &str) -> Trace {
    let path = format!(
        "{}/python/cubepool/examples/data/{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::load(path).expect("bundled trace")
}

fn replay_traces(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    for name in ["gpt2-train", "gpt2-generate", "transformer-train"] {
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
