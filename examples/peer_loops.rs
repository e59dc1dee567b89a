//! The FIFO and steady-state loops of `benches/peers.rs` for cubepool's default layout
//! and offset-allocator, small enough to count instructions.
//!
//! `cargo run --release --example peer_loops -- WORKLOAD PEER STEPS` sets the workload
//! up (untimed), runs `STEPS` steps and prints ns per step. `WORKLOAD` is `fifo` (W =
//! 4000 live 1 MiB reserves; free the oldest, reserve one) or `steady` (10,000 live
//! log-uniform sizes from 8 B to 32 MiB; free a random one, reserve a new size).
//! `PEER` is `virtual` (the default layout, handles dropped), `virtual-release`
//! (handles given back with `mm.release`), `virtual-slots` (no handles),
//! `sub-slices` (handles dropped) or `offset` (offset-allocator).
//!
//! With `--no-bytes` first, cubepool runs on `VirtualStorage` (address ranges without
//! bytes) instead of `HostStorage`: the steady state makes 28.78 map + unmap calls per
//! 100 steps (`examples/default_calls.rs -- steady`): on a host each unmap is a
//! `madvise`, and each map of a run not mapped before an `mprotect`, so timing it on
//! `HostStorage` measures the kernel too.
//!
//! Instruction counts per step: run it under `valgrind --tool=callgrind` with two
//! step counts and divide the difference of the totals by the difference of steps
//! (the setup cancels out). Timing on a loaded machine: `PEER` = `all` interleaves
//! every peer (`ROUNDS` rounds, 20 unless given, of `STEPS` steps each, peers in turn)
//! and prints each one's best round, and its ratio to offset-allocator's. With `--json
//! PATH` (before the workload) it also writes them to `PATH`: `benches/run_all.sh` puts
//! these interleaved figures beside criterion's in BENCHMARKS.md, because a drift of
//! the machine's speed over the minutes between two criterion benchmarks moves their
//! ratio, while rounds taken in turn see the same machine (BENCHMARKS.md, Method,
//! Noise).

#[path = "../benches/common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use common::{sub_slices, virtual_pages, SteadyState, MIB};
use cubepool::handle::Location;
use cubepool::{
    ComputeStorage, HostStorage, ManagedMemoryHandle, MemoryManagement, VirtualStorage,
};

/// The FIFO window.
const WINDOW: usize = 4000;

/// The steady state cycles through this many precomputed steps.
const STEADY_STEPS: usize = 1 << 16;

/// offset-allocator's unit in bytes (the pools' alignment).
const OFFSET_UNIT: u64 = 32;

/// One allocator as the loops drive it.
trait Peer {
    /// What a reservation returns; freeing consumes it.
    type Handle;
    /// Reserves `size` bytes.
    fn alloc(&mut self, size: u64) -> Self::Handle;
    /// Frees a reservation.
    fn free(&mut self, handle: Self::Handle);
}

/// How a cubepool peer frees a handle.
#[derive(Clone, Copy)]
enum Free {
    /// Dropped (the lock-free hand-back).
    Drop,
    /// Given back with `MemoryManagement::release`.
    Release,
}

/// A cubepool layout with handles.
struct Cubepool<S: ComputeStorage>(MemoryManagement<S>, Free);

impl<S: ComputeStorage> Peer for Cubepool<S> {
    type Handle = ManagedMemoryHandle;

    fn alloc(&mut self, size: u64) -> Self::Handle {
        self.0.reserve(size).expect("cubepool reserve")
    }

    fn free(&mut self, handle: Self::Handle) {
        match self.1 {
            Free::Drop => drop(handle),
            Free::Release => self.0.release(handle),
        }
    }
}

/// The default layout without handles.
struct Slots<S: ComputeStorage>(MemoryManagement<S>);

impl<S: ComputeStorage> Peer for Slots<S> {
    type Handle = Location;

    fn alloc(&mut self, size: u64) -> Self::Handle {
        self.0.reserve_slot(size).expect("cubepool reserve").0
    }

    fn free(&mut self, handle: Self::Handle) {
        self.0.release_slot(handle).expect("a live slot");
    }
}

/// offset-allocator over 2^32 - 1 units of `OFFSET_UNIT` bytes.
struct Offset(offset_allocator::Allocator);

impl Peer for Offset {
    type Handle = offset_allocator::Allocation;

    fn alloc(&mut self, size: u64) -> Self::Handle {
        let units = u32::try_from(size.div_ceil(OFFSET_UNIT).max(1)).expect("size fits");
        self.0.allocate(units).expect("offset-allocator has room")
    }

    fn free(&mut self, handle: Self::Handle) {
        self.0.free(handle);
    }
}

/// A workload set up on one peer, stepped on demand.
trait Loop {
    /// Runs `steps` steps.
    fn run(&mut self, steps: usize);
}

/// The FIFO window on peer `P`.
struct Fifo<P: Peer>(P, VecDeque<P::Handle>);

impl<P: Peer> Fifo<P> {
    fn new(mut peer: P) -> Self {
        let live = (0..WINDOW).map(|_| peer.alloc(MIB)).collect();
        Self(peer, live)
    }
}

impl<P: Peer> Loop for Fifo<P> {
    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            let oldest = self.1.pop_front().expect("the window is never empty");
            self.0.free(oldest);
            self.1.push_back(black_box(self.0.alloc(black_box(MIB))));
        }
    }
}

/// The steady state on peer `P`.
struct Steady<'a, P: Peer> {
    peer: P,
    live: Vec<Option<P::Handle>>,
    workload: &'a SteadyState,
    step: usize,
}

impl<'a, P: Peer> Steady<'a, P> {
    fn new(mut peer: P, workload: &'a SteadyState) -> Self {
        let live = workload
            .initial
            .iter()
            .map(|&size| Some(peer.alloc(size)))
            .collect();
        Self {
            peer,
            live,
            workload,
            step: 0,
        }
    }
}

impl<P: Peer> Loop for Steady<'_, P> {
    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            let (victim, size) = self.workload.steps[self.step % STEADY_STEPS];
            self.step += 1;
            let handle = self.live[victim].take().expect("every slot is live");
            self.peer.free(handle);
            self.live[victim] = Some(black_box(self.peer.alloc(black_box(size))));
        }
    }
}

/// The peers by name.
const PEERS: [&str; 5] = [
    "offset",
    "virtual",
    "virtual-release",
    "virtual-slots",
    "sub-slices",
];

/// Sets `workload` up on the peer `name`, cubepool's over `VirtualStorage` when
/// `no_bytes`.
fn setup<'a>(
    workload: &str,
    name: &str,
    steady: &'a SteadyState,
    no_bytes: bool,
) -> Box<dyn Loop + 'a> {
    if no_bytes {
        setup_on(workload, name, steady, VirtualStorage::new)
    } else {
        setup_on(workload, name, steady, HostStorage::new)
    }
}

/// [`setup`] with cubepool's storage made by `storage`.
fn setup_on<'a, S: ComputeStorage + 'a>(
    workload: &str,
    name: &str,
    steady: &'a SteadyState,
    storage: fn() -> S,
) -> Box<dyn Loop + 'a> {
    fn on<'a, P: Peer + 'a>(workload: &str, peer: P, steady: &'a SteadyState) -> Box<dyn Loop + 'a>
    where
        P::Handle: 'a,
    {
        match workload {
            "fifo" => Box::new(Fifo::new(peer)),
            "steady" => Box::new(Steady::new(peer, steady)),
            other => panic!("unknown workload {other} (fifo, steady)"),
        }
    }
    match name {
        "offset" => on(
            workload,
            Offset(offset_allocator::Allocator::new(u32::MAX)),
            steady,
        ),
        "virtual" => on(
            workload,
            Cubepool(virtual_pages(storage()), Free::Drop),
            steady,
        ),
        "virtual-release" => on(
            workload,
            Cubepool(virtual_pages(storage()), Free::Release),
            steady,
        ),
        "virtual-slots" => on(workload, Slots(virtual_pages(storage())), steady),
        "sub-slices" => on(
            workload,
            Cubepool(sub_slices(storage()), Free::Drop),
            steady,
        ),
        other => panic!("unknown peer {other} ({PEERS:?} or all)"),
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let mut no_bytes = false;
    let mut json = None;
    loop {
        match args.get(1).map(String::as_str) {
            Some("--no-bytes") => {
                no_bytes = true;
                args.remove(1);
            }
            Some("--json") if args.len() > 2 => {
                json = Some(args.remove(2));
                args.remove(1);
            }
            _ => break,
        }
    }
    if args.len() < 4 {
        eprintln!(
            "usage: peer_loops [--no-bytes] [--json PATH] fifo|steady PEER|all STEPS [ROUNDS]"
        );
        std::process::exit(2);
    }
    let (workload, peer) = (args[1].as_str(), args[2].as_str());
    let steps: usize = args[3].parse().expect("STEPS is a number");
    let steady = SteadyState::new(STEADY_STEPS);
    if peer != "all" {
        let mut looped = setup(workload, peer, &steady, no_bytes);
        let start = Instant::now();
        looped.run(steps);
        let ns = start.elapsed().as_nanos() as f64 / steps.max(1) as f64;
        println!("{workload} {peer}: {ns:.1} ns/step");
        return;
    }
    let rounds: usize = args.get(4).map_or(20, |n| n.parse().expect("ROUNDS"));
    let mut loops: Vec<Box<dyn Loop + '_>> = PEERS
        .iter()
        .map(|name| setup(workload, name, &steady, no_bytes))
        .collect();
    // Warm every peer up past its first pages.
    for looped in &mut loops {
        looped.run(steps);
    }
    let mut best = [f64::INFINITY; PEERS.len()];
    for _ in 0..rounds {
        for (index, looped) in loops.iter_mut().enumerate() {
            let start = Instant::now();
            looped.run(steps);
            let ns = start.elapsed().as_nanos() as f64 / steps.max(1) as f64;
            best[index] = best[index].min(ns);
        }
    }
    for (name, ns) in PEERS.iter().zip(best) {
        println!(
            "{workload} {name}: {ns:.1} ns/step (best of {rounds}), {:.2}x offset",
            ns / best[0]
        );
    }
    if let Some(path) = json {
        let best_ns: serde_json::Map<String, serde_json::Value> = PEERS
            .iter()
            .zip(best)
            .map(|(name, ns)| (name.to_string(), ns.into()))
            .collect();
        let result = serde_json::json!({
            "workload": workload,
            "bytes": !no_bytes,
            "steps": steps,
            "rounds": rounds,
            "best_ns": best_ns,
        });
        if let Err(error) = std::fs::write(&path, format!("{result:#}\n")) {
            eprintln!("cannot write {path}: {error}");
            std::process::exit(1);
        }
    }
}
