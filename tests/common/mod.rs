//! Helpers shared by the integration test binaries (each compiles this module on its
//! own).

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use cubepool::storage::{StorageHandle, StorageId};
use cubepool::{
    ComputeStorage, HostStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    PoolError, VirtualStorage,
};

/// Memory management with the default layout and device properties over host memory.
pub fn host_memory() -> MemoryManagement<HostStorage> {
    MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::default(),
    )
    .unwrap()
}

/// A storage with plain buffers only: no virtual memory (what `HostStorage` is off
/// Linux), for the paths that must do without it.
pub struct Buffers(pub VirtualStorage);

impl ComputeStorage for Buffers {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        self.0.alloc(size, alignment)
    }
    fn dealloc(&mut self, id: StorageId) {
        self.0.dealloc(id)
    }
    fn bytes_allocated(&self) -> u64 {
        self.0.bytes_allocated()
    }
    fn allocations(&self) -> u64 {
        self.0.allocations()
    }
    fn deallocations(&self) -> u64 {
        self.0.deallocations()
    }
}

/// Fails when two of the live placements share a byte (compared by address, so
/// placements in different storage buffers are compared too).
pub fn check_disjoint(
    live: &[cubepool::pool::Placement],
) -> Result<(), proptest::test_runner::TestCaseError> {
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|p| (p.storage.address + p.offset, p.size))
        .collect();
    spans.sort_unstable();
    match spans
        .windows(2)
        .find(|pair| pair[0].0 + pair[0].1 > pair[1].0)
    {
        Some(pair) => Err(proptest::test_runner::TestCaseError::fail(format!(
            "overlap: {pair:?}"
        ))),
        None => Ok(()),
    }
}
