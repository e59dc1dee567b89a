//! Dropped handles are freed in the order they were dropped, so a program that drops its
//! handles places exactly as one that hands them back with `release`, and as a replay
//! of its trace: the figures a user picks a layout by hold for the handles they drop.

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

/// Peak reserved bytes of `trace` run through handles of the default layout, every
/// storage byte of which is virtual.
fn peak_reserved(trace: &Trace, hand_back: HandBack) -> u64 {
    let mut mm = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::default(),
    )
    .unwrap();
    let mut live: Vec<Option<ManagedMemoryHandle>> = Vec::new();
    live.resize_with(trace.allocations as usize, || None);
    for event in &trace.events {
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
    for name in ["gpt2-train", "gpt2-generate", "transformer-train"] {
        let trace = bundled(name);
        let replayed = replay(
            &trace,
            &MemoryConfiguration::default(),
            MemoryDeviceProperties::default(),
            ReplayOptions::default(),
        )
        .unwrap()
        .peak_reserved;
        let released = peak_reserved(&trace, HandBack::Release);
        let dropped = peak_reserved(&trace, HandBack::Drop);
        assert_eq!(released, replayed, "{name}: release against the replay");
        assert_eq!(dropped, released, "{name}: drop against release");
    }
}
