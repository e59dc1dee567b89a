//! Memory management driven through its public calls only, misuse included, in the
//! build `cargo test` makes (a debug build: `debug_assert!`s run and integer overflow
//! panics): slots released twice, made up, taken from a live handle
//! (`MemoryHandle::address_of`), from another memory management or from pools an
//! `install_pools` replaced; handles of another memory management; binds of ids never
//! issued or issued twice; reserves of 0 bytes and of sizes near `u64::MAX`; mode
//! switches, cleanups, steps and reports in between. Every call answers with a value or
//! a typed error, never a panic, and the books stay consistent (`check_invariants`
//! after each call).
//!
//! `PROPTEST_CASES` raises the number of cases (the default keeps CI fast).

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cubepool::errors::AllocId;
use cubepool::handle::{PoolRef, SlotRef};
use cubepool::pool::SlotId;
use cubepool::{
    ComputeStorage, ManagedMemoryBinding, ManagedMemoryHandle, ManagedMemoryId,
    MemoryAllocationMode, MemoryConfiguration, MemoryDeviceProperties, MemoryHandle,
    MemoryManagement, SharedMemoryBindings, VirtualStorage,
};
use proptest::prelude::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The layouts, as text (a build without sliced pools refuses some: those are
/// skipped), after the named ones.
const TEXT_LAYOUTS: [&str; 7] = [
    "sliced(page=64KiB, max_slice=16KiB); exclusive(max_alloc=1MiB)",
    "sliced(page=16KiB, max_slice=4KiB); direct()",
    "direct(reclaim_at=64KiB)",
    "sliced(page=1MiB, max_slice=1MiB, cap=1MiB); exclusive(max_alloc=4MiB, dealloc_period=3)",
    "exclusive(max_alloc=1MiB, dealloc_period=2); direct(reclaim_at=1MiB, dealloc_period=5)",
    "virtual(granule=2MiB, keep=none, small=4MiB)",
    "sliced(page=64KiB, max_slice=16KiB, cap=128KiB, dealloc_period=4); virtual(granule=2MiB)",
];

/// Layout `index`: the named configurations, then the text ones.
fn layout(index: usize) -> Option<MemoryConfiguration> {
    let named = [
        MemoryConfiguration::VirtualPages,
        MemoryConfiguration::Compact,
        MemoryConfiguration::SubSlices,
        MemoryConfiguration::ExclusivePages,
    ];
    let all = named.len() + TEXT_LAYOUTS.len();
    let index = index % all;
    match named.get(index) {
        Some(configuration) => Some(configuration.clone()),
        None => MemoryConfiguration::parse(TEXT_LAYOUTS[index - named.len()]).ok(),
    }
}

/// The virtual storages: unlimited (so sizes near `u64::MAX` get addresses), limited
/// (so they run out), and of a 64 KiB granularity (as virtual pools' granules).
fn storage(index: usize) -> VirtualStorage {
    match index % 3 {
        0 => VirtualStorage::new(),
        1 => VirtualStorage::with_limit(8 * MIB),
        _ => VirtualStorage::new().with_granularity(64 * KIB),
    }
}

fn properties(index: usize) -> MemoryDeviceProperties {
    match index % 3 {
        0 => MemoryDeviceProperties {
            max_page_size: 64 * MIB,
            alignment: 32,
        },
        1 => MemoryDeviceProperties {
            max_page_size: 1 << 40,
            alignment: 256,
        },
        _ => MemoryDeviceProperties {
            max_page_size: u64::MAX / 2 + 1,
            alignment: 1,
        },
    }
}

/// Memory management of layout `layout_index` over `storage`, with the device
/// properties `setup` picks.
fn build<S: ComputeStorage>(
    layout_index: usize,
    setup: usize,
    storage: S,
) -> Option<MemoryManagement<S>> {
    MemoryManagement::from_configuration(storage, properties(setup), layout(layout_index)?).ok()
}

/// A size of every kind: 0, small, odd, page-sized, near the top of `u64`, or any.
fn any_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(31),
        Just(4096),
        Just(64 * KIB + 1),
        Just(MIB),
        Just(2 * MIB + 1),
        Just(64 * MIB),
        Just(1 << 40),
        Just(1 << 63),
        Just(u64::MAX / 2),
        Just(u64::MAX - 255),
        Just(u64::MAX - 31),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        1u64..3 * MIB,
    ]
}

/// A made-up pool reference.
fn any_pool() -> impl Strategy<Value = PoolRef> {
    prop_oneof![
        Just(PoolRef::Empty),
        Just(PoolRef::Persistent),
        (0u8..4).prop_map(PoolRef::Dynamic),
        any::<u8>().prop_map(PoolRef::Dynamic),
    ]
}

/// A made-up slot id: small or any index and generation.
fn any_slot() -> impl Strategy<Value = SlotId> {
    let number = prop_oneof![0u32..4, any::<u32>()];
    (number.clone(), number).prop_map(|(index, generation)| SlotId { index, generation })
}

/// Which slot a slot call names.
#[derive(Debug, Clone)]
enum Which {
    /// A slot ever seen (live, released, another's, a handle's, replaced), by index.
    Seen(usize),
    /// A live handle's slot (`address_of`).
    OfHandle(usize),
    /// A made-up one.
    MadeUp(PoolRef, SlotId),
}

fn which() -> impl Strategy<Value = Which> {
    prop_oneof![
        3 => any::<usize>().prop_map(Which::Seen),
        2 => any::<usize>().prop_map(Which::OfHandle),
        1 => (any_pool(), any_slot()).prop_map(|(pool, slot)| Which::MadeUp(pool, slot)),
    ]
}

/// Which id a bind names.
#[derive(Debug, Clone)]
enum Id {
    /// A live handle's id (issued, maybe bound already).
    OfHandle(usize),
    /// A fresh one from the global counter.
    Fresh,
    /// Any number.
    Any(u64),
    /// A handle of the other memory management.
    Foreign(usize),
}

fn id() -> impl Strategy<Value = Id> {
    prop_oneof![
        2 => any::<usize>().prop_map(Id::OfHandle),
        1 => Just(Id::Fresh),
        1 => prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()].prop_map(Id::Any),
        1 => any::<usize>().prop_map(Id::Foreign),
    ]
}

/// An allocation id the error graph is given.
#[derive(Debug, Clone)]
enum Alloc {
    OfHandle(usize),
    Any(u64),
}

fn alloc() -> impl Strategy<Value = Alloc> {
    prop_oneof![
        3 => any::<usize>().prop_map(Alloc::OfHandle),
        1 => any::<u64>().prop_map(Alloc::Any),
    ]
}

fn range() -> impl Strategy<Value = Range<u64>> {
    let end = prop_oneof![0u64..4096, Just(u64::MAX), any::<u64>()];
    (prop_oneof![0u64..4096, any::<u64>()], end).prop_map(|(start, end)| start..end)
}

/// One public call.
#[derive(Debug, Clone)]
enum Call {
    Reserve(u64),
    ReserveLocated(u64),
    ReserveSlot(u64),
    /// A handle with no memory yet.
    Handle,
    Bind(Id, u64),
    BindLocated(Id, u64),
    CloneHandle(usize),
    Binding(usize),
    DropHandle(usize),
    /// Dropped on another thread (its release goes through a ring).
    DropElsewhere(usize),
    ReleaseHandle(usize),
    DropBinding(usize),
    ReleaseSlot(Which),
    Locate(Which),
    Resource(usize),
    AllocId(usize),
    /// The other memory management reserves (a handle and a slot).
    Foreign(u64),
    /// This one is given a handle of the other one.
    ReleaseForeign(usize),
    ResourceOfForeign(usize),
    Pin(usize),
    Unpin,
    Cleanup(bool),
    Mode(bool),
    Step,
    Install(usize),
    Report,
    Launch(Vec<(Alloc, Range<u64>)>, Vec<(Alloc, Range<u64>)>, bool),
    Write(Alloc, Range<u64>),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        4 => any_size().prop_map(Call::Reserve),
        2 => any_size().prop_map(Call::ReserveLocated),
        4 => any_size().prop_map(Call::ReserveSlot),
        1 => Just(Call::Handle),
        2 => (id(), any_size()).prop_map(|(id, size)| Call::Bind(id, size)),
        1 => (id(), any_size()).prop_map(|(id, size)| Call::BindLocated(id, size)),
        1 => any::<usize>().prop_map(Call::CloneHandle),
        1 => any::<usize>().prop_map(Call::Binding),
        2 => any::<usize>().prop_map(Call::DropHandle),
        1 => any::<usize>().prop_map(Call::DropElsewhere),
        2 => any::<usize>().prop_map(Call::ReleaseHandle),
        1 => any::<usize>().prop_map(Call::DropBinding),
        5 => which().prop_map(Call::ReleaseSlot),
        2 => which().prop_map(Call::Locate),
        1 => any::<usize>().prop_map(Call::Resource),
        1 => any::<usize>().prop_map(Call::AllocId),
        2 => any_size().prop_map(Call::Foreign),
        1 => any::<usize>().prop_map(Call::ReleaseForeign),
        1 => any::<usize>().prop_map(Call::ResourceOfForeign),
        1 => any::<usize>().prop_map(Call::Pin),
        1 => Just(Call::Unpin),
        2 => any::<bool>().prop_map(Call::Cleanup),
        2 => any::<bool>().prop_map(Call::Mode),
        1 => Just(Call::Step),
        1 => any::<usize>().prop_map(Call::Install),
        1 => Just(Call::Report),
        1 => (
            prop::collection::vec((alloc(), range()), 0..3),
            prop::collection::vec((alloc(), range()), 0..3),
            any::<bool>()
        )
            .prop_map(|(reads, writes, fail)| Call::Launch(reads, writes, fail)),
        1 => (alloc(), range()).prop_map(|(alloc, range)| Call::Write(alloc, range)),
    ]
}

/// What the run holds: handles, bindings and slots of `memory` and of `other`.
struct World<S: ComputeStorage> {
    memory: MemoryManagement<S>,
    other: MemoryManagement<S>,
    handles: Vec<ManagedMemoryHandle>,
    bindings: Vec<ManagedMemoryBinding>,
    foreign: Vec<ManagedMemoryHandle>,
    /// Every slot seen: reserved here or by `other`, a handle's, released or not.
    seen: Vec<SlotRef>,
    pins: SharedMemoryBindings,
}

/// The element at `k` (modulo the length), if any.
fn pick<T>(items: &[T], k: usize) -> Option<&T> {
    items.get(k % items.len().max(1))
}

fn take<T>(items: &mut Vec<T>, k: usize) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        let k = k % items.len();
        Some(items.swap_remove(k))
    }
}

impl<S: ComputeStorage> World<S> {
    fn slot(&self, which: &Which) -> Option<SlotRef> {
        match which {
            Which::Seen(k) => pick(&self.seen, *k).copied(),
            Which::OfHandle(k) => pick(&self.handles, *k).map(|handle| handle.address_of().1),
            Which::MadeUp(pool, slot) => Some(SlotRef {
                pool: *pool,
                slot: *slot,
            }),
        }
    }

    fn id(&self, id: &Id) -> ManagedMemoryId {
        match id {
            Id::OfHandle(k) => pick(&self.handles, *k).map_or(ManagedMemoryId(7), |h| h.id()),
            Id::Fresh => ManagedMemoryId::next(),
            Id::Any(n) => ManagedMemoryId(*n),
            Id::Foreign(k) => pick(&self.foreign, *k).map_or(ManagedMemoryId(9), |h| h.id()),
        }
    }

    fn alloc(&self, alloc: &Alloc) -> AllocId {
        match alloc {
            Alloc::OfHandle(k) => pick(&self.handles, *k)
                .and_then(|handle| self.memory.alloc_id(handle).ok())
                .unwrap_or(AllocId(3)),
            Alloc::Any(n) => AllocId(*n),
        }
    }

    fn keep(&mut self, handle: ManagedMemoryHandle) {
        self.seen.push(handle.address_of().1);
        self.handles.push(handle);
    }

    fn make(&mut self, call: &Call) {
        match call {
            Call::Reserve(size) => {
                if let Ok(handle) = self.memory.reserve(*size) {
                    self.keep(handle);
                }
            }
            Call::ReserveLocated(size) => {
                if let Ok((handle, resource)) = self.memory.reserve_located(*size) {
                    assert_eq!(self.memory.resource(&handle).ok(), Some(resource));
                    self.keep(handle);
                }
            }
            Call::ReserveSlot(size) => {
                if let Ok((slot, _)) = self.memory.reserve_slot(*size) {
                    self.seen.push(slot);
                }
            }
            Call::Handle => {
                let handle = self.memory.handle();
                self.handles.push(handle);
            }
            Call::Bind(id, size) => {
                let id = self.id(id);
                if let Ok(handle) = self.memory.bind(id, *size) {
                    self.keep(handle);
                }
            }
            Call::BindLocated(id, size) => {
                let id = self.id(id);
                if let Ok((handle, _)) = self.memory.bind_located(id, *size) {
                    self.keep(handle);
                }
            }
            Call::CloneHandle(k) => {
                if let Some(handle) = pick(&self.handles, *k).cloned() {
                    self.handles.push(handle);
                }
            }
            Call::Binding(k) => {
                if let Some(binding) = pick(&self.handles, *k).map(|h| h.binding()) {
                    self.bindings.push(binding);
                }
            }
            Call::DropHandle(k) => drop(take(&mut self.handles, *k)),
            Call::DropElsewhere(k) => {
                if let Some(handle) = take(&mut self.handles, *k) {
                    std::thread::spawn(move || drop(handle)).join().unwrap();
                }
            }
            Call::ReleaseHandle(k) => {
                if let Some(handle) = take(&mut self.handles, *k) {
                    self.memory.release(handle);
                }
            }
            Call::DropBinding(k) => drop(take(&mut self.bindings, *k)),
            Call::ReleaseSlot(which) => {
                if let Some(slot) = self.slot(which) {
                    let _ = self.memory.release_slot(slot);
                }
            }
            Call::Locate(which) => {
                if let Some(slot) = self.slot(which) {
                    let _ = self.memory.locate(slot);
                }
            }
            Call::Resource(k) => {
                if let Some(handle) = pick(&self.handles, *k) {
                    let _ = self.memory.resource(handle);
                }
            }
            Call::AllocId(k) => {
                if let Some(handle) = pick(&self.handles, *k) {
                    let _ = self.memory.alloc_id(handle);
                }
            }
            Call::Foreign(size) => {
                if let Ok(handle) = self.other.reserve(*size) {
                    self.seen.push(handle.address_of().1);
                    self.foreign.push(handle);
                }
                if let Ok((slot, _)) = self.other.reserve_slot(*size) {
                    self.seen.push(slot);
                }
            }
            Call::ReleaseForeign(k) => {
                if let Some(handle) = take(&mut self.foreign, *k) {
                    self.memory.release(handle);
                }
            }
            Call::ResourceOfForeign(k) => {
                if let Some(handle) = pick(&self.foreign, *k) {
                    assert!(self.memory.resource(handle).is_err());
                    assert!(self.memory.alloc_id(handle).is_err());
                }
            }
            Call::Pin(k) => {
                if let Some(handle) = pick(&self.handles, *k) {
                    self.pins.pin(handle);
                }
            }
            Call::Unpin => self.pins.release(),
            Call::Cleanup(explicit) => self.memory.cleanup(*explicit),
            Call::Mode(persistent) => self.memory.set_mode(if *persistent {
                MemoryAllocationMode::Persistent
            } else {
                MemoryAllocationMode::Auto
            }),
            Call::Step => self.memory.step(),
            Call::Install(index) => {
                if let Some(configuration) = layout(*index) {
                    let _ = self.memory.install_pools(configuration);
                }
            }
            Call::Report => {
                let _ = self.memory.memory_report();
                let _ = self.memory.memory_stats();
                let _ = self.memory.pool_states();
                let _ = self.memory.planned_stats();
                let _ = self.memory.record_memory("r");
                let _ = self.memory.current_usage();
                self.memory.reset_peaks();
                self.memory.reset_peak_memory_stats();
                self.memory.reset_accumulated_memory_stats();
                let _ = self.memory.take_records();
            }
            Call::Launch(reads, writes, fail) => {
                let reads: Vec<_> = reads
                    .iter()
                    .map(|(a, r)| (self.alloc(a), r.clone()))
                    .collect();
                let writes: Vec<_> = writes
                    .iter()
                    .map(|(a, r)| (self.alloc(a), r.clone()))
                    .collect();
                let fail = fail.then(|| "failed".to_string());
                let graph = self.memory.error_graph_mut();
                let _ = graph.launch("k", &reads, &writes, fail);
                for (alloc, range) in reads.iter().chain(&writes) {
                    let _ = graph.claims(*alloc, range.clone());
                }
            }
            Call::Write(alloc, range) => {
                let alloc = self.alloc(alloc);
                let _ = self.memory.error_graph_mut().write(alloc, range.clone());
            }
        }
    }
}

/// Makes `calls`; the first panic or broken invariant is the error, with the calls
/// up to it.
fn survives(layout_index: usize, setup: usize, calls: &[Call], end: u8) -> Result<(), String> {
    // Virtual storages, then one granting any size (with no addresses).
    match setup % 4 {
        3 => survives_on(layout_index, setup / 4, calls, end, Unbounded::default),
        kind => survives_on(layout_index, setup / 4, calls, end, || storage(kind)),
    }
}

/// [`survives`] on the storages `storage` makes.
fn survives_on<S: ComputeStorage>(
    layout_index: usize,
    setup: usize,
    calls: &[Call],
    end: u8,
    storage: impl Fn() -> S,
) -> Result<(), String> {
    let memory = build(layout_index, setup, storage());
    let (Some(memory), Some(other)) = (memory, build(layout_index, setup, storage())) else {
        return Ok(());
    };
    let mut world = World {
        memory,
        other,
        handles: Vec::new(),
        bindings: Vec::new(),
        foreign: Vec::new(),
        seen: Vec::new(),
        pins: SharedMemoryBindings::new(),
    };
    let history = |at: usize| format!("{:#?}", &calls[..=at]);
    for (at, call) in calls.iter().enumerate() {
        if catch_unwind(AssertUnwindSafe(|| world.make(call))).is_err() {
            return Err(format!(
                "layout {layout_index}, setup {setup}: call {at} panicked; calls: {}",
                history(at)
            ));
        }
        let checked = catch_unwind(AssertUnwindSafe(|| {
            world.memory.check_invariants()?;
            world
                .memory
                .error_graph()
                .check_invariants()
                .map_err(|e| e.to_string())
        }));
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(broken)) => {
                return Err(format!(
                    "layout {layout_index}, setup {setup}: after call {at}: {broken}; calls: {}",
                    history(at)
                ))
            }
            Err(_) => {
                return Err(format!(
                    "layout {layout_index}, setup {setup}: the check after call {at} panicked; calls: {}",
                    history(at)
                ))
            }
        }
    }
    // The end: everything given back, in one of three orders.
    let ended = catch_unwind(AssertUnwindSafe(move || {
        let World {
            mut memory,
            other,
            handles,
            bindings,
            foreign,
            pins,
            ..
        } = world;
        match end % 3 {
            0 => {
                drop((handles, bindings, foreign, pins));
                memory.cleanup(true);
                memory
                    .check_invariants()
                    .map_err(|e| format!("at the end: {e}"))?;
                drop((memory, other));
            }
            1 => {
                // The memory managements go first; their handles after.
                drop((memory, other));
                drop((handles, bindings, foreign, pins));
            }
            _ => {
                drop(other);
                std::thread::spawn(move || drop((handles, bindings, foreign, pins)))
                    .join()
                    .map_err(|_| "a drop on another thread panicked".to_string())?;
                memory.cleanup(true);
                memory
                    .check_invariants()
                    .map_err(|e| format!("at the end: {e}"))?;
            }
        }
        Ok::<(), String>(())
    }));
    match ended {
        Ok(Ok(())) => Ok(()),
        Ok(Err(broken)) => Err(format!("layout {layout_index}, setup {setup}: {broken}")),
        Err(_) => Err(format!(
            "layout {layout_index}, setup {setup}: the end (order {}) panicked; calls: {calls:#?}",
            end % 3
        )),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_management_survives_any_public_calls(
        layout_index in 0usize..11,
        setup in 0usize..12,
        calls in prop::collection::vec(call(), 0..60),
        end in any::<u8>(),
    ) {
        survives(layout_index, setup, &calls, end).map_err(TestCaseError::fail)?;
    }
}

/// A storage of buffers without addresses (as a graphics API's, whose buffers are
/// objects): it grants any size while the bytes it holds stay below 2^64, or past
/// that too (counting them modulo 2^64) when built by [`Unbounded::past_2_64`].
#[derive(Debug, Default)]
struct Unbounded {
    next_id: u64,
    live: std::collections::HashMap<u64, u64>,
    bytes: u64,
    allocations: u64,
    deallocations: u64,
    past_2_64: bool,
    /// The address of every buffer handed out.
    address: u64,
}

impl Unbounded {
    /// A storage that grants buffers past 2^64 bytes in all.
    fn past_2_64() -> Self {
        Self {
            past_2_64: true,
            ..Self::default()
        }
    }
}

impl ComputeStorage for Unbounded {
    fn alloc(
        &mut self,
        size: u64,
        _alignment: u64,
    ) -> Result<cubepool::storage::StorageHandle, cubepool::PoolError> {
        if !self.past_2_64 && self.bytes.checked_add(size).is_none() {
            return Err(cubepool::PoolError::OutOfMemory { size });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(id, size);
        self.bytes = self.bytes.wrapping_add(size);
        self.allocations += 1;
        Ok(cubepool::storage::StorageHandle {
            id: cubepool::storage::StorageId(id),
            address: self.address,
            size,
        })
    }

    fn dealloc(&mut self, id: cubepool::storage::StorageId) {
        if let Some(size) = self.live.remove(&id.0) {
            self.bytes = self.bytes.wrapping_sub(size);
            self.deallocations += 1;
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }

    fn allocations(&self) -> u64 {
        self.allocations
    }

    fn deallocations(&self) -> u64 {
        self.deallocations
    }
}

/// Capped pools that are all full: the refusal quotes their capacities summed, which
/// passed `u64::MAX` (an overflow panic in a debug build) for two capped pools of 2^63
/// bytes each on a storage that grants them.
#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn full_capped_pools_of_2_63_bytes_each_refuse_with_their_capacity_saturated() {
    use cubepool::{MemoryPoolOptions, PoolError, PoolType};

    let capped = || {
        MemoryPoolOptions::new(PoolType::SlicedPages {
            page_size: 1 << 62,
            max_slice_size: 1 << 62,
            max_pool_size: Some(1 << 63),
        })
    };
    let mut memory = MemoryManagement::from_configuration(
        Unbounded::past_2_64(),
        MemoryDeviceProperties {
            max_page_size: 1 << 63,
            alignment: 1,
        },
        MemoryConfiguration::Custom {
            pool_options: vec![capped(), capped()],
        },
    )
    .unwrap();
    // Two pages of each pool, each held by one reservation: both pools are full.
    let held: Vec<_> = (0..4).map(|_| memory.reserve(1 << 62).unwrap()).collect();
    match memory.reserve(1 << 62) {
        Err(PoolError::PoolCapacityExceeded {
            size,
            capacity,
            in_use,
        }) => {
            assert_eq!(size, 1 << 62);
            assert_eq!(capacity, u64::MAX, "2^64 bytes, saturated");
            assert_eq!(in_use, u64::MAX, "2^64 bytes in use, saturated");
        }
        other => panic!("full pools refuse with their capacity, got {other:?}"),
    }
    // What was reserved is untouched.
    for handle in &held {
        assert_eq!(memory.resource(handle).unwrap().size, 1 << 62);
    }
}

/// A pool whose next page would take its bytes reserved past `u64::MAX` refuses the
/// reserve (`PoolCapacityExceeded`, naming the request) before asking the storage, and
/// keeps what it holds: the sum overflowed (a panic in debug and release builds alike,
/// which check overflow) on a storage that grants buffers past 2^64 bytes in all.
#[test]
fn a_pool_refuses_a_page_that_would_take_its_books_past_u64_max() {
    use cubepool::pool::{DirectPool, ExclusivePool, MemoryPool, PersistentPool, SlicedPool};
    use cubepool::PoolError;

    let half = 1u64 << 63;
    let pools: Vec<(&str, Box<dyn MemoryPool>)> = vec![
        ("sliced", Box::new(SlicedPool::new(half, half, None, 1))),
        ("exclusive", Box::new(ExclusivePool::new(half, 1, None))),
        ("direct", Box::new(DirectPool::new(half, 1, None))),
        ("persistent", Box::new(PersistentPool::new(half, 1))),
    ];
    for (name, mut pool) in pools {
        let mut storage = Unbounded::past_2_64();
        let first = pool.reserve(&mut storage, half).unwrap();
        match pool.reserve(&mut storage, half) {
            Err(PoolError::PoolCapacityExceeded {
                size,
                capacity,
                in_use,
            }) => assert_eq!((size, capacity, in_use), (half, u64::MAX, half), "{name}"),
            other => panic!("{name}: a second page of 2^63 bytes is refused, got {other:?}"),
        }
        assert_eq!(storage.allocations, 1, "{name}: the storage was not asked");
        assert_eq!(pool.usage().bytes_reserved, half, "{name}");
        assert_eq!(
            pool.locate(first.slot).map(|p| p.size),
            Some(half),
            "{name}"
        );
        pool.check_invariants().unwrap();
        pool.release(first.slot).unwrap();
        pool.check_invariants().unwrap();
        // The page freed serves the size again.
        let again = pool.reserve(&mut storage, half).unwrap();
        pool.release(again.slot).unwrap();
    }
}

/// Memory management over such a storage: its default layout without virtual memory
/// (`Compact`; exclusive pages in a build without sliced pools) refuses a second
/// reservation of 2^63 bytes with a typed error.
#[test]
fn memory_management_refuses_a_page_past_2_64_bytes_with_a_typed_error() {
    use cubepool::PoolError;

    let half = 1u64 << 63;
    let mut memory = MemoryManagement::from_configuration(
        Unbounded::past_2_64(),
        MemoryDeviceProperties {
            max_page_size: half,
            alignment: 1,
        },
        if cubepool::EXCLUSIVE_MEMORY_ONLY {
            MemoryConfiguration::ExclusivePages
        } else {
            MemoryConfiguration::VirtualPages
        },
    )
    .unwrap();
    let held = memory.reserve(half).unwrap();
    assert!(
        matches!(
            memory.reserve(half),
            Err(PoolError::PoolCapacityExceeded { size, .. }) if size == half
        ),
        "a second page of 2^63 bytes is refused"
    );
    assert_eq!(memory.resource(&held).unwrap().size, half);
    memory.check_invariants().unwrap();
}

/// `check_invariants` of memory management whose pools together hold 2^64 bytes or
/// more (on a storage granting that much): it summed the pools' requested and padding
/// bytes unchecked (an overflow panic in a debug build) and compared saturated sums
/// with the statistics' wrapping ones (a drift it reported where there was none).
#[test]
fn the_invariants_of_pools_holding_2_64_bytes_together_check_without_a_panic() {
    let half = 1u64 << 63;
    let mut memory = MemoryManagement::from_configuration(
        Unbounded::past_2_64(),
        MemoryDeviceProperties {
            max_page_size: half,
            alignment: 2,
        },
        MemoryConfiguration::ExclusivePages,
    )
    .unwrap();
    // 2^63 - 1 bytes padded to 2^63, in a dynamic pool and in the persistent pool.
    let dynamic = memory.reserve(half - 1).unwrap();
    memory.set_mode(MemoryAllocationMode::Persistent);
    let persistent = memory.reserve(half - 1).unwrap();
    memory.set_mode(MemoryAllocationMode::Auto);
    assert_eq!(persistent.address_of().1.pool, PoolRef::Persistent);
    memory.check_invariants().unwrap();
    drop((dynamic, persistent));
    memory.cleanup(true);
    memory.check_invariants().unwrap();
}

/// A storage whose buffers sit at the top of the address space, so a reservation's
/// address (the buffer's plus its offset) passes `u64::MAX`: it wrapped with an overflow
/// panic in a debug build (`locate.rs`); it is computed wrapping now. (An
/// exclusive-memory-only build gives each reservation a buffer of its own, at offset 0,
/// so no address passes there.)
#[test]
#[cfg(not(feature = "exclusive-memory-only"))]
fn a_storage_at_the_top_of_the_address_space_locates_without_a_panic() {
    let top = u64::MAX - 100;
    let storage = Unbounded {
        address: top,
        ..Unbounded::default()
    };
    let mut memory = MemoryManagement::from_configuration(
        storage,
        MemoryDeviceProperties {
            max_page_size: 1 << 20,
            alignment: 256,
        },
        MemoryConfiguration::default(),
    )
    .unwrap();
    let held: Vec<_> = (0..4).map(|_| memory.reserve(4096).unwrap()).collect();
    let resources: Vec<_> = held.iter().map(|h| memory.resource(h).unwrap()).collect();
    assert!(
        resources.iter().any(|r| r.offset > 100),
        "some reservation's offset passes the buffer's room below 2^64: {resources:?}"
    );
    for resource in &resources {
        assert_eq!(resource.address, top.wrapping_add(resource.offset));
    }
    memory.check_invariants().unwrap();
}

/// A storage of real memory asked for an alignment that is not a power of two named a
/// want of memory (`OutOfMemory { size: 64 }`), for small buffers only (a large one took
/// the huge-page alignment instead). The simulated storage, whose addresses are
/// arithmetic, gives any alignment.
#[test]
fn an_alignment_not_a_power_of_two_is_named_by_the_host_storage() {
    use cubepool::storage::ComputeStorage;
    use cubepool::{HostStorage, PoolError, VirtualStorage};
    let mut host = HostStorage::new();
    for (size, alignment) in [(64, 3), (64, 96), (4 << 20, 3), (64, (1 << 62) + 1)] {
        match host.alloc(size, alignment) {
            Err(PoolError::InvalidArgument { reason }) => assert_eq!(
                reason,
                format!("alignment {alignment} is not a power of two")
            ),
            other => panic!("alloc({size}, {alignment}) gave {other:?}"),
        }
    }
    let held = host.alloc(64, 0).expect("an alignment of 0 is taken as 1");
    host.dealloc(held.id);
    assert_eq!((host.allocations(), host.bytes_allocated()), (1, 0));
    let mut simulated = VirtualStorage::new();
    for alignment in [3, 96, 1000] {
        let held = simulated.alloc(64, alignment).unwrap();
        assert_eq!(held.address % alignment, 0);
    }
}
