//! Helpers shared by the bench binaries: the fixed-seed generator, the workloads'
//! shapes, and the bundled traces.
//!
//! Each bench binary compiles this module on its own and uses a subset of it.
#![allow(dead_code)]

use cubepool::trace::Trace;
use cubepool::{ComputeStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement};

/// One mebibyte.
pub const MIB: u64 = 1024 * 1024;

/// The seed of every generator, so every allocator sees the same sizes.
pub const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The live allocations of the steady-state workload.
pub const STEADY_LIVE: usize = 10_000;

/// The FIFO windows (live 1 MiB reserves), CubeCL's own benchmark shape.
pub const FIFO_WINDOWS: [usize; 3] = [40, 400, 4000];

/// The bundled traces, in the order reports list them.
pub const TRACES: [&str; 3] = ["gpt2-train", "gpt2-generate", "transformer-train"];

/// The device properties of every benchmark: 2 GiB pages at most, 32-byte alignment.
pub fn properties() -> MemoryDeviceProperties {
    MemoryDeviceProperties {
        max_page_size: 2048 * MIB,
        alignment: 32,
    }
}

/// cubepool's `MemoryManagement` with the `SubSlices` preset and [`properties`] over
/// `storage`: the cubepool of every benchmark.
pub fn sub_slices<S: ComputeStorage>(storage: S) -> MemoryManagement<S> {
    MemoryManagement::from_configuration(storage, properties(), MemoryConfiguration::SubSlices)
        .expect("the SubSlices preset is valid")
}

/// cubepool's `MemoryManagement` with its default layout, the `virtual_pages` preset
/// (one virtual pool of 2 MiB granules), and [`properties`] over `storage`, which needs
/// virtual memory (`VirtualStorage`, or `HostStorage` on Linux): the virtual pool every
/// benchmark measures beside the sliced pools.
pub fn virtual_pages<S: ComputeStorage>(storage: S) -> MemoryManagement<S> {
    MemoryManagement::from_configuration(storage, properties(), MemoryConfiguration::VirtualPages)
        .expect("the virtual_pages preset is valid")
}

/// A small deterministic generator (xorshift64*), so runs are comparable.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A log-uniform size in `[8, 32 MiB]`.
    pub fn log_uniform_size(&mut self) -> u64 {
        let exponent = 3.0 + (self.next() % 10_000) as f64 / 10_000.0 * 22.0;
        2f64.powf(exponent) as u64
    }
}

/// The steady-state workload, drawn once so that every allocator runs the same
/// sequence and the generator stays out of the timed loop.
pub struct SteadyState {
    /// The sizes of the initial live set (`STEADY_LIVE` of them).
    pub initial: Vec<u64>,
    /// Steps `(victim, size)`: free live allocation `victim`, then reserve `size`
    /// bytes in its place. A benchmark cycles through them.
    pub steps: Vec<(usize, u64)>,
}

impl SteadyState {
    /// The workload: `STEADY_LIVE` initial sizes, then `steps` replacements.
    pub fn new(steps: usize) -> Self {
        let mut rng = Rng(SEED);
        let initial = (0..STEADY_LIVE).map(|_| rng.log_uniform_size()).collect();
        let steps = (0..steps)
            .map(|_| {
                let victim = (rng.next() % STEADY_LIVE as u64) as usize;
                (victim, rng.log_uniform_size())
            })
            .collect();
        Self { initial, steps }
    }
}

/// The folder of the shared traces that are not bundled: `$CUBEPOOL_TRACES`, else
/// `/work/shared/traces` (as `benches/run_all.sh` reads them).
pub fn shared_traces_dir() -> std::path::PathBuf {
    std::env::var_os("CUBEPOOL_TRACES")
        .map_or_else(|| "/work/shared/traces".into(), std::path::PathBuf::from)
}

/// Every trace a bench runs: the bundled ones ([`TRACES`]), then each `NAME.jsonl` of
/// [`shared_traces_dir`] whose name is not bundled, in name order (none where the
/// folder is absent).
pub fn all_traces() -> Vec<(String, Trace)> {
    let mut traces: Vec<(String, Trace)> = TRACES
        .iter()
        .map(|&name| (name.to_string(), example(name)))
        .collect();
    let Ok(entries) = std::fs::read_dir(shared_traces_dir()) else {
        return traces;
    };
    let mut shared: Vec<(String, std::path::PathBuf)> = entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(".jsonl")?
                .to_string();
            (!TRACES.contains(&name.as_str())).then_some((name, path))
        })
        .collect();
    shared.sort();
    for (name, path) in shared {
        let trace = Trace::load(&path)
            .unwrap_or_else(|err| panic!("shared trace {}: {err}", path.display()));
        traces.push((name, trace));
    }
    traces
}

/// The bundled trace `name` (see `python/cubepool/examples/data/README.md`).
pub fn example(name: &str) -> Trace {
    let path = format!(
        "{}/python/cubepool/examples/data/{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::load(path).expect("bundled trace")
}
