//! A digest of every placement a layout makes on a trace: evidence that a change to a
//! pool's code places every block where it did before.
//!
//! `cargo run --release --example placements -- TRACE.jsonl LAYOUT`
//! replays the trace through the layout on virtual storage and prints the number of
//! reservations, a 64-bit FNV-1a digest of each one's storage id and offset (in
//! event order), the peak of bytes reserved, and the storage calls. Two builds that
//! print the same line placed every block at the same bytes.

use cubepool::config::{MemoryConfiguration, MemoryDeviceProperties};
use cubepool::storage::{ComputeStorage, VirtualStorage};
use cubepool::trace::{Trace, TraceEvent};
use cubepool::MemoryManagement;

/// FNV-1a over the little-endian bytes of `value`, continuing from `digest`.
fn fnv(digest: u64, value: u64) -> u64 {
    value.to_le_bytes().iter().fold(digest, |digest, &byte| {
        (digest ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: placements TRACE LAYOUT");
        std::process::exit(2);
    }
    let trace = Trace::load(&args[1]).unwrap_or_else(|error| {
        eprintln!("cannot load {}: {error}", args[1]);
        std::process::exit(1);
    });
    let layout = MemoryConfiguration::parse(&args[2]).unwrap_or_else(|error| {
        eprintln!("bad layout {}: {error}", args[2]);
        std::process::exit(1);
    });
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties::default(),
        layout,
    )
    .unwrap_or_else(|error| {
        eprintln!("bad layout {}: {error}", args[2]);
        std::process::exit(1);
    });
    let mut live = std::collections::HashMap::new();
    let (mut digest, mut reserves, mut peak) = (0xcbf2_9ce4_8422_2325u64, 0u64, 0u64);
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                let (location, placement) = memory.reserve_slot(size).unwrap_or_else(|error| {
                    eprintln!("reserve of {size} bytes failed: {error}");
                    std::process::exit(1);
                });
                digest = fnv(fnv(digest, placement.storage.id.0), placement.offset);
                reserves += 1;
                live.insert(id, location);
            }
            TraceEvent::Free { id, .. } => {
                if let Some(location) = live.remove(&id) {
                    let _ = memory.release_slot(location);
                }
            }
        }
        peak = peak.max(memory.storage().bytes_allocated());
    }
    println!(
        "{reserves} reservations, placement digest {digest:016x}, peak reserved {peak}, \
         storage calls {}",
        memory.storage().allocations() + memory.storage().deallocations()
    );
}
