//! The `MemoryManagement` class: its lock and list of dead handles
//! ([`ManagementState`]), and methods that convert arguments, call the core and map
//! its errors. Handles live in `handles`, values in `values`, the error graph in
//! `taint`.
//!
//! Memory safety: every handle holds a reference to its `MemoryManagement` object and
//! every binding an `Arc` of its [`ManagementState`], so the host storage outlives them
//! all (see `handles` for buffer views).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;

use super::config::{config_arg, PyMemoryConfiguration, PyMemoryDeviceProperties};
use super::errors::{
    handle_released, install_error, invalid_argument, pool_error, size_arg, unavailable,
};
use super::gil_cell::{GilCell, GilLock, Unavailable};
use super::handles::{PyHandle, Target};
use super::method_o::{self, MethodO};
use super::report::{record_object, report_object, PyMemoryRecord, PyMemoryReport};
use super::shared_bindings::PySharedMemoryBindings;
use super::taint::{self, PyClaim, PyErrorGraph};
use super::values::PyResource;
use crate::config::{MemoryConfiguration, MemoryDeviceProperties};
use crate::handle::ManagedMemoryHandle;
use crate::management::{MemoryAllocationMode, MemoryManagement};
use crate::storage::DeviceStorage;

/// `trace` and `report` name the usage class through this module.
pub(crate) use super::values::PyMemoryUsage;

/// The state one `MemoryManagement` shares with its handles, bindings and views: the
/// core behind its lock, and the handles of dead Python objects waiting to be given
/// back.
///
/// Lock discipline: no Python code ever runs while the memory management (or a
/// handle's slot mutex) is held. Work under a lock produces plain Rust values;
/// exceptions are built after it is released, since building one may run a
/// finalizer that needs the same memory management. The memory management is
/// guarded by the GIL ([`GilLock`]): every access holds it, so threads take turns
/// without atomic operations; a re-entered or poisoned memory management is an
/// error, never an alias.
pub(crate) struct ManagementState {
    memory: GilLock<MemoryManagement<DeviceStorage>>,
    /// Handles whose Python objects went while the memory management was busy (a
    /// re-entry) or poisoned, given back to it (`MemoryManagement::release`) at the
    /// start of its next operation. Guarded by the GIL, so a handle's deallocation
    /// takes no lock and no atomic operation.
    graveyard: GilCell<Vec<ManagedMemoryHandle>>,
    /// The CUDA device the bytes are on, or `None` for host memory (fixed at
    /// construction, so read without the lock).
    cuda_ordinal: Option<i32>,
}

impl ManagementState {
    fn new(memory: MemoryManagement<DeviceStorage>) -> Self {
        let cuda_ordinal = memory.storage().cuda_ordinal();
        Self {
            memory: GilLock::new(memory),
            graveyard: GilCell::new(Vec::new()),
            cuda_ordinal,
        }
    }

    /// The CUDA device the bytes are on, or `None` for host memory.
    pub(crate) fn cuda_ordinal(&self) -> Option<i32> {
        self.cuda_ordinal
    }

    /// Runs `f` with the lock held, after giving back the handles of dead Python
    /// objects; `f` must not call into Python.
    pub(crate) fn try_with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut MemoryManagement<DeviceStorage>) -> T,
    ) -> Result<T, Unavailable> {
        let graveyard = &self.graveyard;
        let result = self.memory.with(py, |memory| {
            // The closure only moves handles out of the list (the cell's invariant).
            graveyard.with(py, |dead| {
                // Mostly empty: handles are given back as they go (`give_back`).
                if !dead.is_empty() {
                    for handle in dead.drain(..) {
                        memory.release(handle);
                    }
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

    /// Gives `handle` back now (`MemoryManagement::release`: no atomic operation when
    /// it is the last handle), or, while an operation is in progress or after one
    /// panicked, at the memory management's next operation.
    pub(crate) fn give_back(&self, py: Python<'_>, handle: ManagedMemoryHandle) {
        let mut handle = Some(handle);
        // The closure only runs the core's release (the lock's invariant). The
        // graveyard is not drained here: what it holds waits for an operation, which
        // gives it back before anything else.
        let _ = self.memory.with(py, |memory| {
            if let Some(handle) = handle.take() {
                memory.release(handle);
            }
        });
        if let Some(handle) = handle {
            self.graveyard.with(py, |graveyard| graveyard.push(handle));
        }
    }

    /// [`ManagementState::try_with`], with poisoning raised as `CubepoolError` (after
    /// unlocking).
    pub(crate) fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut MemoryManagement<DeviceStorage>) -> T,
    ) -> PyResult<T> {
        self.try_with(py, f).map_err(|why| unavailable(py, why))
    }

    /// Whether two handles' memory managements are the same one.
    pub(crate) fn same(a: &Arc<ManagementState>, b: &Arc<ManagementState>) -> bool {
        Arc::ptr_eq(a, b)
    }
}

/// Reserves and keeps track of chunks of memory (host memory, or a CUDA device's with
/// `device="cuda:N"`), and slices upon them.
///
/// Thread-safe: one instance may be used from many threads at once.
#[pyclass(name = "MemoryManagement", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyMemoryManagement {
    state: Arc<ManagementState>,
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
    /// cubepool.toml, else the build's default layout. `device` is "cpu" (host
    /// memory) or "cuda:N" (device memory through the CUDA driver; DeviceUnavailable
    /// without one).
    #[new]
    #[pyo3(signature = (config = None, properties = None, *, mode = "auto", name = "default", device = "cpu"))]
    fn new(
        py: Python<'_>,
        config: Option<&Bound<'_, PyAny>>,
        properties: Option<&PyMemoryDeviceProperties>,
        mode: &str,
        name: &str,
        device: &str,
    ) -> PyResult<Self> {
        let configuration = config_arg(py, config)?;
        let ordinal = super::cuda_device::parse_device(py, device)?;
        let storage = super::cuda_device::storage_for(py, ordinal)?;
        let properties = properties
            .map(|p| p.inner)
            .unwrap_or_else(|| super::cuda_device::default_properties(ordinal));
        Self::build_on(py, storage, configuration, properties, mode, name)
    }

    /// "cpu" or "cuda:N": where the bytes are.
    #[getter]
    fn device(&self) -> String {
        super::cuda_device::device_name(self.state.cuda_ordinal())
    }

    /// A report of every pool: shape, usage and high-water marks.
    fn memory_report(&self, py: Python<'_>) -> PyResult<PyMemoryReport> {
        Ok(report_object(
            self.state.with(py, |memory| memory.memory_report())?,
        ))
    }

    /// Records a report under `label` (with a sequence number and the time) and
    /// returns it. Records survive `install_pools`.
    fn record_memory(&self, py: Python<'_>, label: String) -> PyResult<PyMemoryRecord> {
        Ok(record_object(
            self.state.with(py, |memory| memory.record_memory(label))?,
        ))
    }

    /// The records made so far, oldest first.
    fn records(&self, py: Python<'_>) -> PyResult<Vec<PyMemoryRecord>> {
        let records = self.state.with(py, |memory| memory.records().to_vec())?;
        Ok(records.into_iter().map(record_object).collect())
    }

    /// Takes the records made so far, oldest first (sequence numbers keep counting).
    fn take_records(&self, py: Python<'_>) -> PyResult<Vec<PyMemoryRecord>> {
        let records = self.state.with(py, |memory| memory.take_records())?;
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
            .state
            .with(py, |memory| memory.install_pools(configuration))?;
        installed.map_err(|e| install_error(py, e))
    }

    /// Restarts the pools' high-water marks (what reports and plans read).
    fn reset_peaks(&self, py: Python<'_>) -> PyResult<()> {
        self.state.with(py, |memory| memory.reset_peaks())
    }

    /// Statistics under the keys of `torch.cuda.memory_stats()`:
    /// "allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms", ...
    fn memory_stats(&self, py: Python<'_>) -> PyResult<Py<pyo3::types::PyDict>> {
        let stats = self.state.with(py, |memory| memory.memory_stats())?;
        let dict = pyo3::types::PyDict::new(py);
        for (key, value) in stats.to_flat() {
            dict.set_item(key, value)?;
        }
        Ok(dict.unbind())
    }

    /// Restarts the peaks of `memory_stats()` (`torch.cuda.reset_peak_memory_stats`).
    fn reset_peak_memory_stats(&self, py: Python<'_>) -> PyResult<()> {
        self.state
            .with(py, |memory| memory.reset_peak_memory_stats())
    }

    /// Restarts the cumulative counts of `memory_stats()` (`allocated`, `freed`,
    /// `num_*`).
    fn reset_accumulated_memory_stats(&self, py: Python<'_>) -> PyResult<()> {
        self.state
            .with(py, |memory| memory.reset_accumulated_memory_stats())
    }

    /// The table `torch.cuda.memory_summary()` prints, for these statistics.
    fn memory_summary(&self, py: Python<'_>) -> PyResult<String> {
        let stats = self.state.with(py, |memory| memory.memory_stats())?;
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
        let shared = PySharedMemoryBindings::new(Arc::clone(&self.state));
        if let Some(targets) = targets {
            for target in targets.try_iter()? {
                shared.pin(py, &target?)?;
            }
        }
        Ok(shared)
    }

    /// The usage of every pool together.
    fn memory_usage(&self, py: Python<'_>) -> PyResult<PyMemoryUsage> {
        Ok(PyMemoryUsage {
            inner: self.state.with(py, |memory| memory.memory_usage())?,
        })
    }

    /// Releases pages: every fully free page when `explicit`, else what the periodic
    /// policies of the pools say.
    #[pyo3(signature = (explicit = true))]
    fn cleanup(&self, py: Python<'_>, explicit: bool) -> PyResult<()> {
        self.state.with(py, |memory| memory.cleanup(explicit))
    }

    /// Marks a step boundary (call it between steps, after the setup): a `planned`
    /// pool's requests after it follow its plan's next phase; other pools ignore it.
    fn step(&self, py: Python<'_>) -> PyResult<()> {
        self.state.with(py, |memory| memory.step())
    }

    /// A `planned` pool's hits and misses so far (`hits`, `misses`, `misses_unplanned`,
    /// `misses_held`, `steps`), or None when no pool is planned.
    fn planned_stats<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        let Some(stats) = self.state.with(py, |memory| memory.planned_stats())? else {
            return Ok(None);
        };
        let dict = pyo3::types::PyDict::new(py);
        dict.set_item("hits", stats.hits)?;
        dict.set_item("misses", stats.misses())?;
        dict.set_item("misses_unplanned", stats.misses_unplanned)?;
        dict.set_item("misses_held", stats.misses_held)?;
        dict.set_item("steps", stats.steps)?;
        Ok(Some(dict))
    }

    /// "auto" or "persistent". Setting "persistent" opens a persistent window,
    /// setting "auto" closes one; windows nest.
    #[getter]
    fn mode(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(mode_name(self.state.with(py, |memory| memory.mode())?))
    }

    #[setter]
    fn set_mode(&self, py: Python<'_>, mode: &str) -> PyResult<()> {
        let mode = parse_mode(py, mode)?;
        self.state.with(py, |memory| memory.set_mode(mode))
    }

    /// A context manager that opens a persistent window on entry and closes it on exit.
    fn persistent(&self) -> PersistentWindow {
        PersistentWindow {
            state: Arc::clone(&self.state),
            open: AtomicUsize::new(0),
        }
    }

    /// Where the bytes of a handle or binding are.
    fn resource(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<PyResource> {
        // Another management's handle is refused here as by every other call that
        // takes one (`InvalidArgument`), before the memory management's own check
        // (`NotFound`, the Rust API's error) is reached.
        let binding = Target::of_state(
            target,
            &self.state,
            "resource() takes a ManagedMemoryHandle or a ManagedMemoryBinding",
        )?
        .bound_binding(py, "asking where its bytes are")?;
        let resource = self.state.with(py, |memory| memory.resource(&binding))?;
        Ok(PyResource {
            inner: resource.map_err(|e| pool_error(py, e))?,
        })
    }

    /// A handle that names a buffer before memory is bound to it (`mm.bind` binds it).
    fn handle(slf: &Bound<'_, Self>) -> PyResult<PyHandle> {
        let handle = slf.get().state.with(slf.py(), |memory| memory.handle())?;
        Ok(PyHandle::unbound(slf.clone().unbind(), handle))
    }

    /// Reserves `size` bytes for an unbound handle from `mm.handle()`. When the
    /// reservation fails, the error is raised and the handle stays unbound with an
    /// "unallocated" claim: launches that read it are skipped.
    fn bind(&self, py: Python<'_>, handle: &PyHandle, size: &Bound<'_, PyAny>) -> PyResult<()> {
        let size = size_arg(size, "size")?;
        if !ManagementState::same(handle.state(), &self.state) {
            return Err(invalid_argument(
                py,
                format!(
                    "handle {} belongs to another MemoryManagement",
                    handle.id_value()
                ),
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
        let outcome = self.state.try_with(py, |memory| {
            handle.with_slot(|slot| {
                // Checked under the slot lock, so two threads cannot both bind.
                if slot.is_none() {
                    return Bind::Released;
                }
                if handle.bound_size().is_some() {
                    return Bind::AlreadyBound;
                }
                let id = crate::handle::ManagedMemoryId(handle.id_value());
                let bound = memory.bind_located(id, size);
                match bound {
                    Err(error) => Bind::Failed(error),
                    Ok((bound, resource)) => {
                        handle.set_bytes(&resource);
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
                format!("handle {} is already bound", handle.id_value()),
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
        taint::launch(py, &self.state, kernel, reads, writes, fail)
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
        taint::write(py, &self.state, target, start, end)
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
        taint::claim(py, &self.state, target, start, end)
    }

    /// A live view of the error graph.
    fn error_graph(&self) -> PyErrorGraph {
        PyErrorGraph {
            state: Arc::clone(&self.state),
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
                .state
                .with(py, |memory| memory.configuration().clone())?,
        })
    }

    /// The device properties the pools were built for.
    #[getter]
    fn properties(&self, py: Python<'_>) -> PyResult<PyMemoryDeviceProperties> {
        Ok(PyMemoryDeviceProperties {
            inner: self.state.with(py, |memory| *memory.properties())?,
        })
    }

    /// Checks every invariant of every pool; raises AssertionError naming the first
    /// broken one.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let checked = self.state.with(py, |memory| memory.check_invariants())?;
        checked.map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (pools, mode, usage) = self.state.with(py, |memory| {
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
    /// `MemoryManagement.reserve`'s whole body, for any argument: the size parsed,
    /// then [`PyMemoryManagement::reserve_size`] (entered as `METH_O`: [`RESERVE`]).
    fn reserve(slf: &Bound<'_, Self>, size: &Bound<'_, PyAny>) -> PyResult<PyHandle> {
        let size = size_arg(size, "size")?;
        Self::reserve_size(slf, size).map_err(|failure| failure.into_error(slf.py()))
    }

    /// Reserves `size` bytes. Makes no Python object but the handle's reference to
    /// this memory management (a new reference, not a dropped one) and drops none, and
    /// returns a failure as a plain value: so `method_o`'s fast path may run it with
    /// PyO3's attach count at zero.
    fn reserve_size(slf: &Bound<'_, Self>, size: u64) -> Result<PyHandle, ReserveFailure> {
        let py = slf.py();
        // The closure hands the reservation's fields out one by one, and the error
        // apart. Moving the whole `Result` of the handle and its `Resource` out of the
        // lock (and through `map_err`) had the compiler copy it with 16-byte loads
        // right after the 8-byte stores that wrote it: store-forwarding stalls, about
        // 7 % of the reserve + drop step's samples (`perf annotate` of
        // `bench_reserve.py --loop default`), 3-6 ns a step.
        let mut handle = None;
        let (mut bytes, mut address) = (0, 0);
        let mut failed = None;
        let locked = slf
            .get()
            .state
            .try_with(py, |memory| match memory.reserve_located(size) {
                Ok((reserved, resource)) => {
                    handle = Some(reserved);
                    (bytes, address) = (resource.size, resource.address);
                }
                Err(error) => failed = Some(error),
            });
        if let Err(why) = locked {
            return Err(ReserveFailure::Unavailable(why));
        }
        let Some(handle) = handle else {
            // The closure ran (the lock was taken), so it set one of the two.
            debug_assert!(failed.is_some());
            return Err(failed.map_or(
                ReserveFailure::Unavailable(Unavailable::Busy),
                ReserveFailure::Pool,
            ));
        };
        Ok(PyHandle::new(slf.clone().unbind(), handle, bytes, address))
    }

    /// The state every handle and binding of this memory management shares.
    pub(crate) fn state(&self) -> &Arc<ManagementState> {
        &self.state
    }

    /// A memory management over `storage`, as `MemoryManagement(...)` makes it.
    fn build_on(
        py: Python<'_>,
        storage: DeviceStorage,
        configuration: MemoryConfiguration,
        properties: MemoryDeviceProperties,
        mode: &str,
        name: &str,
    ) -> PyResult<Self> {
        let mode = parse_mode(py, mode)?;
        let mut memory = MemoryManagement::from_configuration(storage, properties, configuration)
            .map_err(|e| super::errors::config_error(py, &e, None))?
            .with_name(name);
        memory.set_mode(mode);
        Ok(Self {
            state: Arc::new(ManagementState::new(memory)),
            name: name.to_string(),
        })
    }
}

/// Why a reserve of a parsed size failed, before it is a Python exception (which is
/// built under PyO3's attach: `method_o`).
enum ReserveFailure {
    /// The memory management is busy (re-entered) or poisoned.
    Unavailable(Unavailable),
    /// The pools refused.
    Pool(crate::error::PoolError),
}

impl ReserveFailure {
    /// The exception it raises.
    fn into_error(self, py: Python<'_>) -> PyErr {
        match self {
            Self::Unavailable(why) => unavailable(py, why),
            Self::Pool(error) => pool_error(py, error),
        }
    }
}

/// `MemoryManagement.reserve`, entered as `METH_O` (`method_o`): the hottest call of
/// the binding, with one argument.
pub(crate) static RESERVE: MethodO = MethodO::new(
    c"reserve",
    reserve_entry,
    c"reserve($self, size, /)\n--\n\nReserves `size` bytes (of host or device memory) and returns a handle to them.\n\nThe bytes are not cleared (as numpy.empty's are not): write before reading.\n\nRaises PoolCapacityExceeded, BufferTooBig, OutOfMemory, or InvalidArgument for a\nnegative size.",
);

/// The C entry of [`RESERVE`].
unsafe extern "C" fn reserve_entry(
    slf: *mut pyo3::ffi::PyObject,
    size: *mut pyo3::ffi::PyObject,
) -> *mut pyo3::ffi::PyObject {
    // SAFETY: CPython calls this entry only as the `METH_O` method `RESERVE`
    // installed on `PyMemoryManagement`, with the pointers it was given.
    unsafe {
        method_o::enter_with_size(
            slf,
            size,
            PyMemoryManagement::reserve_size,
            |py, failure: ReserveFailure| failure.into_error(py),
            PyMemoryManagement::reserve,
        )
    }
}

/// Opens a persistent window for the duration of a `with` block.
///
/// Invariant: `open` counts the windows this object opened and has not closed, so an
/// exit closes only a window its own entry opened: a stray `__exit__` (one without its
/// `__enter__`) closed another caller's window, and the other caller's reservations
/// went to the dynamic pools.
#[pyclass(name = "PersistentWindow", module = "cubepool._cubepool", frozen)]
pub(crate) struct PersistentWindow {
    state: Arc<ManagementState>,
    open: AtomicUsize,
}

#[pymethods]
impl PersistentWindow {
    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.state.with(py, |memory| {
            memory.set_mode(MemoryAllocationMode::Persistent);
            self.open.fetch_add(1, Ordering::Relaxed);
        })
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.state.with(py, |memory| {
            // Under the management's lock, as the entry counted it.
            let closed = self
                .open
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if closed.is_ok() {
                memory.set_mode(MemoryAllocationMode::Auto);
            }
        })?;
        Ok(false)
    }
}
