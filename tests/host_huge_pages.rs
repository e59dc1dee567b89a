//! Host buffers of a huge page or more are aligned to one and advised to use
//! transparent huge pages (Linux), as numpy's large arrays are.
#![cfg(target_os = "linux")]

use cubepool::storage::HUGE_PAGE_SIZE;
use cubepool::{ComputeStorage, HostStorage};

const MIB: u64 = 1 << 20;

/// The `VmFlags` of the mapping that holds `address`, from `/proc/self/smaps`.
fn vm_flags(address: u64) -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps is readable");
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                inside = (start..end).contains(&address);
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.split_whitespace().map(str::to_owned).collect();
            }
        }
    }
    panic!("no mapping with VmFlags holds {address:#x}");
}

/// Whether this kernel has transparent huge pages at all (without them `madvise`
/// refuses the advice, and buffers live on small pages).
fn kernel_has_transparent_huge_pages() -> bool {
    std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists()
}

#[test]
fn large_host_buffers_are_huge_page_aligned_and_advised_small_ones_are_not() {
    let mut storage = HostStorage::new();
    // The small buffer first: nothing advised yet in this process's heap or mappings.
    let small = storage.alloc(MIB, 64).expect("1 MiB");
    let large = storage.alloc(8 * MIB + 100, 64).expect("8 MiB");
    assert_eq!(
        small.address % 64,
        0,
        "a small buffer keeps the alignment asked for"
    );
    assert_eq!(
        large.address % HUGE_PAGE_SIZE,
        0,
        "a buffer of a huge page or more starts on a huge page"
    );
    if !kernel_has_transparent_huge_pages() {
        eprintln!("this kernel has no transparent huge pages: only the alignment is checked");
        return;
    }
    let large_flags = vm_flags(large.address);
    assert!(
        large_flags.iter().any(|flag| flag == "hg"),
        "the 8 MiB buffer's mapping is advised for huge pages (VmFlags {large_flags:?})"
    );
    let last_huge_page = large.address + 8 * MIB - 1;
    assert!(
        vm_flags(last_huge_page).iter().any(|flag| flag == "hg"),
        "the advice covers the buffer's last whole huge page"
    );
    let small_flags = vm_flags(small.address);
    assert!(
        !small_flags.iter().any(|flag| flag == "hg"),
        "a buffer under a huge page is not advised (VmFlags {small_flags:?})"
    );
    // The buffers are usable memory, advised or not.
    // SAFETY: both runs lie inside live buffers of `storage`, which nothing else uses.
    unsafe {
        std::ptr::write_bytes(large.address as *mut u8, 7, large.size as usize);
        std::ptr::write_bytes(small.address as *mut u8, 7, small.size as usize);
        assert_eq!(*((large.address + large.size - 1) as *const u8), 7);
    }
    storage.dealloc(large.id);
    storage.dealloc(small.id);
    assert_eq!(storage.bytes_allocated(), 0);
}

/// Every page a host storage makes reads as zeros, small (the allocator's, where the
/// process just freed bytes of its own) or of a huge page or more (a mapping of its
/// own); before, a small page showed what the process had freed there.
#[test]
fn new_host_buffers_read_as_zeros_whatever_the_process_freed() {
    let mut storage = HostStorage::new();
    for (size, alignment) in [
        (4096, 8),
        (4096, 64),
        (64 * 1024, 8),
        (3 * MIB, 64),
        (8 * MIB + 100, 8),
    ] {
        for _ in 0..4 {
            // Bytes the process frees just before: the allocator may hand them out next.
            drop(vec![0xAB_u8; size as usize]);
            let page = storage.alloc(size, alignment).expect("a page");
            // SAFETY (test): the page is `size` bytes of this storage's, live until
            // the dealloc below.
            let bytes =
                unsafe { std::slice::from_raw_parts(page.address as *const u8, size as usize) };
            assert!(
                bytes.iter().all(|&b| b == 0),
                "a {size}-byte page holds old bytes"
            );
            // SAFETY (test): as above; written before it is freed.
            unsafe { std::ptr::write_bytes(page.address as *mut u8, 0xCD, size as usize) };
            storage.dealloc(page.id);
        }
    }
    assert_eq!(storage.bytes_allocated(), 0);
}
