//! Model-based test with real bytes on host storage: random programs of reserves,
//! clones, bindings, shared bindings, drops, cleanups, mode switches and layout swaps,
//! at alignments from 32 B to 4 KiB, with every live reservation's bytes written at its
//! address and checked after every step.
//!
//! What must hold: a reservation's bytes stay as written while any handle, binding or
//! pinned set keeps it; no two live reservations share a byte; every reservation starts
//! at a multiple of the alignment; the memory management's invariants hold; a layout
//! swap is refused exactly while the dynamic pools hold a live reservation.
#![allow(unsafe_code)]

use cubepool::{
    HostStorage, InstallMemoryPoolsError, ManagedMemoryBinding, ManagedMemoryHandle,
    MemoryAllocationMode, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    SharedMemoryBindings,
};
use proptest::prelude::*;

const LAYOUTS: [&str; 4] = [
    "sliced(page=64KiB, max_slice=16KiB); exclusive(max_alloc=1MiB)",
    "exclusive(max_alloc=1MiB)",
    "sliced(page=16KiB, max_slice=4KiB); direct()",
    "direct(reclaim_at=64KiB)",
];

#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    Rewrite(usize),
    Clone(usize),
    Bind(usize),
    Pin(usize),
    DropHandle(usize),
    ReleaseHandle(usize),
    UnpinAll,
    Cleanup(bool),
    Persistent(bool),
    Install(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..=70_000).prop_map(Op::Reserve),
        2 => any::<usize>().prop_map(Op::Rewrite),
        2 => any::<usize>().prop_map(Op::Clone),
        2 => any::<usize>().prop_map(Op::Bind),
        2 => any::<usize>().prop_map(Op::Pin),
        4 => any::<usize>().prop_map(Op::DropHandle),
        2 => any::<usize>().prop_map(Op::ReleaseHandle),
        1 => Just(Op::UnpinAll),
        1 => any::<bool>().prop_map(Op::Cleanup),
        1 => any::<bool>().prop_map(Op::Persistent),
        1 => (0..LAYOUTS.len()).prop_map(Op::Install),
    ]
}

/// One reservation: what keeps it, and the pattern last written to it.
struct Reservation {
    handles: Vec<ManagedMemoryHandle>,
    bindings: Vec<ManagedMemoryBinding>,
    pinned: bool,
    /// Whether the persistent pool holds it (layout swaps leave that pool alone).
    persistent: bool,
    size: u64,
    pattern: u8,
}

/// Byte `i` of a reservation written with pattern `p` is `p + i` (mod 251).
fn expected(pattern: u8, i: u64) -> u8 {
    ((u64::from(pattern) + i) % 251) as u8
}

fn bytes_of(memory: &mut MemoryManagement<HostStorage>, handle: &ManagedMemoryHandle) -> *mut u8 {
    memory.resource(handle).unwrap().address as *mut u8
}

fn write(memory: &mut MemoryManagement<HostStorage>, r: &Reservation) {
    let ptr = bytes_of(memory, &r.handles[0]);
    for i in 0..r.size {
        // SAFETY: the handle keeps its reservation of `size` bytes at `ptr` live, the
        // storage never moves a buffer, and nothing else writes here meanwhile.
        unsafe { ptr.add(i as usize).write(expected(r.pattern, i)) };
    }
}

fn check(
    memory: &mut MemoryManagement<HostStorage>,
    live: &[Reservation],
    alignment: u64,
) -> Result<(), TestCaseError> {
    let mut extents = Vec::new();
    for r in live {
        let resource = match (r.handles.first(), r.bindings.first()) {
            (Some(handle), _) => memory.resource(handle).unwrap(),
            (None, Some(binding)) => memory.resource(binding).unwrap(),
            (None, None) => continue,
        };
        prop_assert_eq!(resource.size, r.size);
        prop_assert_eq!(resource.address % alignment, 0, "misaligned");
        extents.push((resource.address, resource.address + r.size));
        if !r.handles.is_empty() {
            // SAFETY: as in `write`; a shared read of bytes nothing writes meanwhile.
            let bytes = unsafe {
                std::slice::from_raw_parts(resource.address as *const u8, r.size as usize)
            };
            for (i, &byte) in bytes.iter().enumerate() {
                prop_assert_eq!(byte, expected(r.pattern, i as u64), "byte {} changed", i);
            }
        }
    }
    extents.sort_unstable();
    for pair in extents.windows(2) {
        prop_assert!(
            pair[0].1 <= pair[1].0,
            "live reservations overlap: {:?}",
            pair
        );
    }
    memory.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

fn run(alignment: u64, layout: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let properties = MemoryDeviceProperties {
        max_page_size: 1 << 20,
        alignment,
    };
    // The layouts this build has (an exclusive-memory-only build has no sliced pools).
    let layouts: Vec<MemoryConfiguration> = LAYOUTS
        .iter()
        .filter_map(|text| MemoryConfiguration::parse(text).ok())
        .collect();
    let parse = |i: usize| layouts[i % layouts.len()].clone();
    let mut memory =
        MemoryManagement::from_configuration(HostStorage::new(), properties, parse(layout))
            .unwrap();
    let mut live: Vec<Reservation> = Vec::new();
    let mut pins: Vec<SharedMemoryBindings> = Vec::new();
    let mut next_pattern = 0u8;
    for op in ops {
        let pick = |i: usize, n: usize| (n > 0).then(|| i % n);
        match op {
            Op::Reserve(size) => {
                let handle = memory.reserve(size).unwrap();
                let pool = memory.resource(&handle).unwrap().pool;
                next_pattern = next_pattern.wrapping_add(1);
                let r = Reservation {
                    handles: vec![handle],
                    bindings: Vec::new(),
                    pinned: false,
                    persistent: pool == Some(memory.pool_options().len()),
                    size,
                    pattern: next_pattern,
                };
                write(&mut memory, &r);
                live.push(r);
            }
            Op::Rewrite(i) => {
                let with_handle: Vec<usize> = (0..live.len())
                    .filter(|&k| !live[k].handles.is_empty())
                    .collect();
                if let Some(k) = pick(i, with_handle.len()) {
                    next_pattern = next_pattern.wrapping_add(1);
                    let r = &mut live[with_handle[k]];
                    r.pattern = next_pattern;
                    write(&mut memory, &live[with_handle[k]]);
                }
            }
            Op::Clone(i) | Op::Bind(i) | Op::Pin(i) => {
                if let Some(k) = pick(i, live.len()) {
                    let r = &mut live[k];
                    if let Some(handle) = r.handles.first() {
                        match op {
                            Op::Clone(_) => r.handles.push(handle.clone()),
                            Op::Bind(_) => r.bindings.push(handle.binding()),
                            _ => {
                                let mut set = SharedMemoryBindings::new();
                                set.pin(handle);
                                pins.push(set);
                                r.pinned = true;
                            }
                        }
                    }
                }
            }
            Op::DropHandle(i) | Op::ReleaseHandle(i) => {
                if let Some(k) = pick(i, live.len()) {
                    let r = &mut live[k];
                    if let Some(handle) = r.handles.pop() {
                        if matches!(op, Op::ReleaseHandle(_)) {
                            memory.release(handle);
                        }
                    } else {
                        r.bindings.pop();
                    }
                }
            }
            Op::UnpinAll => {
                for mut set in pins.drain(..) {
                    set.release();
                }
                for r in &mut live {
                    r.pinned = false;
                }
            }
            Op::Cleanup(explicit) => memory.cleanup(explicit),
            Op::Persistent(on) => memory.set_mode(if on {
                MemoryAllocationMode::Persistent
            } else {
                MemoryAllocationMode::Auto
            }),
            Op::Install(layout) => {
                let dynamic_in_use = live.iter().any(|r| !r.persistent);
                match memory.install_pools(parse(layout)) {
                    Ok(()) => prop_assert!(!dynamic_in_use, "installed under live reservations"),
                    Err(InstallMemoryPoolsError::PoolsInUse { .. }) => {
                        prop_assert!(dynamic_in_use, "refused with nothing in use")
                    }
                    Err(other) => prop_assert!(false, "{other}"),
                }
            }
        }
        live.retain(|r| !r.handles.is_empty() || !r.bindings.is_empty() || r.pinned);
        check(&mut memory, &live, alignment)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn real_bytes_survive_any_program(
        alignment in prop::sample::select(vec![32u64, 64, 256, 1024, 4096]),
        layout in 0..LAYOUTS.len(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(alignment, layout, ops)?;
    }
}
