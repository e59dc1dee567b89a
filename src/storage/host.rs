//! Host memory from the global allocator, and (on Linux) virtual memory: address
//! ranges reserved with `mmap` and committed run by run (see `os_mapping`).
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;

#[cfg(target_os = "linux")]
use super::os_mapping;
use super::virtual_memory::MappedRuns;
#[cfg(target_os = "linux")]
use super::virtual_memory::{MappingError, VirtualMemory};
use super::writable_runs::WritableRuns;
use super::{ComputeStorage, StorageHandle, StorageId};
use crate::error::PoolError;

/// One live allocation of a [`HostStorage`]: a page, zeroed when made, freed by its id
/// through [`ComputeStorage::dealloc`] (or with the storage).
///
/// Not the tensor module's [`HostBuffer`](crate::tensor::HostBuffer), which frees
/// itself on drop and is owned by one tensor: two ideas, kept apart on purpose (a page
/// is freed by id, not on drop).
struct HostAllocation {
    ptr: NonNull<u8>,
    /// The allocator's layout, or, for a mapping of its own, its length (whole host
    /// pages) and alignment.
    layout: Layout,
    /// The size the caller asked for (the layout holds at least one byte).
    size: u64,
    /// Whether it is a mapping of its own (`os_mapping`, Linux: a huge page or more)
    /// rather than the global allocator's.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    mapped: bool,
}

impl HostAllocation {
    /// Gives the allocation back to where it came from.
    ///
    /// # Safety
    /// Called once per allocation, when nothing uses its bytes any more.
    unsafe fn free(self) {
        #[cfg(target_os = "linux")]
        if self.mapped {
            // SAFETY: the mapping was made by `os_mapping::reserve` with this length,
            // and is released once (the caller's contract).
            unsafe { os_mapping::release(self.ptr.as_ptr() as u64, self.layout.size() as u64) };
            return;
        }
        // SAFETY: the buffer came from the global allocator with this layout, and is
        // freed once (the caller's contract).
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: a HostAllocation is a uniquely owned heap allocation; nothing in it is tied to
// the thread that made it.
unsafe impl Send for HostAllocation {}

/// Buffers of at least this many bytes (the size of a huge page on x86-64 and
/// aarch64) are aligned to it and, on Linux, advised to live on transparent huge pages.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;

/// Real host memory, allocated with the alignment each page asks for (the device
/// properties' alignment, 64 by default), and zeroed: a page never shows what the
/// process freed before (a buffer of [`HUGE_PAGE_SIZE`] or more, on Linux, is a mapping
/// of its own, whose pages read as zeros and take memory when first touched; a smaller
/// one comes zero-filled from the global allocator).
///
/// On Linux a buffer of [`HUGE_PAGE_SIZE`] or more is aligned to a huge page and
/// advised to use transparent huge pages (`madvise(MADV_HUGEPAGE)`), like numpy's large
/// arrays: with `transparent_hugepage` set to `madvise` (a common default), small pages
/// would cost a large buffer streamed through by a collective or a copy a TLB miss per
/// 4 KiB, and it would run measurably slower than the same work on numpy arrays.
///
/// Buffers live until [`ComputeStorage::dealloc`] or until the storage is dropped;
/// their addresses never move.
///
/// On Linux it also has virtual memory ([`super::VirtualMemory`]): address ranges
/// reserved without memory, where mapped runs take resident memory as they are
/// touched and give it back when unmapped. Its granularity is the host page (4 KiB).
/// An unmapped run stays readable and writable (it reads as zeros), so that mapping
/// it again needs no call to the host, until the host refuses a map for want of
/// memory: then such runs are made inaccessible, which the host counts as writable
/// memory no more, and the map is tried once more.
#[derive(Default)]
pub struct HostStorage {
    /// Invariant: every entry is a live allocation made with its layout.
    buffers: HashMap<StorageId, HostAllocation>,
    /// Every live address range (a storage holds a few, so they are found by a
    /// scan). Invariant: each was made by `os_mapping::reserve` with the size `runs`
    /// holds for it, and is released once.
    ranges: Vec<HostRange>,
    /// The address ranges' sizes and mapped runs.
    runs: MappedRuns,
    next_id: u64,
    bytes: u64,
    allocations: u64,
    deallocations: u64,
}

impl HostStorage {
    /// An empty storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index in `ranges` of live range `id`.
    #[cfg(target_os = "linux")]
    fn range_index(&self, id: StorageId) -> Result<usize, MappingError> {
        self.ranges
            .iter()
            .position(|range| range.id == id)
            .ok_or(MappingError::UnknownRange { id: id.0 })
    }
}

#[cfg(target_os = "linux")]
impl HostStorage {
    /// Makes the runs of range `ranges[index]` that are writable but mapped no more
    /// inaccessible, after the host refused a commit: the host counts them as the
    /// process's writable memory (`RLIMIT_DATA`) until then (see `os_mapping`). Returns
    /// whether there were any (whether a second try can differ).
    fn withdraw_unmapped(&mut self, index: usize) -> bool {
        let range = &mut self.ranges[index];
        let gaps = range.writable.keep_mapped(self.runs.runs_of(range.id));
        for &(start, end) in &gaps {
            // SAFETY: the gap lies inside the live range (it was committed there) and
            // holds no mapped run, so no reservation uses it; its pages were dropped
            // when it was unmapped.
            unsafe { os_mapping::withdraw(range.address + start, end - start) };
        }
        !gaps.is_empty()
    }
}

/// One address range of a [`HostStorage`].
#[derive(Debug)]
struct HostRange {
    id: StorageId,
    /// Its base address.
    address: u64,
    /// Its runs that are readable and writable: committed once, and not made
    /// inaccessible by an unmap. Invariant: it holds every mapped run.
    writable: WritableRuns,
}

/// A zero-filled buffer of `size` bytes from the global allocator (`layout`: at least one
/// byte); `None` when it has no memory.
fn heap_buffer(size: u64, layout: Layout) -> Option<HostAllocation> {
    // SAFETY: the layout has a non-zero size (at least one byte is asked for).
    let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
    Some(HostAllocation {
        ptr,
        layout,
        size,
        mapped: false,
    })
}

/// A buffer of `size` bytes (a huge page or more) in a mapping of its own, aligned to
/// `layout`'s alignment and advised to use transparent huge pages: its pages read as
/// zeros and take memory when first touched, and freeing it gives the memory straight
/// back to the host. `None` when the host refuses the memory (its overcommit check).
#[cfg(target_os = "linux")]
fn map_buffer(size: u64, layout: Layout) -> Option<HostAllocation> {
    let length = size.checked_next_multiple_of(os_mapping::page_size())?;
    let layout = Layout::from_size_align(usize::try_from(length).ok()?, layout.align()).ok()?;
    let address = os_mapping::reserve(length, layout.align() as u64)?;
    // SAFETY: the run is the range just reserved, which nothing else knows of.
    if !unsafe { os_mapping::commit(address, length) } {
        // SAFETY: as above; the range is released once, here.
        unsafe { os_mapping::release(address, length) };
        return None;
    }
    // The whole huge pages of the buffer; a host without transparent huge pages refuses
    // the advice, and the buffer lives on small pages.
    // SAFETY: the run starts at the buffer (aligned to a huge page, so to a page) and
    // ends inside it.
    unsafe { os_mapping::advise_huge_pages(address, size - size % HUGE_PAGE_SIZE) };
    Some(HostAllocation {
        ptr: NonNull::new(address as *mut u8)?,
        layout,
        size,
        mapped: true,
    })
}

impl ComputeStorage for HostStorage {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        let alignment = super::checked_alignment(alignment)?;
        let oom = PoolError::OutOfMemory { size };
        let huge = cfg!(target_os = "linux") && size >= HUGE_PAGE_SIZE;
        let alignment = if huge {
            alignment.max(HUGE_PAGE_SIZE)
        } else {
            alignment
        };
        let align = usize::try_from(alignment.max(1)).map_err(|_| oom.clone())?;
        let bytes = usize::try_from(size.max(1)).map_err(|_| oom.clone())?;
        let layout = Layout::from_size_align(bytes, align).map_err(|_| oom.clone())?;
        #[cfg(target_os = "linux")]
        let buffer = if huge {
            map_buffer(size, layout).ok_or(oom)?
        } else {
            heap_buffer(size, layout).ok_or(oom)?
        };
        #[cfg(not(target_os = "linux"))]
        let buffer = heap_buffer(size, layout).ok_or(oom)?;
        let ptr = buffer.ptr;
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.buffers.insert(id, buffer);
        self.bytes += size;
        self.allocations += 1;
        Ok(StorageHandle {
            id,
            address: ptr.as_ptr() as u64,
            size,
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(buffer) = self.buffers.remove(&id) {
            self.bytes -= buffer.size;
            self.deallocations += 1;
            // SAFETY: the buffer was made by `alloc` and is removed from the map, so it
            // is freed exactly once; the pool frees a page no reservation uses.
            unsafe { buffer.free() };
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.bytes
    }

    fn allocations(&self) -> u64 {
        self.allocations
    }

    fn deallocations(&self) -> u64 {
        self.deallocations
    }

    #[cfg(target_os = "linux")]
    fn virtual_memory(&mut self) -> Option<&mut dyn super::VirtualMemory> {
        Some(self)
    }

    #[cfg(target_os = "linux")]
    fn virtual_memory_ref(&self) -> Option<&dyn super::VirtualMemory> {
        Some(self)
    }
}

#[cfg(target_os = "linux")]
impl VirtualMemory for HostStorage {
    fn granularity(&self) -> u64 {
        os_mapping::page_size()
    }

    fn reserve_range(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, MappingError> {
        if !alignment.is_power_of_two() {
            return Err(MappingError::BadAlignment { alignment });
        }
        let oom = MappingError::OutOfMemory { size };
        let size = size
            .max(1)
            .checked_next_multiple_of(self.granularity())
            .ok_or(oom.clone())?;
        let address = os_mapping::reserve(size, alignment).ok_or(oom)?;
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.ranges.push(HostRange {
            id,
            address,
            writable: WritableRuns::default(),
        });
        self.runs.add_range(id, size);
        Ok(StorageHandle { id, address, size })
    }

    fn free_range(&mut self, id: StorageId) {
        let Some(position) = self.ranges.iter().position(|range| range.id == id) else {
            return;
        };
        let address = self.ranges.swap_remove(position).address;
        if let Some((size, runs)) = self.runs.remove_range(id) {
            for (_, run) in runs {
                self.bytes -= run;
                self.deallocations += 1;
            }
            // SAFETY: the range was reserved with this size and is removed from
            // `ranges`, so it is released once; the pool that unmaps or frees a range
            // holds no live reservation in it.
            unsafe { os_mapping::release(address, size) };
        }
    }

    fn map(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        let granularity = self.granularity();
        let index = self.range_index(id)?;
        // Checked and recorded with one search of the range's runs, and taken back if
        // the host refuses the memory.
        self.runs.map_run(id, offset, size, granularity)?;
        let range = &mut self.ranges[index];
        // `map_run` found the run inside the range, so its end is no overflow.
        let (base, end) = (range.address, offset + size);
        // A run unmapped before is writable still: asking again would change nothing.
        if !range.writable.cover(offset, end) {
            // SAFETY: `map_run` found the run inside the live range `id`, based at
            // `base`.
            let committed = unsafe { os_mapping::commit(base + offset, size) }
                || self.withdraw_unmapped(index) && {
                    // SAFETY: as above.
                    unsafe { os_mapping::commit(base + offset, size) }
                };
            if !committed {
                // SAFETY: as above; the refused run holds nothing (a refusal part way
                // may leave some of its pages writable), so dropping its pages loses
                // no byte.
                unsafe { os_mapping::decommit(base + offset, size) };
                self.runs.unrecord_map(id, offset);
                return Err(MappingError::OutOfMemory { size });
            }
            self.ranges[index].writable.add(offset, end);
        }
        self.bytes += size;
        self.allocations += 1;
        Ok(())
    }

    fn unmap(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        let base = self.ranges[self.range_index(id)?].address;
        self.runs.unmap_run(id, offset, size)?;
        // SAFETY: `unmap_run` found the run mapped inside the live range `id`, based at
        // `base`; the caller unmaps only runs that hold no live reservation.
        unsafe { os_mapping::decommit(base + offset, size) };
        self.bytes -= size;
        self.deallocations += 1;
        Ok(())
    }

    fn bytes_mapped(&self) -> u64 {
        self.runs.bytes()
    }

    fn ranges_reserved(&self) -> u64 {
        self.runs.reserved
    }
}

impl Drop for HostStorage {
    fn drop(&mut self) {
        for (_, buffer) in self.buffers.drain() {
            // SAFETY: each buffer is freed once, here, as the storage goes.
            unsafe { buffer.free() };
        }
        #[cfg(target_os = "linux")]
        for HostRange { id, address, .. } in std::mem::take(&mut self.ranges) {
            if let Some((size, _)) = self.runs.remove_range(id) {
                // SAFETY: each live range is released once, here, as the storage goes.
                unsafe { os_mapping::release(address, size) };
            }
        }
    }
}
