//! Storages with virtual memory: host ranges whose resident memory comes and goes,
//! and the rules every map and unmap is checked against.

use cubepool::storage::{MappingError, StorageId, VirtualMemory};
use cubepool::{ComputeStorage, HostStorage, VirtualStorage};

const MIB: u64 = 1 << 20;

/// Resident memory of this process, in bytes, from `/proc/self/statm` (its second
/// field, in pages).
#[cfg(target_os = "linux")]
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm is readable");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("statm's second field is the resident page count");
    // The page size of every Linux machine this runs on; the storage reads the real
    // one, and the thresholds below leave room for either.
    pages * 4096
}

#[test]
#[cfg(target_os = "linux")]
fn host_ranges_take_resident_memory_when_mapped_and_give_it_back_when_unmapped() {
    let mut storage = HostStorage::new();
    let memory = storage
        .virtual_memory()
        .expect("Linux hosts have virtual memory");
    let range = memory
        .reserve_range(1 << 30, 2 * MIB)
        .expect("1 GiB of address space");
    assert_eq!(
        range.address % (2 * MIB),
        0,
        "the range is aligned as asked"
    );
    let before = resident_bytes();
    memory.map(range.id, 0, 64 * MIB).expect("64 MiB of memory");
    // SAFETY (test): the run [0, 64 MiB) of the range was just mapped read-write.
    let bytes = unsafe { std::slice::from_raw_parts_mut(range.address as *mut u8, 64 << 20) };
    bytes.fill(0xA5);
    let mapped = resident_bytes();
    assert!(
        mapped >= before + 60 * MIB,
        "resident memory rose by {} MiB, expected about 64",
        (mapped - before) / MIB
    );
    assert_eq!(memory.bytes_mapped(), 64 * MIB);
    memory
        .unmap(range.id, 0, 64 * MIB)
        .expect("the run is mapped");
    let unmapped = resident_bytes();
    assert!(
        unmapped + 60 * MIB <= mapped,
        "resident memory fell by {} MiB, expected about 64",
        mapped.saturating_sub(unmapped) / MIB
    );
    assert_eq!(memory.bytes_mapped(), 0);
    // Mapped again, the bytes read as zeros: the old pages are gone.
    memory.map(range.id, 0, 2 * MIB).expect("2 MiB");
    // SAFETY (test): the first 2 MiB of the range are mapped again.
    let again = unsafe { std::slice::from_raw_parts(range.address as *const u8, 2 << 20) };
    assert!(again.iter().all(|&byte| byte == 0));
    assert_eq!((storage.allocations(), storage.deallocations()), (2, 1));
    assert_eq!(storage.bytes_allocated(), 2 * MIB);
    storage.virtual_memory().unwrap().free_range(range.id);
    assert_eq!(
        (storage.deallocations(), storage.bytes_allocated()),
        (2, 0),
        "freeing a range unmaps what it still holds"
    );
}

/// The rules of the interface, for one storage.
fn check_rules(memory: &mut dyn VirtualMemory) {
    let granule = memory.granularity();
    let range = memory.reserve_range(16 * granule, granule).unwrap();
    assert_eq!(range.size, 16 * granule);
    let id = range.id;
    assert!(matches!(memory.map(id, 1, granule), Err(MappingError::BadRun { .. })) || granule == 1);
    assert!(matches!(
        memory.map(id, 15 * granule, 2 * granule),
        Err(MappingError::BadRun { .. })
    ));
    assert!(matches!(
        memory.map(id, 0, 0),
        Err(MappingError::BadRun { .. })
    ));
    assert!(matches!(
        memory.map(StorageId(999), 0, granule),
        Err(MappingError::UnknownRange { id: 999 })
    ));
    memory.map(id, 2 * granule, 3 * granule).unwrap();
    assert_eq!(
        memory.map(id, 4 * granule, granule),
        Err(MappingError::AlreadyMapped {
            offset: 4 * granule
        })
    );
    assert_eq!(
        memory.map(id, granule, 2 * granule),
        Err(MappingError::AlreadyMapped { offset: granule })
    );
    memory.map(id, granule, granule).unwrap();
    assert_eq!(
        memory.unmap(id, 2 * granule, granule),
        Err(MappingError::NotMapped {
            offset: 2 * granule,
            size: granule
        }),
        "only whole runs are unmapped"
    );
    assert_eq!(memory.bytes_mapped(), 4 * granule);
    memory.unmap(id, 2 * granule, 3 * granule).unwrap();
    assert_eq!(memory.bytes_mapped(), granule);
    assert!(matches!(
        memory.reserve_range(granule, 3),
        Err(MappingError::BadAlignment { alignment: 3 })
    ));
    memory.free_range(id);
    assert_eq!(memory.bytes_mapped(), 0);
    assert_eq!(memory.ranges_reserved(), 1);
}

#[test]
#[cfg(target_os = "linux")]
fn host_virtual_memory_refuses_what_breaks_the_rules() {
    let mut storage = HostStorage::new();
    check_rules(storage.virtual_memory().unwrap());
}

#[test]
fn virtual_storage_checks_the_same_rules_and_counts_calls() {
    let mut storage = VirtualStorage::new().with_granularity(2 * MIB);
    check_rules(storage.virtual_memory().unwrap());
    // 3 maps, 2 unmaps (the last by freeing the range).
    assert_eq!((storage.allocations(), storage.deallocations()), (2, 2));
}

#[test]
fn a_limited_virtual_storage_refuses_maps_past_its_limit() {
    let mut storage = VirtualStorage::with_limit(8 * MIB).with_granularity(2 * MIB);
    let buffer = storage.alloc(2 * MIB, 64).unwrap();
    let memory = storage.virtual_memory().unwrap();
    let range = memory
        .reserve_range(1 << 40, 2 * MIB)
        .expect("address space is free");
    memory.map(range.id, 0, 6 * MIB).unwrap();
    assert_eq!(
        memory.map(range.id, 6 * MIB, 2 * MIB),
        Err(MappingError::OutOfMemory { size: 2 * MIB }),
        "buffers and mapped runs share the limit"
    );
    storage.dealloc(buffer.id);
    let memory = storage.virtual_memory().unwrap();
    memory.map(range.id, 6 * MIB, 2 * MIB).unwrap();
    assert_eq!(storage.bytes_allocated(), 8 * MIB);
}
