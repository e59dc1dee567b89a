//! The C entry points PyTorch's `CUDAPluggableAllocator` loads from the extension
//! (`cubepool_torch_alloc`, `cubepool_torch_free`, with its signatures), and the one
//! process-wide allocator behind them.
//!
//! An entry point never unwinds into C: a failure is NULL from alloc (nothing from
//! free), with the error kept for [`last_error`], counted in [`error_counts`] and
//! written to stderr. PyTorch (2.x) does not check the pointer alloc returns, so a
//! failed allocation is not a Python `OutOfMemoryError` there.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::allocator::{AllocError, DeviceAllocator};

/// The allocator the entry points serve (`None` until installed).
static ALLOCATOR: Mutex<Option<Box<dyn DeviceAllocator>>> = Mutex::new(None);

/// The last error of an entry point, and how many of each kind so far.
static ERRORS: Mutex<ErrorLog> = Mutex::new(ErrorLog {
    last: None,
    counts: Vec::new(),
});

struct ErrorLog {
    last: Option<String>,
    counts: Vec<(&'static str, u64)>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks (the bodies are caught, and every
    // change is a single assignment), so a poisoned lock still guards a valid value.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The kind of an error, as [`error_counts`] names it.
fn kind(error: &AllocError) -> &'static str {
    match error {
        AllocError::NotConfigured => "not_configured",
        AllocError::WrongDevice { .. } => "wrong_device",
        AllocError::BadSize { .. } => "bad_size",
        AllocError::Pool(_) => "alloc_failed",
        AllocError::UnknownPointer { .. } => "unknown_pointer",
        AllocError::DoubleFree { .. } => "double_free",
        AllocError::SizeMismatch { .. } => "size_mismatch",
        AllocError::AddressTaken { .. } => "address_taken",
        AllocError::Event { .. } => "event_failed",
    }
}

/// Counts and keeps `error`, and writes it to stderr: PyTorch's pluggable allocator
/// does not check what alloc returns, so a NULL from a failed allocation surfaces
/// later as an illegal memory access, and this line is the only word of its cause.
///
/// A write that fails (stderr a closed pipe, as under `| head`, or a full disk) is
/// passed over: `eprintln!` panics there, and a panic leaving an `extern "C"` entry
/// point aborts the process. The error is still counted and kept.
fn log(error: &AllocError) {
    let _ = writeln!(std::io::stderr().lock(), "cubepool.torch: {error}");
    record(kind(error), error.to_string());
}

/// Counts one error of `kind` and keeps `message` as the last.
fn record(kind: &'static str, message: String) {
    let mut errors = lock(&ERRORS);
    match errors.counts.iter_mut().find(|(k, _)| *k == kind) {
        Some((_, count)) => *count += 1,
        None => errors.counts.push((kind, 1)),
    }
    errors.last = Some(message);
}

/// Installs `allocator` behind the entry points. Refused (the allocator is given
/// back) while the one installed has live allocations: their frees would reach the
/// wrong allocator.
pub fn install(allocator: Box<dyn DeviceAllocator>) -> Result<(), usize> {
    let mut slot = lock(&ALLOCATOR);
    if let Some(current) = slot.as_ref() {
        let live = current.live();
        if live > 0 {
            return Err(live);
        }
    }
    *slot = Some(allocator);
    drop(slot);
    let mut errors = lock(&ERRORS);
    errors.last = None;
    errors.counts.clear();
    Ok(())
}

/// Runs `f` on the installed allocator; [`AllocError::NotConfigured`] without one.
pub fn with_allocator<T>(f: impl FnOnce(&mut dyn DeviceAllocator) -> T) -> Result<T, AllocError> {
    let mut slot = lock(&ALLOCATOR);
    match slot.as_deref_mut() {
        Some(allocator) => Ok(f(allocator)),
        None => Err(AllocError::NotConfigured),
    }
}

/// The last error of an entry point since the allocator was installed.
pub fn last_error() -> Option<String> {
    lock(&ERRORS).last.clone()
}

/// How many errors of each kind the entry points met since the allocator was
/// installed (`unknown_pointer`, `double_free`, `alloc_failed`, ...).
pub fn error_counts() -> Vec<(&'static str, u64)> {
    lock(&ERRORS).counts.clone()
}

/// Runs an entry point's body: no unwinding into C, errors logged (the logging too runs
/// where a panic is caught).
fn guarded<T>(fallback: T, body: impl FnOnce() -> Result<T, AllocError>) -> T {
    match catch_unwind(AssertUnwindSafe(|| body().map_err(|error| log(&error)))) {
        Ok(Ok(value)) => value,
        Ok(Err(())) => fallback,
        Err(_) => {
            record(
                "panic",
                "cubepool's allocator panicked (a bug; please report it)".into(),
            );
            fallback
        }
    }
}

/// PyTorch's `alloc_fn`: `void* alloc(ssize_t size, int device, cudaStream_t stream)`.
/// NULL when the allocation fails (see [`last_error`]) and for zero bytes.
#[no_mangle]
pub extern "C" fn cubepool_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let address = with_allocator(|a| a.alloc(size as i64, device, stream as u64))??;
        Ok(address as *mut c_void)
    })
}

/// PyTorch's `free_fn`: `void free(void* ptr, ssize_t size, int device, cudaStream_t
/// stream)`, with the size and stream of the allocation. A NULL pointer does nothing.
#[no_mangle]
pub extern "C" fn cubepool_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    guarded((), || {
        with_allocator(|a| a.free(ptr as u64, size as i64, device, stream as u64))?
    });
}
