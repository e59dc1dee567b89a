//! DLPack: exporting tensors as capsules (`__dlpack__`) and importing any producer
//! (`from_dlpack`) without copying.
//!
//! Exports hold an `Arc` of the tensor's backing in the managed tensor's context, so the
//! memory outlives the capsule and the consumer. The capsule destructor calls the deleter
//! only if no consumer took the capsule (renamed it `used_…`). Imports take ownership of the
//! producer's managed tensor and call its deleter when the last tensor using it is dropped.

use std::any::Any;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

use crate::tensor::array::{is_compact, row_major_strides};
use crate::tensor::storage::Backing;
use crate::tensor::{byte_size, DataType, Device, Tensor, TensorError};

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";

/// Most dimensions an imported tensor may have: as many as any tensor
/// ([`crate::tensor::MAX_NDIM`], numpy's), so that what is imported can be exported and
/// saved and read back.
const MAX_IMPORT_NDIM: i32 = crate::tensor::MAX_NDIM as i32;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED` (DLPack 1.1): the producer's elements of a
/// type narrower than a byte take a byte each; without it they are packed.
const FLAG_SUBBYTE_PADDED: u64 = 1 << 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// One of DLPack's two managed-tensor layouts, with its capsule names: everything the
/// export and import paths need to know of which one they handle, so each path is
/// written once.
trait ManagedLayout: Sized {
    /// The capsule's name while nobody took it.
    const NAME: &'static CStr;
    /// The name a consumer gives the capsule when it takes it.
    const USED_NAME: &'static CStr;

    /// A managed tensor around `dl_tensor`, with `deleter` and (versioned only) `flags`;
    /// its context pointer is null until [`ManagedLayout::set_ctx`].
    fn new(dl_tensor: DLTensor, flags: u64, deleter: unsafe extern "C" fn(*mut Self)) -> Self;

    /// Sets the pointer the deleter finds its context by.
    fn set_ctx(&mut self, ctx: *mut c_void);

    /// The context pointer.
    fn ctx(&self) -> *mut c_void;

    /// The producer's deleter.
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;

    /// The tensor described.
    fn dl_tensor(&self) -> &DLTensor;

    /// The DLPack flags (none for the legacy layout).
    fn flags(&self) -> u64;

    /// BufferError for a layout version this crate does not read.
    fn check_version(&self) -> PyResult<()>;
}

impl ManagedLayout for DLManagedTensor {
    const NAME: &'static CStr = DLTENSOR;
    const USED_NAME: &'static CStr = USED_DLTENSOR;

    fn new(dl_tensor: DLTensor, _flags: u64, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        Self {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        }
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn dl_tensor(&self) -> &DLTensor {
        &self.dl_tensor
    }
    fn flags(&self) -> u64 {
        0
    }
    fn check_version(&self) -> PyResult<()> {
        Ok(())
    }
}

impl ManagedLayout for DLManagedTensorVersioned {
    const NAME: &'static CStr = DLTENSOR_VERSIONED;
    const USED_NAME: &'static CStr = USED_DLTENSOR_VERSIONED;

    fn new(dl_tensor: DLTensor, flags: u64, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        Self {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
            flags,
            dl_tensor,
        }
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn dl_tensor(&self) -> &DLTensor {
        &self.dl_tensor
    }
    fn flags(&self) -> u64 {
        self.flags
    }
    fn check_version(&self) -> PyResult<()> {
        if self.version.major != 1 {
            return Err(PyBufferError::new_err(format!(
                "from_dlpack: DLPack version {}.{} is not supported",
                self.version.major, self.version.minor
            )));
        }
        Ok(())
    }
}

/// What an exported managed tensor owns. `managed` is the first field, so a pointer to
/// the context is a pointer to the managed tensor; its context pointer points back to
/// it.
#[repr(C)]
struct ExportCtx<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Keeps the bytes alive: a tensor's backing, or a handle's binding.
    _owner: Box<dyn Any + Send>,
}

/// Drops an export context, attached to the interpreter when it still runs (the backing
/// may hold Python objects); leaks it during interpreter shutdown instead of touching a
/// finalised interpreter.
fn drop_attached<T>(value: T) {
    let mut slot = Some(value);
    let _ = catch_unwind(AssertUnwindSafe(|| {
        Python::try_attach(|_py| drop(slot.take()));
    }));
    if let Some(value) = slot {
        std::mem::forget(value);
    }
}

/// The deleter of an exported managed tensor of layout `M`.
unsafe extern "C" fn delete_export<M: ManagedLayout>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` is the first field of an `ExportCtx<M>` leaked by `export_as`
    // (its context pointer points to that box); DLPack calls the deleter once.
    let ctx = unsafe { Box::from_raw((*managed).ctx().cast::<ExportCtx<M>>()) };
    drop_attached(ctx);
}

/// The destructor of a capsule of layout `M`: calls the deleter unless a consumer took
/// the capsule.
unsafe extern "C" fn destroy_capsule<M: ManagedLayout>(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the capsule being destroyed. A consumer that took the
    // capsule renamed it, so `IsValid` fails and the consumer owns the deleter call; `IsValid`
    // never sets an exception. A valid capsule of this name holds an `M` (`export_as`).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()).cast::<M>();
            if !managed.is_null() {
                if let Some(deleter) = (*managed).deleter() {
                    deleter(managed);
                }
            }
        }
    }
}

/// What an export shows: the bytes, their device and type, and what keeps them alive.
pub(crate) struct RawExport {
    /// The first byte (a device pointer for device memory).
    pub(crate) data: *mut u8,
    /// Where the bytes are.
    pub(crate) device: Device,
    /// The element type.
    pub(crate) dtype: DataType,
    /// The shape, and its strides in elements.
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Vec<i64>,
    /// Keeps the bytes alive until the consumer's deleter runs.
    pub(crate) owner: Box<dyn Any + Send>,
}

fn dl_tensor(export: &RawExport, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
    DLTensor {
        data: export.data.cast(),
        device: DLDevice {
            device_type: export.device.device_type,
            device_id: export.device.device_id,
        },
        ndim: shape.len() as i32,
        dtype: DLDataType {
            code: export.dtype.code,
            bits: export.dtype.bits,
            lanes: export.dtype.lanes,
        },
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    }
}

/// Builds the capsule for `tensor`: versioned (DLPack 1.0, flags 0 when writable) or legacy.
pub(crate) fn export<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    versioned: bool,
    copied: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if versioned {
        let mut flags = 0;
        if tensor.readonly() {
            flags |= FLAG_READ_ONLY;
        }
        if copied {
            flags |= FLAG_IS_COPIED;
        }
        export_as::<DLManagedTensorVersioned>(py, tensor, flags)
    } else {
        if tensor.readonly() {
            return Err(PyBufferError::new_err(
                "cannot export a read-only tensor through a legacy DLPack capsule, which cannot \
                 signal read-only; ask for max_version=(1, 0)",
            ));
        }
        export_as::<DLManagedTensor>(py, tensor, 0)
    }
}

/// The capsule of layout `M` for `tensor`, holding its backing until the deleter runs.
fn export_as<'py, M: ManagedLayout>(
    py: Python<'py>,
    tensor: &Tensor,
    flags: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let raw = RawExport {
        data: tensor.data_ptr(),
        device: tensor.device(),
        dtype: tensor.dtype(),
        shape: tensor.shape().to_vec(),
        strides: tensor.strides(),
        owner: Box::new(tensor.backing().clone()),
    };
    export_raw::<M>(py, raw, flags)
}

/// The capsule of layout `M` for `raw`, holding its owner until the deleter runs.
fn export_raw<'py, M: ManagedLayout>(
    py: Python<'py>,
    raw: RawExport,
    flags: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let mut shape = raw.shape.clone();
    let mut strides = raw.strides.clone();
    let managed = M::new(
        dl_tensor(&raw, &mut shape, &mut strides),
        flags,
        delete_export::<M>,
    );
    let ctx = Box::into_raw(Box::new(ExportCtx {
        managed,
        shape,
        strides,
        _owner: raw.owner,
    }));
    // SAFETY: `ctx` is a live box just leaked; the shape and strides pointers stored in
    // `dl_tensor` point into its vectors' heap blocks, which did not move with the box.
    // If the capsule cannot be made, nobody else saw the pointer and we free it here.
    unsafe {
        (*ctx).managed.set_ctx(ctx.cast());
        let raw = ffi::PyCapsule_New(ctx.cast(), M::NAME.as_ptr(), Some(destroy_capsule::<M>));
        if raw.is_null() {
            delete_export::<M>(ctx.cast());
        }
        Bound::from_owned_ptr_or_err(py, raw)
    }
}

/// A capsule for `raw` (writable bytes): versioned (DLPack 1.0) or legacy.
pub(crate) fn export_bytes<'py>(
    py: Python<'py>,
    raw: RawExport,
    versioned: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if versioned {
        export_raw::<DLManagedTensorVersioned>(py, raw, 0)
    } else {
        export_raw::<DLManagedTensor>(py, raw, 0)
    }
}

/// Implements `Tensor.__dlpack__`'s keyword rules.
pub(crate) fn dlpack_method<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<(u64, u64)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(stream) = stream {
        if !stream.is_none() {
            return Err(PyBufferError::new_err(
                "cubepool tensors live on the CPU: only stream=None is supported",
            ));
        }
    }
    if let Some((device_type, device_id)) = dl_device {
        let here = tensor.device();
        if (device_type, device_id) != (here.device_type, here.device_id) {
            return Err(PyBufferError::new_err(format!(
                "cannot export a tensor on {here} to device ({device_type}, {device_id})"
            )));
        }
    }
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    if copy == Some(true) {
        let fresh = tensor.copy_to(tensor.device())?;
        return export(py, &fresh, versioned, true);
    }
    export(py, tensor, versioned, false)
}

/// Calls the deleter of a managed tensor of layout `M`, given as an untyped pointer.
///
/// # Safety
///
/// `managed` must point to a live `M` whose deleter has not been called.
unsafe fn call_deleter<M: ManagedLayout>(managed: *mut c_void) {
    let managed = managed.cast::<M>();
    // SAFETY: `managed` is a live `M` (caller contract).
    unsafe {
        if let Some(deleter) = (*managed).deleter() {
            deleter(managed);
        }
    }
}

/// Bytes of an imported DLPack tensor.
struct ImportedBacking {
    data: *mut u8,
    len: usize,
    readonly: bool,
    /// The producer's managed tensor, owned since the capsule was renamed.
    managed: *mut c_void,
    /// [`call_deleter`] for the managed tensor's layout.
    delete: unsafe fn(*mut c_void),
}

// SAFETY: DLPack hands the consumer ownership of the managed tensor, which may be released
// from any thread (producers such as numpy take the GIL in their deleter; we call it while
// attached anyway). The data is plain bytes reached only through raw copies.
unsafe impl Send for ImportedBacking {}
// SAFETY: as above; shared access only reads the pointer values.
unsafe impl Sync for ImportedBacking {}

// SAFETY: the producer keeps `data` (`len` bytes, checked against shape and dtype when
// imported) valid until its deleter runs, which happens only in `drop`.
unsafe impl Backing for ImportedBacking {
    fn as_ptr(&self) -> *mut u8 {
        self.data
    }
    fn len(&self) -> usize {
        self.len
    }
    fn readonly(&self) -> bool {
        self.readonly
    }
}

impl Drop for ImportedBacking {
    fn drop(&mut self) {
        // SAFETY: we own the managed tensor (the capsule was renamed `used_…` when we
        // took it), so calling its deleter once, here, is the consumer's duty; `delete`
        // is `call_deleter` for its layout.
        let call = || unsafe { (self.delete)(self.managed) };
        // During interpreter shutdown the producer's memory is leaked rather than released
        // without an interpreter.
        let _ = catch_unwind(AssertUnwindSafe(|| Python::try_attach(|_py| call())));
    }
}

/// The fields of a producer's `DLTensor`, checked.
struct Imported {
    data: *mut u8,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: DataType,
    nbytes: usize,
}

/// Reads and checks a producer's tensor before taking ownership of it.
///
/// # Safety
///
/// `t` must point to a live `DLTensor` whose `shape` (and `strides`, when not null) point to
/// `ndim` values.
unsafe fn read_dl_tensor(t: *const DLTensor) -> PyResult<Imported> {
    // SAFETY: `t` is live (caller contract).
    let t = unsafe { &*t };
    if t.device.device_type != crate::tensor::device::CPU {
        let name = crate::tensor::device_type_to_str(t.device.device_type).unwrap_or("unknown");
        return Err(PyBufferError::new_err(format!(
            "from_dlpack: the tensor is on device {name} (type {}), cubepool imports CPU \
             tensors only",
            t.device.device_type
        )));
    }
    if !(0..=MAX_IMPORT_NDIM).contains(&t.ndim) || (t.ndim > 0 && t.shape.is_null()) {
        return Err(PyValueError::new_err(format!(
            "from_dlpack: invalid ndim {} (at most {MAX_IMPORT_NDIM})",
            t.ndim
        )));
    }
    let ndim = t.ndim as usize;
    let shape = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: `shape` points to `ndim` values (caller contract), checked non-null.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    let strides = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: as for `shape`.
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec())
    };
    let dtype = DataType::new(t.dtype.code, t.dtype.bits, t.dtype.lanes)?;
    let nbytes = byte_size(&shape, dtype)?;
    let data = (t.data as *mut u8).wrapping_add(t.byte_offset as usize);
    if data.is_null() && nbytes > 0 {
        return Err(PyValueError::new_err(
            "from_dlpack: the tensor's data pointer is null",
        ));
    }
    Ok(Imported {
        data,
        shape,
        strides,
        dtype,
        nbytes,
    })
}

/// Refuses a type narrower than a byte unless the producer says its elements take a byte
/// each (`flags` of a versioned capsule; a legacy one has none).
///
/// cubepool holds `uint1` (the old encoding of bool) as a byte an element, while DLPack
/// 1.1 makes packed bits the default for such types: `n` packed elements are `n / 8`
/// bytes, and reading them as `n` bytes would run past the producer's memory.
fn check_subbyte_padded(bits: u8, flags: u64) -> PyResult<()> {
    if bits >= 8 || flags & FLAG_SUBBYTE_PADDED != 0 {
        return Ok(());
    }
    Err(PyBufferError::new_err(format!(
        "from_dlpack: a {bits}-bit dtype may be packed (DLPack's default for types narrower \
         than a byte) and cubepool holds a byte an element; it imports one only from a \
         versioned capsule with the flag DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED set \
         (export bool as kDLBool, 8 bits)"
    )))
}

/// Copies a strided producer tensor into a fresh compact one.
///
/// # Safety
///
/// Every element addressed by `imp.shape` and `imp.strides` from `imp.data` must be
/// readable (the producer's promise for a live tensor).
unsafe fn gather(imp: &Imported, strides: &[i64]) -> PyResult<Tensor> {
    let out = Tensor::empty(&imp.shape, imp.dtype, Device::CPU0)?;
    let item = imp.dtype.itemsize();
    let count = out.numel();
    let dst = out.data_ptr();
    let mut index = vec![0i64; imp.shape.len()];
    for element in 0..count {
        let mut offset: isize = 0;
        for (&i, &s) in index.iter().zip(strides) {
            offset = offset.wrapping_add((i as isize).wrapping_mul(s as isize));
        }
        let src = imp.data.wrapping_offset(offset.wrapping_mul(item as isize));
        // SAFETY: `src` addresses one element of the producer's tensor (caller contract);
        // `dst` is the fresh tensor's `count * item` bytes, which nothing else reaches yet.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst.add(element * item), item);
        }
        for axis in (0..index.len()).rev() {
            index[axis] += 1;
            if index[axis] < imp.shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    Ok(out)
}

/// Takes ownership of the capsule's managed tensor and wraps it as a tensor.
fn import_capsule(capsule: &Bound<'_, PyAny>, copy: Option<bool>) -> PyResult<Tensor> {
    let ptr = capsule.as_ptr();
    // SAFETY: `ptr` is a live object; `IsValid` checks the name and sets no exception.
    let valid = |name: &CStr| unsafe { ffi::PyCapsule_IsValid(ptr, name.as_ptr()) } == 1;
    if valid(DLTENSOR_VERSIONED) {
        import_as::<DLManagedTensorVersioned>(capsule, copy)
    } else if valid(DLTENSOR) {
        import_as::<DLManagedTensor>(capsule, copy)
    } else {
        Err(PyValueError::new_err(
            "from_dlpack: not a DLPack capsule, or one already consumed",
        ))
    }
}

/// [`import_capsule`] for a valid, untaken capsule of layout `M`.
fn import_as<M: ManagedLayout>(capsule: &Bound<'_, PyAny>, copy: Option<bool>) -> PyResult<Tensor> {
    let ptr = capsule.as_ptr();
    // SAFETY: `ptr` is a live capsule named `M::NAME` (checked by the caller), so it
    // holds a live `M` from its producer, whose `dl_tensor` describes live memory.
    let (managed, imported, flags) = unsafe {
        let m = ffi::PyCapsule_GetPointer(ptr, M::NAME.as_ptr()).cast::<M>();
        if m.is_null() {
            return Err(PyErr::fetch(capsule.py()));
        }
        (*m).check_version()?;
        // The type first: one cubepool cannot hold at all says so, padded or not.
        let imported = read_dl_tensor((*m).dl_tensor())?;
        check_subbyte_padded((*m).dl_tensor().dtype.bits, (*m).flags())?;
        (m, imported, (*m).flags())
    };
    let compact = imported
        .strides
        .as_deref()
        .is_none_or(|s| is_compact(&imported.shape, s));
    if !compact && copy == Some(false) {
        return Err(PyBufferError::new_err(
            "from_dlpack: the tensor is not compact row-major and copy=False forbids a copy",
        ));
    }
    // Take ownership: renaming the capsule tells its destructor (and anyone else) that the
    // deleter is now ours to call.
    // SAFETY: `ptr` is a live capsule; the name is a static string.
    if unsafe { ffi::PyCapsule_SetName(ptr, M::USED_NAME.as_ptr()) } != 0 {
        return Err(PyErr::fetch(capsule.py()));
    }
    let backing = ImportedBacking {
        data: imported.data,
        len: imported.nbytes,
        readonly: flags & FLAG_READ_ONLY != 0,
        managed: managed.cast(),
        delete: call_deleter::<M>,
    };
    if compact && copy != Some(true) {
        let shape = imported.shape.clone();
        return Ok(Tensor::from_backing(
            Arc::new(backing),
            0,
            &shape,
            imported.dtype,
            Device::CPU0,
        )?);
    }
    let strides = match &imported.strides {
        Some(s) if !compact => s.clone(),
        _ => row_major_strides(&imported.shape),
    };
    // SAFETY: the producer's tensor is live until `backing` (which owns it) drops below.
    let out = unsafe { gather(&imported, &strides) };
    drop(backing);
    out
}

/// `cubepool.from_dlpack`: imports any DLPack producer (or a raw capsule).
pub(crate) fn from_dlpack(
    x: &Bound<'_, PyAny>,
    device: Option<Device>,
    copy: Option<bool>,
) -> PyResult<Tensor> {
    if let Some(device) = device {
        device.require_cpu()?;
    }
    if x.is_instance_of::<PyCapsule>() {
        return import_capsule(x, copy);
    }
    if !x.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "from_dlpack: {} does not implement __dlpack__",
            x.get_type().name()?
        )));
    }
    if x.hasattr("__dlpack_device__")? {
        let (device_type, device_id): (i32, i32) =
            x.call_method0("__dlpack_device__")?.extract()?;
        if device_type != crate::tensor::device::CPU {
            let dev = Device {
                device_type,
                device_id,
            };
            return Err(TensorError::UnsupportedDevice { device: dev }.into());
        }
    }
    let py = x.py();
    let kwargs = [("max_version", PyTuple::new(py, [1u32, 0])?)];
    let capsule = match x.call_method(
        "__dlpack__",
        (),
        Some(&pyo3::types::IntoPyDict::into_py_dict(kwargs, py)?),
    ) {
        Ok(c) => c,
        // A producer older than DLPack 1.0 does not know max_version.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => x.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    import_capsule(&capsule, copy)
}
