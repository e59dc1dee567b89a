//! What the core tells a user: messages in the units the user wrote, quoted numbers
//! cut short, the address space a range was granted, layouts a storage cannot serve
//! refused when memory management is built, and the files a killed save left behind
//! cleaned at the next save.

#[cfg(not(feature = "exclusive-memory-only"))]
use cubepool::storage::{MappingError, StorageId, VirtualMemory};
use cubepool::trace::format::{Trace, TraceError};
#[cfg(not(feature = "exclusive-memory-only"))]
use cubepool::{
    ComputeStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    MemoryPoolOptions, PoolError, PoolType, VirtualStorage,
};

#[cfg(not(feature = "exclusive-memory-only"))]
const MIB: u64 = 1 << 20;

#[cfg(not(feature = "exclusive-memory-only"))]
/// A virtual storage under an address-space limit: ranges larger than `max_range`
/// are refused for memory, as a host under `ulimit -v` refuses them.
struct LimitedAddressSpace {
    inner: VirtualStorage,
    max_range: u64,
}

#[cfg(not(feature = "exclusive-memory-only"))]
impl ComputeStorage for LimitedAddressSpace {
    fn alloc(
        &mut self,
        size: u64,
        alignment: u64,
    ) -> Result<cubepool::storage::StorageHandle, PoolError> {
        self.inner.alloc(size, alignment)
    }
    fn dealloc(&mut self, id: StorageId) {
        self.inner.dealloc(id)
    }
    fn bytes_allocated(&self) -> u64 {
        self.inner.bytes_allocated()
    }
    fn allocations(&self) -> u64 {
        self.inner.allocations()
    }
    fn deallocations(&self) -> u64 {
        self.inner.deallocations()
    }
    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }
    fn virtual_memory_ref(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }
}

#[cfg(not(feature = "exclusive-memory-only"))]
impl VirtualMemory for LimitedAddressSpace {
    fn granularity(&self) -> u64 {
        self.inner.virtual_memory_ref().unwrap().granularity()
    }
    fn reserve_range(
        &mut self,
        size: u64,
        alignment: u64,
    ) -> Result<cubepool::storage::StorageHandle, MappingError> {
        if size > self.max_range {
            return Err(MappingError::OutOfMemory { size });
        }
        self.inner
            .virtual_memory()
            .unwrap()
            .reserve_range(size, alignment)
    }
    fn free_range(&mut self, id: StorageId) {
        self.inner.virtual_memory().unwrap().free_range(id)
    }
    fn map(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        self.inner.virtual_memory().unwrap().map(id, offset, size)
    }
    fn unmap(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        self.inner.virtual_memory().unwrap().unmap(id, offset, size)
    }
    fn bytes_mapped(&self) -> u64 {
        self.inner.virtual_memory_ref().unwrap().bytes_mapped()
    }
    fn ranges_reserved(&self) -> u64 {
        self.inner.virtual_memory_ref().unwrap().ranges_reserved()
    }
}

#[cfg(not(feature = "exclusive-memory-only"))]
fn virtual_layout(granule: u64) -> MemoryConfiguration {
    MemoryConfiguration::Custom {
        pool_options: vec![MemoryPoolOptions {
            pool_type: PoolType::VirtualPages {
                granule,
                keep: Some(0),
                small: 0,
                range: 1 << 40,
            },
            dealloc_period: None,
        }],
    }
}

#[test]
// Virtual and sliced pools are unavailable in exclusive-memory-only builds.
#[cfg(not(feature = "exclusive-memory-only"))]
fn the_capacity_error_quotes_the_address_space_granted_not_the_range_asked_for() {
    let storage = LimitedAddressSpace {
        inner: VirtualStorage::new().with_granularity(2 * MIB),
        max_range: 600 * MIB,
    };
    let mut mm = MemoryManagement::from_configuration(
        storage,
        MemoryDeviceProperties::default(),
        virtual_layout(2 * MIB),
    )
    .expect("2 MiB granules suit a 2 MiB storage");
    let error = mm.reserve(900 * MIB).map(|_| ()).unwrap_err();
    // 1 TiB halves to 512 MiB, the largest half the storage grants.
    match error {
        PoolError::PoolCapacityExceeded { capacity, .. } => assert_eq!(capacity, 512 * MIB),
        other => panic!("expected a capacity error, got {other}"),
    }
    let text = error.to_string();
    assert!(text.contains("of 512.0 MiB in use"), "{text}");
    assert!(
        !text.contains("TiB") && !text.contains("1099511627776"),
        "{text}"
    );
}

#[test]
// Virtual and sliced pools are unavailable in exclusive-memory-only builds.
#[cfg(not(feature = "exclusive-memory-only"))]
fn a_granule_the_storage_cannot_map_is_refused_when_memory_management_is_built() {
    let storage = VirtualStorage::new().with_granularity(4096);
    let built = MemoryManagement::from_configuration(
        storage,
        MemoryDeviceProperties::default(),
        virtual_layout(64),
    );
    let error = built.map(|_| ()).unwrap_err();
    assert_eq!(error.kind(), "GranuleNotOfStorage");
    assert_eq!(error.field(), Some("granule"));
    assert!(
        error.to_string().contains("granule (64 B)") && error.to_string().contains("(4 KiB)"),
        "{error}"
    );
    // A granule the storage maps is taken, and so is the same layout installed later.
    let mut mm = MemoryManagement::from_configuration(
        VirtualStorage::new().with_granularity(4096),
        MemoryDeviceProperties::default(),
        virtual_layout(64 * 1024),
    )
    .expect("64 KiB granules suit 4 KiB mappings");
    assert!(mm.install_pools(virtual_layout(64)).is_err());
    assert!(mm.install_pools(virtual_layout(8 * 1024)).is_ok());
}

#[test]
// Virtual and sliced pools are unavailable in exclusive-memory-only builds.
#[cfg(not(feature = "exclusive-memory-only"))]
fn size_errors_speak_the_units_the_user_wrote() {
    let error = MemoryConfiguration::parse("sliced(page=8MiB, max_slice=16MiB)").unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("max_slice_size (16 MiB) is larger than page_size (8 MiB)"),
        "{text}"
    );
    let error =
        MemoryConfiguration::parse("sliced(page=1000KB, max_slice=1000KB, cap=512B)").unwrap_err();
    assert!(
        error
            .to_string()
            .contains("max_pool_size (512 B) is smaller than page_size (1 MB)"),
        "{error}"
    );
}

#[test]
// Virtual and sliced pools are unavailable in exclusive-memory-only builds.
#[cfg(not(feature = "exclusive-memory-only"))]
fn a_long_number_is_cut_short_in_the_message() {
    let digits = "9".repeat(100_000);
    let error =
        MemoryConfiguration::parse(&format!("sliced(page={digits}, max_slice=1MiB)")).unwrap_err();
    let text = error.to_string();
    assert!(text.len() < 300, "{} characters", text.len());
    assert!(text.contains("(100000 bytes)"), "{text}");
}

#[test]
fn an_unsupported_trace_version_is_named_plainly() {
    let text = "{\"format\":\"cubepool-trace\",\"version\":2}\n";
    let error = Trace::read(text.as_bytes()).unwrap_err().to_string();
    assert!(error.contains("unsupported trace version 2:"), "{error}");
    assert!(!error.contains("Some("), "{error}");
    let text = "{\"format\":\"cubepool-trace\"}\n";
    let error = Trace::read(text.as_bytes()).unwrap_err().to_string();
    assert!(error.contains("the header has no version"), "{error}");
}

fn small_trace() -> Trace {
    let text = "{\"format\":\"cubepool-trace\",\"version\":1,\"workload\":\"w\"}\n\
                {\"t\":1,\"op\":\"alloc\",\"id\":0,\"size\":64}\n\
                {\"t\":2,\"op\":\"free\",\"id\":0}\n";
    Trace::read(text.as_bytes()).unwrap()
}

/// This host's name as temporary files carry it (`.{name}.{pid}-{n}.{host}.tmp`): the
/// kernel's host name, every character but ASCII letters, digits, `-` and `_` made `_`.
#[cfg(target_os = "linux")]
fn host_tag() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let keep = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    name.trim_end_matches('\n')
        .chars()
        .map(|c| if keep(c) { c } else { '_' })
        .collect()
}

#[test]
#[cfg(target_os = "linux")]
fn a_save_removes_the_temporaries_killed_saves_left_and_no_others() {
    let folder = std::env::temp_dir().join(format!("cubepool-face-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let target = folder.join("out.jsonl");
    // A process that has ended: its pid names no process now.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let host = host_tag();
    let stale = folder.join(format!(".out.jsonl.{dead}-0.{host}.tmp"));
    let running = folder.join(format!(".out.jsonl.{}-99.{host}.tmp", std::process::id()));
    let other_target = folder.join(format!(".other.jsonl.{dead}-0.{host}.tmp"));
    // On a folder hosts share, a pid says nothing of another host's processes.
    let other_host = folder.join(format!(".out.jsonl.{dead}-1.{host}x.tmp"));
    // Written before temporaries named their host: whose it is cannot be told.
    let unnamed_host = folder.join(format!(".out.jsonl.{dead}-2.tmp"));
    for file in [&stale, &running, &other_target, &other_host, &unnamed_host] {
        std::fs::write(file, b"half a trace").unwrap();
    }
    small_trace().save(&target).unwrap();
    assert!(!stale.exists(), "a dead process's temporary is removed");
    assert!(running.exists(), "a running process's temporary is left");
    assert!(other_target.exists(), "another target's temporary is left");
    assert!(other_host.exists(), "another host's temporary is left");
    assert!(unnamed_host.exists(), "a temporary naming no host is left");
    assert_eq!(Trace::load(&target).unwrap(), small_trace());
    std::fs::remove_dir_all(&folder).unwrap();
}

#[test]
fn a_failed_save_names_the_target_and_leaves_no_temporary() {
    let folder = std::env::temp_dir().join(format!("cubepool-face-fail-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    // The target is a folder: the rename over it fails after the temporary is written.
    let target = folder.join("taken.jsonl");
    std::fs::create_dir_all(target.join("inside")).unwrap();
    let error = small_trace().save(&target).unwrap_err();
    assert!(matches!(error, TraceError::Io { .. }), "{error}");
    assert!(
        error.to_string().starts_with(&target.display().to_string()),
        "{error}"
    );
    let left: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("taken.jsonl")]);
    std::fs::remove_dir_all(&folder).unwrap();
}
