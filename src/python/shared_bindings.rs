//! The `SharedMemoryBindings` class: reservations pinned for another stream.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;

use super::errors::invalid_argument;
use super::handles::Target;
use super::management::ManagementState;
use crate::shared_bindings::SharedMemoryBindings;

/// Reservations pinned for another stream: their memory stays in use until the set is
/// released (`release()`, or the end of a `with` block), even when every handle of
/// them was released first. Made by `MemoryManagement.shared_bindings(...)`.
#[pyclass(name = "SharedMemoryBindings", module = "cubepool._cubepool", frozen)]
pub(crate) struct PySharedMemoryBindings {
    state: Arc<ManagementState>,
    /// `None` once released.
    bindings: Mutex<Option<SharedMemoryBindings>>,
}

impl PySharedMemoryBindings {
    /// An empty set of the memory management `state`.
    pub(crate) fn new(state: Arc<ManagementState>) -> Self {
        Self {
            state,
            bindings: Mutex::new(Some(SharedMemoryBindings::new())),
        }
    }

    /// Runs `f` on the set (`None` once released) with its lock held; `f` must not
    /// call into Python. The set is only pushed to or taken whole, so a poisoned lock
    /// still guards a consistent value.
    fn with<T>(&self, f: impl FnOnce(&mut Option<SharedMemoryBindings>) -> T) -> T {
        let mut bindings = self.bindings.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut bindings)
    }
}

#[pymethods]
impl PySharedMemoryBindings {
    /// Pins one more handle or binding of the same MemoryManagement.
    pub(crate) fn pin(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<()> {
        let binding = Target::of_state(
            target,
            &self.state,
            "shared bindings pin ManagedMemoryHandle or ManagedMemoryBinding objects",
        )?
        .bound_binding(py, "pinning it")?;
        // The binding is dropped after the lock if the set was released.
        let refused = self.with(|bindings| match bindings.as_mut() {
            Some(bindings) => {
                bindings.push(binding);
                None
            }
            None => Some(binding),
        });
        match refused {
            None => Ok(()),
            Some(_) => Err(invalid_argument(
                py,
                "the shared bindings were released".to_string(),
            )),
        }
    }

    /// Unpins everything (the memory is freed once nothing else holds it). Releasing
    /// twice does nothing.
    fn release(&self) {
        let taken = self.with(Option::take);
        drop(taken);
    }

    /// Whether `release()` was called.
    #[getter]
    fn released(&self) -> bool {
        self.with(|bindings| bindings.is_none())
    }

    /// The ids of the pinned reservations.
    #[getter]
    fn ids(&self) -> Vec<u64> {
        self.with(|bindings| {
            bindings.as_ref().map_or_else(Vec::new, |bindings| {
                bindings.bindings().iter().map(|b| b.id().0).collect()
            })
        })
    }

    /// The bytes the pinned bindings hold.
    #[getter]
    fn bytes(&self) -> u64 {
        self.with(|bindings| bindings.as_ref().map_or(0, SharedMemoryBindings::bytes))
    }

    fn __len__(&self) -> usize {
        self.with(|bindings| bindings.as_ref().map_or(0, SharedMemoryBindings::len))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        self.with(|bindings| match bindings.as_ref() {
            Some(bindings) => format!(
                "<SharedMemoryBindings bindings={} bytes={}>",
                bindings.len(),
                bindings.bytes()
            ),
            None => "<SharedMemoryBindings released>".to_string(),
        })
    }
}
