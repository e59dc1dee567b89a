//! cubepool side by side with its peers, in one run and on the same workloads:
//!
//! - **cubecl**: CubeCL 0.10's `MemoryManagement` over `BytesStorage`, `SubSlices`, the
//!   same device properties (2 GiB pages at most, 32-byte alignment);
//! - **cubecl11**: CubeCL's current stable release (`cubecl-server` 0.11.3,
//!   `cubecl-runtime` 0.11.4), its `MemoryManagement` with its default layout,
//!   `Adaptive`, over its `BytesStorage`, the same device properties, reserved the way
//!   its server reserves (relocation on; see [`cubecl11`]);
//! - **offset**: the `offset-allocator` crate (O(1) two-level bitmap), in 32-byte units
//!   over a virtual range of 2^32 - 1 units (128 GiB: the steady state's 10,000 live
//!   sizes add up to 22 GB, more than a 4 GiB range holds);
//! - **system**: `std::alloc` (glibc malloc/free) with the same sizes, the floor.
//!
//! cubepool runs twice: with the `SubSlices` preset (sliced pools, `cubepool`), and with
//! its default layout, the `virtual_pages` preset (one virtual pool of 2 MiB granules,
//! `virtual-pool`). Both run on [`HostStorage`] (sliced pages from the global allocator,
//! like CubeCL's `BytesStorage`, which zeroes them with `calloc`; the virtual pool's
//! range reserved with `mmap` and committed granule by granule). The replays, whose
//! timed loop also allocates the pages, run the pools a second time on storage without
//! bytes (`cubepool-virtual`, `virtual-pool-virtual`, `cubecl-virtual`,
//! `cubecl11-virtual`), which times the pools alone.
//! In the FIFO and the steady state both layouts also run with handles given back by
//! `mm.release` (`cubepool-release`, `virtual-pool-release`) and without handles
//! (`cubepool-slots`, `virtual-pool-slots`), which splits a step's time into the pools
//! and what each way of freeing adds.
//!
//! Workloads: a FIFO window of 1 MiB reserves (free the oldest, reserve a new one;
//! W = 40, 400, 4000), a steady state of log-uniform sizes from 8 B to 32 MiB with 10,000
//! live (free a random victim, reserve a new size), and replay of the bundled traces
//! and the shared ones (each allocator's own reserve and free, trace ids mapped to
//! handles).
//!
//! Before the timings it prints the peak bytes each allocator reserves on each trace
//! (the bundled three, and the shared traces in `$CUBEPOOL_TRACES`, default
//! `/work/shared/traces`, that are not bundled); after them, the storage calls (page
//! allocations and releases, or maps and unmaps) that cubepool's two layouts and both
//! CubeCLs make per 100 reserves of each workload, in untimed runs. With `CUBEPOOL_PEERS_JSON=path` it writes both as JSON
//! (`{"memory": [...], "calls": [...]}`, read by `benches/report.py`).
//!
//! Run: `cargo bench --bench peers`; smoke run: `cargo bench --bench peers -- --test`.

use std::alloc::Layout;
use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use criterion::{
    criterion_group, BatchSize, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management as cubecl;
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{
    BytesStorage, ComputeStorage, StorageHandle, StorageId, StorageUtilization,
};
use cubepool::trace::{replay_torch, ReplayOptions, TorchSettings, Trace, TraceEvent};
use cubepool::{HostStorage, MemoryManagement, VirtualStorage};

mod common;
#[path = "peers/cubecl11.rs"]
mod cubecl11;
use common::{all_traces, properties, sub_slices, virtual_pages, SteadyState, FIFO_WINDOWS, MIB};

/// The steady state cycles through this many precomputed steps.
const STEADY_STEPS: usize = 1 << 16;

/// offset-allocator's unit in bytes (the pools' alignment).
const OFFSET_UNIT: u64 = 32;

/// One allocator as the workloads drive it.
trait Peer {
    /// The name in benchmark ids and tables.
    const NAME: &'static str;
    /// What a reservation returns; freeing consumes it.
    type Handle;
    /// An empty allocator.
    fn new() -> Self;
    /// Reserves `size` bytes (panics if the allocator cannot: a benchmark bug).
    fn alloc(&mut self, size: u64) -> Self::Handle;
    /// Frees a reservation.
    fn free(&mut self, handle: Self::Handle);
    /// The calls to the storage so far (allocations and releases, or maps and unmaps),
    /// where the allocator's storage counts them.
    fn storage_calls(&mut self) -> Option<u64> {
        None
    }
}

/// The calls to the storage a cubepool memory management has made.
fn cubepool_calls<S: cubepool::ComputeStorage>(mm: &mut MemoryManagement<S>) -> u64 {
    let stats = mm.memory_stats();
    stats.num_device_alloc + stats.num_device_free
}

/// cubepool's `MemoryManagement` with the `SubSlices` preset over storage `S`.
struct Cubepool<S: cubepool::ComputeStorage>(MemoryManagement<S>);

/// cubepool's default layout (the `virtual_pages` preset: one virtual pool of 2 MiB
/// granules) over storage `S`.
struct VirtualPool<S: cubepool::ComputeStorage>(MemoryManagement<S>);

/// Implements [`Peer`] for a cubepool layout (`$peer`, made by `$layout`) over one
/// storage: handles reserved and dropped.
macro_rules! cubepool_peer {
    ($peer:ident, $layout:ident, $storage:ty, $name:literal) => {
        impl Peer for $peer<$storage> {
            const NAME: &'static str = $name;
            type Handle = cubepool::ManagedMemoryHandle;

            fn new() -> Self {
                Self($layout(<$storage>::new()))
            }

            fn alloc(&mut self, size: u64) -> Self::Handle {
                self.0.reserve(size).expect("cubepool reserve")
            }

            fn free(&mut self, handle: Self::Handle) {
                drop(handle);
            }

            fn storage_calls(&mut self) -> Option<u64> {
                Some(cubepool_calls(&mut self.0))
            }
        }
    };
}

cubepool_peer!(Cubepool, sub_slices, HostStorage, "cubepool");
cubepool_peer!(Cubepool, sub_slices, VirtualStorage, "cubepool-virtual");
cubepool_peer!(VirtualPool, virtual_pages, HostStorage, "virtual-pool");
cubepool_peer!(
    VirtualPool,
    virtual_pages,
    VirtualStorage,
    "virtual-pool-virtual"
);

/// cubepool with handles given back by `MemoryManagement::release` instead of dropped:
/// a sole handle's reservation is freed at once, without the atomic operations of
/// the lock-free drop (`SubSlices` preset).
struct CubepoolRelease(MemoryManagement<HostStorage>);

/// cubepool without handles: `reserve_slot` / `release_slot`, the caller owning each
/// reservation, as offset-allocator's and malloc's callers do (`SubSlices` preset).
struct CubepoolSlots(MemoryManagement<HostStorage>);

/// [`CubepoolRelease`] with the default layout (`virtual_pages`).
struct VirtualPoolRelease(MemoryManagement<HostStorage>);

/// [`CubepoolSlots`] with the default layout (`virtual_pages`).
struct VirtualPoolSlots(MemoryManagement<HostStorage>);

/// Implements [`Peer`] for a cubepool layout (made by `$layout`) whose handles are
/// given back with `mm.release` (`$release`) and for one without handles (`$slots`).
macro_rules! freeing_peers {
    ($layout:ident, $release:ident, $release_name:literal, $slots:ident, $slots_name:literal) => {
        impl Peer for $release {
            const NAME: &'static str = $release_name;
            type Handle = cubepool::ManagedMemoryHandle;

            fn new() -> Self {
                Self($layout(HostStorage::new()))
            }

            fn alloc(&mut self, size: u64) -> Self::Handle {
                self.0.reserve(size).expect("cubepool reserve")
            }

            fn free(&mut self, handle: Self::Handle) {
                self.0.release(handle);
            }
        }

        impl Peer for $slots {
            const NAME: &'static str = $slots_name;
            type Handle = cubepool::handle::Location;

            fn new() -> Self {
                Self($layout(HostStorage::new()))
            }

            fn alloc(&mut self, size: u64) -> Self::Handle {
                self.0.reserve_slot(size).expect("cubepool reserve").0
            }

            fn free(&mut self, handle: Self::Handle) {
                self.0.release_slot(handle).expect("a live slot");
            }
        }
    };
}

freeing_peers!(
    sub_slices,
    CubepoolRelease,
    "cubepool-release",
    CubepoolSlots,
    "cubepool-slots"
);
freeing_peers!(
    virtual_pages,
    VirtualPoolRelease,
    "virtual-pool-release",
    VirtualPoolSlots,
    "virtual-pool-slots"
);

/// CubeCL 0.10's `MemoryManagement` with the `SubSlices` preset over `storage`.
fn cubecl_memory<S: ComputeStorage>(storage: S) -> cubecl::MemoryManagement<S> {
    let ours = properties();
    cubecl::MemoryManagement::from_configuration(
        storage,
        &cubecl_ir::MemoryDeviceProperties {
            max_page_size: ours.max_page_size,
            alignment: ours.alignment,
        },
        cubecl::MemoryConfiguration::SubSlices,
        Arc::new(ServerLogger::default()),
        cubecl::MemoryManagementOptions::new("bench"),
    )
}

/// CubeCL 0.10 over storage `S`.
struct Cubecl<S>(cubecl::MemoryManagement<S>);

/// Implements [`Peer`] for CubeCL over one storage.
macro_rules! cubecl_peer {
    ($storage:ty, $name:literal) => {
        impl Peer for Cubecl<$storage> {
            const NAME: &'static str = $name;
            type Handle = cubecl::ManagedMemoryHandle;

            fn new() -> Self {
                Self(cubecl_memory(<$storage>::default()))
            }

            fn alloc(&mut self, size: u64) -> Self::Handle {
                self.0.reserve(size).expect("cubecl reserve")
            }

            fn free(&mut self, handle: Self::Handle) {
                drop(handle);
            }

            fn storage_calls(&mut self) -> Option<u64> {
                <$storage>::calls(self.0.storage())
            }
        }
    };
}

cubecl_peer!(BytesStorage, "cubecl");
cubecl_peer!(VirtualPages, "cubecl-virtual");
cubecl_peer!(CountingStorage<VirtualPages>, "cubecl-counted");

/// Implements [`Peer`] for CubeCL 0.11 over one storage and its copy queue.
macro_rules! cubecl11_peer {
    ($peer:ty, $name:literal, $calls:expr) => {
        impl Peer for $peer {
            const NAME: &'static str = $name;
            type Handle = cubecl11::ManagedMemoryHandle;

            fn new() -> Self {
                Self::on(Default::default(), Default::default())
            }

            fn alloc(&mut self, size: u64) -> Self::Handle {
                self.reserve(size)
            }

            fn free(&mut self, handle: Self::Handle) {
                drop(handle);
            }

            fn storage_calls(&mut self) -> Option<u64> {
                $calls(self)
            }
        }
    };
}

cubecl11_peer!(cubecl11::Host, "cubecl11", |_: &mut cubecl11::Host| None);
cubecl11_peer!(
    cubecl11::Virtual,
    "cubecl11-virtual",
    |peer: &mut cubecl11::Virtual| Some(peer.storage().calls())
);

/// The storage calls a CubeCL storage has counted, if it counts them.
trait StorageCalls {
    /// Allocations and deallocations so far.
    fn calls(&self) -> Option<u64> {
        None
    }
}

impl StorageCalls for BytesStorage {}
impl StorageCalls for VirtualPages {}
impl<S: ComputeStorage> StorageCalls for CountingStorage<S> {
    fn calls(&self) -> Option<u64> {
        Some(self.calls)
    }
}

/// A CubeCL storage of address ranges without bytes (cubepool's `VirtualStorage` for
/// CubeCL): pages cost nothing, so a replay times the pools alone.
#[derive(Default)]
struct VirtualPages;

impl ComputeStorage for VirtualPages {
    type Resource = ();

    fn alignment(&self) -> usize {
        // BytesStorage's.
        4
    }

    fn get(&mut self, _handle: &StorageHandle) -> Self::Resource {}

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        Ok(StorageHandle {
            id: StorageId::new(),
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, _id: StorageId) {}

    fn flush(&mut self) {}
}

/// offset-allocator over 2^32 - 1 units of `OFFSET_UNIT` bytes.
struct Offset(offset_allocator::Allocator);

/// `size` bytes in offset-allocator units (at least one).
fn offset_units(size: u64) -> u32 {
    u32::try_from(size.div_ceil(OFFSET_UNIT).max(1)).expect("size fits the unit range")
}

impl Peer for Offset {
    const NAME: &'static str = "offset";
    type Handle = offset_allocator::Allocation;

    fn new() -> Self {
        Self(offset_allocator::Allocator::new(u32::MAX))
    }

    fn alloc(&mut self, size: u64) -> Self::Handle {
        self.0
            .allocate(offset_units(size))
            .expect("offset-allocator has room")
    }

    fn free(&mut self, handle: Self::Handle) {
        self.0.free(handle);
    }
}

/// A block from the system allocator, freed on drop.
struct SystemBlock {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for SystemBlock {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `std::alloc::alloc` with `layout` and is freed
        // only here, once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// `std::alloc` (glibc malloc/free): alignment 1 asks for plain `malloc`, which returns
/// 16-byte-aligned blocks.
struct System;

impl Peer for System {
    const NAME: &'static str = "system";
    type Handle = SystemBlock;

    fn new() -> Self {
        Self
    }

    fn alloc(&mut self, size: u64) -> Self::Handle {
        let bytes = usize::try_from(size.max(1)).expect("size fits usize");
        let layout = Layout::from_size_align(bytes, 1).expect("valid layout");
        // SAFETY: the layout's size is at least one byte.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).expect("malloc succeeds");
        SystemBlock { ptr, layout }
    }

    fn free(&mut self, handle: Self::Handle) {
        drop(handle);
    }
}

/// FIFO window: `window` live 1 MiB reserves; each step frees the oldest and reserves a
/// new one (CubeCL's `benches/dynamic.rs` shape).
fn fifo<P: Peer>(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, window: usize) {
    // Built on the first sample (not at all when a filter skips this benchmark) and
    // kept across samples, so the window stays in its steady state.
    let mut state: Option<(P, VecDeque<P::Handle>)> = None;
    group.bench_with_input(BenchmarkId::new(P::NAME, window), &window, |b, &window| {
        let (peer, live) = state.get_or_insert_with(|| {
            let mut peer = P::new();
            let live = (0..window).map(|_| peer.alloc(MIB)).collect();
            (peer, live)
        });
        b.iter(|| {
            let oldest = live.pop_front().expect("the window is never empty");
            peer.free(oldest);
            live.push_back(black_box(peer.alloc(black_box(MIB))));
        });
    });
}

fn fifo_window(c: &mut Criterion) {
    let mut group = c.benchmark_group("peers_fifo_1mib");
    group.throughput(Throughput::Elements(1));
    for window in FIFO_WINDOWS {
        fifo::<Cubepool<HostStorage>>(&mut group, window);
        fifo::<VirtualPool<HostStorage>>(&mut group, window);
        fifo::<CubepoolRelease>(&mut group, window);
        fifo::<CubepoolSlots>(&mut group, window);
        fifo::<VirtualPoolRelease>(&mut group, window);
        fifo::<VirtualPoolSlots>(&mut group, window);
        fifo::<Cubecl<BytesStorage>>(&mut group, window);
        fifo::<cubecl11::Host>(&mut group, window);
        fifo::<Offset>(&mut group, window);
        fifo::<System>(&mut group, window);
    }
    group.finish();
}

/// Steady state: the initial live set, then each step frees a victim and reserves a
/// new size in its place, cycling through the precomputed steps.
fn steady<P: Peer>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    workload: &SteadyState,
) {
    // Built on the first sample (not at all when a filter skips this benchmark) and
    // kept across samples.
    let mut state: Option<(P, Vec<Option<P::Handle>>)> = None;
    let mut step = 0usize;
    group.bench_function(P::NAME, |b| {
        let (peer, live) = state.get_or_insert_with(|| {
            let mut peer = P::new();
            let live = workload
                .initial
                .iter()
                .map(|&size| Some(peer.alloc(size)))
                .collect();
            (peer, live)
        });
        b.iter(|| {
            let (victim, size) = workload.steps[step % STEADY_STEPS];
            step += 1;
            peer.free(live[victim].take().expect("every slot is live"));
            live[victim] = Some(black_box(peer.alloc(black_box(size))));
        });
    });
}

fn steady_state(c: &mut Criterion) {
    let workload = SteadyState::new(STEADY_STEPS);
    let mut group = c.benchmark_group("peers_steady_state");
    group.throughput(Throughput::Elements(1));
    steady::<Cubepool<HostStorage>>(&mut group, &workload);
    steady::<VirtualPool<HostStorage>>(&mut group, &workload);
    steady::<CubepoolRelease>(&mut group, &workload);
    steady::<CubepoolSlots>(&mut group, &workload);
    steady::<VirtualPoolRelease>(&mut group, &workload);
    steady::<VirtualPoolSlots>(&mut group, &workload);
    // The default on address ranges without bytes: the same placements and storage
    // calls, which only update tables there, so the host's share of a step shows.
    steady::<VirtualPool<VirtualStorage>>(&mut group, &workload);
    steady::<Cubecl<BytesStorage>>(&mut group, &workload);
    // On address ranges without bytes: its `BytesStorage` pages (27 GB at the peak,
    // `calloc`ed on the heap the steps above left) would be zeroed and resident, more
    // than the machine holds.
    steady::<cubecl11::Virtual>(&mut group, &workload);
    steady::<Offset>(&mut group, &workload);
    steady::<System>(&mut group, &workload);
    group.finish();
}

/// Runs every event of `trace` through `peer`; `slots` maps dense trace ids to handles.
fn run_trace<P: Peer>(peer: &mut P, trace: &Trace, slots: &mut [Option<P::Handle>]) {
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => slots[id as usize] = Some(peer.alloc(size)),
            TraceEvent::Free { id, .. } => {
                if let Some(handle) = slots[id as usize].take() {
                    peer.free(handle);
                }
            }
        }
    }
}

/// One replay per iteration from an empty allocator; building it before and dropping it
/// (with the never-freed allocations) after are not timed.
fn replay<P: Peer>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    trace: &Trace,
) {
    group.bench_function(BenchmarkId::new(P::NAME, name), |b| {
        b.iter_batched(
            || {
                let slots: Vec<Option<P::Handle>> =
                    (0..trace.allocations()).map(|_| None).collect();
                (P::new(), slots)
            },
            |(mut peer, mut slots)| {
                run_trace(&mut peer, black_box(trace), &mut slots);
                (peer, slots)
            },
            BatchSize::PerIteration,
        );
    });
}

fn replay_traces(c: &mut Criterion) {
    let mut group = c.benchmark_group("peers_replay");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(20);
    for (name, trace) in &all_traces() {
        group.throughput(Throughput::Elements(trace.len() as u64));
        replay::<Cubepool<HostStorage>>(&mut group, name, trace);
        replay::<Cubecl<BytesStorage>>(&mut group, name, trace);
        // Not `cubecl11::Host`: its host memory is not given back when a replay's
        // MemoryManagement is dropped (a full run grew to 23.6 GB of resident memory
        // within the transformer-train replays and was killed for it), so CubeCL 0.11's
        // replays are timed on storage without bytes only (`cubecl11-virtual` below).
        replay::<VirtualPool<HostStorage>>(&mut group, name, trace);
        replay::<Cubepool<VirtualStorage>>(&mut group, name, trace);
        replay::<VirtualPool<VirtualStorage>>(&mut group, name, trace);
        replay::<Cubecl<VirtualPages>>(&mut group, name, trace);
        replay::<cubecl11::Virtual>(&mut group, name, trace);
        replay::<Offset>(&mut group, name, trace);
        replay::<System>(&mut group, name, trace);
    }
    group.finish();
}

/// A CubeCL storage that counts the bytes it holds and the calls it gets (for the
/// memory and storage-call tables only).
#[derive(Default)]
struct CountingStorage<S> {
    inner: S,
    sizes: HashMap<StorageId, u64>,
    bytes: u64,
    /// Allocations and deallocations so far.
    calls: u64,
}

impl<S: ComputeStorage> ComputeStorage for CountingStorage<S> {
    type Resource = S::Resource;

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn get(&mut self, handle: &StorageHandle) -> Self::Resource {
        self.inner.get(handle)
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let handle = self.inner.alloc(size)?;
        self.sizes.insert(handle.id, size);
        self.bytes += size;
        self.calls += 1;
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.bytes -= size;
        }
        self.calls += 1;
        self.inner.dealloc(id);
    }

    fn flush(&mut self) {
        self.inner.flush();
    }
}

/// The peak bytes each allocator holds while replaying one trace.
struct MemoryRow {
    trace: String,
    events: usize,
    peak_live: u64,
    cubepool_reserved: u64,
    /// cubepool's default layout, the virtual pool (peak bytes mapped).
    virtual_pool_reserved: u64,
    cubecl_reserved: u64,
    cubecl_storage: u64,
    /// CubeCL 0.11 (`Adaptive`): the most bytes its storage held at once.
    cubecl11_storage: u64,
    /// The relocations CubeCL 0.11 ran during the replay.
    cubecl11_relocations: u64,
    offset_span: u64,
    /// The model of PyTorch's caching allocator, with its defaults and with
    /// expandable segments (peak bytes mapped).
    torch_reserved: u64,
    torch_expandable_reserved: u64,
}

/// Replays `trace` through each allocator once, reading their books after every event.
fn peak_memory(name: &str, trace: &Trace) -> MemoryRow {
    let mut ours = Cubepool::<HostStorage>::new();
    let mut our_handles: Vec<Option<cubepool::ManagedMemoryHandle>> = Vec::new();
    our_handles.resize_with(trace.allocations() as usize, || None);
    let mut cubepool_reserved = 0;
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                our_handles[id as usize] = Some(ours.alloc(size));
                cubepool_reserved = cubepool_reserved.max(ours.0.memory_usage().bytes_reserved);
            }
            TraceEvent::Free { id, .. } => our_handles[id as usize] = None,
        }
    }

    let mut pool = VirtualPool::<VirtualStorage>::new();
    let mut pool_handles: Vec<Option<cubepool::ManagedMemoryHandle>> = Vec::new();
    pool_handles.resize_with(trace.allocations() as usize, || None);
    let mut virtual_pool_reserved = 0;
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                pool_handles[id as usize] = Some(pool.alloc(size));
                virtual_pool_reserved =
                    virtual_pool_reserved.max(pool.0.memory_usage().bytes_reserved);
            }
            TraceEvent::Free { id, .. } => pool_handles[id as usize] = None,
        }
    }

    let mut theirs = cubecl_memory(CountingStorage::<BytesStorage>::default());
    let mut handles: Vec<Option<cubecl::ManagedMemoryHandle>> = Vec::new();
    handles.resize_with(trace.allocations() as usize, || None);
    let (mut cubecl_reserved, mut cubecl_storage) = (0, 0);
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                handles[id as usize] = Some(theirs.reserve(size).expect("cubecl reserve"));
                cubecl_reserved = cubecl_reserved.max(theirs.memory_usage().bytes_reserved);
                cubecl_storage = cubecl_storage.max(theirs.storage().bytes);
            }
            TraceEvent::Free { id, .. } => handles[id as usize] = None,
        }
    }

    let mut latest = cubecl11::Virtual::new();
    let mut latest_handles: Vec<Option<cubecl11::ManagedMemoryHandle>> = Vec::new();
    latest_handles.resize_with(trace.allocations() as usize, || None);
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                latest_handles[id as usize] = Some(latest.alloc(size));
            }
            TraceEvent::Free { id, .. } => latest_handles[id as usize] = None,
        }
    }

    let mut offset = Offset::new();
    let mut allocations: Vec<Option<offset_allocator::Allocation>> =
        vec![None; trace.allocations() as usize];
    let mut offset_end = 0u64;
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                let allocation = offset.alloc(size);
                let end =
                    u64::from(allocation.offset) + u64::from(offset.0.allocation_size(allocation));
                offset_end = offset_end.max(end);
                allocations[id as usize] = Some(allocation);
            }
            TraceEvent::Free { id, .. } => {
                if let Some(allocation) = allocations[id as usize].take() {
                    offset.free(allocation);
                }
            }
        }
    }

    let torch = |settings| {
        let options = ReplayOptions {
            limit: None,
            samples: 0,
        };
        replay_torch(trace, settings, options).peak_reserved
    };
    MemoryRow {
        torch_reserved: torch(TorchSettings::default()),
        torch_expandable_reserved: torch(TorchSettings::expandable()),
        trace: name.to_string(),
        events: trace.len(),
        peak_live: trace.peak_live(),
        cubepool_reserved,
        virtual_pool_reserved,
        cubecl_reserved,
        cubecl_storage,
        cubecl11_storage: latest.storage().peak(),
        cubecl11_relocations: latest.relocations(),
        offset_span: offset_end * OFFSET_UNIT,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB as f64)
}

/// Prints the memory table and returns it as JSON rows.
fn memory_table() -> Vec<serde_json::Value> {
    let rows: Vec<MemoryRow> = all_traces()
        .iter()
        .map(|(name, trace)| peak_memory(name, trace))
        .collect();
    println!("Peak bytes reserved per trace (MiB):");
    println!("| trace | peak live | cubepool | virtual pool | CubeCL memory_usage | CubeCL storage | CubeCL 0.11 storage (relocations) | offset-allocator span | torch (model) | torch_expandable (model) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} |",
            row.trace,
            mib(row.peak_live),
            mib(row.cubepool_reserved),
            mib(row.virtual_pool_reserved),
            mib(row.cubecl_reserved),
            mib(row.cubecl_storage),
            mib(row.cubecl11_storage),
            row.cubecl11_relocations,
            mib(row.offset_span),
            mib(row.torch_reserved),
            mib(row.torch_expandable_reserved)
        );
    }
    rows.iter()
        .map(|row| {
            serde_json::json!({
                "trace": row.trace,
                "events": row.events,
                "peak_live": row.peak_live,
                "cubepool_peak_reserved": row.cubepool_reserved,
                "virtual_pool_peak_reserved": row.virtual_pool_reserved,
                "cubecl_peak_bytes_reserved": row.cubecl_reserved,
                "cubecl_peak_storage": row.cubecl_storage,
                "cubecl11_peak_storage": row.cubecl11_storage,
                "cubecl11_relocations": row.cubecl11_relocations,
                "offset_allocator_peak_span": row.offset_span,
                "torch_peak_reserved": row.torch_reserved,
                "torch_expandable_peak_reserved": row.torch_expandable_reserved,
            })
        })
        .collect()
}

/// Whether this is a smoke run (criterion's test mode, `cargo test --bench peers`: no
/// `--bench` argument), where the bench is a debug build and the storage-call runs are
/// cut down to seconds: 64 steps instead of 4,096, the first trace and FIFO window only,
/// and no steady state for CubeCL (its 10,000 first reserves scan pages for seconds).
fn smoke() -> bool {
    !std::env::args().any(|arg| arg == "--bench")
}

/// Storage calls per 100 steps of a FIFO window of `window` 1 MiB reserves, after
/// `steps` steps of warm-up (the window's steady state, which the timings measure).
fn fifo_calls<P: Peer>(window: usize, steps: usize) -> f64 {
    let mut peer = P::new();
    let mut live: VecDeque<P::Handle> = (0..window).map(|_| peer.alloc(MIB)).collect();
    let mut before = 0;
    for step in 0..2 * steps {
        if step == steps {
            before = peer.storage_calls().expect("a counted storage");
        }
        let oldest = live.pop_front().expect("the window is never empty");
        peer.free(oldest);
        live.push_back(peer.alloc(MIB));
    }
    let calls = peer.storage_calls().expect("a counted storage") - before;
    100.0 * calls as f64 / steps as f64
}

/// Storage calls per 100 steps of the steady state, after the initial live set and
/// `steps` steps of warm-up, and the peer after the run (its live set freed).
fn steady_calls<P: Peer>(workload: &SteadyState, steps: usize) -> (f64, P) {
    let mut peer = P::new();
    let mut live: Vec<Option<P::Handle>> = workload
        .initial
        .iter()
        .map(|&size| Some(peer.alloc(size)))
        .collect();
    let mut before = 0;
    for step in 0..2 * steps {
        if step == steps {
            before = peer.storage_calls().expect("a counted storage");
        }
        let (victim, size) = workload.steps[step % STEADY_STEPS];
        peer.free(live[victim].take().expect("every slot is live"));
        live[victim] = Some(peer.alloc(size));
    }
    let calls = peer.storage_calls().expect("a counted storage") - before;
    drop(live);
    (100.0 * calls as f64 / steps as f64, peer)
}

/// Storage calls per 100 allocations of one replay of `trace` from an empty allocator
/// (the never-freed allocations' release at the end not counted).
fn replay_calls<P: Peer>(trace: &Trace) -> f64 {
    let mut peer = P::new();
    let mut slots: Vec<Option<P::Handle>> = (0..trace.allocations()).map(|_| None).collect();
    run_trace(&mut peer, trace, &mut slots);
    let calls = peer.storage_calls().expect("a counted storage");
    100.0 * calls as f64 / trace.allocations() as f64
}

/// One row of the storage-call table: a workload, named by its criterion group and
/// input, and the calls per 100 reserves of cubepool's two layouts, CubeCL 0.10 and
/// CubeCL 0.11 (None: not counted in this run).
fn calls_row(group: &str, input: &str, counts: [Option<f64>; 4]) -> serde_json::Value {
    let [cubepool, virtual_pool, cubecl, cubecl11] =
        counts.map(|count| count.map_or_else(|| "-".to_string(), |count| format!("{count:.2}")));
    println!(
        "{group}/{input}: storage calls per 100 reserves: cubepool {cubepool}, virtual pool {virtual_pool}, CubeCL {cubecl}, CubeCL 0.11 {cubecl11}"
    );
    serde_json::json!({
        "group": group,
        "input": input,
        "cubepool": counts[0],
        "virtual-pool": counts[1],
        "cubecl": counts[2],
        "cubecl11": counts[3],
    })
}

/// Storage calls per 100 reserves on every workload, in untimed runs, as JSON rows
/// (cut down in a smoke run, see [`smoke`]). The runs use storages without bytes: the
/// pools decide the same calls as on host memory, and the steady state's 22 GB of
/// `calloc`ed CubeCL pages, zeroed on a heap the timed runs recycled, would be resident.
fn calls_table() -> Vec<serde_json::Value> {
    let smoke = smoke();
    let (steps, kinds) = if smoke { (64, 1) } else { (4096, usize::MAX) };
    let mut rows = Vec::new();
    for (name, trace) in all_traces().iter().take(kinds) {
        let counts = [
            Some(replay_calls::<Cubepool<VirtualStorage>>(trace)),
            Some(replay_calls::<VirtualPool<VirtualStorage>>(trace)),
            Some(replay_calls::<Cubecl<CountingStorage<VirtualPages>>>(trace)),
            Some(replay_calls::<cubecl11::Virtual>(trace)),
        ];
        rows.push(calls_row("peers_replay", name, counts));
    }
    for window in FIFO_WINDOWS.into_iter().take(kinds) {
        let counts = [
            Some(fifo_calls::<Cubepool<VirtualStorage>>(window, steps)),
            Some(fifo_calls::<VirtualPool<VirtualStorage>>(window, steps)),
            Some(fifo_calls::<Cubecl<CountingStorage<VirtualPages>>>(
                window, steps,
            )),
            Some(fifo_calls::<cubecl11::Virtual>(window, steps)),
        ];
        rows.push(calls_row("peers_fifo_1mib", &window.to_string(), counts));
    }
    let workload = SteadyState::new(STEADY_STEPS);
    let latest = (!smoke).then(|| steady_calls::<cubecl11::Virtual>(&workload, steps));
    let counts = [
        Some(steady_calls::<Cubepool<VirtualStorage>>(&workload, steps).0),
        Some(steady_calls::<VirtualPool<VirtualStorage>>(&workload, steps).0),
        (!smoke).then(|| steady_calls::<Cubecl<CountingStorage<VirtualPages>>>(&workload, steps).0),
        latest.as_ref().map(|(calls, _)| *calls),
    ];
    let mut row = calls_row("peers_steady_state", "", counts);
    if let Some((_, mut peer)) = latest {
        // What CubeCL 0.11 held and moved in the steady state: its storage's peak (the
        // 22 GB live set, plus what its pages leave unused) and its relocations.
        let (peak, relocations) = (peer.storage().peak(), peer.relocations());
        println!(
            "peers_steady_state: CubeCL 0.11 peak storage {} MiB, {relocations} relocations",
            mib(peak)
        );
        row["cubecl11_peak_storage"] = peak.into();
        row["cubecl11_relocations"] = relocations.into();
    }
    rows.push(row);
    rows
}

/// CubeCL reads `cubecl.toml`/`burn.toml` from the working directory and its parents, and
/// `CUBECL_*` variables: refuse to measure a configured CubeCL.
fn assert_default_cubecl_config() {
    let variables: Vec<String> = std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("CUBECL_"))
        .collect();
    assert!(
        variables.is_empty(),
        "unset {variables:?}: CubeCL must run with its defaults"
    );
    let mut dir = std::env::current_dir().expect("a working directory");
    loop {
        for file in ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"] {
            let path = dir.join(file);
            assert!(
                !path.exists(),
                "{} configures CubeCL: run from a clean directory",
                path.display()
            );
        }
        if !dir.pop() {
            break;
        }
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    // The steady state last: its 22 GB of freed blocks leave glibc's heap in a state
    // that makes later `calloc`s (BytesStorage pages) zero recycled memory.
    targets = replay_traces, fifo_window, steady_state
}

fn main() {
    assert_default_cubecl_config();
    let memory = memory_table();
    benches();
    // After the timings: the steady state's runs here would change glibc's heap
    // under the timed ones (see the order of `targets` above).
    let calls = calls_table();
    Criterion::default().configure_from_args().final_summary();
    if let Some(path) = std::env::var_os("CUBEPOOL_PEERS_JSON") {
        let json = serde_json::json!({ "memory": memory, "calls": calls });
        let text = serde_json::to_string_pretty(&json).expect("JSON values serialize");
        std::fs::write(&path, text).expect("write CUBEPOOL_PEERS_JSON");
    }
}
