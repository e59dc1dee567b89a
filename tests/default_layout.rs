//! The default layout: a virtual pool of 2 MiB granules, `compact` where the storage
//! has no virtual memory, and no 2 GiB constant limiting the sizes it serves.
// The virtual pool shares granules between blocks, which exclusive-memory-only
// builds refuse (their default stays `ExclusivePages`).
#![cfg(not(feature = "exclusive-memory-only"))]

mod common;

use common::Buffers;
use cubepool::trace::{replay, ReplayOptions, Trace};
use cubepool::{
    MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, PoolType, VirtualStorage,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn props() -> MemoryDeviceProperties {
    MemoryDeviceProperties::default()
}

#[test]
fn the_default_is_one_virtual_pool_of_2_mib_granules_kept_to_the_high_water_mark() {
    assert_eq!(
        MemoryConfiguration::default(),
        MemoryConfiguration::VirtualPages
    );
    let options = MemoryConfiguration::default().resolve(&props()).unwrap();
    assert_eq!(options.len(), 1);
    assert_eq!(
        options[0].pool_type,
        PoolType::VirtualPages {
            granule: 2 * MIB,
            keep: None,
            small: 16 * MIB,
            range: PoolType::VIRTUAL_RANGE,
        }
    );
    assert_eq!(
        MemoryConfiguration::preset("virtual_pages"),
        Some(MemoryConfiguration::VirtualPages)
    );
    assert_eq!(
        MemoryConfiguration::preset("compact"),
        Some(MemoryConfiguration::Compact)
    );
}

#[test]
fn the_default_on_virtual_storage_builds_the_virtual_pool() {
    let memory =
        MemoryManagement::from_configuration(VirtualStorage::new(), props(), Default::default())
            .unwrap();
    assert!(matches!(
        memory.pool_options()[0].pool_type,
        PoolType::VirtualPages { .. }
    ));
}

#[test]
fn the_default_falls_back_to_compact_on_a_storage_without_virtual_memory() {
    let mut memory = MemoryManagement::from_configuration(
        Buffers(VirtualStorage::new()),
        props(),
        MemoryConfiguration::default(),
    )
    .unwrap();
    let compact = MemoryConfiguration::Compact.resolve(&props()).unwrap();
    assert_eq!(memory.pool_options(), compact.as_slice());
    // And it serves small and large requests there (a virtual pool could not).
    let small = memory.reserve(1000).unwrap();
    let large = memory.reserve(100 * MIB).unwrap();
    assert!(memory.memory_usage().bytes_in_use >= 100 * MIB + 1000);
    drop((small, large));
    // Installing the default later falls back the same way.
    memory.cleanup(true);
    memory
        .install_pools(MemoryConfiguration::VirtualPages)
        .unwrap();
    assert_eq!(memory.pool_options(), compact.as_slice());
}

/// The JSONL of a trace that allocates `sizes` and then frees them.
fn trace_of(sizes: &[u64]) -> Trace {
    let mut text =
        String::from(r#"{"format":"cubepool-trace","version":1,"workload":"big","phases":[]}"#);
    text.push('\n');
    let mut t = 0;
    for (id, size) in sizes.iter().enumerate() {
        t += 10;
        text += &format!("{{\"t\":{t},\"op\":\"alloc\",\"id\":{id},\"size\":{size}}}\n");
    }
    for id in 0..sizes.len() {
        t += 10;
        text += &format!("{{\"t\":{t},\"op\":\"free\",\"id\":{id}}}\n");
    }
    Trace::read(text.as_bytes()).unwrap()
}

#[test]
fn the_default_replays_allocations_larger_than_2_gib_on_virtual_storage() {
    // Sizes of a public snapshot of an LLM run on an 80 GB GPU: 2 to 4.9 GiB.
    let big = (49 * GIB) / 10;
    let trace = trace_of(&[big, 2 * GIB + 1, 3 * GIB, 1000]);
    let result = replay(
        &trace,
        &MemoryConfiguration::default(),
        props(),
        ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!(result.failed_reserves, 0);
    assert_eq!(result.peak_in_use, trace.peak_live());
    assert!(result.utilization > 0.99, "{}", result.utilization);
    // `compact` (a 2 GiB largest page) refuses them: the limit was the layout's.
    let compact = replay(
        &trace,
        &MemoryConfiguration::Compact,
        props(),
        ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!(compact.failed_reserves, 3);
}

#[test]
fn the_default_reaches_the_utilization_bar_on_each_shared_trace() {
    // Issue 17's bar: 0.95 on training traces, 0.93 on vit-train and gpt2-generate.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/python/cubepool/examples/data");
    for (name, bar) in [
        ("gpt2-train", 0.95),
        ("gpt2-generate", 0.93),
        ("transformer-train", 0.95),
    ] {
        let trace = Trace::load(format!("{dir}/{name}.jsonl.gz")).unwrap();
        let result = replay(
            &trace,
            &MemoryConfiguration::default(),
            props(),
            ReplayOptions::default(),
        )
        .unwrap();
        assert_eq!(result.failed_reserves, 0, "{name}");
        assert!(result.utilization >= bar, "{name}: {}", result.utilization);
    }
}
