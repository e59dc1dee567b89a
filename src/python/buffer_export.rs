//! The buffer protocol's export side, once for every exporter: handles export their
//! bytes as a flat `'B'` view, tensors add a typed shape on top (`tensor::buffer`).
//!
//! Both fill the view here, so the checks every export needs (a null view, a writable
//! request on read-only bytes, a length that fits `Py_ssize_t`, an address for zero
//! bytes) are written once.

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A byte to point zero-length views at, since zero bytes may have no address.
static EMPTY: u8 = 0;

/// The bytes an export shows.
#[derive(Clone, Copy)]
pub(crate) struct ByteView {
    /// The first byte; may be null or dangling when `len` is 0.
    pub(crate) ptr: *mut u8,
    /// How many bytes.
    pub(crate) len: usize,
    /// Whether consumers may only read them.
    pub(crate) readonly: bool,
}

/// Fills `view` with `bytes` as a flat, C-contiguous `'B'` buffer owned by `owner`
/// (the view holds a new reference to it).
///
/// BufferError for a null view, a writable request on read-only bytes, or more bytes
/// than `Py_ssize_t` counts; the view is untouched then.
///
/// # Safety
///
/// `view` must be null or a valid `Py_buffer` handed to `bf_getbuffer`, and `bytes`
/// must stay valid (and writable unless `readonly`) until the view is released: the
/// exporter keeps them alive for as long as `owner` lives and counts the export.
pub(crate) unsafe fn fill_byte_view(
    view: *mut ffi::Py_buffer,
    owner: &Bound<'_, PyAny>,
    bytes: ByteView,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("View is null"));
    }
    if bytes.readonly && flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err("the memory is read-only"));
    }
    let Ok(len) = ffi::Py_ssize_t::try_from(bytes.len) else {
        return Err(PyBufferError::new_err(format!(
            "{} bytes do not fit in a buffer view",
            bytes.len
        )));
    };
    let ptr = if bytes.len == 0 {
        std::ptr::addr_of!(EMPTY).cast_mut().cast::<c_void>()
    } else {
        bytes.ptr.cast::<c_void>()
    };
    // SAFETY: `view` is a valid Py_buffer (caller contract, checked non-null); `ptr`
    // points at `len` valid bytes (caller contract; the static byte for none), and
    // `owner` is a live object that `PyBuffer_FillInfo` stores with a new reference in
    // `view.obj`. The one failure it can report (writable request on read-only data)
    // was refused above, but a failure is still fetched rather than assumed away.
    let filled = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            ptr,
            len,
            c_int::from(bytes.readonly),
            flags,
        )
    };
    if filled != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// Refuses a buffer view of device memory (BufferError naming the device): the host
/// cannot read a CUDA device's bytes, which `__dlpack__` exports instead.
pub(crate) fn refuse_device_memory(cuda_ordinal: Option<i32>) -> PyResult<()> {
    match cuda_ordinal {
        None => Ok(()),
        Some(ordinal) => Err(PyBufferError::new_err(format!(
            "the handle's bytes are on device cuda:{ordinal}, which the buffer protocol cannot \
             show (it is for host memory); use torch.from_dlpack(handle) or \
             cupy.from_dlpack(handle)"
        ))),
    }
}
