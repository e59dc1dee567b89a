//! The Python class of a trace's recording: what the recorded run's own allocator
//! reserved ([`Recording`]).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::trace::{Recording, Trace};

/// PyTorch's own reserved bytes over a trace, as the source file recorded them (a
/// snapshot's segment events and final segments, or a profiler's "Total Reserved").
///
/// The curve is a step function over the trace's events: each point
/// `(event, t_ns, reserved)` holds from just before event `event` until the next point.
#[pyclass(name = "Recording", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyRecording {
    inner: Recording,
}

impl PyRecording {
    /// The recording of `trace`, if its header has one.
    pub(crate) fn of(trace: &Trace) -> Option<Self> {
        trace.header.recorded.clone().map(|inner| Self { inner })
    }

    fn inner(&self) -> &Recording {
        &self.inner
    }
}

/// The recording as the header dict's `recorded` entry.
pub(crate) fn recording_dict<'py>(
    py: Python<'py>,
    recorded: &Recording,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("source", &recorded.source)?;
    dict.set_item("device", &recorded.device)?;
    dict.set_item("covers", recorded.covers.as_str())?;
    dict.set_item("expandable_segments", recorded.expandable_segments)?;
    // Only where known, as the v1 file holds it (so a header read back compares equal).
    if let Some(settings) = &recorded.settings {
        dict.set_item("settings", settings.to_string())?;
    }
    let points = PyList::empty(py);
    for point in &recorded.points {
        // Lists, as the v1 file holds them, so a header read back compares equal.
        points.append(PyList::new(
            py,
            [point.event as u64, point.t, point.reserved],
        )?)?;
    }
    dict.set_item("points", points)?;
    Ok(dict)
}

#[pymethods]
impl PyRecording {
    /// Where the figures come from (`"torch-snapshot segments"`, ...).
    #[getter]
    fn source(&self) -> &str {
        &self.inner().source
    }

    /// The device they are of (`"cuda:0"`).
    #[getter]
    fn device(&self) -> &str {
        &self.inner().device
    }

    /// `"start"` (nothing was reserved before the first point) or `"window"` (the
    /// first point's bytes were already reserved when recording began).
    #[getter]
    fn covers(&self) -> &'static str {
        self.inner().covers.as_str()
    }

    /// Whether the run used expandable segments; None when the file does not say.
    #[getter]
    fn expandable_segments(&self) -> Option<bool> {
        self.inner().expandable_segments
    }

    /// The run's allocator settings as the name of the model of PyTorch's allocator
    /// with them (`"torch_expandable(max_split_size_mb=512)"`), where the file gave
    /// them (a snapshot's `allocator_settings`); None when it did not.
    #[getter]
    fn settings(&self) -> Option<String> {
        self.inner().settings.as_ref().map(ToString::to_string)
    }

    /// The curve as `(event, t_ns, reserved)` triples, events never decreasing.
    #[getter]
    fn points(&self) -> Vec<(usize, u64, u64)> {
        self.inner().points.iter().map(|&p| p.into()).collect()
    }

    /// The largest bytes reserved (0 without points).
    #[getter]
    fn peak(&self) -> u64 {
        self.inner().peak().0
    }

    /// The event index of the first point at the peak (None without points).
    #[getter]
    fn peak_event(&self) -> Option<usize> {
        self.inner().peak().1.map(|point| point.event)
    }

    /// The bytes reserved when recording began (0 for a recording from the start).
    #[getter]
    fn initial(&self) -> u64 {
        self.inner().initial()
    }

    /// The recording as the header dict's `recorded` entry.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        recording_dict(py, self.inner())
    }

    fn __len__(&self) -> usize {
        self.inner().points.len()
    }

    fn __repr__(&self) -> String {
        let recorded = self.inner();
        format!(
            "<Recording device={:?} covers={} expandable_segments={} points={} peak={}>",
            recorded.device,
            recorded.covers.as_str(),
            match recorded.expandable_segments {
                Some(true) => "True",
                Some(false) => "False",
                None => "None",
            },
            recorded.points.len(),
            recorded.peak().0
        )
    }
}
