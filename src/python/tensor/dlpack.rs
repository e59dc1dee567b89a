//! DLPack: exporting tensors as capsules (`__dlpack__`) and importing any producer
//! (`from_dlpack`) without copying.
//!
//! Exports hold an `Arc` of the tensor's backing in the managed tensor's context, so the
//! memory outlives the capsule and the consumer. The capsule destructor calls the deleter
//! only if no consumer took the capsule (renamed it `used_…`). Imports take ownership of the
//! producer's managed tensor and call its deleter when the last tensor using it is dropped.

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

/// Most dimensions an imported tensor may have (numpy allows 64).
const MAX_IMPORT_NDIM: i32 = 1024;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;

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

/// What an exported managed tensor owns. `managed` is the first field, so a pointer to
/// the context is a pointer to the managed tensor; `manager_ctx` points back to it.
#[repr(C)]
struct ExportCtx<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _owner: Arc<dyn Backing>,
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

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` is the first field of an `ExportCtx` leaked by `export` (its
    // `manager_ctx` points to that box); DLPack calls the deleter once.
    let ctx = unsafe { Box::from_raw((*managed).manager_ctx.cast::<ExportCtx<DLManagedTensor>>()) };
    drop_attached(ctx);
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`, for the versioned layout.
    let ctx = unsafe {
        Box::from_raw(
            (*managed)
                .manager_ctx
                .cast::<ExportCtx<DLManagedTensorVersioned>>(),
        )
    };
    drop_attached(ctx);
}

unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the capsule being destroyed. A consumer that took the
    // capsule renamed it, so `IsValid` fails and the consumer owns the deleter call; `IsValid`
    // never sets an exception.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            let managed = managed.cast::<DLManagedTensor>();
            if !managed.is_null() {
                if let Some(deleter) = (*managed).deleter {
                    deleter(managed);
                }
            }
        }
    }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy_capsule`, for the versioned name and layout.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED.as_ptr());
            let managed = managed.cast::<DLManagedTensorVersioned>();
            if !managed.is_null() {
                if let Some(deleter) = (*managed).deleter {
                    deleter(managed);
                }
            }
        }
    }
}

fn dl_tensor(tensor: &Tensor, shape: &mut [i64], strides: &mut [i64]) -> DLTensor {
    let dtype = tensor.dtype();
    let device = tensor.device();
    DLTensor {
        data: tensor.data_ptr().cast(),
        device: DLDevice {
            device_type: device.device_type,
            device_id: device.device_id,
        },
        ndim: shape.len() as i32,
        dtype: DLDataType {
            code: dtype.code,
            bits: dtype.bits,
            lanes: dtype.lanes,
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
    let mut shape = tensor.shape().to_vec();
    let mut strides = tensor.strides();
    let owner = tensor.backing().clone();
    let capsule = if versioned {
        let mut flags = 0;
        if tensor.readonly() {
            flags |= FLAG_READ_ONLY;
        }
        if copied {
            flags |= FLAG_IS_COPIED;
        }
        let managed = DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor: dl_tensor(tensor, &mut shape, &mut strides),
        };
        let ctx = Box::into_raw(Box::new(ExportCtx {
            managed,
            shape,
            strides,
            _owner: owner,
        }));
        // SAFETY: `ctx` is a live box just leaked; the shape and strides pointers stored in
        // `dl_tensor` point into its vectors' heap blocks, which did not move with the box.
        // If the capsule cannot be made, nobody else saw the pointer and we free it here.
        unsafe {
            (*ctx).managed.manager_ctx = ctx.cast();
            let raw = ffi::PyCapsule_New(
                ctx.cast(),
                DLTENSOR_VERSIONED.as_ptr(),
                Some(destroy_versioned_capsule),
            );
            if raw.is_null() {
                delete_versioned(ctx.cast());
            }
            Bound::from_owned_ptr_or_err(py, raw)?
        }
    } else {
        if tensor.readonly() {
            return Err(PyBufferError::new_err(
                "cannot export a read-only tensor through a legacy DLPack capsule, which cannot \
                 signal read-only; ask for max_version=(1, 0)",
            ));
        }
        let managed = DLManagedTensor {
            dl_tensor: dl_tensor(tensor, &mut shape, &mut strides),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        let ctx = Box::into_raw(Box::new(ExportCtx {
            managed,
            shape,
            strides,
            _owner: owner,
        }));
        // SAFETY: as in the versioned branch.
        unsafe {
            (*ctx).managed.manager_ctx = ctx.cast();
            let raw =
                ffi::PyCapsule_New(ctx.cast(), DLTENSOR.as_ptr(), Some(destroy_legacy_capsule));
            if raw.is_null() {
                delete_legacy(ctx.cast());
            }
            Bound::from_owned_ptr_or_err(py, raw)?
        }
    };
    Ok(capsule)
}

/// Implements `Tensor.__dlpack__`'s keyword rules.
pub(crate) fn dlpack_method<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<(u32, u32)>,
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

/// Ownership of an imported managed tensor; calls the producer's deleter when dropped.
enum Managed {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

/// Bytes of an imported DLPack tensor.
struct ImportedBacking {
    data: *mut u8,
    len: usize,
    readonly: bool,
    managed: Managed,
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
        let call = || {
            // SAFETY: we own the managed tensor (the capsule was renamed `used_…` when we
            // took it), so calling its deleter once, here, is the consumer's duty.
            unsafe {
                match self.managed {
                    Managed::Legacy(m) => {
                        if let Some(deleter) = (*m).deleter {
                            deleter(m);
                        }
                    }
                    Managed::Versioned(m) => {
                        if let Some(deleter) = (*m).deleter {
                            deleter(m);
                        }
                    }
                }
            }
        };
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
            "from_dlpack: invalid ndim {}",
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
    // SAFETY: `ptr` is a live object; the capsule functions check names themselves and only
    // `GetPointer` (called for a valid name) could fail.
    let (managed, imported, flags) = unsafe {
        if ffi::PyCapsule_IsValid(ptr, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(ptr, DLTENSOR_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if m.is_null() {
                return Err(PyErr::fetch(capsule.py()));
            }
            if (*m).version.major != 1 {
                return Err(PyBufferError::new_err(format!(
                    "from_dlpack: DLPack version {}.{} is not supported",
                    (*m).version.major,
                    (*m).version.minor
                )));
            }
            let imported = read_dl_tensor(&raw const (*m).dl_tensor)?;
            (Managed::Versioned(m), imported, (*m).flags)
        } else if ffi::PyCapsule_IsValid(ptr, DLTENSOR.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(ptr, DLTENSOR.as_ptr()).cast::<DLManagedTensor>();
            if m.is_null() {
                return Err(PyErr::fetch(capsule.py()));
            }
            let imported = read_dl_tensor(&raw const (*m).dl_tensor)?;
            (Managed::Legacy(m), imported, 0)
        } else {
            return Err(PyValueError::new_err(
                "from_dlpack: not a DLPack capsule, or one already consumed",
            ));
        }
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
    let used = match managed {
        Managed::Legacy(_) => USED_DLTENSOR,
        Managed::Versioned(_) => USED_DLTENSOR_VERSIONED,
    };
    // SAFETY: `ptr` is a live capsule; the name is a static string.
    if unsafe { ffi::PyCapsule_SetName(ptr, used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(capsule.py()));
    }
    let backing = ImportedBacking {
        data: imported.data,
        len: imported.nbytes,
        readonly: flags & FLAG_READ_ONLY != 0,
        managed,
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
