//! The default layout's storage calls and peak of mapped bytes, beside its eager-unmap
//! limit (`keep=0`, the same size split): the figures issue 28's release rule trades.
//!
//! `cargo run --release --example default_calls -- steady` runs the steady state of
//! `benches/peers.rs` (10,000 live log-uniform sizes from 8 B to 32 MiB; free a random
//! one, reserve a new size) on `VirtualStorage`: 4,096 steps of warm-up, then 4,096
//! counted, and prints map + unmap calls per 100 counted steps and the peak of mapped
//! bytes over the whole run, for each layout.
//!
//! `cargo run --release --example default_calls -- TRACE...` replays each trace
//! (`.jsonl` or `.jsonl.gz`) and prints, for each layout, the utilization (peak live
//! over peak mapped, three decimals) and map + unmap calls per 100 allocations.

#[path = "../benches/common/mod.rs"]
mod common;

use common::{properties, SteadyState};
use cubepool::config::{MemoryConfiguration, MemoryDeviceProperties};
use cubepool::trace::replay::{replay, ReplayOptions};
use cubepool::trace::{Trace, TraceEvent};
use cubepool::{ComputeStorage, MemoryManagement, VirtualStorage};

/// The eager-unmap limit of the default: its size split, unmapping at once.
const EAGER: &str = "virtual(granule=2MiB, keep=0, small=16MiB)";

/// Steady-state steps of warm-up, and as many counted after them.
const STEPS: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: default_calls steady | TRACE...");
        std::process::exit(2);
    }
    let eager = MemoryConfiguration::parse(EAGER).expect("a valid layout");
    let layouts = [
        ("default", MemoryConfiguration::default()),
        ("eager", eager),
    ];
    if args[0] == "steady" {
        for (name, layout) in &layouts {
            let (calls, peak) = steady(layout);
            println!("steady {name}: {calls:.2} calls per 100 steps, peak mapped {peak}");
        }
        return;
    }
    for path in &args {
        let trace = Trace::load(path).unwrap_or_else(|error| {
            eprintln!("cannot load {path}: {error}");
            std::process::exit(1);
        });
        let allocations = trace
            .events()
            .iter()
            .filter(|event| matches!(event, TraceEvent::Alloc { .. }))
            .count()
            .max(1);
        let mut line = path.rsplit('/').next().unwrap_or(path).to_string();
        for (name, layout) in &layouts {
            let options = ReplayOptions {
                limit: None,
                samples: 0,
            };
            let result = replay(&trace, layout, MemoryDeviceProperties::default(), options)
                .expect("a valid layout");
            let calls = result.storage_allocations + result.storage_frees;
            line += &format!(
                "  {name} {:.3} {:.2}",
                result.utilization,
                100.0 * calls as f64 / allocations as f64
            );
        }
        println!("{line}");
    }
}

/// The steady state through `layout`: calls per 100 counted steps, and the peak of
/// mapped bytes.
fn steady(layout: &MemoryConfiguration) -> (f64, u64) {
    let workload = SteadyState::new(2 * STEPS);
    let mut memory =
        MemoryManagement::from_configuration(VirtualStorage::new(), properties(), layout.clone())
            .expect("a valid layout");
    let calls = |memory: &MemoryManagement<VirtualStorage>| {
        memory.storage().allocations() + memory.storage().deallocations()
    };
    let mut peak = 0;
    let mut live: Vec<_> = workload
        .initial
        .iter()
        .map(|&size| {
            let handle = memory.reserve(size).expect("reserve");
            peak = peak.max(memory.storage().bytes_allocated());
            Some(handle)
        })
        .collect();
    let mut before = 0;
    for (step, &(victim, size)) in workload.steps.iter().enumerate() {
        if step == STEPS {
            before = calls(&memory);
        }
        drop(live[victim].take());
        live[victim] = Some(memory.reserve(size).expect("reserve"));
        peak = peak.max(memory.storage().bytes_allocated());
    }
    let counted = calls(&memory) - before;
    (100.0 * counted as f64 / STEPS as f64, peak)
}
