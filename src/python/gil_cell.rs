//! A value guarded by the interpreter's global lock instead of a mutex.
//!
//! cubepool's extension module declares that it needs the GIL (`gil_used = true`),
//! so even a free-threaded CPython keeps the GIL enabled once it is imported (and
//! the stable-ABI build cannot target free-threaded CPython at all): every thread
//! that runs its code while attached to the interpreter holds the GIL, and a
//! `Python<'py>` token proves it is attached. A
//! [`GilCell`] hands out `&mut T` only inside [`GilCell::with`], which takes such a
//! token, so two threads never reach the value at once.
//!
//! Invariant (what makes `with` sound): the closure never runs Python code, never
//! detaches and never reaches the same cell again, so the GIL is not released while
//! the `&mut T` lives and no second `&mut T` to it can exist. Callers keep closures
//! to plain Rust data moves (a `Vec` push or swap).

use std::cell::UnsafeCell;

use pyo3::Python;

/// A value only touched by threads attached to the interpreter, one at a time.
pub(crate) struct GilCell<T>(UnsafeCell<T>);

// SAFETY: every access goes through `with`, under the GIL (module docs).
unsafe impl<T: Send> Sync for GilCell<T> {}

impl<T> GilCell<T> {
    /// A cell holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self(UnsafeCell::new(value))
    }

    /// Runs `f` on the value. `f` must not run Python code, detach, or use this cell
    /// (the module invariant).
    #[inline]
    pub(crate) fn with<R>(&self, _attached: Python<'_>, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: the token proves this thread holds the GIL, which no other thread
        // holds at the same time; `f` keeps it held and does not re-enter the cell.
        f(unsafe { &mut *self.0.get() })
    }
}
