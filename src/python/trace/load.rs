//! `load_trace_v1`: reading a trace from a v1 file, within limits.

use pyo3::prelude::*;

use super::PyTrace;
use crate::python::errors::{opt_size_arg, trace_error};
use crate::trace::{ReadLimits, Trace};

/// Reads a cubepool trace v1 file (`.jsonl`, or gzip-compressed), refusing one with
/// more than `max_events` events or `max_bytes` bytes of text (None: no bound).
#[pyfunction]
#[pyo3(signature = (path, *, max_events = None, max_bytes = None))]
pub(crate) fn load_trace_v1(
    py: Python<'_>,
    path: std::path::PathBuf,
    max_events: Option<&Bound<'_, PyAny>>,
    max_bytes: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTrace> {
    let limits = ReadLimits {
        max_events: opt_size_arg(max_events, "max_events")?,
        max_bytes: opt_size_arg(max_bytes, "max_bytes")?,
    };
    let shown = path.display().to_string();
    let trace = py
        .detach(|| Trace::load_limited(&path, limits))
        .map_err(|e| trace_error(py, Some(&shown), e))?;
    Ok(trace.into())
}
