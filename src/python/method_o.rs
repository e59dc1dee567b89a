//! Methods of one argument entered as `METH_O`: CPython hands the function its one
//! argument as it is, where a `#[pymethods]` method is entered through PyO3's
//! fastcall machinery (its trampoline, the attach guard's thread-local count, the
//! argument parser for positional and keyword arguments).
//!
//! Only for the hottest call of the binding, `MemoryManagement.reserve`: a reserve
//! and drop of 4 KiB ran 1,734 instructions, of which PyO3's entry took about 190
//! (callgrind of `benches/python/bench_reserve.py --loop default`: 1,532-1,548
//! now). Such a method takes its argument by position only, as `list.append` does.
//!
//! What PyO3's entry does and this one does not: it counts the thread as attached in
//! PyO3's thread-local count, and applies the reference counts other threads left
//! for the next attached call. Neither is needed for soundness here: the body holds
//! a `Python` token (CPython enters a `METH_O` function with the thread attached),
//! and a `Py` dropped in the body while the count reads zero only has its count
//! changed later, by the next PyO3 entry, instead of now. A panic is caught and
//! raised as PyO3's `PanicException`, as PyO3 does.

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

/// Runs `body` as the body of a `METH_O` method of class `C` returning a new `T`:
/// the result as a new reference, or NULL with the error (or the panic, as
/// `PanicException`) raised.
///
/// # Safety
/// Called only from a `METH_O` entry installed by [`MethodO::install`] on class `C`,
/// with the pointers CPython passed it: CPython calls it attached to the interpreter,
/// with `slf` an instance of `C` (the method's descriptor checks the type of `self`)
/// and `arg` a live object, both borrowed for the call.
pub(crate) unsafe fn enter<C, T>(
    slf: *mut ffi::PyObject,
    arg: *mut ffi::PyObject,
    body: impl FnOnce(&Bound<'_, C>, &Bound<'_, PyAny>) -> PyResult<T>,
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
        body(&slf, &arg).and_then(|value| Bound::new(py, value))
    }));
    let error = match outcome {
        Ok(Ok(object)) => return object.into_ptr(),
        Ok(Err(error)) => error,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_owned());
            PanicException::new_err(message)
        }
    };
    error.restore(py);
    ptr::null_mut()
}
