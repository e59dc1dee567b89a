//! Methods of one argument entered as `METH_O`: CPython hands the function its one
//! argument as it is, where a `#[pymethods]` method is entered through PyO3's
//! fastcall machinery (its trampoline, the attach guard's thread-local count, the
//! argument parser for positional and keyword arguments).
//!
//! Only for the hottest call of the binding, `MemoryManagement.reserve`: a reserve
//! and drop of 4 KiB ran 1,734 instructions, of which PyO3's entry took about 190 and
//! the size's extraction about 70 (callgrind of `benches/python/bench_reserve.py
//! --loop default`: 1,480-1,497 now). Such a method takes its argument by position
//! only, as `list.append` does.
//!
//! What PyO3's entry does and the fast path does not: it counts the thread as
//! attached in PyO3's thread-local count. With that count at zero, a `Py` dropped
//! is leaked in this build (`.cargo/config.toml` disables PyO3's reference pool), and
//! a `PyErr` made and dropped leaks its objects. So [`enter_with_size`] runs with the
//! count at zero only a fast path written to make no `PyErr` and drop no `Py` (an
//! exact `int` read through the C API, then a body that returns its failure as a
//! plain value); the failure's exception, any other argument (the method's whole
//! body), the error of a failed allocation of the result and a panic (raised as
//! PyO3's `PanicException`, as PyO3 does) run counted as attached ([`counted`]). (The
//! value whose allocation failed is dropped inside `Bound::new`, uncounted: the
//! handle's `Drop` gives its `Py` back with `drop_ref`, which decrements at once.)
//! `tests/python/test_management.py` checks that refused sizes, failed reserves and a
//! size whose `__index__` raises leak nothing, and a reserve at shutdown.

use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::PyClass;

/// The C entry of a `METH_O` method: `(self, argument) -> result or NULL`.
pub(crate) type Entry =
    unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// A `METH_O` method's definition, kept for the life of the process (CPython keeps a
/// pointer to it in the method's descriptor).
pub(crate) struct MethodO(ffi::PyMethodDef);

// SAFETY: the definition is never written after it is made; CPython only reads it
// (its name and doc strings are static, its entry a plain function).
unsafe impl Sync for MethodO {}

impl MethodO {
    /// The definition of method `name`, entered at `entry`, documented by `doc`
    /// (which starts with its text signature: `name($self, arg, /)\n--\n\n`).
    pub(crate) const fn new(name: &'static CStr, entry: Entry, doc: &'static CStr) -> Self {
        Self(ffi::PyMethodDef {
            ml_name: name.as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunction: entry },
            ml_flags: ffi::METH_O,
            ml_doc: doc.as_ptr(),
        })
    }

    /// Adds the method to class `ty` (replacing an attribute of its name).
    pub(crate) fn install(&'static self, ty: &Bound<'_, PyType>) -> PyResult<()> {
        let py = ty.py();
        // SAFETY: `self` lives for the process and is never written, so CPython may
        // keep the pointer (it casts it to mutable but only reads it); `ty` is a live
        // type object.
        let descriptor = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                ffi::PyDescr_NewMethod(ty.as_type_ptr(), ptr::from_ref(&self.0).cast_mut()),
            )?
        };
        // SAFETY: `ml_name` is the `CStr` given to `new`.
        let name = unsafe { CStr::from_ptr(self.0.ml_name) };
        ty.setattr(
            String::from_utf8_lossy(name.to_bytes()).as_ref(),
            descriptor,
        )
    }
}

/// `arg`'s value when it is an exact `int` (not a subclass: `bool` is one) that fits
/// in 64 bits; `None`, with no error left set, otherwise.
///
/// # Safety
/// `arg` is a live object and the thread is attached with no error set (as CPython
/// calls a method).
unsafe fn exact_u64(arg: *mut ffi::PyObject) -> Option<u64> {
    // SAFETY: `arg` is live and the thread attached (the caller's contract).
    unsafe {
        if ffi::PyLong_CheckExact(arg) == 0 {
            return None;
        }
        let value = ffi::PyLong_AsUnsignedLongLong(arg);
        if value == u64::MAX && !ffi::PyErr_Occurred().is_null() {
            // Negative or past 64 bits: the full body names it.
            ffi::PyErr_Clear();
            return None;
        }
        Some(value)
    }
}

/// Runs a `METH_O` method of class `C` whose argument is a size and whose result is a
/// new `T`: the result as a new reference, or NULL with the error raised.
///
/// When the argument is an exact `int` that fits in 64 bits, `fast` runs with it, with
/// PyO3's attach count possibly at zero: it must make no `PyErr` and drop no `Py` (the
/// module doc), and returns its failure as a plain value, which `failed` turns into
/// the error counted as attached ([`counted`]). Any other argument goes to `full`, the
/// method's whole body, counted as attached.
///
/// # Safety
/// Called only from a `METH_O` entry installed by [`MethodO::install`] on class `C`,
/// with the pointers CPython passed it: CPython calls it attached to the interpreter
/// with no error set, with `slf` an instance of `C` (the method's descriptor checks the
/// type of `self`; the class cannot be subclassed) and `arg` a live object, both
/// borrowed for the call.
pub(crate) unsafe fn enter_with_size<C, T, F>(
    slf: *mut ffi::PyObject,
    arg: *mut ffi::PyObject,
    fast: impl FnOnce(&Bound<'_, C>, u64) -> Result<T, F>,
    failed: impl FnOnce(Python<'_>, F) -> PyErr,
    full: impl FnOnce(&Bound<'_, C>, &Bound<'_, PyAny>) -> PyResult<T>,
) -> *mut ffi::PyObject
where
    C: PyClass,
    T: PyClass + Into<pyo3::PyClassInitializer<T>>,
{
    // SAFETY: CPython runs a method's C function attached to the interpreter.
    let py = unsafe { Python::assume_attached() };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: both pointers are live borrowed references for the call, and
        // `slf` is an instance of `C` (the caller's contract).
        let slf = unsafe { Borrowed::from_ptr(py, slf).cast_unchecked::<C>() };
        let arg = unsafe { Borrowed::from_ptr(py, arg) };
        // SAFETY: `arg` is live, the thread attached with no error set.
        let Some(size) = (unsafe { exact_u64(arg.as_ptr()) }) else {
            return counted(py, |py| {
                match full(&slf, &arg).and_then(|value| Bound::new(py, value)) {
                    Ok(object) => object.into_ptr(),
                    Err(error) => raise(py, error),
                }
            });
        };
        match fast(&slf, size) {
            // The allocation makes no `PyErr` unless it fails (for memory).
            Ok(value) => match Bound::new(py, value) {
                Ok(object) => object.into_ptr(),
                Err(error) => counted(py, |py| raise(py, error)),
            },
            Err(failure) => counted(py, |py| raise(py, failed(py, failure))),
        }
    }));
    outcome.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with no message".to_owned());
        counted(py, |py| raise(py, PanicException::new_err(message)))
    })
}

/// Runs `f` with the thread counted as attached by PyO3 (`Python::try_attach`: on a
/// thread that holds the GIL, `PyGILState_Ensure` only counts, and so does PyO3), so
/// that what `f` drops is given back at once. Once the interpreter shuts down (after
/// the `atexit` handlers, `Py_IsInitialized` reads 0) PyO3 does not attach, and
/// `Python::attach` would panic; `f` runs uncounted, and what it drops is leaked with
/// the rest of the process's objects (the build's leak flag, `.cargo/config.toml`).
fn counted(py: Python<'_>, f: impl FnOnce(Python<'_>) -> *mut ffi::PyObject) -> *mut ffi::PyObject {
    let mut f = Some(f);
    // `f` runs once: in the first closure when PyO3 attaches, else in the second.
    Python::try_attach(|py| f.take().map_or(ptr::null_mut(), |f| f(py)))
        .unwrap_or_else(|| f.take().map_or(ptr::null_mut(), |f| f(py)))
}

/// Raises `error` and returns the NULL a method returns with it.
fn raise(py: Python<'_>, error: PyErr) -> *mut ffi::PyObject {
    error.restore(py);
    ptr::null_mut()
}
