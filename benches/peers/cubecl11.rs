//! CubeCL's current stable release (`cubecl-server` 0.11.3 over `cubecl-runtime`
//! 0.11.4) as the peers bench drives it: its own `MemoryManagement` with its default
//! layout, `MemoryConfiguration::Adaptive` (a small exclusive pool, an 8 MiB-page sliced
//! pool for requests up to 64 KiB, and an arena of up to 64 sliced pools whose page size
//! follows the largest allocation), reserved the way its server reserves.
//!
//! The server (`cubecl_server::command::Command::reserve`, which needs a `Driver` and
//! streams, so the bench cannot call it) does three things around
//! `MemoryManagement::reserve`, and [`Cubecl11::reserve`] does the same three on one
//! stream that never records a graph:
//!
//! 1. `relocate_when_wanted`: when the memory asks for a relocation (outdated pages
//!    left by a growth, and an arena with every page size taken or a device under
//!    pressure), move the live allocations off the outdated pages first;
//! 2. `reserve(size, PageUpdate::Allow)`, whose periodic cleanup gives back the
//!    outdated pages that emptied;
//! 3. on a failure a reclaim may cure (`IoError::may_succeed_after_reclaim`), make room
//!    (`make_room`: a relocation that may allocate when the page sizes ran out, an
//!    explicit cleanup otherwise) and retry once.
//!
//! The relocation's copies go through a [`CopyQueue`]: CubeCL's own `HostCopies`
//! (`memcpy` between `BytesStorage` allocations) on host memory, [`NoCopies`] on
//! [`VirtualPages11`], whose allocations have no bytes to copy. The device properties
//! state no capacity (as the other peers' do not), so memory pressure never asks for a
//! relocation; the arena filling up, or a reserve that fails, does.

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_ir_011::MemoryDeviceProperties;
use cubecl_server_011::logging::ServerLogger;
use cubecl_server_011::memory_management::relocation::{
    CopyQueue, HostCopies, RelocationNeed, RelocationReason, StorageCopy,
};
pub use cubecl_server_011::memory_management::ManagedMemoryHandle;
use cubecl_server_011::memory_management::{
    Cleanup, ErrorGraph, MemoryConfiguration, MemoryManagement, MemoryManagementOptions, PageUpdate,
};
use cubecl_server_011::server::{IoError, ServerError};
pub use cubecl_server_011::storage::BytesStorage;
use cubecl_server_011::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

use crate::common::properties;

/// CubeCL 0.11's memory over storage `S`, relocating through copy queue `Q`.
pub struct Cubecl11<S, Q> {
    memory: MemoryManagement<S>,
    copies: Q,
    /// The failures CubeCL records against allocations (none here: nothing fails).
    failures: ErrorGraph,
    /// Relocations run so far (each moves what it can off the outdated pages).
    relocations: u64,
}

impl<S: ComputeStorage, Q: CopyQueue<S>> Cubecl11<S, Q> {
    /// The default layout (`Adaptive`) over `storage`, with the bench's device
    /// properties (2 GiB pages at most, 32-byte alignment, no capacity stated).
    pub fn on(storage: S, copies: Q) -> Self {
        let ours = properties();
        let memory = MemoryManagement::from_configuration(
            storage,
            &MemoryDeviceProperties::new(ours.max_page_size, ours.alignment),
            MemoryConfiguration::default(),
            Arc::new(ServerLogger::default()),
            MemoryManagementOptions::new("bench"),
        );
        Self {
            memory,
            copies,
            failures: ErrorGraph::default(),
            relocations: 0,
        }
    }

    /// Reserves `size` bytes as CubeCL's server does (module docs: relocate when
    /// wanted, reserve, make room and retry once); panics if it cannot (a bench bug).
    pub fn reserve(&mut self, size: u64) -> ManagedMemoryHandle {
        self.relocate_when_wanted();
        match self
            .memory
            .reserve(size, PageUpdate::Allow, &mut self.failures)
        {
            Ok(handle) => handle,
            Err(err) if err.may_succeed_after_reclaim() => {
                self.make_room(&err);
                self.memory
                    .reserve(size, PageUpdate::Allow, &mut self.failures)
                    .unwrap_or_else(|err| panic!("CubeCL 0.11 reserve of {size} B: {err}"))
            }
            Err(err) => panic!("CubeCL 0.11 reserve of {size} B: {err}"),
        }
    }

    /// The relocations run so far.
    pub fn relocations(&self) -> u64 {
        self.relocations
    }

    /// The storage, for its books.
    pub fn storage(&mut self) -> &mut S {
        self.memory.storage()
    }

    /// `RelocatingStreams::relocate_when_wanted` for one stream that never records.
    fn relocate_when_wanted(&mut self) {
        let need = self.memory.relocation_need();
        if need == RelocationNeed::Nothing {
            return;
        }
        let memory = &self.memory;
        if let Some(reason) = need.reason(|| memory.bytes_allocated()) {
            self.relocate(reason);
        }
    }

    /// `RelocatingStreams::relocate`: nothing to do unless a growth left pages behind.
    fn relocate(&mut self, reason: RelocationReason) {
        if !self.memory.has_outdated() {
            return;
        }
        self.memory
            .relocate(&mut self.copies, reason, &mut self.failures);
        self.relocations += 1;
    }

    /// `Command::make_room` after a reserve failed with `err`: a relocation that may
    /// allocate when the page sizes ran out, else the explicit cleanup
    /// (`memory_cleanup`: relocate what the outdated pages hold, then give back every
    /// page nothing holds).
    fn make_room(&mut self, err: &IoError) {
        if let IoError::PageSizesExhausted { .. } = err {
            self.relocate(RelocationReason::ArenaFull);
        } else {
            self.relocate(RelocationReason::Explicit);
            self.memory.cleanup(Cleanup::Explicit, &mut self.failures);
        }
    }
}

/// A CubeCL 0.11 storage of address ranges without bytes (cubepool's `VirtualStorage`
/// for CubeCL 0.11): pages cost a map insert, so a replay times the pools; it counts
/// the calls it gets and the most bytes it held at once.
#[derive(Default)]
pub struct VirtualPages11 {
    /// The size of every allocation held.
    sizes: HashMap<StorageId, u64>,
    /// The bytes held now (the sum of `sizes`).
    bytes: u64,
    /// The most bytes held at once.
    peak: u64,
    /// Allocations and deallocations so far.
    calls: u64,
}

impl VirtualPages11 {
    /// The most bytes held at once, relocations' moments included.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Allocations and deallocations so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }
}

impl ComputeStorage for VirtualPages11 {
    type Resource = ();

    fn alignment(&self) -> usize {
        BytesStorage::ALIGNMENT
    }

    fn get(&mut self, _handle: &StorageHandle) -> Result<Self::Resource, IoError> {
        Ok(())
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        self.sizes.insert(id, size);
        self.bytes += size;
        self.peak = self.peak.max(self.bytes);
        self.calls += 1;
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.bytes -= size;
        }
        self.calls += 1;
    }

    fn flush(&mut self) {}

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }
}

/// The copy queue of [`VirtualPages11`]: its allocations have no bytes, so a copy has
/// nothing to move and has landed at once.
#[derive(Default)]
pub struct NoCopies;

impl CopyQueue<VirtualPages11> for NoCopies {
    fn wait_device(&mut self) -> Result<(), ServerError> {
        Ok(())
    }

    fn copy(&mut self, _storage: &mut VirtualPages11, _copy: &StorageCopy) -> Result<(), IoError> {
        Ok(())
    }

    fn wait_copies(&mut self) -> Result<(), ServerError> {
        Ok(())
    }
}

/// CubeCL 0.11 on host memory (`BytesStorage`, pages zeroed by `calloc`), relocating
/// with `memcpy`.
pub type Host = Cubecl11<BytesStorage, HostCopies>;

/// CubeCL 0.11 on address ranges without bytes.
pub type Virtual = Cubecl11<VirtualPages11, NoCopies>;
