//! cubepool as PyTorch's allocator, on host storage with fake streams: addresses,
//! stream-safe reuse, traces, and every error path (the CUDA storage is the only part
//! these tests cannot reach; `scripts/gpu-check` runs it on a GPU).

use cubepool::storage::cuda::{probe_driver, CudaError, CudaStorage};
use cubepool::torch_alloc::{
    cubepool_torch_alloc, cubepool_torch_free, error_counts, install, last_error, AllocError,
    DeviceAllocator, HostEvents, ManualEvents, StreamAllocator,
};
use cubepool::{
    HostStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, PoolError,
};

const MIB: i64 = 1 << 20;

fn allocator<E: cubepool::torch_alloc::StreamEvents>(events: E) -> StreamAllocator<HostStorage, E> {
    let memory = MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties {
            alignment: 512,
            ..MemoryDeviceProperties::default()
        },
        MemoryConfiguration::default(),
    )
    .expect("the default layout builds on host storage");
    StreamAllocator::new(memory, events, 0)
}

#[test]
fn blocks_are_distinct_aligned_and_reused() {
    let mut a = allocator(HostEvents);
    let x = a.alloc(MIB, 0, 0).unwrap();
    let y = a.alloc(3 * MIB, 0, 0).unwrap();
    assert_ne!(x, 0);
    assert_ne!(x, y);
    assert_eq!(x % 512, 0);
    assert!(
        y >= x + MIB as u64 || x >= y + 3 * MIB as u64,
        "blocks overlap"
    );
    a.free(x, MIB, 0, 0).unwrap();
    let z = a.alloc(MIB, 0, 0).unwrap();
    assert_eq!(z, x, "a freed block is handed out again on its stream");
    assert_eq!(a.live(), 2);
    let stats = a.memory_stats().to_flat();
    let current = stats
        .iter()
        .find(|(k, _)| k == "allocated_bytes.all.current")
        .map(|(_, v)| *v);
    assert_eq!(current, Some(4 * MIB as u64));
    // Zero bytes: NULL, and freeing NULL does nothing.
    assert_eq!(a.alloc(0, 0, 0).unwrap(), 0);
    a.free(0, 0, 0, 0).unwrap();
}

#[test]
fn a_free_is_ordered_after_the_allocation_streams_work_whatever_stream_it_names() {
    // Allocated for stream 5, freed naming stream 7: the event goes on stream 5, so
    // stream 7 taking the same bytes waits for it (an event on stream 7 made that
    // stream's reuse look safe while stream 5's work could still read the bytes).
    let mut a = allocator(ManualEvents::default());
    let x = a.alloc(MIB, 0, 5).unwrap();
    a.free(x, MIB, 0, 7).unwrap();
    let again = a.alloc(MIB, 0, 7).unwrap();
    assert_eq!(again, x);
    assert_eq!(
        a.stream_counts(),
        (0, 1),
        "stream 7 waited for stream 5's free"
    );
}

#[test]
fn another_stream_waits_for_the_freeing_streams_work() {
    let mut a = allocator(ManualEvents::default());
    let x = a.alloc(MIB, 0, 7).unwrap();
    a.free(x, MIB, 0, 7).unwrap();
    // Same stream: no wait.
    let again = a.alloc(MIB, 0, 7).unwrap();
    assert_eq!(again, x);
    assert_eq!(a.stream_counts(), (1, 0));
    a.free(again, MIB, 0, 7).unwrap();
    // Another stream gets the same bytes only after waiting for stream 7's latest free.
    let other = a.alloc(MIB, 0, 9).unwrap();
    assert_eq!(other, x);
    assert_eq!(a.stream_counts(), (0, 1));
}

#[test]
fn every_error_path_is_typed() {
    let mut a = allocator(HostEvents);
    assert_eq!(
        a.alloc(MIB, 1, 0),
        Err(AllocError::WrongDevice {
            device: 1,
            serves: 0
        })
    );
    assert_eq!(a.alloc(-1, 0, 0), Err(AllocError::BadSize { size: -1 }));
    assert_eq!(
        a.free(0x1000, 64, 0, 0),
        Err(AllocError::UnknownPointer { ptr: 0x1000 })
    );
    let x = a.alloc(MIB, 0, 0).unwrap();
    assert_eq!(
        a.free(x, 2 * MIB, 0, 0),
        Err(AllocError::SizeMismatch {
            ptr: x,
            size: 2 * MIB as u64,
            allocated: MIB as u64
        })
    );
    a.free(x, MIB, 0, 0).unwrap();
    assert_eq!(a.free(x, MIB, 0, 0), Err(AllocError::DoubleFree { ptr: x }));
    // More than any pool or the host can give.
    let huge = a.alloc(i64::MAX, 0, 0);
    assert!(
        matches!(
            huge,
            Err(AllocError::Pool(
                PoolError::OutOfMemory { .. } | PoolError::BufferTooBig { .. }
            ))
        ),
        "{huge:?}"
    );
    // A free whose event cannot be recorded keeps the block out of the pools.
    let mut events = ManualEvents::default();
    events.failing = Some(5);
    let mut b = allocator(events);
    let y = b.alloc(MIB, 0, 5).unwrap();
    assert!(matches!(
        b.free(y, MIB, 0, 5),
        Err(AllocError::Event { stream: 5, .. })
    ));
    assert_ne!(b.alloc(MIB, 0, 5).unwrap(), y);
}

#[test]
fn a_recorded_trace_holds_the_run_from_its_start() {
    let mut a = allocator(HostEvents);
    let before = a.alloc(MIB, 0, 0).unwrap();
    assert!(a.start_trace("unit"));
    assert!(
        !a.start_trace("nested"),
        "recordings do not nest: the first goes on"
    );
    let x = a.alloc(2 * MIB, 0, 0).unwrap();
    a.free(before, MIB, 0, 0).unwrap();
    let y = a.alloc(MIB, 0, 0).unwrap();
    a.free(x, 2 * MIB, 0, 0).unwrap();
    let trace = a.stop_trace().expect("recording").expect("a valid trace");
    assert_eq!(
        trace.len(),
        3,
        "two allocations and one free; the earlier block is not in it"
    );
    assert_eq!(trace.peak_live(), 3 * MIB as u64);
    assert_eq!(trace.header().workload, "unit");
    assert!(a.stop_trace().is_none());
    a.free(y, MIB, 0, 0).unwrap();
}

#[test]
fn the_c_entry_points_serve_the_installed_allocator() {
    // The only test of the process-wide allocator (tests run in parallel).
    let stream = std::ptr::null_mut();
    assert!(cubepool_torch_alloc(MIB as isize, 0, stream).is_null());
    assert!(last_error().unwrap().contains("not configured"));
    install(Box::new(allocator(HostEvents))).unwrap();
    let p = cubepool_torch_alloc(MIB as isize, 0, stream);
    assert!(!p.is_null());
    // The bytes are real host memory here.
    // SAFETY: `p` points at MIB bytes just allocated.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xab, MIB as usize) };
    // Reinstalling while a block is live is refused.
    assert_eq!(install(Box::new(allocator(HostEvents))).err(), Some(1));
    cubepool_torch_free(p, MIB as isize, 0, stream);
    cubepool_torch_free(p, MIB as isize, 0, stream);
    assert!(last_error().unwrap().contains("double free"));
    assert!(cubepool_torch_alloc(MIB as isize, 3, stream).is_null());
    assert!(last_error().unwrap().contains("device 3"));
    let mut counts = error_counts();
    counts.sort();
    assert_eq!(counts, vec![("double_free", 1), ("wrong_device", 1)]);
    install(Box::new(allocator(HostEvents))).unwrap();
    assert!(error_counts().is_empty());
}

#[test]
fn a_missing_driver_is_a_typed_error() {
    match probe_driver("/nonexistent/libcuda.so.1") {
        Err(CudaError::DriverNotFound { library, .. }) => {
            assert_eq!(library, "/nonexistent/libcuda.so.1")
        }
        other => panic!("expected DriverNotFound, got {other:?}"),
    }
    // A library that is not the driver lacks its entry points.
    match probe_driver("libc.so.6") {
        Err(CudaError::MissingSymbol { symbol, .. }) => assert_eq!(symbol, "cuInit"),
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
    // This machine's own driver, if any: a storage or a typed error, never a panic.
    match CudaStorage::new(0) {
        Ok(storage) => assert_eq!(storage.ordinal(), 0),
        Err(error) => assert!(!error.to_string().is_empty()),
    }
    assert!(matches!(
        CudaStorage::new(-1),
        Err(CudaError::NoDevice { .. } | CudaError::DriverNotFound { .. })
    ));
}

/// A storage whose every buffer is at one address (`address`): buffers with no
/// addresses of their own.
#[derive(Default)]
struct OneAddress {
    address: u64,
    next_id: u64,
    live: std::collections::HashMap<u64, u64>,
    allocations: u64,
    deallocations: u64,
}

impl cubepool::storage::ComputeStorage for OneAddress {
    fn alloc(
        &mut self,
        size: u64,
        _alignment: u64,
    ) -> Result<cubepool::storage::StorageHandle, PoolError> {
        self.next_id += 1;
        self.live.insert(self.next_id, size);
        self.allocations += 1;
        Ok(cubepool::storage::StorageHandle {
            id: cubepool::storage::StorageId(self.next_id),
            address: self.address,
            size,
        })
    }

    fn dealloc(&mut self, id: cubepool::storage::StorageId) {
        if self.live.remove(&id.0).is_some() {
            self.deallocations += 1;
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.live.values().sum()
    }

    fn allocations(&self) -> u64 {
        self.allocations
    }

    fn deallocations(&self) -> u64 {
        self.deallocations
    }
}

#[test]
fn a_block_at_address_0_or_at_a_live_address_is_refused_and_given_back() {
    // The live blocks were kept by address: a second block at the same address took
    // the first one's place, which freed the first under its user; a block at 0 was
    // NULL to PyTorch.
    for address in [0, 1 << 20] {
        let memory = MemoryManagement::from_configuration(
            OneAddress {
                address,
                ..OneAddress::default()
            },
            MemoryDeviceProperties::default(),
            MemoryConfiguration::ExclusivePages,
        )
        .unwrap();
        let mut a = StreamAllocator::new(memory, HostEvents, 0);
        let mut served = Vec::new();
        for _ in 0..2 {
            match a.alloc(1000, 0, 1) {
                Ok(ptr) => served.push(ptr),
                Err(error) => assert_eq!(
                    error,
                    AllocError::AddressTaken {
                        address,
                        size: 1000
                    }
                ),
            }
        }
        // At 0 nothing is served; otherwise the first block only, still live; the
        // refused ones were given back.
        assert_eq!(served.len(), usize::from(address != 0), "{served:?}");
        assert_eq!(a.live(), served.len());
        let stats = a.memory_stats().to_flat();
        let current = stats
            .iter()
            .find(|(k, _)| k == "allocation.all.current")
            .map(|(_, v)| *v);
        assert_eq!(current, Some(served.len() as u64));
        for ptr in served {
            a.free(ptr, 1000, 0, 1).unwrap();
        }
        assert_eq!(a.live(), 0);
    }
}
