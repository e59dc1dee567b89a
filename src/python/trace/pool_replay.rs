//! The `PoolReplay` class: what one pool of a layout did during a replay.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::PoolType;
use crate::python::config::{pool_type_repr, PyMemoryPoolOptions, PyPoolType};
use crate::python::management::PyMemoryUsage;
use crate::trace::{PoolReplay, ReplayResult, ReplayedPool, TorchPool};

/// What one pool of a layout did during a replay.
#[pyclass(name = "PoolReplay", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyPoolReplay {
    pub(super) result: Arc<ReplayResult>,
    pub(super) index: usize,
}

impl PyPoolReplay {
    fn pool(&self) -> &PoolReplay {
        &self.result.pools[self.index]
    }

    /// The pool's type, when it is a pool of a layout (not of the torch model).
    fn layout_type(&self) -> Option<&PoolType> {
        match &self.pool().pool {
            ReplayedPool::Layout(options) => Some(&options.pool_type),
            ReplayedPool::Torch(_) => None,
        }
    }

    /// The pool in words, as `pool_type_repr` says a layout's pool.
    fn description(&self) -> String {
        match &self.pool().pool {
            ReplayedPool::Layout(options) => pool_type_repr(&options.pool_type),
            ReplayedPool::Torch(TorchPool::Small) => {
                "torch small pool (requests <= 1 MiB, model)".to_string()
            }
            ReplayedPool::Torch(TorchPool::Large) => {
                "torch large pool (requests > 1 MiB, model)".to_string()
            }
        }
    }
}

#[pymethods]
impl PyPoolReplay {
    /// The pool's index in routing order.
    #[getter]
    fn index(&self) -> usize {
        self.index
    }
    /// "sliced_pages", "exclusive_pages", "direct", "virtual_pages" or "planned"; for the torch
    /// model's pools "torch_small" or "torch_large".
    #[getter]
    fn kind(&self) -> &'static str {
        match &self.pool().pool {
            ReplayedPool::Layout(options) => options.pool_type.kind(),
            ReplayedPool::Torch(TorchPool::Small) => "torch_small",
            ReplayedPool::Torch(TorchPool::Large) => "torch_large",
        }
    }
    /// The pool's effective options (sizes rounded to the alignment); None for the
    /// torch model's pools, which are no layout's.
    #[getter]
    fn options(&self) -> Option<PyMemoryPoolOptions> {
        match &self.pool().pool {
            ReplayedPool::Layout(options) => Some(PyMemoryPoolOptions { inner: *options }),
            ReplayedPool::Torch(_) => None,
        }
    }
    /// The pool's effective type; None for the torch model's pools.
    #[getter]
    fn pool_type(&self) -> Option<PyPoolType> {
        self.layout_type()
            .map(|pool_type| PyPoolType { inner: *pool_type })
    }
    /// Reservations this pool served.
    #[getter]
    fn reservations(&self) -> u64 {
        self.pool().reservations
    }
    /// The most bytes this pool held from the storage at once.
    #[getter]
    fn peak_reserved(&self) -> u64 {
        self.pool().stats.bytes_reserved_peak
    }
    /// The most bytes in use in this pool at once.
    #[getter]
    fn peak_in_use(&self) -> u64 {
        self.pool().stats.bytes_in_use_peak
    }
    /// Pages (storage buffers) held at the end.
    #[getter]
    fn pages(&self) -> u64 {
        self.pool().stats.pages
    }
    /// The most pages held at once.
    #[getter]
    fn pages_peak(&self) -> u64 {
        self.pool().stats.pages_peak
    }
    /// Pages released back to the storage.
    #[getter]
    fn pages_unmapped(&self) -> u64 {
        self.pool().stats.pages_unmapped
    }
    /// The largest reservation served.
    #[getter]
    fn largest_alloc(&self) -> u64 {
        self.pool().stats.largest_alloc
    }
    /// The pool's usage after the last event.
    #[getter]
    fn final_usage(&self) -> PyMemoryUsage {
        PyMemoryUsage {
            inner: self.pool().final_usage,
        }
    }

    /// The pool's figures as a JSON-ready dict.
    pub(super) fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("index", self.index)?;
        dict.set_item("kind", self.kind())?;
        dict.set_item("pool_type", self.description())?;
        let period = match &self.pool().pool {
            ReplayedPool::Layout(options) => options.dealloc_period,
            ReplayedPool::Torch(_) => None,
        };
        dict.set_item("dealloc_period", period)?;
        // The options' text, which `ReplayResult.from_dict` reads back (None for the
        // torch model's pools, which `kind` names).
        let options = match &self.pool().pool {
            ReplayedPool::Layout(options) => Some(options.to_string()),
            ReplayedPool::Torch(_) => None,
        };
        dict.set_item("options", options)?;
        dict.set_item("reservations", self.reservations())?;
        dict.set_item("peak_reserved", self.peak_reserved())?;
        dict.set_item("peak_in_use", self.peak_in_use())?;
        dict.set_item("pages", self.pages())?;
        dict.set_item("pages_peak", self.pages_peak())?;
        dict.set_item("pages_unmapped", self.pages_unmapped())?;
        dict.set_item("largest_alloc", self.largest_alloc())?;
        dict.set_item("final_usage", self.final_usage().to_dict(py)?)?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "<PoolReplay index={} {} reservations={} peak_reserved={} peak_in_use={}>",
            self.index,
            self.description(),
            self.reservations(),
            self.peak_reserved(),
            self.peak_in_use()
        )
    }
}
