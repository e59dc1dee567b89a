//! Buffer protocol: exporting tensors (`__getbuffer__`, a typed shape over the one byte
//! export of `python::buffer_export`) and borrowing other objects' buffers as tensor
//! backing.

use std::ffi::{c_int, c_void, CStr};
use std::sync::Arc;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::python::buffer_export::{fill_byte_view, ByteView};
use crate::tensor::storage::Backing;
use crate::tensor::{DataType, Device, Tensor, TensorError};

/// Bytes of another Python object, held through a buffer export for as long as the backing
/// lives. `owner` is the object itself (the export also holds a reference to it); the export
/// is released first, then the owner.
pub(crate) struct PyBufferBacking {
    buffer: PyUntypedBuffer,
    _owner: Py<PyAny>,
}

impl PyBufferBacking {
    /// Acquires a C-contiguous buffer export of `obj` whose items are plain numbers or
    /// bytes ([`is_plain_buffer_format`](crate::tensor::is_plain_buffer_format)).
    ///
    /// A 0-d export (a numpy scalar or 0-d array: no shape, which pyo3 refuses) is taken
    /// through a flat byte view of it (`memoryview(obj).cast("B")`, its owner then), once
    /// its item format is checked; an object with no export is refused naming `op`.
    pub(crate) fn acquire(obj: &Bound<'_, PyAny>, op: &'static str) -> PyResult<Self> {
        let (buffer, owner) = match PyUntypedBuffer::get(obj) {
            Ok(buffer) => (buffer, obj.clone()),
            Err(error) => match zero_dim_bytes(obj, op)? {
                Some(flat) => (PyUntypedBuffer::get(&flat)?, flat),
                None => {
                    return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                        "{op}: its source ({}) exports no buffer cubepool can read ({})",
                        crate::python::errors::type_name(obj),
                        error.value(obj.py())
                    )))
                }
            },
        };
        if !buffer.is_c_contiguous() {
            return Err(TensorError::NotContiguous { op }.into());
        }
        let format = buffer.format().to_bytes();
        if !crate::tensor::is_plain_buffer_format(format) {
            return Err(TensorError::NotPlainBuffer {
                op,
                format: String::from_utf8_lossy(format).into_owned(),
            }
            .into());
        }
        Ok(PyBufferBacking {
            buffer,
            _owner: owner.unbind(),
        })
    }

    /// As a backing shared by tensors.
    pub(crate) fn into_backing(self) -> Arc<dyn Backing> {
        Arc::new(self)
    }
}

// SAFETY: the buffer protocol guarantees that the exported memory (`buf`, `len` bytes,
// writable unless `readonly`) stays valid and in place until the export is released, which
// happens only when this value is dropped (`PyUntypedBuffer::drop`). The export is
// C-contiguous (checked in `acquire`), so the `len` bytes from `buf` are exactly its bytes.
unsafe impl Backing for PyBufferBacking {
    fn as_ptr(&self) -> *mut u8 {
        self.buffer.buf_ptr().cast()
    }
    fn len(&self) -> usize {
        self.buffer.len_bytes()
    }
    fn readonly(&self) -> bool {
        self.buffer.readonly()
    }
}

/// A flat byte view of `obj` where it exports a 0-d buffer of plain items; `None` where
/// it exports no buffer or one of another kind.
fn zero_dim_bytes<'py>(
    obj: &Bound<'py, PyAny>,
    op: &'static str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Ok(view) = pyo3::types::PyMemoryView::from(obj) else {
        return Ok(None);
    };
    if view.getattr("ndim")?.extract::<usize>()? != 0 {
        return Ok(None);
    }
    let format: String = view.getattr("format")?.extract()?;
    if !crate::tensor::is_plain_buffer_format(format.as_bytes()) {
        return Err(TensorError::NotPlainBuffer { op, format }.into());
    }
    Ok(Some(view.call_method1("cast", ("B",))?))
}

/// A `uint8[len]` tensor over the buffer of `obj`.
pub(crate) fn tensor_over_buffer(obj: &Bound<'_, PyAny>, op: &'static str) -> PyResult<Tensor> {
    let backing = PyBufferBacking::acquire(obj, op)?.into_backing();
    let len = i64::try_from(backing.len()).unwrap_or(i64::MAX);
    Ok(Tensor::from_backing(
        backing,
        0,
        &[len],
        DataType::UINT8,
        Device::CPU0,
    )?)
}

/// The struct-module format string of one lane, nul-terminated.
fn format_cstr(dtype: DataType) -> &'static CStr {
    match dtype.format_char() {
        "b" => c"b",
        "h" => c"h",
        "i" => c"i",
        "q" => c"q",
        "H" => c"H",
        "I" => c"I",
        "Q" => c"Q",
        "e" => c"e",
        "f" => c"f",
        "d" => c"d",
        "?" => c"?",
        _ => c"B",
    }
}

/// Shape and strides of one export; freed in `__releasebuffer__`.
struct ExportLayout {
    shape: Vec<ffi::Py_ssize_t>,
    strides: Vec<ffi::Py_ssize_t>,
}

/// Fills `view` for `tensor`, owned by `owner` (the Python tensor object, which the view
/// keeps alive).
///
/// A consumer that asks for shape and format (numpy, memoryview) gets a typed,
/// C-contiguous n-d view (vector lanes become a last axis; bfloat16 is exported as `'H'`,
/// its raw 16 bits); any other request gets the raw bytes as a 1-d `'B'` view.
///
/// # Safety
///
/// `view` must be a valid `Py_buffer` pointer handed to `bf_getbuffer`.
pub(crate) unsafe fn fill_view(
    owner: &Bound<'_, PyAny>,
    tensor: &Tensor,
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    let dtype = tensor.dtype();
    let typed =
        flags & ffi::PyBUF_ND == ffi::PyBUF_ND && flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT;
    let layout = if typed {
        Some(Box::new(typed_layout(tensor, flags)?))
    } else {
        None
    };
    let bytes = ByteView {
        ptr: tensor.data_ptr(),
        len: tensor.nbytes(),
        readonly: tensor.readonly(),
    };
    // SAFETY: `view` comes from `bf_getbuffer` (caller contract); the view holds a
    // reference to `owner`, the Python tensor, which keeps its backing (and so these
    // bytes) alive until the view is released.
    unsafe { fill_byte_view(view, owner, bytes, flags)? };
    if let Some(mut layout) = layout {
        // SAFETY: `view` was just filled; the shape and strides arrays live in a heap block
        // owned by `view.internal` until `release_view` frees it, and the format string is
        // static.
        unsafe {
            (*view).itemsize = dtype.lane_bytes() as ffi::Py_ssize_t;
            (*view).format = format_cstr(dtype).as_ptr().cast_mut();
            (*view).ndim = layout.shape.len() as c_int;
            (*view).shape = layout.shape.as_mut_ptr();
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                layout.strides.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            };
            (*view).internal = Box::into_raw(layout).cast::<c_void>();
        }
    }
    Ok(())
}

/// The shape and C-contiguous strides of a typed export of `tensor` (vector lanes as a
/// last axis); BufferError past 64 dimensions or for a Fortran-contiguous request it
/// cannot meet.
fn typed_layout(tensor: &Tensor, flags: c_int) -> PyResult<ExportLayout> {
    let dtype = tensor.dtype();
    let itemsize = dtype.lane_bytes();
    let mut shape: Vec<ffi::Py_ssize_t> = tensor
        .shape()
        .iter()
        .map(|&d| d as ffi::Py_ssize_t)
        .collect();
    if dtype.lanes != 1 {
        shape.push(dtype.lanes as ffi::Py_ssize_t);
    }
    if shape.len() > 64 {
        return Err(PyBufferError::new_err(format!(
            "a tensor of {} dimensions cannot be exported (the buffer protocol allows 64)",
            shape.len()
        )));
    }
    let mut strides = vec![itemsize as ffi::Py_ssize_t; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1].saturating_mul(shape[axis + 1].max(1));
    }
    let f_contiguous = shape.iter().filter(|&&d| d > 1).count() <= 1;
    if flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS && !f_contiguous {
        return Err(PyBufferError::new_err(
            "the tensor is not Fortran-contiguous",
        ));
    }
    Ok(ExportLayout { shape, strides })
}

/// Frees what [`fill_view`] allocated for `view`.
///
/// # Safety
///
/// `view` must be a view filled by [`fill_view`] and released only once.
pub(crate) unsafe fn release_view(view: *mut ffi::Py_buffer) {
    if view.is_null() {
        return;
    }
    // SAFETY: `view` is valid (caller contract); `internal` is either null (byte views) or
    // the `ExportLayout` box that `fill_view` leaked, freed here exactly once.
    unsafe {
        let internal = (*view).internal;
        if !internal.is_null() {
            (*view).internal = std::ptr::null_mut();
            drop(Box::from_raw(internal.cast::<ExportLayout>()));
        }
    }
}
