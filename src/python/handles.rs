//! The handle and binding classes, and the one place that tells them apart.
//!
//! Memory safety: every handle holds a reference to its `MemoryManagement` object and
//! every binding an `Arc` of its state, so the host storage (and the bytes of a view)
//! outlives them all. A handle's export counter is changed only by compare-and-swap;
//! `release()` succeeds only when it swaps 0 exports for the released state, so no
//! view outlives the reservation.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;

use super::buffer_export::{fill_byte_view, refuse_device_memory, ByteView};
use super::errors::{handle_released, invalid_argument};
use super::management::{ManagementState, PyMemoryManagement};
use crate::handle::{ManagedMemoryBinding, ManagedMemoryHandle};
use crate::management::Resource;

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
    /// `None` once released. `Drop` takes the handle out, so the field's own drop
    /// (of a `None`, in a lock that holds no resource) is skipped.
    handle: ManuallyDrop<Mutex<Option<ManagedMemoryHandle>>>,
    /// Where the bytes are; set once, when the handle is bound.
    bytes: HandleBytesCell,
    /// `RELEASED`, or the number of live buffer exports. Changed only by CAS.
    exports: AtomicIsize,
}

impl Drop for PyHandle {
    /// Gives the handle back (no lock, no atomic operation, no thread-local lookup):
    /// the memory management frees its reservation now, or at its next operation
    /// while it is busy.
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
            self.memory.get().state().give_back(py, handle);
        }
        // SAFETY: `memory` is not used again; the field's own drop is skipped.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        memory.drop_ref(py);
    }
}

/// Where a handle's bytes are: known when it is made by a reserve (no
/// synchronization needed), or set once by a later bind. (The skin's own type: the
/// core's word for a reservation's place is `Resource`.)
#[derive(Clone)]
enum HandleBytesCell {
    /// Made by a reserve: placed from the start.
    Reserved(HandleBytes),
    /// Made by `mm.handle()`: empty until `mm.bind` fills it, once.
    Bound(OnceLock<HandleBytes>),
}

impl HandleBytesCell {
    fn get(&self) -> Option<&HandleBytes> {
        match self {
            Self::Reserved(bytes) => Some(bytes),
            Self::Bound(cell) => cell.get(),
        }
    }

    /// Sets the bytes of an unbound handle; false when already set.
    fn set(&self, bytes: HandleBytes) -> bool {
        match self {
            Self::Reserved(_) => false,
            Self::Bound(cell) => cell.set(bytes).is_ok(),
        }
    }
}

/// Where a bound handle's bytes are: what a buffer view and `repr` need of the core's
/// `Resource`. Not its pool: a persistent pool's index moves when `install_pools`
/// changes the dynamic pools before it (`mm.resource` says where a handle is now).
#[derive(Clone, Copy)]
struct HandleBytes {
    size: u64,
    /// The address of the first byte; valid while the reservation is held.
    address: usize,
}

impl From<&Resource> for HandleBytes {
    fn from(resource: &Resource) -> Self {
        Self {
            size: resource.size,
            address: resource.address as usize,
        }
    }
}

impl PyHandle {
    /// A handle to a reservation made by a reserve: `size` bytes at `address` (the
    /// fields of its `Resource`, passed one by one: see `PyMemoryManagement::reserve`).
    #[inline(always)]
    pub(crate) fn new(
        memory: Py<PyMemoryManagement>,
        handle: ManagedMemoryHandle,
        size: u64,
        address: u64,
    ) -> Self {
        Self::with_bytes(
            memory,
            handle,
            HandleBytesCell::Reserved(HandleBytes {
                size,
                address: address as usize,
            }),
        )
    }

    /// A handle that names a buffer before memory is bound to it.
    pub(crate) fn unbound(memory: Py<PyMemoryManagement>, handle: ManagedMemoryHandle) -> Self {
        Self::with_bytes(memory, handle, HandleBytesCell::Bound(OnceLock::new()))
    }

    fn with_bytes(
        memory: Py<PyMemoryManagement>,
        handle: ManagedMemoryHandle,
        bytes: HandleBytesCell,
    ) -> Self {
        Self {
            memory: ManuallyDrop::new(memory),
            id: handle.id().0,
            handle: ManuallyDrop::new(Mutex::new(Some(handle))),
            bytes,
            exports: AtomicIsize::new(0),
        }
    }

    /// Runs `f` on the handle's slot (`None` once released) with its lock held; `f`
    /// must not call into Python. The slot is only ever replaced or taken whole, so a
    /// poisoned lock still guards a consistent value.
    pub(crate) fn with_slot<T>(&self, f: impl FnOnce(&mut Option<ManagedMemoryHandle>) -> T) -> T {
        let mut slot = self.handle.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut slot)
    }

    /// `InvalidArgument` for a handle not bound yet, which has no memory for a clone, a
    /// binding or a pin to keep: bound later, it gets a reservation they would not hold.
    pub(crate) fn check_bound(&self, py: Python<'_>, to: &str) -> PyResult<()> {
        if self.bytes.get().is_none() {
            return Err(invalid_argument(
                py,
                format!("handle {} is not bound yet; bind it before {to}", self.id),
            ));
        }
        Ok(())
    }

    /// Runs `f` on the core handle; HandleReleased once released.
    pub(crate) fn with_handle<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&ManagedMemoryHandle) -> T,
    ) -> PyResult<T> {
        let result = self.with_slot(|slot| slot.as_ref().map(f));
        result.ok_or_else(|| handle_released(py))
    }

    /// Records where the bytes of a freshly bound handle are; false when it was bound
    /// already. Called by `mm.bind` under the handle's slot lock.
    pub(crate) fn set_bytes(&self, resource: &Resource) -> bool {
        self.bytes.set(HandleBytes::from(resource))
    }

    /// The state of the memory management that made this handle.
    pub(crate) fn state(&self) -> &Arc<ManagementState> {
        self.memory.get().state()
    }

    /// The reservation's id.
    pub(crate) fn id_value(&self) -> u64 {
        self.id
    }

    /// The bound size, or None while unbound.
    pub(crate) fn bound_size(&self) -> Option<u64> {
        self.bytes.get().map(|b| b.size)
    }

    /// Whether `release()` was called.
    pub(crate) fn released(&self) -> bool {
        self.exports.load(Ordering::Acquire) == RELEASED
    }

    /// Counts one more buffer export; HandleReleased once released.
    fn add_export(&self, py: Python<'_>) -> PyResult<()> {
        let mut current = self.exports.load(Ordering::Acquire);
        loop {
            if current == RELEASED {
                return Err(handle_released(py));
            }
            match self.exports.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => current = actual,
            }
        }
    }

    /// Counts one buffer export fewer.
    fn drop_export(&self) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
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
        self.bytes.get().is_some()
    }

    /// Whether this is the only handle to the reservation (bindings do not count).
    #[getter]
    fn can_mut(&self, py: Python<'_>) -> PyResult<bool> {
        // Give back the handles of dead or released Python objects first (a dropped or
        // released clone), so the answer is CubeCL's at once, not after the memory
        // management's next operation. A busy (re-entered) memory management keeps
        // them for later; the answer is then conservative.
        let _ = self.state().try_with(py, |_| ());
        self.with_handle(py, ManagedMemoryHandle::can_mut)
    }

    /// Whether `release()` was called.
    #[getter(released)]
    fn py_released(&self) -> bool {
        self.released()
    }

    /// A binding to the same reservation; it keeps the memory in use. A handle not bound
    /// yet has no memory to keep: refused (`InvalidArgument`), as a clone of it is.
    fn binding(&self, py: Python<'_>) -> PyResult<PyBinding> {
        self.check_bound(py, "taking a binding of it")?;
        let binding = self.with_handle(py, ManagedMemoryHandle::binding)?;
        Ok(PyBinding {
            owner: Arc::clone(self.state()),
            binding,
        })
    }

    /// Another handle to the same reservation.
    fn clone(&self, py: Python<'_>) -> PyResult<PyHandle> {
        self.check_bound(py, "cloning")?;
        let handle = self.with_handle(py, ManagedMemoryHandle::clone)?;
        Ok(PyHandle::with_bytes(
            self.memory.clone_ref(py),
            handle,
            self.bytes.clone(),
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
                    self.state().give_back(py, handle);
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
        match self.bytes.get() {
            Some(bytes) => format!(
                "<ManagedMemoryHandle id={} size={}{state}>",
                self.id, bytes.size
            ),
            None => format!("<ManagedMemoryHandle id={} unbound{state}>", self.id),
        }
    }

    /// The bytes as a 1-D uint8 DLPack tensor on the handle's device (see
    /// `cuda_dlpack`).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = super::args::dlpack_max_version)] max_version: Option<(u64, u64)>,
        #[pyo3(from_py_with = super::args::dlpack_device)] dl_device: Option<(i32, i32)>,
        #[pyo3(from_py_with = super::args::dlpack_copy)] copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let state = slf.get().state();
        super::cuda_dlpack::export_handle(slf.as_any(), state, stream, max_version, dl_device, copy)
    }

    /// `(device_type, device_id)`: `(2, N)` (kDLCUDA) for `cuda:N`, `(1, 0)` on the host.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let device = super::cuda_dlpack::dlpack_device(self.state());
        (device.device_type, device.device_id)
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
        refuse_device_memory(this.state().cuda_ordinal())?;
        this.add_export(py)?;
        let Some(bytes) = this.bytes.get().copied() else {
            this.drop_export();
            return Err(invalid_argument(
                py,
                "the handle is not bound to memory (call mm.bind(handle, size))".to_string(),
            ));
        };
        let bytes = ByteView {
            ptr: bytes.address as *mut u8,
            len: bytes.size as usize,
            readonly: false,
        };
        // SAFETY: `view` is a valid Py_buffer from CPython. The bytes stay reserved
        // while the export count is positive (release() refuses then) and the
        // `memory` reference keeps their storage alive; the view holds a strong
        // reference to `slf`, so the handle outlives the view.
        let filled = unsafe { fill_byte_view(view, slf.as_any(), bytes, flags) };
        if filled.is_err() {
            this.drop_export();
        }
        filled
    }

    /// # Safety
    /// Called by CPython once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.drop_export();
    }
}

/// A binding of a reservation, as a launch would hold it: it keeps the memory in use
/// but does not count as a handle for `can_mut`.
#[pyclass(name = "ManagedMemoryBinding", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyBinding {
    /// Keeps the storage alive until the binding's release is processed.
    pub(crate) owner: Arc<ManagementState>,
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

/// A handle or a binding: what `resource`, `shared_bindings`, `launch`, `write`,
/// `claim` and `ErrorGraph.report` accept. The only place that asks "which is it?".
pub(crate) enum Target<'a, 'py> {
    /// A `ManagedMemoryHandle`.
    Handle(&'a Bound<'py, PyHandle>),
    /// A `ManagedMemoryBinding`.
    Binding(&'a Bound<'py, PyBinding>),
}

impl<'a, 'py> Target<'a, 'py> {
    /// `object` as a handle or binding; TypeError with `expected` as its message for
    /// anything else.
    pub(crate) fn of(object: &'a Bound<'py, PyAny>, expected: &'static str) -> PyResult<Self> {
        if let Ok(handle) = object.cast::<PyHandle>() {
            Ok(Self::Handle(handle))
        } else if let Ok(binding) = object.cast::<PyBinding>() {
            Ok(Self::Binding(binding))
        } else {
            Err(PyTypeError::new_err(expected))
        }
    }

    /// [`Target::of`], refusing (InvalidArgument) a handle or binding of another memory
    /// management than `state`: ids mean nothing outside the one that minted them.
    pub(crate) fn of_state(
        object: &'a Bound<'py, PyAny>,
        state: &Arc<ManagementState>,
        expected: &'static str,
    ) -> PyResult<Self> {
        let target = Self::of(object, expected)?;
        let (owner, what) = match &target {
            Self::Handle(handle) => (handle.get().state(), "handle"),
            Self::Binding(binding) => (&binding.get().owner, "binding"),
        };
        if !ManagementState::same(owner, state) {
            return Err(invalid_argument(
                object.py(),
                format!("{what} {} belongs to another MemoryManagement", target.id()),
            ));
        }
        Ok(target)
    }

    /// The reservation's id.
    pub(crate) fn id(&self) -> u64 {
        match self {
            Self::Handle(handle) => handle.get().id,
            Self::Binding(binding) => binding.get().binding.id().0,
        }
    }

    /// A new binding of the target's reservation, for what `to` names (a pin, an
    /// export, a lookup): `InvalidArgument` for a handle not bound yet (see
    /// [`PyHandle::check_bound`]), which has no bytes. A binding of one kept past the
    /// call would hold its descriptor while `bind` gives the same id to the handle's
    /// reservation, and its release would then clear that reservation's books in the
    /// error graph (its failures).
    pub(crate) fn bound_binding(&self, py: Python<'_>, to: &str) -> PyResult<ManagedMemoryBinding> {
        if let Self::Handle(handle) = self {
            handle.get().check_bound(py, to)?;
        }
        self.binding(py)
    }

    /// A new binding of the target's reservation; HandleReleased for a released handle.
    pub(crate) fn binding(&self, py: Python<'_>) -> PyResult<ManagedMemoryBinding> {
        match self {
            Self::Handle(handle) => handle.get().with_handle(py, ManagedMemoryHandle::binding),
            Self::Binding(binding) => Ok(binding.get().binding.clone()),
        }
    }
}
