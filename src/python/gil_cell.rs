//! Values guarded by the interpreter's global lock instead of a mutex.
//!
//! cubepool's extension is built for the stable ABI (abi3), which free-threaded
//! CPython cannot use; it also declares that it needs the GIL (`gil_used = true`)
//! and refuses to import into an interpreter whose GIL is disabled (the module init
//! checks `sys._is_gil_enabled()`). So every thread that runs its code while attached
//! to the interpreter holds the GIL, and a `Python<'py>` token proves it is attached.
//! Building without abi3 for a free-threaded CPython would need real locks. A
//! [`GilCell`] hands out `&mut T` only inside [`GilCell::with`], which takes such a
//! token, so two threads never reach the value at once.
//!
//! Invariant (what makes `with` sound): the closure never runs Python code, never
//! detaches and never reaches the same cell again, so the GIL is not released while
//! the `&mut T` lives and no second `&mut T` to it can exist. Callers keep closures
//! to plain Rust data moves (a `Vec` push or swap).

use std::cell::{Cell, UnsafeCell};

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

/// Why [`GilLock::with`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// An earlier operation panicked half way: the value may be inconsistent.
    Poisoned,
    /// An operation is in progress: the value was re-entered (from a finalizer run
    /// by that operation, say), which the lock refuses rather than aliasing it.
    Busy,
}

/// A value guarded by the GIL like [`GilCell`], with the checks of a mutex: a
/// closure that (against the module invariant) released the GIL or re-entered the
/// value makes the second access fail with [`Unavailable::Busy`] instead of aliasing,
/// and a panic poisons the value. Taking it costs plain loads and stores, where a
/// mutex costs two atomic read-modify-writes.
pub(crate) struct GilLock<T> {
    busy: Cell<bool>,
    poisoned: Cell<bool>,
    value: UnsafeCell<T>,
}

// SAFETY: `busy`, `poisoned` and `value` are only touched under the GIL (every method
// takes a `Python` token), and `value` only while `busy` is set by the one caller
// that found it clear.
unsafe impl<T: Send> Sync for GilLock<T> {}

/// Clears `busy` when an operation ends, and poisons the lock if a panic that began
/// during the operation ended it (as `std::sync::Mutex` does).
struct Release<'a> {
    busy: &'a Cell<bool>,
    poisoned: &'a Cell<bool>,
    /// Whether the thread was already unwinding when the operation began.
    panicking: bool,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if !self.panicking && std::thread::panicking() {
            self.poisoned.set(true);
        }
        self.busy.set(false);
    }
}

impl<T> GilLock<T> {
    /// A lock holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self {
            busy: Cell::new(false),
            poisoned: Cell::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the value, unless an operation is in progress or one panicked.
    #[inline]
    pub(crate) fn with<R>(
        &self,
        _attached: Python<'_>,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, Unavailable> {
        if self.poisoned.get() {
            return Err(Unavailable::Poisoned);
        }
        if self.busy.replace(true) {
            return Err(Unavailable::Busy);
        }
        let _release = Release {
            busy: &self.busy,
            poisoned: &self.poisoned,
            panicking: std::thread::panicking(),
        };
        // SAFETY: this caller set `busy`, under the GIL; until `_release` clears it no
        // other access to `value` can start, whatever `f` does.
        Ok(f(unsafe { &mut *self.value.get() }))
    }
}
