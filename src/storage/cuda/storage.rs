//! [`CudaStorage`]: device buffers (`cuMemAlloc` / `cuMemFree`) and virtual memory
//! (`cuMemAddressReserve` / `cuMemCreate` / `cuMemMap` / `cuMemSetAccess` /
//! `cuMemUnmap` / `cuMemRelease` / `cuMemAddressFree`), as the
//! [`VirtualMemory`](crate::storage::VirtualMemory) trait documents them.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_int;

use super::context::DeviceContext;
use super::driver::{AccessDesc, AllocationProp, DevicePtr, MemHandle, ERROR_OUT_OF_MEMORY};
use super::CudaError;
use crate::error::PoolError;
use crate::storage::virtual_memory::MappedRuns;
use crate::storage::{ComputeStorage, MappingError, StorageHandle, StorageId, VirtualMemory};

/// The alignment `cuMemAlloc` guarantees; larger alignments are made by allocating
/// more and rounding the address up.
const MALLOC_ALIGNMENT: u64 = 256;

/// A device buffer: the address `cuMemAlloc` returned (freed with `cuMemFree`), and
/// the size the caller asked for.
struct DeviceBuffer {
    base: DevicePtr,
    size: u64,
}

/// Memory of one CUDA device: buffers and virtual memory through the driver API.
///
/// Addresses are device pointers (`CUdeviceptr`); the host cannot read them. Buffers
/// and ranges live until released or until the storage is dropped, which frees every
/// one (the pools above it hold no reservation by then).
pub struct CudaStorage {
    context: DeviceContext,
    /// `cuMemGetAllocationGranularity(MINIMUM)` for pinned memory of this device.
    granule: u64,
    /// Invariant: every entry is a live `cuMemAlloc` allocation.
    buffers: HashMap<StorageId, DeviceBuffer>,
    /// The base address of every live address range (reserved with the size `runs`
    /// holds for it).
    ranges: HashMap<StorageId, DevicePtr>,
    /// The physical allocation behind each mapped run, by range and offset.
    /// Invariant: exactly the runs `runs` records.
    handles: HashMap<(StorageId, u64), MemHandle>,
    runs: MappedRuns,
    next_id: u64,
    bytes: u64,
    allocations: u64,
    deallocations: u64,
}

impl CudaStorage {
    /// A storage on device `ordinal` (its primary context, which PyTorch and CuPy
    /// share). Loads the driver on first use.
    ///
    /// [`CudaError::DriverNotFound`] without the NVIDIA driver, [`CudaError::NoDevice`]
    /// for an ordinal the driver does not have.
    pub fn new(ordinal: i32) -> Result<Self, CudaError> {
        let context = DeviceContext::new(ordinal)?;
        let prop = AllocationProp::device(ordinal);
        let mut granule: usize = 0;
        let driver = context.driver;
        // SAFETY: the driver writes one size_t; `prop` is a valid CUmemAllocationProp.
        let code = unsafe { (driver.granularity)(&mut granule, &prop, 0) };
        driver.check(code, "cuMemGetAllocationGranularity")?;
        Ok(Self {
            context,
            granule: granule.max(1) as u64,
            buffers: HashMap::new(),
            ranges: HashMap::new(),
            handles: HashMap::new(),
            runs: MappedRuns::default(),
            next_id: 0,
            bytes: 0,
            allocations: 0,
            deallocations: 0,
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.context.ordinal
    }

    fn next_id(&mut self) -> StorageId {
        let id = StorageId(self.next_id);
        self.next_id += 1;
        id
    }

    /// The device address of `offset` in live range `id`.
    fn address_in(&self, id: StorageId, offset: u64) -> Result<DevicePtr, MappingError> {
        let base = self
            .ranges
            .get(&id)
            .ok_or(MappingError::UnknownRange { id: id.0 })?;
        Ok(base + offset)
    }

    /// Makes the context current; a failure is a device error.
    fn enter(&self) -> Result<(), CudaError> {
        self.context.make_current()
    }

    fn check(&self, code: c_int, call: &'static str) -> Result<(), CudaError> {
        self.context.driver.check(code, call)
    }

    /// Maps `size` bytes of new memory at `address`: create, map, set access; undoes
    /// what succeeded when a later call fails.
    fn map_at(&self, address: DevicePtr, size: u64) -> Result<MemHandle, CudaError> {
        let driver = self.context.driver;
        let prop = AllocationProp::device(self.context.ordinal);
        let len = size as usize;
        let mut handle: MemHandle = 0;
        // SAFETY: the driver writes one handle; `prop` is valid.
        self.check(
            unsafe { (driver.mem_create)(&mut handle, len, &prop, 0) },
            "cuMemCreate",
        )?;
        // SAFETY: `address..address + size` lies in a reserved range with no mapping
        // (checked by MappedRuns); the handle holds exactly `size` bytes.
        let mapped = self.check(
            unsafe { (driver.mem_map)(address, len, 0, handle, 0) },
            "cuMemMap",
        );
        if let Err(error) = mapped {
            // SAFETY: the handle was created above and is not mapped.
            unsafe { (driver.mem_release)(handle) };
            return Err(error);
        }
        let access = AccessDesc::read_write(self.context.ordinal);
        // SAFETY: the run was just mapped; one descriptor.
        let granted = self.check(
            unsafe { (driver.mem_set_access)(address, len, &access, 1) },
            "cuMemSetAccess",
        );
        if let Err(error) = granted {
            // SAFETY: undoing the map and the create above.
            unsafe {
                (driver.mem_unmap)(address, len);
                (driver.mem_release)(handle);
            }
            return Err(error);
        }
        Ok(handle)
    }

    /// Unmaps the run at `address` and releases its memory, after the device has
    /// finished all work queued so far (unlike `cuMemFree`, `cuMemUnmap` does not
    /// synchronize, and a kernel still running could touch the run).
    fn unmap_at(&self, address: DevicePtr, size: u64, handle: MemHandle) {
        let driver = self.context.driver;
        // SAFETY: the run was mapped by `map_at` with this handle and holds no live
        // reservation (the caller's contract); the context is current. Failures cannot
        // be recovered: the run is forgotten either way.
        unsafe {
            (driver.ctx_synchronize)();
            (driver.mem_unmap)(address, size as usize);
            (driver.mem_release)(handle);
        }
    }
}

impl CudaError {
    /// Whether the device ran out of memory (`CUDA_ERROR_OUT_OF_MEMORY`).
    fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            CudaError::Call {
                code: ERROR_OUT_OF_MEMORY,
                ..
            }
        )
    }
}

/// The pool error of a failed driver call for `size` bytes.
fn pool_error(error: CudaError, size: u64) -> PoolError {
    if error.is_out_of_memory() {
        return PoolError::OutOfMemory { size };
    }
    PoolError::Storage {
        reason: error.to_string(),
    }
}

/// The mapping error of a failed driver call for `size` bytes.
fn mapping_error(error: CudaError, size: u64) -> MappingError {
    if error.is_out_of_memory() {
        return MappingError::OutOfMemory { size };
    }
    MappingError::Device {
        reason: error.to_string(),
    }
}

impl ComputeStorage for CudaStorage {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        let alignment = crate::storage::checked_alignment(alignment)?;
        let oom = PoolError::OutOfMemory { size };
        // cuMemAlloc refuses 0 bytes and aligns to 256: ask for more to align further.
        let extra = if alignment > MALLOC_ALIGNMENT {
            alignment - 1
        } else {
            0
        };
        let asked = size.max(1).checked_add(extra).ok_or(oom.clone())?;
        let len = usize::try_from(asked).map_err(|_| oom)?;
        self.enter().map_err(|e| pool_error(e, size))?;
        let mut base: DevicePtr = 0;
        let driver = self.context.driver;
        // SAFETY: the driver writes one device pointer.
        let code = unsafe { (driver.mem_alloc)(&mut base, len) };
        self.check(code, "cuMemAlloc")
            .map_err(|e| pool_error(e, size))?;
        let address = base.next_multiple_of(alignment);
        let id = self.next_id();
        self.buffers.insert(id, DeviceBuffer { base, size });
        self.bytes += size;
        self.allocations += 1;
        Ok(StorageHandle { id, address, size })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(buffer) = self.buffers.remove(&id) {
            // A context that cannot be made current leaks the buffer rather than
            // freeing it in another context.
            if self.enter().is_ok() {
                // SAFETY: a live cuMemAlloc allocation, removed from the map, so freed once.
                unsafe { (self.context.driver.mem_free)(buffer.base) };
            }
            self.bytes -= buffer.size;
            self.deallocations += 1;
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

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }

    fn virtual_memory_ref(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for CudaStorage {
    fn granularity(&self) -> u64 {
        self.granule
    }

    fn reserve_range(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, MappingError> {
        if !alignment.is_power_of_two() {
            return Err(MappingError::BadAlignment { alignment });
        }
        let oom = MappingError::OutOfMemory { size };
        let size = size
            .max(1)
            .checked_next_multiple_of(self.granule)
            .ok_or(oom.clone())?;
        let len = usize::try_from(size).map_err(|_| oom)?;
        self.enter().map_err(|e| mapping_error(e, size))?;
        let mut address: DevicePtr = 0;
        let driver = self.context.driver;
        let align = usize::try_from(alignment.max(self.granule)).unwrap_or(0);
        // SAFETY: the driver writes one device pointer; no fixed address, no flags.
        let code = unsafe { (driver.address_reserve)(&mut address, len, align, 0, 0) };
        self.check(code, "cuMemAddressReserve")
            .map_err(|e| mapping_error(e, size))?;
        let id = self.next_id();
        self.ranges.insert(id, address);
        self.runs.add_range(id, size);
        Ok(StorageHandle { id, address, size })
    }

    fn free_range(&mut self, id: StorageId) {
        let Some(address) = self.ranges.remove(&id) else {
            return;
        };
        let Some((size, runs)) = self.runs.remove_range(id) else {
            return;
        };
        let entered = self.enter().is_ok();
        for (offset, run) in runs {
            if let Some(handle) = self.handles.remove(&(id, offset)) {
                if entered {
                    self.unmap_at(address + offset, run, handle);
                }
            }
            self.bytes -= run;
            self.deallocations += 1;
        }
        if entered {
            // SAFETY: the range was reserved with this size and every run in it is
            // unmapped; removed from `ranges`, so freed once.
            unsafe { (self.context.driver.address_free)(address, size as usize) };
        }
    }

    fn map(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        self.runs.check_map(id, offset, size, self.granule)?;
        let address = self.address_in(id, offset)?;
        self.enter().map_err(|e| mapping_error(e, size))?;
        let handle = self
            .map_at(address, size)
            .map_err(|e| mapping_error(e, size))?;
        self.handles.insert((id, offset), handle);
        self.runs.add_run(id, offset, size);
        self.bytes += size;
        self.allocations += 1;
        Ok(())
    }

    fn unmap(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        self.runs.check_unmap(id, offset, size)?;
        let address = self.address_in(id, offset)?;
        self.enter().map_err(|e| mapping_error(e, size))?;
        if let Some(handle) = self.handles.remove(&(id, offset)) {
            self.unmap_at(address, size, handle);
        }
        self.runs.remove_run(id, offset);
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

impl Drop for CudaStorage {
    fn drop(&mut self) {
        let ids: Vec<StorageId> = self.buffers.keys().copied().collect();
        for id in ids {
            self.dealloc(id);
        }
        let ranges: Vec<StorageId> = self.ranges.keys().copied().collect();
        for id in ranges {
            self.free_range(id);
        }
    }
}

/// `cuMemGetInfo` for device `ordinal`: `(free, total)` bytes.
pub fn device_memory_info(ordinal: i32) -> Result<(u64, u64), CudaError> {
    let context = DeviceContext::new(ordinal)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the driver writes two size_t.
    let code = unsafe { (context.driver.mem_get_info)(&mut free, &mut total) };
    context.driver.check(code, "cuMemGetInfo")?;
    Ok((free as u64, total as u64))
}
