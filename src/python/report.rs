//! Python classes for pool reports, records and their plans: plain data with
//! equality, a readable `repr`, `to_dict()` for JSON and a table as `str()`.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::config::{PyMemoryConfiguration, PyMemoryPoolOptions};
use super::errors::{invalid_argument, plan_error};
use super::management::PyMemoryUsage;
use super::pickling::{reduce_by, Reduced};
use crate::report::{human_size, MemoryPoolKind, MemoryPoolReport, MemoryRecord, MemoryReport};

/// A JSON value as the Python object `json.loads` would make.
pub(crate) fn json_to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any().unbind(),
            (_, Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (_, _, Some(f)) => f.into_pyobject(py)?.into_any().unbind(),
            _ => py.None(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, json_to_py(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}

/// `value` as a dict (through its serde form).
fn to_dict<T: Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    let json = serde_json::to_value(value)
        .map_err(|e| invalid_argument(py, format!("cannot convert to a dict: {e}")))?;
    json_to_py(py, &json)
}

/// A value of type `T` from a dict laid out as `to_dict()` writes it.
fn from_dict<T: DeserializeOwned>(data: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    let py = data.py();
    if !data.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(format!(
            "{what}.from_dict() takes a dict as to_dict() writes it"
        )));
    }
    let text: String = py
        .import("json")?
        .call_method1("dumps", (data,))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| invalid_argument(py, format!("not a {what} dict: {e}")))
}

/// The shape of one pool, with its effective configuration: `type` is "sliced",
/// "exclusive", "direct", "virtual" or "persistent"; fields that do not apply are None.
#[pyclass(
    name = "MemoryPoolKind",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryPoolKind {
    inner: MemoryPoolKind,
}

#[pymethods]
impl PyMemoryPoolKind {
    /// "sliced", "exclusive", "direct", "virtual", "planned" or "persistent".
    #[getter]
    fn r#type(&self) -> &'static str {
        match self.inner {
            MemoryPoolKind::Sliced { .. } => "sliced",
            MemoryPoolKind::Exclusive { .. } => "exclusive",
            MemoryPoolKind::Direct { .. } => "direct",
            MemoryPoolKind::Virtual { .. } => "virtual",
            MemoryPoolKind::Planned { .. } => "planned",
            MemoryPoolKind::Persistent => "persistent",
        }
    }

    /// The page size of a sliced pool.
    #[getter]
    fn page_size(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Sliced { page_size, .. } => Some(page_size),
            _ => None,
        }
    }

    /// The largest slice of a sliced pool.
    #[getter]
    fn max_slice_size(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Sliced { max_slice_size, .. } => Some(max_slice_size),
            _ => None,
        }
    }

    /// The cap of a sliced pool, if it has one.
    #[getter]
    fn max_pool_size(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Sliced { max_pool_size, .. } => max_pool_size,
            _ => None,
        }
    }

    /// The largest reservation of an exclusive pool.
    #[getter]
    fn max_alloc_size(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Exclusive { max_alloc_size } => Some(max_alloc_size),
            _ => None,
        }
    }

    /// The watermark of a direct pool, if it has one.
    #[getter]
    fn reclaim_at(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Direct { reclaim_at } => reclaim_at,
            _ => None,
        }
    }

    /// The granule of a virtual pool.
    #[getter]
    fn granule(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Virtual { granule, .. } | MemoryPoolKind::Planned { granule } => {
                Some(granule)
            }
            _ => None,
        }
    }

    /// The idle mapped bytes a virtual pool keeps for reuse (None also for a
    /// virtual pool bounded only by its high-water mark).
    #[getter]
    fn keep(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Virtual { keep, .. } => keep,
            _ => None,
        }
    }

    /// The largest request a virtual pool places in its range of small requests.
    #[getter]
    fn small(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Virtual { small, .. } => Some(small),
            _ => None,
        }
    }

    /// The bytes of address space of each range of a virtual pool.
    #[getter]
    fn range(&self) -> Option<u64> {
        match self.inner {
            MemoryPoolKind::Virtual { range, .. } => Some(range),
            _ => None,
        }
    }

    /// The kind as a JSON-ready dict (`{"type": "sliced", "page_size": ..., ...}`).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_dict(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        format!("MemoryPoolKind({})", self.inner)
    }

    /// The pool as the configuration language writes it.
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}

/// One pool's shape, usage and high-water marks.
#[pyclass(
    name = "MemoryPoolReport",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryPoolReport {
    inner: MemoryPoolReport,
}

#[pymethods]
impl PyMemoryPoolReport {
    /// The pool's shape and effective configuration.
    #[getter]
    fn kind(&self) -> PyMemoryPoolKind {
        PyMemoryPoolKind {
            inner: self.inner.kind,
        }
    }

    /// The pool's usage now.
    #[getter]
    fn usage(&self) -> PyMemoryUsage {
        PyMemoryUsage {
            inner: self.inner.usage,
        }
    }

    /// Pages (storage buffers) held now.
    #[getter]
    fn pages(&self) -> u64 {
        self.inner.pages
    }

    /// The most pages held at once since the peaks were reset.
    #[getter]
    fn pages_peak(&self) -> u64 {
        self.inner.pages_peak
    }

    /// Pages released back to the storage so far.
    #[getter]
    fn pages_unmapped(&self) -> u64 {
        self.inner.pages_unmapped
    }

    /// The largest reservation served since the peaks were reset, in bytes asked for.
    #[getter]
    fn largest_alloc(&self) -> u64 {
        self.inner.largest_alloc
    }

    /// Reservations between periodic releases of free pages, or None.
    #[getter]
    fn dealloc_period(&self) -> Option<u64> {
        self.inner.dealloc_period
    }

    /// The most bytes held from the storage at once since the peaks were reset.
    #[getter]
    fn bytes_reserved_peak(&self) -> u64 {
        self.inner.bytes_reserved_peak
    }

    /// The most bytes of live reservations at once since the peaks were reset.
    #[getter]
    fn bytes_in_use_peak(&self) -> u64 {
        self.inner.bytes_in_use_peak
    }

    /// The options that build this pool again, or None for the persistent pool (no
    /// configuration lists it) and a planned pool (its kind keeps no plan file).
    fn options(&self) -> Option<PyMemoryPoolOptions> {
        self.inner
            .options()
            .map(|inner| PyMemoryPoolOptions { inner })
    }

    /// The report as a JSON-ready dict.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_dict(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        let r = &self.inner;
        let opt = |v: Option<u64>| v.map_or("None".to_string(), |v| v.to_string());
        format!(
            "MemoryPoolReport(kind={}, number_allocs={}, bytes_in_use={}, bytes_reserved={}, \
             pages={}, pages_peak={}, pages_unmapped={}, largest_alloc={}, dealloc_period={}, \
             bytes_reserved_peak={}, bytes_in_use_peak={})",
            r.kind,
            r.usage.number_allocs,
            r.usage.bytes_in_use,
            r.usage.bytes_reserved,
            r.pages,
            r.pages_peak,
            r.pages_unmapped,
            r.largest_alloc,
            opt(r.dealloc_period),
            r.bytes_reserved_peak,
            r.bytes_in_use_peak
        )
    }
}

/// A report of every pool of a MemoryManagement: the dynamic pools in routing order,
/// then the persistent pool. `str(report)` is a table; `report.plan()` a layout capped
/// at its high-water marks.
#[pyclass(
    name = "MemoryReport",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryReport {
    pub(crate) inner: MemoryReport,
}

#[pymethods]
impl PyMemoryReport {
    /// The dynamic pools, in routing order.
    #[getter]
    fn dynamic(&self) -> Vec<PyMemoryPoolReport> {
        self.inner
            .dynamic
            .iter()
            .map(|inner| PyMemoryPoolReport {
                inner: inner.clone(),
            })
            .collect()
    }

    /// The persistent pool.
    #[getter]
    fn persistent(&self) -> PyMemoryPoolReport {
        PyMemoryPoolReport {
            inner: self.inner.persistent.clone(),
        }
    }

    /// The usage of every pool together.
    #[getter]
    fn usage(&self) -> PyMemoryUsage {
        PyMemoryUsage {
            inner: self.inner.usage(),
        }
    }

    /// A layout whose sliced pools are capped at their peak pages plus `headroom` (a
    /// fraction: 0.25 allows a quarter more); exclusive and direct pools are kept as
    /// they are. Installed before the same workload runs again (on the same device
    /// properties), it serves it with the same reservations, so no capacity error and
    /// no more memory. Raises InvalidArgument for a negative headroom, and for a report
    /// with a planned pool, which it cannot build again (it keeps the pool's granule,
    /// not its plan file).
    #[pyo3(signature = (headroom = 0.0))]
    fn plan(&self, py: Python<'_>, headroom: f64) -> PyResult<PyMemoryConfiguration> {
        let inner = self.inner.plan(headroom).map_err(|e| plan_error(py, e))?;
        Ok(PyMemoryConfiguration { inner })
    }

    /// The layout of the dynamic pools as they are (effective options, no caps added).
    /// Raises InvalidArgument for a report with a planned pool, as plan() does.
    fn configuration(&self, py: Python<'_>) -> PyResult<PyMemoryConfiguration> {
        let inner = self.inner.configuration().map_err(|e| plan_error(py, e))?;
        inner
            .validate()
            .map_err(|e| super::errors::config_error(py, &e, None))?;
        Ok(PyMemoryConfiguration { inner })
    }

    /// The report as a JSON-ready dict (`{"dynamic": [...], "persistent": {...}}`).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_dict(py, &self.inner)
    }

    /// A report from a dict as `to_dict()` writes it (a report saved as JSON, say).
    #[staticmethod]
    fn from_dict(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: from_dict(data, "MemoryReport")?,
        })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<Reduced<'py>> {
        reduce_by(slf.as_any(), "from_dict", slf.get().to_dict(py)?)
    }

    fn __repr__(&self) -> String {
        let usage = self.inner.usage();
        format!(
            "<MemoryReport dynamic={} pools, number_allocs={}, in_use={}, reserved={}>",
            self.inner.dynamic.len(),
            usage.number_allocs,
            human_size(usage.bytes_in_use),
            human_size(usage.bytes_reserved)
        )
    }

    /// A table: one row per pool, then the total.
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}

/// A report recorded at a moment the caller named: `label`, `sequence` (0, 1, ...),
/// `time` (seconds since the MemoryManagement was made, on a monotonic clock) and
/// `report`.
#[pyclass(
    name = "MemoryRecord",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryRecord {
    pub(crate) inner: MemoryRecord,
}

#[pymethods]
impl PyMemoryRecord {
    /// What the caller was doing.
    #[getter]
    fn label(&self) -> &str {
        &self.inner.label
    }

    /// The record's number in its MemoryManagement (0 for the first).
    #[getter]
    fn sequence(&self) -> u64 {
        self.inner.sequence
    }

    /// Seconds since the MemoryManagement was made (monotonic).
    #[getter]
    fn time(&self) -> f64 {
        self.inner.time.as_secs_f64()
    }

    /// The pools at that moment.
    #[getter]
    fn report(&self) -> PyMemoryReport {
        PyMemoryReport {
            inner: self.inner.report.clone(),
        }
    }

    /// The record as a JSON-ready dict.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_dict(py, &self.inner)
    }

    /// A record from a dict as `to_dict()` writes it.
    #[staticmethod]
    fn from_dict(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: from_dict(data, "MemoryRecord")?,
        })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<Reduced<'py>> {
        reduce_by(slf.as_any(), "from_dict", slf.get().to_dict(py)?)
    }

    fn __repr__(&self) -> String {
        let usage = self.inner.report.usage();
        format!(
            "<MemoryRecord sequence={} label={:?} time={:.6} in_use={} reserved={}>",
            self.inner.sequence,
            self.inner.label,
            self.inner.time.as_secs_f64(),
            human_size(usage.bytes_in_use),
            human_size(usage.bytes_reserved)
        )
    }

    /// A heading line, then the report's table.
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}

/// Wraps a core report for Python.
pub(crate) fn report_object(inner: MemoryReport) -> PyMemoryReport {
    PyMemoryReport { inner }
}

/// Wraps a core record for Python.
pub(crate) fn record_object(inner: MemoryRecord) -> PyMemoryRecord {
    PyMemoryRecord { inner }
}
