//! Replaying the bundled real traces.
// These scenarios use sliced pools, which exclusive-memory-only builds refuse.
#![cfg(not(feature = "exclusive-memory-only"))]

use cubepool::trace::{replay, ReplayOptions, Trace};
use cubepool::{MemoryConfiguration, MemoryDeviceProperties};

fn example(name: &str) -> Trace {
    let path = format!(
        "{}/python/cubepool/examples/data/{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::load(path).unwrap()
}

/// Peak live bytes from the traces' README.
const TRACES: [(&str, u64, usize); 3] = [
    ("gpt2-train", 356_502_840, 6_870),
    ("gpt2-generate", 29_677_568, 30_427),
    ("transformer-train", 575_271_436, 10_882),
];

#[test]
fn replay_reaches_each_traces_peak_live() {
    for (name, peak_live, events) in TRACES {
        let trace = example(name);
        assert_eq!(trace.len(), events, "{name}");
        assert_eq!(trace.peak_live(), peak_live, "{name}");
        for config in [
            MemoryConfiguration::SubSlices,
            MemoryConfiguration::ExclusivePages,
        ] {
            let result = replay(
                &trace,
                &config,
                MemoryDeviceProperties::default(),
                ReplayOptions::default(),
            )
            .unwrap();
            assert_eq!(result.peak_in_use, peak_live, "{name} {config:?}");
            assert!(result.peak_reserved >= peak_live, "{name} {config:?}");
            assert_eq!(result.failed_reserves, 0);
        }
    }
}

#[test]
fn a_memory_limit_makes_reserves_fail_without_crashing() {
    let trace = example("gpt2-train");
    let result = replay(
        &trace,
        &MemoryConfiguration::SubSlices,
        MemoryDeviceProperties::default(),
        ReplayOptions {
            limit: Some(64 * 1024 * 1024),
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert!(result.failed_reserves > 0);
    assert!(result.peak_reserved <= 64 * 1024 * 1024);
}
