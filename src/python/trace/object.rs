//! The `Trace` class: a trace's events, figures and variants, and its v1 text.

use std::sync::{Arc, OnceLock};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use crate::python::config::{PyMemoryConfiguration, PyMemoryDeviceProperties};
use crate::python::errors::{
    config_error, invalid_argument, size_arg, trace_error, trace_format_error,
};
use crate::python::pickling::{reduce_by, Reduced};
use crate::python::recording::{recording_dict, PyRecording};
use crate::python::trace_builder::{checked, header_from_dict};
use crate::trace::format::TraceBuilder;
use crate::trace::twister::Twister;
use crate::trace::{route_runs, SizeIndex, Trace, TraceHeader, VariantError};

/// An allocation trace: events in time order, with dense allocation ids.
#[pyclass(name = "Trace", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyTrace {
    pub(crate) inner: Arc<Trace>,
    /// Made at the first replay of a part of the trace (`replay_until(..., sizes=)`),
    /// which a planner runs thousands of.
    pub(super) size_index: OnceLock<SizeIndex>,
}

impl From<Trace> for PyTrace {
    fn from(trace: Trace) -> Self {
        Self {
            inner: Arc::new(trace),
            size_index: OnceLock::new(),
        }
    }
}

#[pymethods]
impl PyTrace {
    /// Builds a trace from `(t_ns, op, id, size)` events (op "alloc" or "free"; size
    /// is ignored for frees, which may also be `(t_ns, "free", id)`) and an optional v1
    /// header dict. Importers and other
    /// producers of events call `TraceBuilder` directly, with no tuples in between.
    #[staticmethod]
    #[pyo3(signature = (events, header = None))]
    fn from_events(
        py: Python<'_>,
        events: &Bound<'_, PyAny>,
        header: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let header = match header {
            Some(header) if !header.is_none() => header_from_dict(header)?,
            _ => TraceHeader::default(),
        };
        let mut builder = TraceBuilder::new(header);
        // Errors name the event by its index in `events` (there are no lines).
        let refuse = |index: usize, message: String| {
            trace_format_error(py, format!("event {index}: {message}"), None, None)
        };
        for (index, event) in events.try_iter()?.enumerate() {
            let event = event?;
            // `(t_ns, op, id, size)`, or `(t_ns, "free", id)`: a free needs no size.
            let parsed = event
                .extract::<(u64, Bound<'_, PyString>, u64, u64)>()
                .map(|(t, op, id, size)| (t, op, id, Some(size)))
                .or_else(|four| {
                    event
                        .extract::<(u64, Bound<'_, PyString>, u64)>()
                        .map(|(t, op, id)| (t, op, id, None))
                        .map_err(|_| four)
                });
            let (t, op, id, size) = parsed.map_err(|e| {
                refuse(
                    index,
                    format!(
                        "expected (t_ns, op, id, size), or (t_ns, \"free\", id), with t_ns, \
                         id and size non-negative 64-bit integers: {e}"
                    ),
                )
            })?;
            // A str that is no UTF-8 text (a lone surrogate) is no op either.
            let op = op.to_str().unwrap_or("\u{fffd}");
            let result = match (op, size) {
                ("alloc", Some(size)) => builder.alloc(t, id, size),
                ("alloc", None) => Err("an alloc needs a size: (t_ns, \"alloc\", id, size)".into()),
                ("free", _) => builder.free(t, id),
                (other, _) => Err(format!("unknown op {other:?} (expected alloc or free)")),
            };
            result.map_err(|message| refuse(index, message))?;
        }
        Ok(checked(py, builder.finish())?.into())
    }

    /// Reads a trace from the bytes of a v1 file (JSON Lines, plain or gzip-compressed),
    /// as `to_jsonl` writes them.
    #[staticmethod]
    fn from_jsonl(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        let trace = py
            .detach(|| Trace::read(data))
            .map_err(|e| trace_error(py, None, e))?;
        Ok(trace.into())
    }

    /// The trace as the bytes of a v1 file (JSON Lines, not compressed).
    fn to_jsonl<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let trace = Arc::clone(&self.inner);
        let mut text = Vec::new();
        py.detach(|| trace.write(&mut text))?;
        Ok(PyBytes::new(py, &text))
    }

    /// Writes the trace to `path` as a v1 file (gzip-compressed when the name ends in
    /// `.gz`). A temporary file beside `path` replaces it only once complete, so no
    /// partial file is left under the name.
    fn write(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let trace = Arc::clone(&self.inner);
        let shown = path.display().to_string();
        py.detach(|| trace.save(&path))
            .map_err(|e| trace_error(py, Some(&shown), e))
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

    /// The header's fields as a dict: `workload`, `source`, `model`, `notes`,
    /// `phases` (a list of `{"name", "first_event", "t"}` dicts) when it has any, and
    /// `recorded` (see `Trace.recording`) when the trace has a recording.
    #[getter]
    fn header<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let header = &self.inner.header;
        let dict = PyDict::new(py);
        dict.set_item("workload", &header.workload)?;
        dict.set_item("source", &header.source)?;
        dict.set_item("model", &header.model)?;
        dict.set_item("notes", &header.notes)?;
        if !header.phases.is_empty() {
            let phases = PyList::empty(py);
            for phase in &header.phases {
                let entry = PyDict::new(py);
                entry.set_item("name", &phase.name)?;
                entry.set_item("first_event", phase.first_event)?;
                entry.set_item("t", phase.t)?;
                phases.append(entry)?;
            }
            dict.set_item("phases", phases)?;
        }
        if let Some(recorded) = &header.recorded {
            dict.set_item("recorded", recording_dict(py, recorded)?)?;
        }
        Ok(dict)
    }

    /// What the recorded run's own allocator reserved over the trace, where the source
    /// file showed it (a PyTorch snapshot's segments, a profiler's "Total Reserved");
    /// None otherwise.
    #[getter]
    fn recording(&self) -> Option<PyRecording> {
        PyRecording::of(&self.inner)
    }

    /// The allocation stack of allocation `id` (its dense id, as `events()` names
    /// it), innermost frame first, where the source file had one (a PyTorch snapshot's
    /// `frames`); None when it had none. Raises InvalidArgument for an id past the
    /// trace's allocations.
    fn frames(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<Option<Vec<String>>> {
        let id = size_arg(id, "id")?;
        let Some(id) = u32::try_from(id)
            .ok()
            .filter(|&id| id < self.inner.allocations)
        else {
            return Err(invalid_argument(
                py,
                format!(
                    "allocation id {id} is past the trace's {} allocations",
                    self.inner.allocations
                ),
            ));
        };
        Ok(self
            .inner
            .stacks
            .get(id)
            .map(|frames| frames.into_iter().map(str::to_owned).collect()))
    }

    /// Whether any allocation of the trace has its stack frames (see `frames`).
    #[getter]
    fn has_frames(&self) -> bool {
        !self.inner.stacks.is_empty()
    }

    /// The events as a list of (t_ns, op, id, size) tuples (size 0 for frees).
    fn events(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let list = PyList::empty(py);
        // One str object per op for the whole list.
        let alloc = intern!(py, "alloc");
        let free = intern!(py, "free");
        for event in &self.inner.events {
            match *event {
                crate::trace::TraceEvent::Alloc { t, id, size } => {
                    list.append((t, alloc, id, size))?
                }
                crate::trace::TraceEvent::Free { t, id } => list.append((t, free, id, 0u64))?,
            }
        }
        Ok(list.unbind())
    }

    /// The events' times in nanoseconds, in order: the first field of each of
    /// `events`, without building the tuples (a picture of a trace of a million events
    /// needs only these).
    fn times(&self) -> Vec<u64> {
        self.inner.events.iter().map(|event| event.t()).collect()
    }

    /// The first `events` events as a trace of its own: allocations live at the cut
    /// stay live, phases starting before it are kept, peak_live is the prefix's.
    fn prefix(&self, py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<Self> {
        // Past the end means the whole trace, so a count beyond usize is that too.
        let events = usize::try_from(size_arg(events, "events")?).unwrap_or(usize::MAX);
        let trace = Arc::clone(&self.inner);
        Ok(py.detach(|| trace.prefix(events)).into())
    }

    /// The distinct sizes the trace allocates, ascending.
    fn distinct_sizes(&self) -> Vec<u64> {
        self.inner.distinct_sizes()
    }

    /// For each of `limits` (ascending), the peak live bytes of the allocations of at
    /// most that size.
    fn live_peaks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::limits)] limits: Vec<u64>,
    ) -> Vec<u64> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.live_peaks(&limits))
    }

    /// For each group of sizes, the most allocations of those sizes live at once and
    /// how many allocations of those sizes the trace makes.
    fn group_peaks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::groups)] groups: Vec<Vec<u64>>,
    ) -> Vec<(u64, u64)> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.group_peaks(&groups))
    }

    /// For each group of sizes, the peak live bytes of the allocations of those sizes
    /// and the most of them live at once (each peak on its own).
    fn group_live_peaks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::groups)] groups: Vec<Vec<u64>>,
    ) -> Vec<(u64, u64)> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.group_live_peaks(&groups))
    }

    /// `group_live_peaks` of groups given as inclusive `(low, high)` ranges of sizes, in
    /// memory that grows with the ranges, not with the sizes they hold.
    fn range_live_peaks(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::range_groups)] groups: Vec<Vec<(u64, u64)>>,
    ) -> Vec<(u64, u64)> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.range_live_peaks(&groups))
    }

    /// Where `config` routes the trace's distinct sizes (`distinct_sizes()`, ascending),
    /// as `pool_routes` says it, in maximal runs routed alike: `(start, end, pool)` with
    /// `distinct_sizes()[start:end]` routed to `pool` (None: no dynamic pool). It asks
    /// a number of routing questions that grows with the runs, not the sizes, and
    /// passes no sizes across.
    #[pyo3(signature = (config, properties = None))]
    fn route_runs(
        &self,
        py: Python<'_>,
        config: &PyMemoryConfiguration,
        properties: Option<&PyMemoryDeviceProperties>,
    ) -> PyResult<Vec<(usize, usize, Option<usize>)>> {
        let properties = properties.map(|p| p.inner).unwrap_or_default();
        let trace = Arc::clone(&self.inner);
        let index = self.size_index.get_or_init(|| SizeIndex::new(&trace));
        let configuration = config.inner.clone();
        let runs = py.detach(|| route_runs(&configuration, properties, index.distinct()));
        let runs = runs.map_err(|e| config_error(py, &e, None))?;
        Ok(runs.iter().map(|r| (r.start, r.end, r.route)).collect())
    }

    /// The allocations live right after the event that first reaches `peak_live`, as
    /// `(id, size)` pairs by ascending id.
    fn live_at_peak(&self, py: Python<'_>) -> Vec<(u32, u64)> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.live_at_peak())
    }

    /// The events before `cut`, then the step `start..cut` once more on the state it
    /// leaves (what it allocates and frees is repeated with new ids, shifted in time;
    /// what it keeps stays live), with a phase `name` where the repetition starts.
    fn with_step_repeated(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::start)] start: usize,
        #[pyo3(from_py_with = crate::python::args::cut)] cut: usize,
        name: &str,
    ) -> PyResult<Self> {
        let trace = Arc::clone(&self.inner);
        let variant = py.detach(|| trace.with_step_repeated(start, cut, name));
        wrap_variant(py, variant)
    }

    /// The trace with a twin of each allocation in `ids`: the same size, allocated and
    /// freed right after it.
    fn with_twins(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::ids)] ids: Vec<u32>,
    ) -> PyResult<Self> {
        let trace = Arc::clone(&self.inner);
        let variant = py.detach(|| trace.with_twins(&ids));
        wrap_variant(py, variant)
    }

    /// The trace with each event from `start` on moved up to `window` places: event
    /// `start + k` is placed by `k - window + 2 * window * draws[k]` (ties in event
    /// order), a free never before its allocation; times stay in order.
    fn reordered(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::start)] start: usize,
        window: f64,
        #[pyo3(from_py_with = crate::python::args::draws)] draws: Vec<f64>,
    ) -> PyResult<Self> {
        let trace = Arc::clone(&self.inner);
        let variant = py.detach(|| trace.reordered(start, window, &draws));
        wrap_variant(py, variant)
    }

    /// [`reordered`](Self::reordered) with the draws that Python's `random.random()`
    /// would make next from `state` (`random.Random.getstate()[1]`: 624 words and a
    /// position), drawn here: one per event from `start` on.
    fn reordered_from_state(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::args::start)] start: usize,
        window: f64,
        #[pyo3(from_py_with = crate::python::args::twister_state)] state: Vec<u32>,
    ) -> PyResult<Self> {
        let mut twister = Twister::from_python_state(&state)
            .map_err(|error| invalid_argument(py, error.to_string()))?;
        let trace = Arc::clone(&self.inner);
        let variant = py.detach(|| {
            let moved = trace.len().saturating_sub(start);
            let draws: Vec<f64> = (0..moved).map(|_| twister.next_f64()).collect();
            trace.reordered(start, window, &draws)
        });
        wrap_variant(py, variant)
    }

    /// Pickles as its v1 text (`Trace.from_jsonl(trace.to_jsonl())`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let text = slf.get().to_jsonl(slf.py())?;
        reduce_by(slf.as_any(), "from_jsonl", text)
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

/// A trace variant as a Python trace, or `InvalidArgument` naming the problem.
fn wrap_variant(py: Python<'_>, variant: Result<Trace, VariantError>) -> PyResult<PyTrace> {
    match variant {
        Ok(trace) => Ok(trace.into()),
        Err(error) => Err(invalid_argument(py, error.to_string())),
    }
}
