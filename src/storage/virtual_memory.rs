//! Storages with virtual memory: an address range reserved without memory, and
//! physical memory mapped into it and unmapped again, granule by granule.
//!
//! The interface is documented on [`VirtualMemory`], with the CUDA driver calls
//! behind each method.

use thiserror::Error;

use super::run_map::RunMap;
use super::{StorageHandle, StorageId};

/// Why a call of [`VirtualMemory`] did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MappingError {
    /// The device (or the host) has no memory (or address space) for the request.
    #[error("out of memory: could not map or reserve {size} bytes")]
    OutOfMemory {
        /// The bytes asked for.
        size: u64,
    },
    /// The id names no address range of this storage.
    #[error("no address range {id} in this storage")]
    UnknownRange {
        /// The id given.
        id: u64,
    },
    /// An offset or size that is not a positive multiple of the granularity, or that
    /// reaches past the end of the range.
    #[error(
        "bad run: offset {offset} and size {size} must be multiples of the granularity \
         {granularity}, the size positive, and the run inside the range"
    )]
    BadRun {
        /// The offset given.
        offset: u64,
        /// The size given.
        size: u64,
        /// The storage's granularity.
        granularity: u64,
    },
    /// A map over bytes already mapped.
    #[error("offset {offset} of the range is already mapped")]
    AlreadyMapped {
        /// The offset of the run asked for.
        offset: u64,
    },
    /// An unmap that names no run mapped by one map call.
    #[error("no run of {size} bytes is mapped at offset {offset} (unmap whole runs only)")]
    NotMapped {
        /// The offset given.
        offset: u64,
        /// The size given.
        size: u64,
    },
    /// An alignment that is not a power of two.
    #[error("alignment must be a power of two, got {alignment}")]
    BadAlignment {
        /// The alignment given.
        alignment: u64,
    },
    /// The device refused a call for a reason other than memory (a CUDA driver error).
    #[error("device error: {reason}")]
    Device {
        /// The failed call and the driver's error.
        reason: String,
    },
}

/// A storage that reserves address ranges without memory and maps physical memory
/// into them in runs of granules.
///
/// This is the interface of CUDA's virtual memory management (the driver API's
/// `cuMem*` calls); [`CudaStorage`](super::cuda::CudaStorage) implements it call by call
/// (on Linux):
///
/// | [`VirtualMemory`] method | CUDA driver API |
/// |---|---|
/// | [`granularity`](VirtualMemory::granularity) | `cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)` with `prop.type = CU_MEM_ALLOCATION_TYPE_PINNED`, `prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device}` (2 MiB on current GPUs) |
/// | [`reserve_range`](VirtualMemory::reserve_range) | `cuMemAddressReserve(&ptr, size, alignment, 0, 0)`: address space only, no memory |
/// | [`map`](VirtualMemory::map) | `cuMemCreate(&handle, size, &prop, 0)` (the physical memory, one allocation for the whole run), `cuMemMap(ptr + offset, size, 0, handle, 0)`, `cuMemSetAccess(ptr + offset, size, &{location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}, 1)`; the storage keeps `handle` under `(range, offset)` |
/// | [`unmap`](VirtualMemory::unmap) | `cuMemUnmap(ptr + offset, size)`, then `cuMemRelease(handle)` (the memory goes back to the device) |
/// | [`free_range`](VirtualMemory::free_range) | `cuMemUnmap` + `cuMemRelease` of every run still mapped, then `cuMemAddressFree(ptr, size)` |
///
/// CUDA unmaps only whole mappings (`cuMemUnmap` takes the whole range one
/// `cuMemMap` mapped) and maps an allocation from its start (`cuMemMap`'s offset
/// must be 0), so the interface has the same rule: [`VirtualMemory::unmap`] names
/// exactly a run that one [`VirtualMemory::map`] mapped. A run is one physical
/// allocation: one map call, one unmap call, whatever its number of granules.
/// `cuMemCreate` fails with `CUDA_ERROR_OUT_OF_MEMORY` when the device is full, which
/// is [`MappingError::OutOfMemory`] here.
///
/// Every storage with virtual memory counts mapped bytes in
/// [`ComputeStorage::bytes_allocated`](super::ComputeStorage::bytes_allocated), each
/// map in [`ComputeStorage::allocations`](super::ComputeStorage::allocations) and
/// each unmap in [`ComputeStorage::deallocations`](super::ComputeStorage::deallocations):
/// they are the calls that take memory from the device and give it back, as
/// `cudaMalloc` and `cudaFree` are for plain buffers. Reserving and freeing address
/// ranges hold no memory and are counted apart ([`VirtualMemory::ranges_reserved`]).
pub trait VirtualMemory {
    /// The granule of every map and unmap: offsets and sizes are multiples of it.
    fn granularity(&self) -> u64;

    /// Reserves `size` bytes of address space, aligned to `alignment` (a power of
    /// two), holding no memory: touching it before a map is an error of the device
    /// (a segmentation fault on the host, where a run unmapped after a map reads as
    /// zeros instead). `size` is rounded up to the granularity.
    fn reserve_range(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, MappingError>;

    /// Frees an address range, unmapping every run still mapped in it (each counted
    /// as an unmap). An unknown id does nothing.
    fn free_range(&mut self, id: StorageId);

    /// Maps `size` bytes of new memory at `offset` of range `id`, readable and
    /// writable from then on (with unspecified contents). One call maps the whole run.
    fn map(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError>;

    /// Unmaps the run that one [`VirtualMemory::map`] mapped at `offset`, `size`
    /// bytes long, giving its memory back.
    fn unmap(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError>;

    /// The bytes mapped now, in every range.
    fn bytes_mapped(&self) -> u64;

    /// The address ranges reserved so far (each a `cuMemAddressReserve`).
    fn ranges_reserved(&self) -> u64;
}

/// Checks that a run of `size` bytes at `offset` is aligned to `granularity`, not
/// empty, and inside a range of `range_size` bytes; returns its end.
fn check_run(
    offset: u64,
    size: u64,
    granularity: u64,
    range_size: u64,
) -> Result<u64, MappingError> {
    let bad = MappingError::BadRun {
        offset,
        size,
        granularity,
    };
    let end = offset.checked_add(size).ok_or(bad.clone())?;
    if size == 0 || offset % granularity != 0 || size % granularity != 0 || end > range_size {
        return Err(bad);
    }
    Ok(end)
}

/// The runs mapped in the address ranges of a storage, by range and offset: the
/// bookkeeping both storages share, which checks every call against the rules of
/// [`VirtualMemory`].
#[derive(Debug, Clone, Default)]
pub(crate) struct MappedRuns {
    /// Each live range's id, size and runs (offset -> size); a storage holds a few
    /// ranges, so they are found by a scan. Invariant: the runs of a range do not
    /// overlap and lie inside it; each is granule-aligned.
    ranges: Vec<(StorageId, u64, RunMap)>,
    /// The sum of every run's size.
    bytes: u64,
    /// Maps made so far.
    pub(crate) maps: u64,
    /// Unmaps made so far (free_range's included).
    pub(crate) unmaps: u64,
    /// Ranges reserved so far.
    pub(crate) reserved: u64,
}

impl MappedRuns {
    /// The size and runs of range `id`.
    fn range(&self, id: StorageId) -> Result<(u64, &RunMap), MappingError> {
        self.ranges
            .iter()
            .find(|(range, _, _)| *range == id)
            .map(|(_, size, runs)| (*size, runs))
            .ok_or(MappingError::UnknownRange { id: id.0 })
    }

    /// Every mapped run as `(range, offset, size)`.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (StorageId, u64, u64)> + '_ {
        self.ranges
            .iter()
            .flat_map(|(id, _, runs)| runs.iter().map(move |(offset, size)| (*id, offset, size)))
    }

    /// The mapped runs of range `id` as `(offset, size)`, by offset (none for an
    /// unknown id).
    pub(crate) fn runs_of(&self, id: StorageId) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.range(id).into_iter().flat_map(|(_, runs)| runs.iter())
    }

    /// Whether no range is reserved.
    pub(crate) fn no_ranges(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Records a new range of `size` bytes.
    pub(crate) fn add_range(&mut self, id: StorageId, size: u64) {
        self.ranges.push((id, size, RunMap::default()));
        self.reserved += 1;
    }

    /// Forgets a range and its runs, counting each run as an unmap; returns the
    /// range's size and runs (`None` for an unknown id).
    pub(crate) fn remove_range(&mut self, id: StorageId) -> Option<(u64, Vec<(u64, u64)>)> {
        let position = self.ranges.iter().position(|(range, _, _)| *range == id)?;
        let (_, size, runs) = self.ranges.swap_remove(position);
        let runs = runs.into_vec();
        for (_, run) in &runs {
            self.bytes -= run;
            self.unmaps += 1;
        }
        Some((size, runs))
    }

    /// Checks that a run of `size` bytes at `offset` of range `id` may be mapped:
    /// aligned to `granularity`, inside the range, over no mapped byte.
    pub(crate) fn check_map(
        &self,
        id: StorageId,
        offset: u64,
        size: u64,
        granularity: u64,
    ) -> Result<(), MappingError> {
        let (range_size, runs) = self.range(id)?;
        let end = check_run(offset, size, granularity, range_size)?;
        // The run starting last before `end` must end at or before `offset`.
        if let Some((start, length)) = runs.last_before(end) {
            if start + length > offset {
                return Err(MappingError::AlreadyMapped { offset });
            }
        }
        Ok(())
    }

    /// [`MappedRuns::check_map`] and [`MappedRuns::add_run`] in one: the range found
    /// once, and its runs searched once ([`RunMap::insert_clear`]). A storage whose map
    /// can still fail after the check takes the run back with
    /// [`MappedRuns::unrecord_map`].
    pub(crate) fn map_run(
        &mut self,
        id: StorageId,
        offset: u64,
        size: u64,
        granularity: u64,
    ) -> Result<(), MappingError> {
        let (range_size, runs) = self
            .ranges
            .iter_mut()
            .find(|(range, _, _)| *range == id)
            .map(|(_, size, runs)| (*size, runs))
            .ok_or(MappingError::UnknownRange { id: id.0 })?;
        check_run(offset, size, granularity, range_size)?;
        if !runs.insert_clear(offset, size) {
            return Err(MappingError::AlreadyMapped { offset });
        }
        self.bytes += size;
        self.maps += 1;
        Ok(())
    }

    /// [`MappedRuns::check_unmap`] and [`MappedRuns::remove_run`] in one: the range
    /// found once and the run searched once ([`RunMap::remove_if`]).
    pub(crate) fn unmap_run(
        &mut self,
        id: StorageId,
        offset: u64,
        size: u64,
    ) -> Result<(), MappingError> {
        let (_, _, runs) = self
            .ranges
            .iter_mut()
            .find(|(range, _, _)| *range == id)
            .ok_or(MappingError::UnknownRange { id: id.0 })?;
        if runs.remove_if(offset, |length| length == size).is_none() {
            return Err(MappingError::NotMapped { offset, size });
        }
        self.bytes -= size;
        self.unmaps += 1;
        Ok(())
    }

    /// Takes back the run [`MappedRuns::map_run`] recorded at `offset` of range `id`,
    /// for a storage whose map failed after it (as if the map had not been made).
    pub(crate) fn unrecord_map(&mut self, id: StorageId, offset: u64) {
        if self.forget_run(id, offset).is_some() {
            self.maps -= 1;
        }
    }

    /// Forgets the run at `offset` of range `id` and its bytes; returns its size, if
    /// one started there.
    fn forget_run(&mut self, id: StorageId, offset: u64) -> Option<u64> {
        let (_, _, runs) = self.ranges.iter_mut().find(|(range, _, _)| *range == id)?;
        let size = runs.remove(offset)?;
        self.bytes -= size;
        Some(size)
    }

    /// Records a run checked by [`MappedRuns::check_map`].
    pub(crate) fn add_run(&mut self, id: StorageId, offset: u64, size: u64) {
        if let Some((_, _, runs)) = self.ranges.iter_mut().find(|(range, _, _)| *range == id) {
            runs.insert(offset, size);
            self.bytes += size;
            self.maps += 1;
        }
    }

    /// Checks that exactly a run of `size` bytes is mapped at `offset` of range `id`.
    pub(crate) fn check_unmap(
        &self,
        id: StorageId,
        offset: u64,
        size: u64,
    ) -> Result<(), MappingError> {
        let (_, runs) = self.range(id)?;
        match runs.get(offset) {
            Some(length) if length == size => Ok(()),
            _ => Err(MappingError::NotMapped { offset, size }),
        }
    }

    /// Forgets a run checked by [`MappedRuns::check_unmap`].
    pub(crate) fn remove_run(&mut self, id: StorageId, offset: u64) {
        if self.forget_run(id, offset).is_some() {
            self.unmaps += 1;
        }
    }

    /// The bytes mapped in every range.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run recorded by `map_run` and taken back by `unrecord_map` (a map the host
    /// refused after the check) leaves the books as before the map, and the run's
    /// place free to map again.
    #[test]
    fn an_unrecorded_map_leaves_the_books_as_before() {
        let mut runs = MappedRuns::default();
        let id = StorageId(3);
        runs.add_range(id, 64);
        runs.map_run(id, 0, 16, 16).unwrap();
        runs.map_run(id, 32, 16, 16).unwrap();
        runs.unrecord_map(id, 32);
        assert_eq!((runs.bytes(), runs.maps, runs.unmaps), (16, 1, 0));
        assert_eq!(runs.runs().collect::<Vec<_>>(), vec![(id, 0, 16)]);
        runs.unrecord_map(StorageId(4), 0);
        runs.unrecord_map(id, 48);
        assert_eq!((runs.bytes(), runs.maps), (16, 1), "nothing recorded there");
        runs.map_run(id, 32, 32, 16).unwrap();
        assert_eq!(runs.bytes(), 48);
    }
}
