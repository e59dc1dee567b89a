//! The `Timeline` class: a replay's memory over time, as columns of samples.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::trace::{ReplayResult, Sample};

/// The memory of a replay over time: one sample per run of consecutive events, with
/// the smallest, largest and last bytes in use and reserved of the run (so the exact
/// peaks are kept) and every pool's bytes at the run's end. Columns are lists.
#[pyclass(name = "Timeline", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyTimeline {
    pub(super) result: Arc<ReplayResult>,
}

impl PyTimeline {
    fn column(&self, field: fn(&Sample) -> u64) -> Vec<u64> {
        self.result.samples.iter().map(field).collect()
    }
}

#[pymethods]
impl PyTimeline {
    fn __len__(&self) -> usize {
        self.result.samples.len()
    }
    /// The index of each sample's first event.
    #[getter]
    fn first_event(&self) -> Vec<usize> {
        self.result.samples.iter().map(|s| s.first_event).collect()
    }
    /// The number of events of each sample.
    #[getter]
    fn events(&self) -> Vec<usize> {
        self.result.samples.iter().map(|s| s.events).collect()
    }
    /// The time of each sample's first event, in ns.
    #[getter]
    fn t_start(&self) -> Vec<u64> {
        self.column(|s| s.t_start)
    }
    /// The time of each sample's last event, in ns.
    #[getter]
    fn t_end(&self) -> Vec<u64> {
        self.column(|s| s.t_end)
    }
    /// The fewest bytes in use during each sample.
    #[getter]
    fn in_use_min(&self) -> Vec<u64> {
        self.column(|s| s.in_use_min)
    }
    /// The most bytes in use during each sample.
    #[getter]
    fn in_use_max(&self) -> Vec<u64> {
        self.column(|s| s.in_use_max)
    }
    /// The bytes in use at the end of each sample.
    #[getter]
    fn in_use_end(&self) -> Vec<u64> {
        self.column(|s| s.in_use_end)
    }
    /// The fewest bytes reserved during each sample.
    #[getter]
    fn reserved_min(&self) -> Vec<u64> {
        self.column(|s| s.reserved_min)
    }
    /// The most bytes reserved during each sample.
    #[getter]
    fn reserved_max(&self) -> Vec<u64> {
        self.column(|s| s.reserved_max)
    }
    /// The bytes reserved at the end of each sample.
    #[getter]
    fn reserved_end(&self) -> Vec<u64> {
        self.column(|s| s.reserved_end)
    }
    /// Per pool (routing order), its bytes reserved at the end of each sample.
    #[getter]
    fn pool_reserved(&self) -> Vec<Vec<u64>> {
        self.result
            .pools
            .iter()
            .map(|p| p.reserved_series.clone())
            .collect()
    }
    /// Per pool (routing order), its bytes in use at the end of each sample.
    #[getter]
    fn pool_in_use(&self) -> Vec<Vec<u64>> {
        self.result
            .pools
            .iter()
            .map(|p| p.in_use_series.clone())
            .collect()
    }

    /// The columns as a JSON-ready dict of lists.
    pub(super) fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("first_event", self.first_event())?;
        dict.set_item("events", self.events())?;
        dict.set_item("t_start", self.t_start())?;
        dict.set_item("t_end", self.t_end())?;
        dict.set_item("in_use_min", self.in_use_min())?;
        dict.set_item("in_use_max", self.in_use_max())?;
        dict.set_item("in_use_end", self.in_use_end())?;
        dict.set_item("reserved_min", self.reserved_min())?;
        dict.set_item("reserved_max", self.reserved_max())?;
        dict.set_item("reserved_end", self.reserved_end())?;
        dict.set_item("pool_reserved", self.pool_reserved())?;
        dict.set_item("pool_in_use", self.pool_in_use())?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "<Timeline samples={} pools={}>",
            self.result.samples.len(),
            self.result.pools.len()
        )
    }
}
