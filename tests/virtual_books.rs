//! The virtual pool's books of granules (an entry per granule, in host memory) grow
//! only over granules the storage has mapped: a request the storage refuses costs
//! no host memory in proportion to its size. Its books grew to the request's end
//! granule before the storage was asked: a 1 TiB request in 4 KiB granules filled
//! 2 GiB of entries and then failed, and tens of TiB took hundreds of GiB, enough
//! for the kernel to kill the process.
//!
//! The test binary's allocator refuses (and remembers) every allocation past
//! [`CAP`] bytes, so the test measures the host memory a refused request asks for
//! without ever committing it: the books' growth, were it back, would fail there
//! (out of memory, quickly) and be seen.
#![allow(unsafe_code)]
#![cfg(not(feature = "exclusive-memory-only"))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use cubepool::config::{MemoryPoolOptions, PoolType};
use cubepool::{
    MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, PoolError, VirtualStorage,
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const TIB: u64 = 1 << 40;

/// The largest allocation the test's allocator grants: far above what the test's
/// own calls need, far below the books of the refused request (2 GiB).
const CAP: usize = 64 << 20;

/// The largest allocation asked for since the test last reset it.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The system's allocator, refusing any allocation past [`CAP`] bytes.
struct Capped;

impl Capped {
    /// Whether an allocation of `size` bytes is granted; remembers the largest asked.
    fn grants(size: usize) -> bool {
        LARGEST.fetch_max(size, Ordering::Relaxed);
        size <= CAP
    }
}

// SAFETY: every call is passed to `System` unchanged, or refused with a null pointer
// (as `GlobalAlloc` allows for any allocation the allocator cannot make).
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::grants(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `layout`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::grants(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `layout`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Self::grants(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `ptr`, `layout` and `new_size`, passed on;
        // `ptr` came from `System` (every grant above is `System`'s).
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout` (every grant above is its).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;

/// A virtual pool of 4 KiB granules over 1 TiB of address space: 2^28 granules.
fn small_granules_over_a_huge_range() -> MemoryConfiguration {
    MemoryConfiguration::Custom {
        pool_options: vec![MemoryPoolOptions {
            pool_type: PoolType::VirtualPages {
                granule: 4 * KIB,
                keep: Some(0),
                small: 0,
                range: TIB,
            },
            dealloc_period: None,
        }],
    }
}

#[test]
fn a_request_the_storage_refuses_costs_no_books_in_proportion_to_its_size() {
    let storage = VirtualStorage::with_limit(MIB).with_granularity(4 * KIB);
    let mut memory = MemoryManagement::from_configuration(
        storage,
        MemoryDeviceProperties::default(),
        small_granules_over_a_huge_range(),
    )
    .expect("4 KiB granules suit a 4 KiB storage");
    let kept = memory.reserve(64 * KIB).expect("64 KiB fit in 1 MiB");
    let kept_at = memory.resource(&kept).expect("live");
    let before = memory.memory_usage();

    LARGEST.store(0, Ordering::Relaxed);
    let refused = memory.reserve(TIB - MIB).map(|_| ());
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        matches!(refused, Err(PoolError::OutOfMemory { .. })),
        "{refused:?}"
    );
    assert!(
        largest <= CAP,
        "the refused request asked the host for {largest} bytes at once"
    );
    assert_eq!(
        memory.memory_usage(),
        before,
        "the refusal changed the books"
    );
    assert_eq!(memory.resource(&kept), Ok(kept_at), "the kept block moved");
    memory.check_invariants().unwrap();

    // What fits still does, beside what was kept.
    let fits = memory
        .reserve(512 * KIB)
        .expect("512 KiB more fit in 1 MiB");
    assert_eq!(memory.memory_usage().bytes_in_use, 576 * KIB);
    memory.check_invariants().unwrap();
    drop((kept, fits));
    memory.cleanup(true);
    assert_eq!(memory.memory_usage().bytes_reserved, 0);
    memory.check_invariants().unwrap();
}
