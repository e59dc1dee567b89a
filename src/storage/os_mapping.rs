//! The Linux calls behind [`HostStorage`](super::HostStorage)'s virtual memory and its
//! buffers of a huge page or more (each a range of its own, committed whole): the only
//! place that calls `mmap`, `mprotect`, `madvise` and `munmap`.
//!
//! A range is reserved with `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS)`: address
//! space only, no memory, and no commit charge (an inaccessible private mapping is not
//! charged). Committing a run makes it readable and writable (`mprotect`); its pages
//! take memory when first touched, and read as zeros until written. Decommitting a run
//! drops its pages (`madvise(MADV_DONTNEED)`), so resident memory falls at once and
//! the run reads as zeros when committed again.
//!
//! A decommitted run stays readable and writable. Making it inaccessible again
//! (`mprotect(PROT_NONE)`, as this did until stop 63) split the host's mapping of the
//! range at every decommit and merged it back at the next commit: two changes of the
//! process's memory map per map and unmap, 40 % of the virtual pool's steady state
//! (`examples/peer_loops.rs steady virtual`: 296.8-305.5 ns a step with it, 177.4-184.9
//! without, best of 3, the builds in turn; the kernel's share of the samples 35 % and
//! 9 %, `perf record -e cpu-clock`). [`HostStorage`](super::HostStorage) does not
//! commit again a run that is writable already (`writable_runs`). What that gives up:
//! - a stray access through a pointer into a decommitted run reads zeros (and a write
//!   takes a page back) instead of faulting. The pools hand out no such pointer: a run
//!   is decommitted only when no live reservation touches it, and every view of
//!   reserved bytes holds its reservation;
//! - the process's writable private memory (what `RLIMIT_DATA` bounds) is the runs
//!   ever committed, not those committed now, until the host refuses a commit: then
//!   `HostStorage` makes the decommitted runs inaccessible ([`withdraw`]) and tries
//!   once more, so a commit fails only where it failed before;
//! - with transparent huge pages set to `always` and granules under 2 MiB, the host
//!   may back a whole huge page across a decommitted run beside a committed one (the
//!   default 2 MiB granules, aligned to 2 MiB, are whole huge pages; not measured).
//!
//! The range is not `MAP_NORESERVE`, so that committing a run passes the host's
//! overcommit check, as `malloc`'s memory (and so `numpy.empty`'s) does: making a
//! private run writable charges it to the commit limit, and under the default
//! heuristic (`vm.overcommit_memory = 0`) a run larger than the host's memory and swap
//! is refused, where a `MAP_NORESERVE` range took any size and a write to more memory
//! than the host has ended the process (the out-of-memory killer), with no error to
//! catch. The charge of a committed run stays until the range is released (Linux takes
//! a charge back when the mapping goes), which the heuristic does not count; under
//! strict accounting (`vm.overcommit_memory = 2`, where Linux ignores `MAP_NORESERVE`
//! anyway) a range's charge is what of it was ever committed.
#![allow(unsafe_code)]

use std::ffi::c_void;

/// The size of a memory page of the host (4096 on most machines), asked of the host
/// once (every map and unmap of a [`HostStorage`](super::HostStorage) reads it).
pub(crate) fn page_size() -> u64 {
    static PAGE_SIZE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE_SIZE.get_or_init(|| {
        // SAFETY: sysconf only reads a system constant.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size)
            .ok()
            .filter(|&size| size > 0)
            .unwrap_or(4096)
    })
}

/// Reserves `size` bytes of address space aligned to `alignment` (a power of two,
/// at least a page), inaccessible and holding no memory; `None` when the host has no
/// such range. The caller frees it with [`release`].
pub(crate) fn reserve(size: u64, alignment: u64) -> Option<u64> {
    let alignment = alignment.max(page_size());
    let length = usize::try_from(size.checked_add(alignment)?).ok()?;
    // SAFETY: an anonymous mapping at an address the kernel chooses touches no
    // existing memory; the result is checked before use.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let base = base as u64;
    let Some(start) = base.checked_next_multiple_of(alignment) else {
        // Past the top of the address space (not seen: the mapping holds an aligned
        // start): the mapping goes back rather than stay reserved for nothing.
        // SAFETY: the whole mapping just made, used by nothing.
        unsafe { libc::munmap(base as *mut c_void, length) };
        return None;
    };
    let (head, tail) = (start - base, base + length as u64 - (start + size));
    // Give back the slack before and after the aligned range. A failure leaves the
    // slack reserved (address space only), which is harmless.
    // SAFETY: both pieces lie inside the mapping just made, outside the range kept.
    unsafe {
        if head > 0 {
            libc::munmap(base as *mut c_void, head as usize);
        }
        if tail > 0 {
            libc::munmap((start + size) as *mut c_void, tail as usize);
        }
    }
    Some(start)
}

/// Makes `size` bytes at `address` readable and writable; false when the host
/// refuses (out of memory).
///
/// # Safety
/// The run lies inside a range made by [`reserve`] and not yet released.
pub(crate) unsafe fn commit(address: u64, size: u64) -> bool {
    // SAFETY: the caller guarantees the run is inside a live reserved range, which
    // no Rust object owns, so changing its protection invalidates no reference.
    unsafe {
        libc::mprotect(
            address as *mut c_void,
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
        ) == 0
    }
}

/// Drops the pages of `size` bytes at `address`: resident memory falls, and the run
/// reads as zeros. It stays readable and writable (see the module doc).
///
/// # Safety
/// The run lies inside a range made by [`reserve`] and not yet released, and
/// nothing reads or writes it any more (its contents are lost).
pub(crate) unsafe fn decommit(address: u64, size: u64) {
    // SAFETY: the caller guarantees the run is inside a live reserved range and that
    // no one uses its bytes; the call only drops that run's pages.
    unsafe {
        libc::madvise(address as *mut c_void, size as usize, libc::MADV_DONTNEED);
    }
}

/// Makes `size` bytes at `address`, decommitted, inaccessible: the host counts them as
/// writable memory (`RLIMIT_DATA`) no more, and takes back the commit charge of pages
/// never touched. A failure leaves them as they were (accessible), which loses nothing.
///
/// # Safety
/// The run lies inside a range made by [`reserve`] and not yet released, decommitted,
/// and nothing reads or writes it.
pub(crate) unsafe fn withdraw(address: u64, size: u64) {
    // SAFETY: the caller guarantees the run is inside a live reserved range that no one
    // uses; the call only changes that run's protection.
    unsafe {
        libc::mprotect(address as *mut c_void, size as usize, libc::PROT_NONE);
    }
}

/// Advises the host to back `size` bytes at `address` with transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`), as numpy does for its large arrays: fewer TLB misses
/// when the buffer is streamed through. True when the host took the advice; false
/// where it has no transparent huge pages (the buffer works the same, on small pages).
///
/// # Safety
/// The run is page-aligned and lies inside one live allocation of the caller; the
/// advice changes no byte of it, only how the host backs its pages.
pub(crate) unsafe fn advise_huge_pages(address: u64, size: u64) -> bool {
    // SAFETY: the caller guarantees the run is inside a live allocation; MADV_HUGEPAGE
    // only sets a flag on its mapping.
    unsafe { libc::madvise(address as *mut c_void, size as usize, libc::MADV_HUGEPAGE) == 0 }
}

/// Gives a range made by [`reserve`] back to the host.
///
/// # Safety
/// The range (`address`, `size` as reserved) is live and nothing uses its bytes;
/// it is released once.
pub(crate) unsafe fn release(address: u64, size: u64) {
    // SAFETY: the caller guarantees the range is a live reservation that no one
    // uses, released exactly once.
    unsafe {
        libc::munmap(address as *mut c_void, size as usize);
    }
}
