//! Storages with virtual memory: host ranges whose resident memory comes and goes,
//! and the rules every map and unmap is checked against.

use cubepool::storage::{MappingError, StorageId, VirtualMemory};
use cubepool::{ComputeStorage, HostStorage, VirtualStorage};

const MIB: u64 = 1 << 20;

/// Held by the tests that write host memory while one of them measures the process's
/// resident memory: the tests of this binary run on threads of one process, so bytes
/// another test touched at the same time would move the measure.
#[cfg(target_os = "linux")]
static RESIDENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`RESIDENT`], also after a test that held it failed.
#[cfg(target_os = "linux")]
fn resident_lock() -> std::sync::MutexGuard<'static, ()> {
    RESIDENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

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
    let _resident = resident_lock();
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

/// An unmapped run of a host range loses its bytes at once but stays readable (it reads
/// as zeros): unmapping drops the pages without changing the run's protection, so that
/// the next map of it changes nothing in the process's memory map (see
/// `storage::os_mapping`). Before stop 63 the run was made inaccessible, and this read
/// faulted.
#[test]
#[cfg(target_os = "linux")]
fn an_unmapped_host_run_drops_its_bytes_and_stays_readable() {
    let _resident = resident_lock();
    let mut storage = HostStorage::new();
    let memory = storage
        .virtual_memory()
        .expect("Linux hosts have virtual memory");
    let range = memory
        .reserve_range(64 * MIB, 2 * MIB)
        .expect("64 MiB of address space");
    let run = (4 * MIB, 8 * MIB);
    memory.map(range.id, run.0, run.1).expect("8 MiB of memory");
    let address = (range.address + run.0) as *mut u8;
    // SAFETY (test): the run was just mapped read-write.
    unsafe { std::slice::from_raw_parts_mut(address, run.1 as usize) }.fill(0x5A);
    memory
        .unmap(range.id, run.0, run.1)
        .expect("the run is mapped");
    // SAFETY (test): the unmapped run stays readable (what this test checks); nothing
    // else uses it.
    let after = unsafe { std::slice::from_raw_parts(address as *const u8, run.1 as usize) };
    assert!(after.iter().all(|&byte| byte == 0), "the bytes are dropped");
    assert_eq!(memory.bytes_mapped(), 0);
    memory
        .map(range.id, run.0, run.1)
        .expect("the run maps again");
    assert_eq!(memory.bytes_mapped(), run.1);
    memory.free_range(range.id);
}

/// A run mapped again that reaches past what was mapped before is writable throughout:
/// the storage skips asking the host only for runs wholly writable already (an unmapped
/// run stays writable), so a run that starts inside an old one and ends past it, or one
/// over two old runs and the gap between them, is made writable where it was not.
#[test]
#[cfg(target_os = "linux")]
fn runs_mapped_again_over_old_runs_and_past_them_are_writable_throughout() {
    let _resident = resident_lock();
    let mut storage = HostStorage::new();
    let memory = storage
        .virtual_memory()
        .expect("Linux hosts have virtual memory");
    let range = memory
        .reserve_range(64 * MIB, 2 * MIB)
        .expect("64 MiB of address space");
    let write = |offset: u64, size: u64| {
        // SAFETY (test): the caller mapped the run read-write just before.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut((range.address + offset) as *mut u8, size as usize)
        };
        bytes.fill(0x3C);
        assert!(bytes.iter().all(|&byte| byte == 0x3C));
    };
    for (offset, size) in [(4 * MIB, 8 * MIB), (20 * MIB, 2 * MIB)] {
        memory.map(range.id, offset, size).expect("an old run");
        memory.unmap(range.id, offset, size).expect("it is mapped");
    }
    // From inside the first old run to past it; then over both old runs and the gap.
    for (offset, size) in [(8 * MIB, 12 * MIB), (2 * MIB, 24 * MIB)] {
        memory.map(range.id, offset, size).expect("a new run");
        write(offset, size);
        memory.unmap(range.id, offset, size).expect("it is mapped");
    }
    memory.free_range(range.id);
}

/// Runs the test `name` of this binary again in a child process with
/// [`REFUSING_CHILD`] set, and checks that it passed; false in that child, where the
/// caller goes on with the test itself (so that a limit it sets binds no other test).
#[cfg(target_os = "linux")]
fn ran_in_a_child(name: &str) -> bool {
    if std::env::var_os(REFUSING_CHILD).is_some() {
        return false;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(REFUSING_CHILD, "1")
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child failed or ran no test: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    true
}

/// Lowers this process's data limit (`RLIMIT_DATA`, which private writable memory
/// counts against) to what it holds now (`VmData`) and `headroom` bytes more; returns
/// the limit before, for [`restore_data_limit`]. A test restores it before it asserts:
/// a panic's message and backtrace need memory, and under the limit the allocation
/// failure's own report deadlocks on the backtrace lock (the child then hangs).
#[cfg(target_os = "linux")]
fn limit_data_to(headroom: u64) -> libc::rlimit {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let data_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmData:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("VmData in /proc/self/status");
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY (test): getrlimit writes the limit into `limit`; setrlimit lowers this
    // process's soft limit only (the hard one stays).
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_DATA, &mut limit), 0);
        let before = limit;
        limit.rlim_cur = ((data_kib * 1024 + headroom) as libc::rlim_t).min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_DATA, &limit), 0);
        before
    }
}

/// Puts back the data limit [`limit_data_to`] returned.
#[cfg(target_os = "linux")]
fn restore_data_limit(before: libc::rlimit) {
    // SAFETY (test): setrlimit raises this process's soft limit back to what it was.
    let restored = unsafe { libc::setrlimit(libc::RLIMIT_DATA, &before) };
    assert_eq!(restored, 0, "the data limit is put back");
}

/// Runs unmapped earlier do not use up the data limit: unmapped, a run stays writable
/// (cheaper to map again) and so counts as the process's writable memory, but when the
/// host refuses a map for that, the storage makes such runs inaccessible and tries
/// again. Mapping, writing and unmapping 48 MiB at eight other offsets under a limit of
/// 64 MiB more than the process holds works each time; without the second try the
/// second map was refused. Runs in a child process of this test binary.
#[test]
#[cfg(target_os = "linux")]
fn runs_unmapped_earlier_do_not_use_up_the_data_limit() {
    if ran_in_a_child("runs_unmapped_earlier_do_not_use_up_the_data_limit") {
        return;
    }
    let mut storage = HostStorage::new();
    let memory = storage.virtual_memory().unwrap();
    let range = memory.reserve_range(1 << 30, 2 * MIB).unwrap();
    // One run stays mapped throughout, and its bytes with it.
    memory
        .map(range.id, 0, 2 * MIB)
        .expect("2 MiB under no limit");
    // SAFETY (test): the first 2 MiB are mapped read-write.
    let kept = unsafe { std::slice::from_raw_parts_mut(range.address as *mut u8, 2 << 20) };
    kept.fill(0x7E);
    let before = limit_data_to(64 * MIB);
    // Under the limit nothing panics (see `limit_data_to`): the first refusal ends the
    // rounds, and is checked once the limit is back.
    let mut refused = None;
    for round in 0..8u64 {
        let offset = (4 + round * 50) * MIB;
        if let Err(error) = memory.map(range.id, offset, 48 * MIB) {
            refused = Some((round, error));
            break;
        }
        // SAFETY (test): the run was just mapped read-write.
        unsafe { std::slice::from_raw_parts_mut((range.address + offset) as *mut u8, 48 << 20) }
            .fill(0x11);
        if let Err(error) = memory.unmap(range.id, offset, 48 * MIB) {
            refused = Some((round, error));
            break;
        }
    }
    restore_data_limit(before);
    assert_eq!(
        refused, None,
        "(round, error) of the first refused map or unmap"
    );
    assert!(
        kept.iter().all(|&byte| byte == 0x7E),
        "the mapped run kept its bytes"
    );
    // A run made inaccessible by a second try maps again, writable again.
    memory
        .map(range.id, 4 * MIB, 48 * MIB)
        .expect("an old run maps again");
    // SAFETY (test): the run was just mapped read-write.
    unsafe { std::slice::from_raw_parts_mut((range.address + 4 * MIB) as *mut u8, 48 << 20) }
        .fill(0x22);
    memory.free_range(range.id);
}

/// Set in the child process [`ran_in_a_child`] starts.
#[cfg(target_os = "linux")]
const REFUSING_CHILD: &str = "CUBEPOOL_TEST_REFUSING_HOST_CHILD";

/// A map the host refuses after the run was checked (here: past the process's data
/// limit, `RLIMIT_DATA`, which private writable memory counts against) fails with
/// `OutOfMemory` and leaves nothing recorded: the bytes mapped and the calls are as
/// before, and the same run maps once the limit allows it. Runs in a child process
/// of this test binary, so that the limit binds no other test.
#[test]
#[cfg(target_os = "linux")]
fn a_map_the_host_refuses_is_out_of_memory_and_records_nothing() {
    if ran_in_a_child("a_map_the_host_refuses_is_out_of_memory_and_records_nothing") {
        return;
    }
    let mut storage = HostStorage::new();
    let memory = storage.virtual_memory().unwrap();
    let range = memory.reserve_range(1 << 30, 2 * MIB).unwrap();
    memory
        .map(range.id, 0, 2 * MIB)
        .expect("2 MiB under no limit");
    let before = limit_data_to(64 * MIB);
    let refused = memory.map(range.id, 4 * MIB, 512 * MIB);
    // Nothing was recorded at 4 MiB: no unmap of the refused run is accepted, and a
    // smaller run maps there.
    let unmapped = memory.unmap(range.id, 4 * MIB, 512 * MIB);
    let smaller = memory.map(range.id, 4 * MIB, 2 * MIB);
    restore_data_limit(before);
    assert_eq!(refused, Err(MappingError::OutOfMemory { size: 512 * MIB }));
    assert!(matches!(unmapped, Err(MappingError::NotMapped { .. })));
    assert_eq!(smaller, Ok(()), "2 MiB under the limit");
    assert_eq!(memory.bytes_mapped(), 4 * MIB);
    assert_eq!(
        (storage.allocations(), storage.bytes_allocated()),
        (2, 4 * MIB)
    );
    storage.virtual_memory().unwrap().free_range(range.id);
}

/// The host's memory and swap in bytes (`MemTotal` + `SwapTotal` of `/proc/meminfo`).
#[cfg(target_os = "linux")]
fn host_memory_and_swap() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |field: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/meminfo"))
    };
    (kib("MemTotal:") + kib("SwapTotal:")) * 1024
}

/// A run larger than the host's memory and swap is refused with `OutOfMemory` under
/// the kernel's default overcommit heuristic (and under strict accounting), as
/// `malloc` refuses it: a range's committed runs pass the overcommit check (its
/// mapping is not `MAP_NORESERVE`). Before, such a map succeeded and writing its
/// pages ended the process. Where the host overcommits without a check
/// (`vm.overcommit_memory = 1`) there is nothing to refuse, and the test says so.
#[test]
#[cfg(target_os = "linux")]
fn a_map_past_the_hosts_memory_and_swap_is_out_of_memory() {
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
    if mode.trim() == "1" {
        eprintln!("vm.overcommit_memory = 1: the host refuses no map, nothing to check");
        return;
    }
    let size = (host_memory_and_swap() + (1 << 30)).next_multiple_of(2 * MIB);
    let mut storage = HostStorage::new();
    let memory = storage.virtual_memory().unwrap();
    let range = memory.reserve_range(size, 2 * MIB).unwrap();
    assert_eq!(
        memory.map(range.id, 0, size),
        Err(MappingError::OutOfMemory { size })
    );
    assert_eq!(memory.bytes_mapped(), 0);
    // The range still works: a small run maps, and reads as zeros.
    memory.map(range.id, 0, 2 * MIB).expect("2 MiB maps");
    // SAFETY (test): the run just mapped is readable.
    let first = unsafe { std::ptr::read_volatile(range.address as *const u8) };
    assert_eq!(first, 0);
    memory.free_range(range.id);
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

#[test]
fn an_emptied_virtual_storage_takes_its_addresses_back() {
    // Addresses were only ever handed out upward: after 2^64 bytes of them over its life
    // the storage refused every allocation while it held nothing (helper-141's find).
    let mut storage = VirtualStorage::new();
    for round in 0..8 {
        let buffer = storage
            .alloc(1 << 62, 64)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        storage.dealloc(buffer.id);
        let range = storage
            .reserve_range(1 << 62, 64)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        storage.free_range(range.id);
    }
    assert_eq!(storage.bytes_allocated(), 0);
    // While something is held, what comes after it never overlaps it.
    let kept = storage.alloc(MIB, 64).unwrap();
    let other = storage.alloc(MIB, 64).unwrap();
    storage.dealloc(other.id);
    let next = storage.alloc(MIB, 64).unwrap();
    assert!(next.address >= kept.address + kept.size || next.address + next.size <= kept.address);
}
