//! Python classes for MemoryManagement, its handles, bindings and usage.
//!
//! Memory safety: every handle holds a reference to its `MemoryManagement` object and
//! every binding an `Arc` of the shared state (a buffer view holds its handle), so the
//! host storage (and the bytes of a view) outlives them all. A handle's export
//! counter is changed only by compare-and-swap; `release()` succeeds only when it
//! swaps 0 exports for the released state, so no view outlives the reservation.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;

use super::config::{config_arg, PyMemoryConfiguration, PyMemoryDeviceProperties};
use super::errors::{
    handle_released, install_error, invalid_argument, opt_size_arg, pool_error, size_arg,
    unavailable,
};
use super::gil_cell::{GilCell, GilLock, Unavailable};
use super::report::{record_object, report_object, PyMemoryRecord, PyMemoryReport};
use super::taint::{
    checked_range, claim_object, graph_error, outcome_object, target_extent, target_range, PyClaim,
    PyErrorGraph,
};
use crate::config::{MemoryConfiguration, MemoryDeviceProperties};
use crate::handle::{ManagedMemoryBinding, ManagedMemoryHandle};
use crate::management::{MemoryAllocationMode, MemoryManagement, Resource};
use crate::shared_bindings::SharedMemoryBindings;
use crate::storage::HostStorage;
use crate::usage::MemoryUsage;

/// The memory management every handle of it shares.
///
/// Lock discipline: no Python code ever runs while the memory management (or a
/// handle's slot mutex) is held. Work under a lock produces plain Rust values;
/// exceptions are built after it is released, since building one may run a
/// finalizer that needs the same memory management. The memory management is
/// guarded by the GIL ([`GilLock`]): every access holds it, so threads take turns
/// without atomic operations; a re-entered or poisoned memory management is an
/// error, never an alias.
pub(crate) struct Shared {
    memory: GilLock<MemoryManagement<HostStorage>>,
    /// Handles whose Python objects are gone, given back to the memory management
    /// (`MemoryManagement::release`) at the start of its next operation. Guarded by
    /// the GIL, so a handle's deallocation takes no lock and no atomic operation.
    graveyard: GilCell<Vec<ManagedMemoryHandle>>,
}

impl Shared {
    fn new(memory: MemoryManagement<HostStorage>) -> Self {
        Self {
            memory: GilLock::new(memory),
            graveyard: GilCell::new(Vec::new()),
        }
    }

    /// Runs `f` with the lock held, after giving back the handles of dead Python
    /// objects; `f` must not call into Python.
    pub(crate) fn try_with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut MemoryManagement<HostStorage>) -> T,
    ) -> Result<T, Unavailable> {
        let graveyard = &self.graveyard;
        let result = self.memory.with(py, |memory| {
            // The closure only moves handles out of the list (the cell's invariant).
            graveyard.with(py, |dead| {
                for handle in dead.drain(..) {
                    memory.release(handle);
                }
            });
            f(memory)
        });
        if result.is_err() {
            // Nothing will give the buried handles back: drop them, so their
            // reservations wait on the lock-free release rings instead.
            drop(self.graveyard.with(py, std::mem::take));
        }
        result
    }

    /// Gives `handle` back at the memory management's next operation.
    fn bury(&self, py: Python<'_>, handle: ManagedMemoryHandle) {
        self.graveyard.with(py, |graveyard| graveyard.push(handle));
    }

    /// [`Shared::try_with`], with poisoning raised as `CubepoolError` (after unlocking).
    pub(crate) fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut MemoryManagement<HostStorage>) -> T,
    ) -> PyResult<T> {
        self.try_with(py, f).map_err(|why| unavailable(py, why))
    }

    /// Whether two handles' memory managements are the same one.
    pub(crate) fn same(a: &Arc<Shared>, b: &Arc<Shared>) -> bool {
        Arc::ptr_eq(a, b)
    }
}

/// Reserves and keeps track of chunks of host memory, and slices upon them.
///
/// Thread-safe: one instance may be used from many threads at once.
#[pyclass(name = "MemoryManagement", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyMemoryManagement {
    shared: Arc<Shared>,
    name: String,
}

fn mode_name(mode: MemoryAllocationMode) -> &'static str {
    match mode {
        MemoryAllocationMode::Auto => "auto",
        MemoryAllocationMode::Persistent => "persistent",
    }
}

fn parse_mode(py: Python<'_>, mode: &str) -> PyResult<MemoryAllocationMode> {
    match mode {
        "auto" => Ok(MemoryAllocationMode::Auto),
        "persistent" => Ok(MemoryAllocationMode::Persistent),
        other => Err(invalid_argument(
            py,
            format!("mode must be \"auto\" or \"persistent\", got {other:?}"),
        )),
    }
}

#[pymethods]
impl PyMemoryManagement {
    /// `config` is a MemoryConfiguration, configuration text, or None: then the
    /// CUBEPOOL_MEMORY_POOLS variable, else `memory.pools` in the nearest
    /// cubepool.toml, else the build's default layout.
    #[new]
    #[pyo3(signature = (config = None, properties = None, *, mode = "auto", name = "default"))]
    fn new(
        py: Python<'_>,
        config: Option<&Bound<'_, PyAny>>,
        properties: Option<&PyMemoryDeviceProperties>,
        mode: &str,
        name: &str,
    ) -> PyResult<Self> {
        let configuration = config_arg(py, config)?;
        Self::build(py, configuration, properties.map(|p| p.inner), mode, name)
    }

    /// A report of every pool: shape, usage and high-water marks.
    fn memory_report(&self, py: Python<'_>) -> PyResult<PyMemoryReport> {
        Ok(report_object(
            self.shared.with(py, |memory| memory.memory_report())?,
        ))
    }

    /// Records a report under `label` (with a sequence number and the time) and
    /// returns it. Records survive `install_pools`.
    fn record_memory(&self, py: Python<'_>, label: String) -> PyResult<PyMemoryRecord> {
        Ok(record_object(
            self.shared.with(py, |memory| memory.record_memory(label))?,
        ))
    }

    /// The records made so far, oldest first.
    fn records(&self, py: Python<'_>) -> PyResult<Vec<PyMemoryRecord>> {
        let records = self.shared.with(py, |memory| memory.records().to_vec())?;
        Ok(records.into_iter().map(record_object).collect())
    }

    /// Takes the records made so far, oldest first (sequence numbers keep counting).
    fn take_records(&self, py: Python<'_>) -> PyResult<Vec<PyMemoryRecord>> {
        let records = self.shared.with(py, |memory| memory.take_records())?;
        Ok(records.into_iter().map(record_object).collect())
    }

    /// Replaces the dynamic pools with `config` (a MemoryConfiguration or text).
    ///
    /// Runs an explicit cleanup, then raises InstallMemoryPoolsError (kind
    /// "PoolsInUse", `bytes_in_use`) while any reservation of the dynamic pools is
    /// live; otherwise builds the new pools and resets the high-water marks. The
    /// persistent pool and the records are untouched. An invalid layout raises
    /// PoolConfigError before anything happens.
    fn install_pools(&self, py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<()> {
        let configuration = config_arg(py, Some(config))?;
        let installed = self
            .shared
            .with(py, |memory| memory.install_pools(configuration))?;
        installed.map_err(|e| install_error(py, e))
    }

    /// Restarts the pools' high-water marks (what reports and plans read).
    fn reset_peaks(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.with(py, |memory| memory.reset_peaks())
    }

    /// Statistics under the keys of `torch.cuda.memory_stats()`:
    /// "allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms", ...
    fn memory_stats(&self, py: Python<'_>) -> PyResult<Py<pyo3::types::PyDict>> {
        let stats = self.shared.with(py, |memory| memory.memory_stats())?;
        let dict = pyo3::types::PyDict::new(py);
        for (key, value) in stats.to_flat() {
            dict.set_item(key, value)?;
        }
        Ok(dict.unbind())
    }

    /// Restarts the peaks of `memory_stats()` (`torch.cuda.reset_peak_memory_stats`).
    fn reset_peak_memory_stats(&self, py: Python<'_>) -> PyResult<()> {
        self.shared
            .with(py, |memory| memory.reset_peak_memory_stats())
    }

    /// Restarts the cumulative counts of `memory_stats()` (`allocated`, `freed`,
    /// `num_*`).
    fn reset_accumulated_memory_stats(&self, py: Python<'_>) -> PyResult<()> {
        self.shared
            .with(py, |memory| memory.reset_accumulated_memory_stats())
    }

    /// The table `torch.cuda.memory_summary()` prints, for these statistics.
    fn memory_summary(&self, py: Python<'_>) -> PyResult<String> {
        let stats = self.shared.with(py, |memory| memory.memory_stats())?;
        Ok(stats.summary(&format!("cubepool memory summary, {:?}", self.name)))
    }

    /// Pins the reservations of handles and bindings for another stream: the memory
    /// stays in use until the returned set is released (`release()`, or the end of a
    /// `with` block), even if every handle is released first.
    #[pyo3(signature = (targets = None))]
    fn shared_bindings(
        &self,
        py: Python<'_>,
        targets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PySharedMemoryBindings> {
        let shared = PySharedMemoryBindings {
            shared: Arc::clone(&self.shared),
            bindings: Mutex::new(Some(SharedMemoryBindings::new())),
        };
        if let Some(targets) = targets {
            for target in targets.try_iter()? {
                shared.pin(py, &target?)?;
            }
        }
        Ok(shared)
    }

    /// Reserves `size` bytes of host memory and returns a handle to them.
    ///
    /// Raises PoolCapacityExceeded, BufferTooBig, OutOfMemory, or InvalidArgument for a
    /// negative size.
    fn reserve(slf: &Bound<'_, Self>, size: &Bound<'_, PyAny>) -> PyResult<PyHandle> {
        let py = slf.py();
        let size = size_arg(size, "size")?;
        let reserved = slf
            .get()
            .shared
            .with(py, |memory| memory.reserve_located(size))?;
        let (handle, resource) = reserved.map_err(|e| pool_error(py, e))?;
        Ok(PyHandle::new(slf.clone().unbind(), handle, resource))
    }

    /// The usage of every pool together.
    fn memory_usage(&self, py: Python<'_>) -> PyResult<PyMemoryUsage> {
        Ok(PyMemoryUsage {
            inner: self.shared.with(py, |memory| memory.memory_usage())?,
        })
    }

    /// Releases pages: every fully free page when `explicit`, else what the periodic
    /// policies of the pools say.
    #[pyo3(signature = (explicit = true))]
    fn cleanup(&self, py: Python<'_>, explicit: bool) -> PyResult<()> {
        self.shared.with(py, |memory| memory.cleanup(explicit))
    }

    /// "auto" or "persistent". Setting "persistent" opens a persistent window,
    /// setting "auto" closes one; windows nest.
    #[getter]
    fn mode(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(mode_name(self.shared.with(py, |memory| memory.mode())?))
    }

    #[setter]
    fn set_mode(&self, py: Python<'_>, mode: &str) -> PyResult<()> {
        let mode = parse_mode(py, mode)?;
        self.shared.with(py, |memory| memory.set_mode(mode))
    }

    /// A context manager that opens a persistent window on entry and closes it on exit.
    fn persistent(&self) -> PersistentWindow {
        PersistentWindow {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Where the bytes of a handle or binding are.
    fn resource(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<PyResource> {
        let resource = if let Ok(handle) = target.cast::<PyHandle>() {
            let handle = handle.get();
            let inner = handle.with_slot(|slot| slot.clone());
            let inner = inner.ok_or_else(|| handle_released(py))?;
            self.shared.with(py, |memory| memory.resource(&inner))?
        } else if let Ok(binding) = target.cast::<PyBinding>() {
            let binding = &binding.get().binding;
            self.shared.with(py, |memory| memory.resource(binding))?
        } else {
            return Err(PyTypeError::new_err(
                "resource() takes a ManagedMemoryHandle or a ManagedMemoryBinding",
            ));
        };
        Ok(PyResource {
            inner: resource.map_err(|e| pool_error(py, e))?,
        })
    }

    /// A handle that names a buffer before memory is bound to it (`mm.bind` binds it).
    fn handle(slf: &Bound<'_, Self>) -> PyResult<PyHandle> {
        let handle = slf.get().shared.with(slf.py(), |memory| memory.handle())?;
        Ok(PyHandle::unbound(slf.clone().unbind(), handle))
    }

    /// Reserves `size` bytes for an unbound handle from `mm.handle()`. When the
    /// reservation fails, the error is raised and the handle stays unbound with an
    /// "unallocated" claim: launches that read it are skipped.
    fn bind(&self, py: Python<'_>, handle: &PyHandle, size: &Bound<'_, PyAny>) -> PyResult<()> {
        let size = size_arg(size, "size")?;
        if !Shared::same(handle.shared(), &self.shared) {
            return Err(invalid_argument(
                py,
                format!("handle {} belongs to another MemoryManagement", handle.id),
            ));
        }
        /// What happened under the handle's slot lock.
        enum Bind {
            Released,
            AlreadyBound,
            Unavailable(Unavailable),
            Failed(crate::error::PoolError),
            Bound,
        }
        // Lock order: the memory management, then the handle's slot (the slot lock is
        // never held while waiting for anything else).
        let outcome = self.shared.try_with(py, |memory| {
            handle.with_slot(|slot| {
                // Checked under the slot lock, so two threads cannot both bind.
                if slot.is_none() {
                    return Bind::Released;
                }
                if handle.placed.get().is_some() {
                    return Bind::AlreadyBound;
                }
                let id = crate::handle::ManagedMemoryId(handle.id);
                let bound = memory.bind_located(id, size);
                match bound {
                    Err(error) => Bind::Failed(error),
                    Ok((bound, resource)) => {
                        let _ = handle.placed.set(Placed {
                            size: resource.size,
                            pool: resource.pool,
                            address: resource.address as usize,
                        });
                        // Dropping the unbound handle queues its id, so the graph
                        // forgets the earlier unallocated record before the next
                        // graph operation.
                        *slot = Some(bound);
                        Bind::Bound
                    }
                }
            })
        });
        let outcome = outcome.unwrap_or_else(Bind::Unavailable);
        match outcome {
            Bind::Bound => Ok(()),
            Bind::Released => Err(handle_released(py)),
            Bind::AlreadyBound => Err(invalid_argument(
                py,
                format!("handle {} is already bound", handle.id),
            )),
            Bind::Unavailable(why) => Err(unavailable(py, why)),
            Bind::Failed(error) => Err(pool_error(py, error)),
        }
    }

    /// Records a launch of `kernel` that reads and writes the given handles, bindings
    /// or `(handle, start, end)` ranges. Returns None when it ran (its written ranges
    /// are clean), a `Skipped` when an input had a claim (its outputs inherit the
    /// failure), or, with `fail="message"`, the new `FailureId` its writes now carry.
    #[pyo3(signature = (kernel, reads = None, writes = None, fail = None))]
    fn launch(
        &self,
        py: Python<'_>,
        kernel: &str,
        reads: Option<&Bound<'_, PyAny>>,
        writes: Option<&Bound<'_, PyAny>>,
        fail: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let ranges = |items: Option<&Bound<'_, PyAny>>| -> PyResult<Vec<_>> {
            match items {
                None => Ok(Vec::new()),
                Some(items) => items
                    .try_iter()?
                    .map(|item| target_range(py, &self.shared, &item?))
                    .collect(),
            }
        };
        let (reads, writes) = (ranges(reads)?, ranges(writes)?);
        let outcome = self.shared.with(py, |memory| {
            memory
                .error_graph_mut()
                .launch(kernel, &reads, &writes, fail)
        })?;
        outcome_object(py, outcome.map_err(|e| graph_error(py, e))?)
    }

    /// Records a host write of `start..end` (default: all) of a handle or binding,
    /// which clears any taint there.
    // `start` is read by `size_arg` so a bad value names it; the text signature keeps
    // the documented default.
    #[pyo3(
        signature = (target, start = None, end = None),
        text_signature = "($self, target, start=0, end=None)"
    )]
    fn write(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (alloc, size) = target_extent(py, &self.shared, target)?;
        let start = opt_size_arg(start, "start")?.unwrap_or(0);
        let (alloc, range) = checked_range(py, alloc, size, start, opt_size_arg(end, "end")?)?;
        let written = self
            .shared
            .with(py, |memory| memory.error_graph_mut().write(alloc, range))?;
        written.map_err(|e| graph_error(py, e))
    }

    /// What a read of `start..end` (default: all) of a handle or binding finds: the
    /// first claim in the range, or None when the bytes can be trusted.
    // `start` is read by `size_arg` so a bad value names it; the text signature keeps
    // the documented default.
    #[pyo3(
        signature = (target, start = None, end = None),
        text_signature = "($self, target, start=0, end=None)"
    )]
    fn claim(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyClaim>> {
        let (alloc, size) = target_extent(py, &self.shared, target)?;
        let start = opt_size_arg(start, "start")?.unwrap_or(0);
        let (alloc, range) = checked_range(py, alloc, size, start, opt_size_arg(end, "end")?)?;
        let claim = self
            .shared
            .with(py, |memory| memory.error_graph_mut().claim(alloc, range))?;
        Ok(claim_object(claim.map_err(|e| graph_error(py, e))?))
    }

    /// A live view of the error graph.
    fn error_graph(&self) -> PyErrorGraph {
        PyErrorGraph {
            shared: Arc::clone(&self.shared),
        }
    }

    /// This instance's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The configuration the pools were built from.
    #[getter]
    fn config(&self, py: Python<'_>) -> PyResult<PyMemoryConfiguration> {
        Ok(PyMemoryConfiguration {
            inner: self
                .shared
                .with(py, |memory| memory.configuration().clone())?,
        })
    }

    /// The device properties the pools were built for.
    #[getter]
    fn properties(&self, py: Python<'_>) -> PyResult<PyMemoryDeviceProperties> {
        Ok(PyMemoryDeviceProperties {
            inner: self.shared.with(py, |memory| *memory.properties())?,
        })
    }

    /// Checks every invariant of every pool; raises AssertionError naming the first
    /// broken one.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let checked = self.shared.with(py, |memory| memory.check_invariants())?;
        checked.map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (pools, mode, usage) = self.shared.with(py, |memory| {
            (
                memory.pool_options().len(),
                memory.mode(),
                memory.memory_usage(),
            )
        })?;
        Ok(format!(
            "<MemoryManagement name={:?} pools={pools} mode={} in_use={} reserved={}>",
            self.name,
            mode_name(mode),
            usage.bytes_in_use,
            usage.bytes_reserved
        ))
    }
}

impl PyMemoryManagement {
    pub(crate) fn build(
        py: Python<'_>,
        configuration: MemoryConfiguration,
        properties: Option<MemoryDeviceProperties>,
        mode: &str,
        name: &str,
    ) -> PyResult<Self> {
        let mode = parse_mode(py, mode)?;
        let mut memory = MemoryManagement::from_configuration(
            HostStorage::new(),
            properties.unwrap_or_default(),
            configuration,
        )
        .map_err(|e| super::errors::config_error(py, &e, None))?
        .with_name(name);
        memory.set_mode(mode);
        Ok(Self {
            shared: Arc::new(Shared::new(memory)),
            name: name.to_string(),
        })
    }
}

/// Opens a persistent window for the duration of a `with` block.
#[pyclass(name = "PersistentWindow", module = "cubepool._cubepool", frozen)]
pub(crate) struct PersistentWindow {
    shared: Arc<Shared>,
}

#[pymethods]
impl PersistentWindow {
    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.with(py, |memory| {
            memory.set_mode(MemoryAllocationMode::Persistent)
        })
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.shared
            .with(py, |memory| memory.set_mode(MemoryAllocationMode::Auto))?;
        Ok(false)
    }
}

/// Export state of a handle: `RELEASED`, or the number of live buffer exports.
const RELEASED: isize = -1;

/// A handle to reserved host memory; `memoryview(h)` and `numpy.frombuffer(h)` see
/// its bytes without copying.
///
/// The memory stays reserved while this handle, a clone, a binding or a buffer view
/// exists. `release()` frees it early; it raises BufferError while views exist.
#[pyclass(name = "ManagedMemoryHandle", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyHandle {
    /// The memory management that made it, kept alive (with its storage) by this
    /// reference: a Python reference, so making and dropping a handle costs no atomic
    /// operation on it. Given back by `Drop` with the attached token (`drop_ref`),
    /// which skips the thread-local check a plain drop of a `Py` makes.
    memory: ManuallyDrop<Py<PyMemoryManagement>>,
    /// The reservation's id (also the id an unbound handle is bound under).
    id: u64,
    /// `None` once released.
    handle: Mutex<Option<ManagedMemoryHandle>>,
    /// Where the bytes are; set once, when the handle is bound.
    placed: Placement,
    /// `RELEASED`, or the number of live buffer exports. Changed only by CAS.
    exports: AtomicIsize,
}

impl Drop for PyHandle {
    /// Buries the handle (no lock, no atomic operation, no thread-local lookup): the
    /// memory management frees its reservation at its next operation.
    fn drop(&mut self) {
        let slot = self
            .handle
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let handle = slot.take();
        // SAFETY: a `PyHandle` is only ever made inside a Python method and owned by
        // its Python object, so it is dropped by that object's deallocation or by a
        // failed construction, both on a thread attached to the interpreter (the
        // module refuses interpreters without a GIL).
        let py = unsafe { Python::assume_attached() };
        if let Some(handle) = handle {
            self.memory.get().shared.bury(py, handle);
        }
        // SAFETY: `memory` is not used again; the field's own drop is skipped.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        memory.drop_ref(py);
    }
}

/// Where a handle's bytes are: known when it is made by a reserve (no
/// synchronization needed), or set once by a later bind.
#[derive(Clone)]
enum Placement {
    Reserved(Placed),
    Bound(OnceLock<Placed>),
}

impl Placement {
    fn get(&self) -> Option<&Placed> {
        match self {
            Self::Reserved(placed) => Some(placed),
            Self::Bound(cell) => cell.get(),
        }
    }

    /// Sets the placement of an unbound handle; false when already placed.
    fn set(&self, placed: Placed) -> bool {
        match self {
            Self::Reserved(_) => false,
            Self::Bound(cell) => cell.set(placed).is_ok(),
        }
    }
}

/// Where a bound handle's bytes are.
#[derive(Clone, Copy)]
struct Placed {
    size: u64,
    pool: Option<usize>,
    /// The address of the first byte; valid while the reservation is held.
    address: usize,
}

/// A byte to point zero-length views at, since a reservation of 0 bytes has no address.
static EMPTY: u8 = 0;

impl PyHandle {
    pub(crate) fn new(
        memory: Py<PyMemoryManagement>,
        handle: ManagedMemoryHandle,
        resource: Resource,
    ) -> Self {
        Self::with_placement(
            memory,
            handle,
            Placement::Reserved(Placed {
                size: resource.size,
                pool: resource.pool,
                address: resource.address as usize,
            }),
        )
    }

    fn unbound(memory: Py<PyMemoryManagement>, handle: ManagedMemoryHandle) -> Self {
        Self::with_placement(memory, handle, Placement::Bound(OnceLock::new()))
    }

    fn with_placement(
        memory: Py<PyMemoryManagement>,
        handle: ManagedMemoryHandle,
        placed: Placement,
    ) -> Self {
        Self {
            memory: ManuallyDrop::new(memory),
            id: handle.id().0,
            handle: Mutex::new(Some(handle)),
            placed,
            exports: AtomicIsize::new(0),
        }
    }

    /// Runs `f` on the handle's slot (`None` once released) with its lock held; `f`
    /// must not call into Python. The slot is only ever replaced or taken whole, so a
    /// poisoned lock still guards a consistent value.
    fn with_slot<T>(&self, f: impl FnOnce(&mut Option<ManagedMemoryHandle>) -> T) -> T {
        let mut slot = self.handle.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut slot)
    }

    fn with_handle<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&ManagedMemoryHandle) -> T,
    ) -> PyResult<T> {
        let result = self.with_slot(|slot| slot.as_ref().map(f));
        result.ok_or_else(|| handle_released(py))
    }

    /// The state of the memory management that made this handle.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.memory.get().shared
    }

    pub(crate) fn id_value(&self) -> u64 {
        self.id
    }

    /// The bound size, or None while unbound.
    pub(crate) fn bound_size(&self) -> Option<u64> {
        self.placed.get().map(|p| p.size)
    }

    pub(crate) fn released(&self) -> bool {
        self.exports.load(Ordering::Acquire) == RELEASED
    }
}

#[pymethods]
impl PyHandle {
    /// The reservation's unique id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// The bytes reserved (0 while unbound).
    #[getter]
    fn size(&self) -> u64 {
        self.bound_size().unwrap_or(0)
    }

    /// Whether memory is bound to the handle (false for `mm.handle()` until `mm.bind`).
    #[getter]
    fn bound(&self) -> bool {
        self.placed.get().is_some()
    }

    /// Whether this is the only handle to the reservation (bindings do not count).
    #[getter]
    fn can_mut(&self, py: Python<'_>) -> PyResult<bool> {
        // Give back the handles of dead or released Python objects first (a dropped or
        // released clone), so the answer is CubeCL's at once, not after the memory
        // management's next operation. A busy (re-entered) memory management keeps
        // them for later; the answer is then conservative.
        let _ = self.shared().try_with(py, |_| ());
        self.with_handle(py, ManagedMemoryHandle::can_mut)
    }

    /// Whether `release()` was called.
    #[getter(released)]
    fn py_released(&self) -> bool {
        self.released()
    }

    /// A binding to the same reservation; it keeps the memory in use.
    fn binding(&self, py: Python<'_>) -> PyResult<PyBinding> {
        let binding = self.with_handle(py, ManagedMemoryHandle::binding)?;
        Ok(PyBinding {
            owner: Arc::clone(self.shared()),
            binding,
        })
    }

    /// Another handle to the same reservation.
    fn clone(&self, py: Python<'_>) -> PyResult<PyHandle> {
        if self.placed.get().is_none() {
            return Err(invalid_argument(
                py,
                format!(
                    "handle {} is not bound yet; bind it before cloning",
                    self.id
                ),
            ));
        }
        let handle = self.with_handle(py, ManagedMemoryHandle::clone)?;
        Ok(PyHandle::with_placement(
            self.memory.clone_ref(py),
            handle,
            self.placed.clone(),
        ))
    }

    /// Gives the reservation back now (it is freed once no clone or binding is left).
    ///
    /// Raises BufferError while buffer views of this handle exist, and HandleReleased
    /// when already released.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        match self
            .exports
            .compare_exchange(0, RELEASED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                if let Some(handle) = self.with_slot(Option::take) {
                    self.shared().bury(py, handle);
                }
                Ok(())
            }
            Err(RELEASED) => Err(handle_released(py)),
            Err(views) => Err(PyBufferError::new_err(format!(
                "cannot release the handle: {views} buffer view(s) still use its memory"
            ))),
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        if !self.released() {
            self.release(py)?;
        }
        Ok(false)
    }

    fn __len__(&self) -> usize {
        self.size() as usize
    }

    fn __repr__(&self) -> String {
        let state = if self.released() { " released" } else { "" };
        match self.placed.get() {
            Some(placed) => {
                let pool = placed.pool.map_or("none".to_string(), |p| p.to_string());
                format!(
                    "<ManagedMemoryHandle id={} size={} pool={pool}{state}>",
                    self.id, placed.size
                )
            }
            None => format!("<ManagedMemoryHandle id={} unbound{state}>", self.id),
        }
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let mut current = this.exports.load(Ordering::Acquire);
        loop {
            if current == RELEASED {
                return Err(handle_released(py));
            }
            match this.exports.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        let Some(placed) = this.placed.get().copied() else {
            this.exports.fetch_sub(1, Ordering::AcqRel);
            return Err(invalid_argument(
                py,
                "the handle is not bound to memory (call mm.bind(handle, size))".to_string(),
            ));
        };
        let len = placed.size as ffi::Py_ssize_t;
        let ptr = if placed.size == 0 {
            std::ptr::addr_of!(EMPTY) as *mut std::ffi::c_void
        } else {
            placed.address as *mut std::ffi::c_void
        };
        // SAFETY: `view` is a valid Py_buffer from CPython. `ptr` points at `len` bytes
        // that stay reserved while the export count is positive (release() refuses
        // then) and whose storage the `shared` Arc keeps alive; FillInfo stores a
        // strong reference to `slf` in the view, so the handle outlives the view.
        let filled = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr, len, 0, flags) };
        if filled != 0 {
            this.exports.fetch_sub(1, Ordering::AcqRel);
            return Err(PyErr::fetch(py));
        }
        Ok(())
    }

    /// # Safety
    /// Called by CPython once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A binding of a reservation, as a launch would hold it: it keeps the memory in use
/// but does not count as a handle for `can_mut`.
#[pyclass(name = "ManagedMemoryBinding", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyBinding {
    /// Keeps the storage alive until the binding's release is processed.
    pub(crate) owner: Arc<Shared>,
    pub(crate) binding: ManagedMemoryBinding,
}

#[pymethods]
impl PyBinding {
    /// The reservation's unique id.
    #[getter]
    fn id(&self) -> u64 {
        self.binding.id().0
    }

    /// The bytes reserved.
    #[getter]
    fn size(&self) -> u64 {
        self.binding.size()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ManagedMemoryBinding id={} size={}>",
            self.binding.id().0,
            self.binding.size()
        )
    }
}

/// Memory in use, padding and reserved bytes of an allocator.
#[pyclass(
    name = "MemoryUsage",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryUsage {
    pub(crate) inner: MemoryUsage,
}

#[pymethods]
impl PyMemoryUsage {
    #[new]
    #[pyo3(signature = (number_allocs = 0, bytes_in_use = 0, bytes_padding = 0, bytes_reserved = 0))]
    fn new(number_allocs: u64, bytes_in_use: u64, bytes_padding: u64, bytes_reserved: u64) -> Self {
        Self {
            inner: MemoryUsage {
                number_allocs,
                bytes_in_use,
                bytes_padding,
                bytes_reserved,
            },
        }
    }

    /// The number of live allocations.
    #[getter]
    fn number_allocs(&self) -> u64 {
        self.inner.number_allocs
    }

    /// The bytes the live allocations asked for.
    #[getter]
    fn bytes_in_use(&self) -> u64 {
        self.inner.bytes_in_use
    }

    /// The bytes added to round live allocations up to the alignment.
    #[getter]
    fn bytes_padding(&self) -> u64 {
        self.inner.bytes_padding
    }

    /// The bytes held from the storage.
    #[getter]
    fn bytes_reserved(&self) -> u64 {
        self.inner.bytes_reserved
    }

    /// The usage as a dict of its four fields.
    pub(crate) fn to_dict(&self, py: Python<'_>) -> PyResult<Py<pyo3::types::PyDict>> {
        let dict = pyo3::types::PyDict::new(py);
        dict.set_item("number_allocs", self.inner.number_allocs)?;
        dict.set_item("bytes_in_use", self.inner.bytes_in_use)?;
        dict.set_item("bytes_padding", self.inner.bytes_padding)?;
        dict.set_item("bytes_reserved", self.inner.bytes_reserved)?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "MemoryUsage(number_allocs={}, bytes_in_use={}, bytes_padding={}, bytes_reserved={})",
            self.inner.number_allocs,
            self.inner.bytes_in_use,
            self.inner.bytes_padding,
            self.inner.bytes_reserved
        )
    }
}

/// Where the bytes of a reservation are: pool index, storage buffer, offset, address.
#[pyclass(
    name = "Resource",
    module = "cubepool._cubepool",
    frozen,
    eq,
    skip_from_py_object
)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyResource {
    inner: Resource,
}

#[pymethods]
impl PyResource {
    /// The index of the pool holding it (the persistent pool follows the dynamic ones),
    /// or None for a zero-byte reservation.
    #[getter]
    fn pool(&self) -> Option<usize> {
        self.inner.pool
    }

    /// The id of the storage buffer (page) holding it, or None for zero bytes.
    #[getter]
    fn storage_id(&self) -> Option<u64> {
        self.inner.storage_id
    }

    /// The offset of the first byte in the page.
    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset
    }

    /// The bytes reserved.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size
    }

    /// The address of the first byte (0 for zero bytes).
    #[getter]
    fn address(&self) -> u64 {
        self.inner.address
    }

    fn __repr__(&self) -> String {
        // As Python writes the getters' values: None, not Rust's `Some(0)`.
        fn py_option<T: std::fmt::Display>(value: Option<T>) -> String {
            value.map_or_else(|| "None".to_string(), |v| v.to_string())
        }
        format!(
            "Resource(pool={}, storage_id={}, offset={}, size={}, address={:#x})",
            py_option(self.inner.pool),
            py_option(self.inner.storage_id),
            self.inner.offset,
            self.inner.size,
            self.inner.address
        )
    }
}

/// Reservations pinned for another stream: their memory stays in use until the set is
/// released (`release()`, or the end of a `with` block), even when every handle of
/// them was released first. Made by `MemoryManagement.shared_bindings(...)`.
#[pyclass(name = "SharedMemoryBindings", module = "cubepool._cubepool", frozen)]
pub(crate) struct PySharedMemoryBindings {
    shared: Arc<Shared>,
    /// `None` once released.
    bindings: Mutex<Option<SharedMemoryBindings>>,
}

impl PySharedMemoryBindings {
    /// Runs `f` on the set (`None` once released) with its lock held; `f` must not
    /// call into Python. The set is only pushed to or taken whole, so a poisoned lock
    /// still guards a consistent value.
    fn with<T>(&self, f: impl FnOnce(&mut Option<SharedMemoryBindings>) -> T) -> T {
        let mut bindings = self.bindings.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut bindings)
    }
}

#[pymethods]
impl PySharedMemoryBindings {
    /// Pins one more handle or binding of the same MemoryManagement.
    fn pin(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<()> {
        let binding = if let Ok(handle) = target.cast::<PyHandle>() {
            let handle = handle.get();
            if !Shared::same(handle.shared(), &self.shared) {
                return Err(invalid_argument(
                    py,
                    "the handle belongs to another MemoryManagement".to_string(),
                ));
            }
            handle.with_handle(py, ManagedMemoryHandle::binding)?
        } else if let Ok(binding) = target.cast::<PyBinding>() {
            let binding = binding.get();
            if !Shared::same(&binding.owner, &self.shared) {
                return Err(invalid_argument(
                    py,
                    "the binding belongs to another MemoryManagement".to_string(),
                ));
            }
            binding.binding.clone()
        } else {
            return Err(PyTypeError::new_err(
                "shared bindings pin ManagedMemoryHandle or ManagedMemoryBinding objects",
            ));
        };
        // The binding is dropped after the lock if the set was released.
        let refused = self.with(|bindings| match bindings.as_mut() {
            Some(bindings) => {
                bindings.push(binding);
                None
            }
            None => Some(binding),
        });
        match refused {
            None => Ok(()),
            Some(_) => Err(invalid_argument(
                py,
                "the shared bindings were released".to_string(),
            )),
        }
    }

    /// Unpins everything (the memory is freed once nothing else holds it). Releasing
    /// twice does nothing.
    fn release(&self) {
        let taken = self.with(Option::take);
        drop(taken);
    }

    /// Whether `release()` was called.
    #[getter]
    fn released(&self) -> bool {
        self.with(|bindings| bindings.is_none())
    }

    /// The ids of the pinned reservations.
    #[getter]
    fn ids(&self) -> Vec<u64> {
        self.with(|bindings| {
            bindings.as_ref().map_or_else(Vec::new, |bindings| {
                bindings.bindings().iter().map(|b| b.id().0).collect()
            })
        })
    }

    /// The bytes the pinned bindings hold.
    #[getter]
    fn bytes(&self) -> u64 {
        self.with(|bindings| bindings.as_ref().map_or(0, SharedMemoryBindings::bytes))
    }

    fn __len__(&self) -> usize {
        self.with(|bindings| bindings.as_ref().map_or(0, SharedMemoryBindings::len))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        self.with(|bindings| match bindings.as_ref() {
            Some(bindings) => format!(
                "<SharedMemoryBindings bindings={} bytes={}>",
                bindings.len(),
                bindings.bytes()
            ),
            None => "<SharedMemoryBindings released>".to_string(),
        })
    }
}
