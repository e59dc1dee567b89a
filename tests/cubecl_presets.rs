//! Our `SubSlices` preset against the pool list CubeCL 0.10 itself builds.
//!
//! CubeCL keeps its pool list private, so the comparison is behavioural: both
//! memory managements, over storages that hand out address ranges without bytes,
//! serve the same requests (kept alive), and after each one the bytes reserved from
//! the storage must agree. Which pool a size goes to, and that pool's page size,
//! decide that figure, so a different ladder, slice limit or tail shows up at once.
#![cfg(not(feature = "exclusive-memory-only"))]

use std::sync::Arc;

use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management as cubecl;
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use cubepool::{MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, VirtualStorage};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A CubeCL storage of address ranges without bytes: pages cost nothing.
#[derive(Default)]
struct Ranges;

impl ComputeStorage for Ranges {
    type Resource = ();

    fn alignment(&self) -> usize {
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

/// Sizes that reach every pool of the ladder and the tail for `max_page`: powers of
/// two and their neighbours, the near-page band of each sliced pool, and the largest
/// page itself.
fn probes(max_page: u64) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut size = 1;
    while size <= max_page {
        sizes.extend([size, size + 1, size * 3 / 2]);
        sizes.push(size - size / 8); // within 80 % of a page of this size
        size *= 2;
    }
    sizes.push(max_page);
    sizes.retain(|&s| s > 0 && s <= max_page);
    sizes
}

/// Bytes reserved after each request, ours and CubeCL's.
fn reserved_after_each(max_page: u64, alignment: u64, sizes: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let mut ours = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties {
            max_page_size: max_page,
            alignment,
        },
        MemoryConfiguration::SubSlices,
    )
    .expect("valid properties");
    let mut theirs = cubecl::MemoryManagement::from_configuration(
        Ranges,
        &cubecl_ir::MemoryDeviceProperties {
            max_page_size: max_page,
            alignment,
        },
        cubecl::MemoryConfiguration::SubSlices,
        Arc::new(ServerLogger::default()),
        cubecl::MemoryManagementOptions::new("presets"),
    );
    let (mut our_handles, mut their_handles) = (Vec::new(), Vec::new());
    let (mut ours_seen, mut theirs_seen) = (Vec::new(), Vec::new());
    for &size in sizes {
        our_handles.push(ours.reserve(size).expect("our SubSlices takes every size"));
        their_handles.push(theirs.reserve(size).expect("CubeCL's takes every size"));
        ours_seen.push(ours.memory_usage().bytes_reserved);
        theirs_seen.push(theirs.memory_usage().bytes_reserved);
    }
    (ours_seen, theirs_seen)
}

#[test]
fn sub_slices_reserves_what_cubecl_0_10_reserves() {
    for (max_page, alignment) in [
        (2048 * MIB, 256),
        (512 * MIB, 64),
        (128 * MIB, 32),
        (40 * MIB, 64),
        (8 * MIB, 4),
    ] {
        let sizes = probes(max_page);
        let (ours, theirs) = reserved_after_each(max_page, alignment, &sizes);
        for (index, size) in sizes.iter().enumerate() {
            assert_eq!(
                ours[index], theirs[index],
                "max_page_size {max_page}, alignment {alignment}: after reserving {size} bytes \
                 (request {index})"
            );
        }
    }
}

#[test]
fn the_largest_page_is_served_by_a_sliced_tail_as_in_cubecl() {
    // A request of a whole device page: CubeCL 0.10's tail is a sliced pool of whole
    // pages, so it reserves exactly one page, and a second such request another.
    let max_page = 64 * MIB;
    let sizes = [max_page, max_page, 3 * max_page / 4];
    let (ours, theirs) = reserved_after_each(max_page, 64, &sizes);
    assert_eq!(ours, theirs);
    assert_eq!(ours, vec![max_page, 2 * max_page, 3 * max_page]);
}
