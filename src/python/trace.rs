//! Python classes for traces and replay results.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::config::{PyMemoryConfiguration, PyMemoryDeviceProperties};
use super::errors::{config_error, opt_size_arg, trace_error};
use super::management::PyMemoryUsage;
use crate::trace::format::TraceBuilder;
use crate::trace::{replay, ReplayOptions, ReplayResult, Trace, TraceError, TraceHeader};

/// An allocation trace: events in time order, with dense allocation ids.
#[pyclass(name = "Trace", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyTrace {
    pub(crate) inner: Arc<Trace>,
}

#[pymethods]
impl PyTrace {
    /// Builds a trace from `(t_ns, op, id, size)` events (op "alloc" or "free"; size
    /// is ignored for frees) and an optional v1 header dict.
    #[staticmethod]
    #[pyo3(signature = (events, header = None))]
    fn from_events(
        py: Python<'_>,
        events: &Bound<'_, PyAny>,
        header: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let header: TraceHeader = match header {
            Some(header) => {
                let json = py.import("json")?.call_method1("dumps", (header,))?;
                serde_json::from_str(json.extract::<&str>()?).map_err(|e| {
                    trace_error(
                        py,
                        None,
                        TraceError::Parse {
                            line: 1,
                            message: format!("malformed header: {e}"),
                        },
                    )
                })?
            }
            None => TraceHeader::default(),
        };
        let mut builder = TraceBuilder::new(header);
        for (index, event) in events.try_iter()?.enumerate() {
            let (t, op, id, size): (u64, String, u64, u64) = event?.extract()?;
            let result = match op.as_str() {
                "alloc" => builder.alloc(t, id, size),
                "free" => builder.free(t, id),
                other => Err(format!("unknown op {other:?} (expected alloc or free)")),
            };
            result.map_err(|message| {
                trace_error(
                    py,
                    None,
                    TraceError::Parse {
                        line: index + 2,
                        message,
                    },
                )
            })?;
        }
        Ok(Self {
            inner: Arc::new(builder.finish()),
        })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// The largest sum of live allocation sizes at any point.
    #[getter]
    fn peak_live(&self) -> u64 {
        self.inner.peak_live
    }

    /// The number of allocations.
    #[getter]
    fn allocations(&self) -> u32 {
        self.inner.allocations
    }

    /// The workload's name from the header.
    #[getter]
    fn workload(&self) -> &str {
        &self.inner.header.workload
    }

    /// The phases from the header, as (name, first_event) pairs.
    #[getter]
    fn phases(&self) -> Vec<(String, usize)> {
        self.inner
            .header
            .phases
            .iter()
            .map(|p| (p.name.clone(), p.first_event))
            .collect()
    }

    /// The header's fields as a dict.
    #[getter]
    fn header(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let json = serde_json::to_string(&self.inner.header).unwrap_or_else(|_| "{}".into());
        Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
    }

    /// The events as a list of (t_ns, op, id, size) tuples (size 0 for frees).
    fn events(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let list = PyList::empty(py);
        for event in &self.inner.events {
            match *event {
                crate::trace::TraceEvent::Alloc { t, id, size } => {
                    list.append((t, "alloc", id, size))?
                }
                crate::trace::TraceEvent::Free { t, id } => list.append((t, "free", id, 0u64))?,
            }
        }
        Ok(list.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "<Trace workload={:?} events={} allocations={} peak_live={}>",
            self.inner.header.workload,
            self.inner.len(),
            self.inner.allocations,
            self.inner.peak_live
        )
    }
}

/// Reads a cubepool trace v1 file (`.jsonl`, or gzip-compressed).
#[pyfunction]
pub(crate) fn load_trace_v1(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyTrace> {
    let shown = path.display().to_string();
    let trace = py
        .detach(|| Trace::load(&path))
        .map_err(|e| trace_error(py, Some(&shown), e))?;
    Ok(PyTrace {
        inner: Arc::new(trace),
    })
}

/// What a pool layout did with a trace.
#[pyclass(name = "ReplayResult", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyReplayResult {
    inner: ReplayResult,
}

#[pymethods]
impl PyReplayResult {
    /// Events replayed.
    #[getter]
    fn events(&self) -> usize {
        self.inner.events
    }
    /// The most bytes held from the storage at once.
    #[getter]
    fn peak_reserved(&self) -> u64 {
        self.inner.peak_reserved
    }
    /// The most bytes live reservations asked for at once.
    #[getter]
    fn peak_in_use(&self) -> u64 {
        self.inner.peak_in_use
    }
    /// The trace's peak live bytes.
    #[getter]
    fn peak_live(&self) -> u64 {
        self.inner.peak_live
    }
    /// peak_live / peak_reserved.
    #[getter]
    fn utilization(&self) -> f64 {
        self.inner.utilization
    }
    /// 1 - utilization.
    #[getter]
    fn fragmentation(&self) -> f64 {
        1.0 - self.inner.utilization
    }
    /// Wall-clock seconds of the replay loop.
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }
    /// Nanoseconds per event.
    #[getter]
    fn ns_per_event(&self) -> f64 {
        if self.inner.events == 0 {
            0.0
        } else {
            self.inner.seconds * 1e9 / self.inner.events as f64
        }
    }
    /// The usage after the last event.
    #[getter]
    fn final_usage(&self) -> PyMemoryUsage {
        PyMemoryUsage {
            inner: self.inner.final_usage,
        }
    }
    /// Reservations that failed (capacity or memory limit).
    #[getter]
    fn failed_reserves(&self) -> u64 {
        self.inner.failed_reserves
    }
    /// Storage allocations made (each a cudaMalloc on a GPU).
    #[getter]
    fn storage_allocations(&self) -> u64 {
        self.inner.storage_allocations
    }
    /// Storage releases made (each a cudaFree on a GPU).
    #[getter]
    fn storage_frees(&self) -> u64 {
        self.inner.storage_frees
    }

    /// The result as a JSON-ready dict.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let r = &self.inner;
        let dict = PyDict::new(py);
        dict.set_item("events", r.events)?;
        dict.set_item("peak_reserved", r.peak_reserved)?;
        dict.set_item("peak_in_use", r.peak_in_use)?;
        dict.set_item("peak_live", r.peak_live)?;
        dict.set_item("utilization", r.utilization)?;
        dict.set_item("fragmentation", 1.0 - r.utilization)?;
        dict.set_item("seconds", r.seconds)?;
        dict.set_item("ns_per_event", self.ns_per_event())?;
        dict.set_item("failed_reserves", r.failed_reserves)?;
        dict.set_item("storage_allocations", r.storage_allocations)?;
        dict.set_item("storage_frees", r.storage_frees)?;
        dict.set_item("final_usage", self.final_usage().to_dict(py)?)?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        let r = &self.inner;
        format!(
            "ReplayResult(events={}, peak_reserved={}, peak_in_use={}, utilization={:.4}, seconds={:.6})",
            r.events, r.peak_reserved, r.peak_in_use, r.utilization, r.seconds
        )
    }
}

/// Replays `trace` through `config` (the default layout when None) on virtual
/// storage, in Rust with the GIL released. With `limit`, storage past that many bytes
/// fails and the reservations that needed it are counted in `failed_reserves`.
#[pyfunction]
#[pyo3(signature = (trace, config = None, properties = None, *, limit = None))]
pub(crate) fn replay_trace(
    py: Python<'_>,
    trace: &PyTrace,
    config: Option<&PyMemoryConfiguration>,
    properties: Option<&PyMemoryDeviceProperties>,
    limit: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyReplayResult> {
    let configuration = match config {
        Some(config) => config.inner.clone(),
        None => super::config::configured(py)?,
    };
    let properties = properties.map(|p| p.inner).unwrap_or_default();
    let options = ReplayOptions {
        limit: opt_size_arg(limit, "limit")?,
    };
    let trace = Arc::clone(&trace.inner);
    let result = py
        .detach(|| replay(&trace, &configuration, properties, options))
        .map_err(|e| config_error(py, &e, None))?;
    Ok(PyReplayResult { inner: result })
}
