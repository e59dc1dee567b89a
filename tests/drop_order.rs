//! Dropped handles are freed in the order they were dropped, so a program that drops its
//! handles places exactly as one that hands them back with `release`, and as a replay
//! of its trace: the figures a user picks a layout by hold for the handles they drop.
// The layouts compared share pages, which exclusive-memory-only builds refuse.
#![cfg(not(feature = "exclusive-memory-only"))]

use cubepool::trace::{replay, ReplayOptions, Trace, TraceEvent};
use cubepool::{
    ManagedMemoryHandle, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    VirtualStorage,
};

/// How a handle goes back.
#[derive(Clone, Copy, Debug)]
enum HandBack {
    /// `drop(handle)`: freed at the next operation.
    Drop,
    /// `mm.release(handle)`: freed at once.
    Release,
}

fn bundled(name: &str) -> Trace {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/python/cubepool/examples/data");
    Trace::load(format!("{dir}/{name}.jsonl.gz")).unwrap()
}

/// The most bytes the storage held while `trace` ran through handles of `layout`, as
/// its statistics counted them (within a reserve too, before a periodic cleanup gave
/// pages back): what a replay reports as its peak reserved.
fn peak_reserved(trace: &Trace, layout: &MemoryConfiguration, hand_back: HandBack) -> u64 {
    let mut mm = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties::default(),
        layout.clone(),
    )
    .unwrap();
    let mut live: Vec<Option<ManagedMemoryHandle>> = Vec::new();
    live.resize_with(trace.allocations() as usize, || None);
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                live[id as usize] = Some(mm.reserve(size).unwrap());
            }
            TraceEvent::Free { id, .. } => {
                let handle = live[id as usize].take().unwrap();
                match hand_back {
                    HandBack::Drop => drop(handle),
                    HandBack::Release => mm.release(handle),
                }
            }
        }
    }
    mm.memory_stats().reserved_bytes.peak
}

#[test]
fn dropping_handles_places_as_releasing_them_and_as_the_replay() {
    let layouts = [
        MemoryConfiguration::default(),
        MemoryConfiguration::Compact,
        MemoryConfiguration::SubSlices,
        MemoryConfiguration::ExclusivePages,
    ];
    for name in ["gpt2-train", "gpt2-generate", "transformer-train"] {
        let trace = bundled(name);
        for layout in &layouts {
            let replayed = replay(
                &trace,
                layout,
                MemoryDeviceProperties::default(),
                ReplayOptions::default(),
            )
            .unwrap()
            .peak_reserved;
            let released = peak_reserved(&trace, layout, HandBack::Release);
            let dropped = peak_reserved(&trace, layout, HandBack::Drop);
            assert_eq!(released, replayed, "{name}, {layout:?}: release vs replay");
            assert_eq!(dropped, released, "{name}, {layout:?}: drop vs release");
        }
    }
}
