//! Python classes for traces and replay results.

use std::sync::{Arc, OnceLock};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use super::at_peak::PyAtPeak;
use super::config::{
    pool_type_repr, PyMemoryConfiguration, PyMemoryDeviceProperties, PyMemoryPoolOptions,
    PyPoolType,
};
use super::errors::{
    config_error, invalid_argument, opt_byte_size_arg, opt_size_arg, size_arg, trace_error,
    trace_format_error,
};
use super::management::PyMemoryUsage;
use super::pickling::{reduce_by, Reduced};
use super::recording::{recording_dict, PyRecording};
use super::result_dict::{replayed_entries, result_from_json};
use super::trace_builder::{checked, header_from_dict};
use crate::config::PoolType;
use crate::report::human_size;
use crate::trace::format::TraceBuilder;
use crate::trace::twister::Twister;
use crate::trace::{
    at_peak, replay, replay_selected_until, replay_until, route_runs, routes, PoolReplay,
    ReadLimits, ReplayOptions, ReplayResult, Replayed, ReplayedPool, Sample, SizeIndex, StopWhen,
    TorchPool, Trace, TraceHeader, VariantError, DEFAULT_SAMPLES,
};

/// An allocation trace: events in time order, with dense allocation ids.
#[pyclass(name = "Trace", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyTrace {
    pub(crate) inner: Arc<Trace>,
    /// Made at the first replay of a part of the trace (`replay_until(..., sizes=)`),
    /// which a planner runs thousands of.
    size_index: OnceLock<SizeIndex>,
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
        Ok(self.inner.stacks.get(id).map(<[String]>::to_vec))
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
    fn live_peaks(&self, py: Python<'_>, limits: Vec<u64>) -> Vec<u64> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.live_peaks(&limits))
    }

    /// For each group of sizes, the most allocations of those sizes live at once and
    /// how many allocations of those sizes the trace makes.
    fn group_peaks(&self, py: Python<'_>, groups: Vec<Vec<u64>>) -> Vec<(u64, u64)> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.group_peaks(&groups))
    }

    /// For each group of sizes, the peak live bytes of the allocations of those sizes
    /// and the most of them live at once (each peak on its own).
    fn group_live_peaks(&self, py: Python<'_>, groups: Vec<Vec<u64>>) -> Vec<(u64, u64)> {
        let trace = Arc::clone(&self.inner);
        py.detach(|| trace.group_live_peaks(&groups))
    }

    /// `group_live_peaks` of groups given as inclusive `(low, high)` ranges of sizes, in
    /// memory that grows with the ranges, not with the sizes they hold.
    fn range_live_peaks(&self, py: Python<'_>, groups: Vec<Vec<(u64, u64)>>) -> Vec<(u64, u64)> {
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
        start: usize,
        cut: usize,
        name: &str,
    ) -> PyResult<Self> {
        let trace = Arc::clone(&self.inner);
        let variant = py.detach(|| trace.with_step_repeated(start, cut, name));
        wrap_variant(py, variant)
    }

    /// The trace with a twin of each allocation in `ids`: the same size, allocated and
    /// freed right after it.
    fn with_twins(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<Self> {
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
        start: usize,
        window: f64,
        draws: Vec<f64>,
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
        start: usize,
        window: f64,
        state: Vec<u32>,
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

/// What a replay ran through, kept with its result so that `at_peak()` can replay it
/// to its peak again.
pub(crate) struct ReplaySource {
    /// The trace replayed; None for a result read back from a dict or a pickle (which
    /// do not hold the trace: `at_peak(trace)` takes it).
    trace: Option<Arc<Trace>>,
    /// The layout on its device, or the torch model.
    replayed: Replayed,
    /// The memory limit of the replay.
    limit: Option<u64>,
}

impl ReplaySource {
    /// The source of a whole replay of `trace`.
    pub(crate) fn new(trace: Arc<Trace>, replayed: Replayed, limit: Option<u64>) -> Self {
        Self {
            trace: Some(trace),
            replayed,
            limit,
        }
    }

    /// What was replayed, in words: the layout's text or the torch model's name.
    fn describe(&self) -> String {
        match &self.replayed {
            Replayed::Layout { configuration, .. } => configuration.to_string(),
            Replayed::Torch(settings) => settings.to_string(),
        }
    }
}

/// What a pool layout did with a trace.
#[pyclass(name = "ReplayResult", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyReplayResult {
    pub(crate) inner: Arc<ReplayResult>,
    /// What it ran through; None for a partial replay (`replay_until`) and a result
    /// read from a dict that does not say (no `replayed`).
    pub(crate) source: Option<Arc<ReplaySource>>,
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
    /// The index of the event after which peak_reserved was first reached.
    #[getter]
    fn peak_reserved_event(&self) -> usize {
        self.inner.peak_reserved_event
    }
    /// The index of the event after which peak_in_use was first reached.
    #[getter]
    fn peak_in_use_event(&self) -> usize {
        self.inner.peak_in_use_event
    }
    /// peak_live / peak_reserved; NaN when a reservation failed (see `complete`): a
    /// layout that did not hold the trace has no utilization to show.
    #[getter]
    fn utilization(&self) -> f64 {
        self.inner.utilization
    }
    /// peak_reserved - peak_live: the bytes reserved over the floor no allocator can
    /// beat; None when a reservation failed (the peaks cover only what was served).
    #[getter]
    fn reserved_over_floor(&self) -> Option<u64> {
        self.inner.reserved_over_floor()
    }
    /// 1 - utilization.
    #[getter]
    fn fragmentation(&self) -> f64 {
        self.inner.fragmentation()
    }
    /// Wall-clock seconds of the replay loop.
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }
    /// Nanoseconds per event.
    #[getter]
    fn ns_per_event(&self) -> f64 {
        self.inner.ns_per_event()
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
    /// Whether every reservation was served. When False the replay is incomplete: the
    /// layout did not hold the trace, its peaks cover only what it served, and
    /// `utilization` is NaN.
    #[getter]
    fn complete(&self) -> bool {
        self.inner.complete()
    }
    /// The failed reservations by cause: `too_big` (larger than every pool takes),
    /// `pools_full` (the capped pools that take it were full), `over_limit` (storage
    /// past `limit`). They sum to `failed_reserves`.
    #[getter]
    fn failures<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let f = self.inner.failures;
        let dict = PyDict::new(py);
        dict.set_item("too_big", f.too_big)?;
        dict.set_item("pools_full", f.pools_full)?;
        dict.set_item("over_limit", f.over_limit)?;
        Ok(dict)
    }
    /// The memory limit the replay ran under, in bytes; None when it ran without one
    /// or the result does not say (a partial replay, or a dict without `replayed`).
    #[getter]
    fn limit(&self) -> Option<u64> {
        self.source.as_ref().and_then(|source| source.limit)
    }
    /// The index of the first event whose reservation failed, or None.
    #[getter]
    fn first_failed_event(&self) -> Option<usize> {
        self.inner.first_failed_event
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
    /// Each dynamic pool of the layout, in routing order: what it served and held.
    #[getter]
    fn pools(&self) -> Vec<PyPoolReplay> {
        (0..self.inner.pools.len())
            .map(|index| PyPoolReplay {
                result: Arc::clone(&self.inner),
                index,
            })
            .collect()
    }
    /// The memory over time, in at most `samples` runs of consecutive events.
    #[getter]
    fn timeline(&self) -> PyTimeline {
        PyTimeline {
            result: Arc::clone(&self.inner),
        }
    }

    /// The address space at the peak of reserved bytes: why the peak reserves more
    /// than is live (see `AtPeak`). Replays the trace again up to the event that first
    /// reached the peak. A result read back from a dict or a pickle does not hold its
    /// trace: pass it as `trace` (it must be the trace replayed: same events and peak
    /// live bytes). Raises InvalidArgument for a partial replay (`replay_until`), a
    /// result without its trace, or a trace that is not the one replayed.
    #[pyo3(signature = (trace = None))]
    fn at_peak(&self, py: Python<'_>, trace: Option<&PyTrace>) -> PyResult<PyAtPeak> {
        let Some(source) = &self.source else {
            return Err(invalid_argument(
                py,
                "at_peak() needs to know what was replayed, and this result does not \
                 say: it is a partial replay (replay_until), or was read from a dict \
                 without \"replayed\"; replay the trace with cubepool.replay"
                    .to_string(),
            ));
        };
        let trace = match (trace, &source.trace) {
            (Some(trace), _) => Arc::clone(&trace.inner),
            (None, Some(trace)) => Arc::clone(trace),
            (None, None) => {
                return Err(invalid_argument(
                    py,
                    "this result was read back without its trace (from a dict or a \
                     pickle): pass the trace replayed, result.at_peak(trace)"
                        .to_string(),
                ))
            }
        };
        let r = &self.inner;
        if trace.len() != r.events || trace.peak_live != r.peak_live {
            return Err(invalid_argument(
                py,
                format!(
                    "the trace given ({} events, peak live {}) is not the one replayed \
                     ({} events, peak live {})",
                    trace.len(),
                    human_size(trace.peak_live),
                    r.events,
                    human_size(r.peak_live)
                ),
            ));
        }
        let event = r.peak_reserved_event;
        let view = py
            .detach(|| at_peak(&trace, &source.replayed, source.limit, event))
            .map_err(|e| config_error(py, &e, None))?;
        // Every view adds up (AtPeak::build's invariant): a failure is a bug of cubepool.
        if let Err(problem) = view.check() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "cubepool bug: the view at the peak does not add up: {problem}"
            )));
        }
        // The replay is deterministic: the same trace reaches the same peak at the same
        // event, so a different figure means another trace (or an edited result dict).
        if view.reserved != r.peak_reserved {
            return Err(invalid_argument(
                py,
                format!(
                    "the replay of this trace reserves {} after event {event}, where the \
                     result's peak was {}: the trace is not the one replayed (or the \
                     result was edited)",
                    human_size(view.reserved),
                    human_size(r.peak_reserved)
                ),
            ));
        }
        Ok(PyAtPeak::new(view, trace, source.describe()))
    }

    /// A result from a dict as `to_dict()` writes it (a result saved as JSON, say).
    /// The dict does not hold the trace: `at_peak(trace)` of the result takes it.
    /// Raises InvalidArgument naming what is missing or does not add up.
    #[staticmethod]
    fn from_dict(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = data.py();
        if !data.is_instance_of::<PyDict>() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "ReplayResult.from_dict() takes a dict as to_dict() writes it",
            ));
        }
        let text: String = py
            .import("json")?
            .call_method1("dumps", (data,))?
            .extract()?;
        let (mut inner, replayed) = result_from_json(&text)
            .map_err(|e| invalid_argument(py, format!("not a ReplayResult dict: {e}")))?;
        // The float as Python holds it: JSON text may not give back its last bit.
        if let Some(seconds) = data.get_item("seconds").ok().and_then(|s| s.extract().ok()) {
            inner.seconds = seconds;
        }
        Ok(Self {
            inner: Arc::new(inner),
            source: replayed.map(|(replayed, limit)| {
                Arc::new(ReplaySource {
                    trace: None,
                    replayed,
                    limit,
                })
            }),
        })
    }

    /// Pickles as its dict (`ReplayResult.from_dict(r.to_dict())`), without the trace.
    fn __reduce__<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<Reduced<'py>> {
        reduce_by(slf.as_any(), "from_dict", slf.get().to_dict(py, true)?)
    }

    /// The result as a JSON-ready dict; with `timeline`, the time series too. Where
    /// the result knows what it replayed, `replayed` says it (`layout` text with the
    /// device's `max_page_size` and `alignment`, or `torch` model name; and `limit`),
    /// so `ReplayResult.from_dict` gives it back.
    #[pyo3(signature = (*, timeline = true))]
    fn to_dict(&self, py: Python<'_>, timeline: bool) -> PyResult<Py<PyDict>> {
        let r = &self.inner;
        let dict = PyDict::new(py);
        dict.set_item("events", r.events)?;
        dict.set_item("peak_reserved", r.peak_reserved)?;
        dict.set_item("peak_reserved_event", r.peak_reserved_event)?;
        dict.set_item("peak_in_use", r.peak_in_use)?;
        dict.set_item("peak_in_use_event", r.peak_in_use_event)?;
        dict.set_item("peak_live", r.peak_live)?;
        // JSON has no NaN: an incomplete replay's ratios are null.
        let ratio = |x: f64| if x.is_nan() { None } else { Some(x) };
        dict.set_item("complete", r.complete())?;
        dict.set_item("utilization", ratio(r.utilization))?;
        dict.set_item("reserved_over_floor", r.reserved_over_floor())?;
        dict.set_item("fragmentation", ratio(r.fragmentation()))?;
        dict.set_item("seconds", r.seconds)?;
        dict.set_item("ns_per_event", r.ns_per_event())?;
        dict.set_item("failed_reserves", r.failed_reserves)?;
        dict.set_item("failures", self.failures(py)?)?;
        dict.set_item("first_failed_event", r.first_failed_event)?;
        dict.set_item("storage_allocations", r.storage_allocations)?;
        dict.set_item("storage_frees", r.storage_frees)?;
        dict.set_item("final_usage", self.final_usage().to_dict(py)?)?;
        let pools = PyList::empty(py);
        for pool in self.pools() {
            pools.append(pool.to_dict(py)?)?;
        }
        dict.set_item("pools", pools)?;
        if timeline {
            dict.set_item("timeline", self.timeline().to_dict(py)?)?;
        }
        if let Some(source) = &self.source {
            let replayed = PyDict::new(py);
            for (key, value) in replayed_entries(&source.replayed, source.limit) {
                replayed.set_item(key, super::report::json_to_py(py, &value)?)?;
            }
            dict.set_item("replayed", replayed)?;
        }
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        let r = &self.inner;
        if r.complete() {
            format!(
                "ReplayResult(events={}, peak_reserved={}, peak_in_use={}, utilization={:.4}, seconds={:.6})",
                r.events, r.peak_reserved, r.peak_in_use, r.utilization, r.seconds
            )
        } else {
            format!(
                "ReplayResult(incomplete, failed_reserves={}, events={}, peak_reserved={}, peak_in_use={}, seconds={:.6})",
                r.failed_reserves, r.events, r.peak_reserved, r.peak_in_use, r.seconds
            )
        }
    }
}

// The literal default of `samples` below (a literal, so the signature shows it).
const _: () = assert!(DEFAULT_SAMPLES == 512);

/// Replays `trace` through `config` (the default layout when None) on virtual
/// storage, in Rust with the GIL released. With `limit`, storage past that many bytes
/// fails and the reservations that needed it are counted in `failed_reserves`. The
/// timeline keeps at most `samples` points (0: none).
#[pyfunction]
// `samples` is read by `size_arg` so a bad value names it; the text signature keeps
// the documented default.
#[pyo3(
    signature = (trace, config = None, properties = None, *, limit = None, samples = None),
    text_signature = "(trace, config=None, properties=None, *, limit=None, samples=512)"
)]
pub(crate) fn replay_trace(
    py: Python<'_>,
    trace: &PyTrace,
    config: Option<&PyMemoryConfiguration>,
    properties: Option<&PyMemoryDeviceProperties>,
    limit: Option<&Bound<'_, PyAny>>,
    samples: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyReplayResult> {
    // More samples than events are never kept, so a count beyond usize is that too.
    let samples = opt_size_arg(samples, "samples")?.map_or(DEFAULT_SAMPLES, |n| {
        usize::try_from(n).unwrap_or(usize::MAX)
    });
    let configuration = match config {
        Some(config) => config.inner.clone(),
        None => super::config::configured(py)?,
    };
    let properties = properties.map(|p| p.inner).unwrap_or_default();
    let options = ReplayOptions {
        limit: opt_byte_size_arg(limit, "limit")?,
        samples,
    };
    let trace = Arc::clone(&trace.inner);
    let result = py
        .detach(|| replay(&trace, &configuration, properties, options))
        .map_err(|e| config_error(py, &e, None))?;
    let replayed = Replayed::Layout {
        configuration,
        properties,
    };
    Ok(PyReplayResult {
        inner: Arc::new(result),
        source: Some(Arc::new(ReplaySource::new(trace, replayed, options.limit))),
    })
}

/// Replays `trace` through `config` like `replay_trace` (no timeline, no limit), but
/// stops after the first event that takes the bytes reserved past `reserved_above` or
/// the storage allocations past `storage_allocations_above`. Returns the result so far
/// (its peaks and counts are lower bounds of the whole replay's) and the index of the
/// event it stopped after, or None when it ran to the end. With `sizes`, only the
/// allocations of those sizes (and their frees) are replayed; with `size_ranges`
/// (inclusive `(low, high)` pairs), only those of the sizes in them.
#[pyfunction(name = "replay_until")]
#[pyo3(signature = (trace, config, properties = None, *, reserved_above = None, storage_allocations_above = None, sizes = None, size_ranges = None))]
#[allow(clippy::too_many_arguments)] // the keyword arguments of the Python signature
pub(crate) fn replay_until_bound(
    py: Python<'_>,
    trace: &PyTrace,
    config: &PyMemoryConfiguration,
    properties: Option<&PyMemoryDeviceProperties>,
    reserved_above: Option<&Bound<'_, PyAny>>,
    storage_allocations_above: Option<&Bound<'_, PyAny>>,
    sizes: Option<Vec<u64>>,
    size_ranges: Option<Vec<(u64, u64)>>,
) -> PyResult<(PyReplayResult, Option<usize>)> {
    if sizes.is_some() && size_ranges.is_some() {
        return Err(invalid_argument(
            py,
            "replay_until takes sizes or size_ranges, not both".to_string(),
        ));
    }
    let configuration = config.inner.clone();
    let properties = properties.map(|p| p.inner).unwrap_or_default();
    let stop = StopWhen {
        reserved_above: opt_size_arg(reserved_above, "reserved_above")?,
        storage_allocations_above: opt_size_arg(
            storage_allocations_above,
            "storage_allocations_above",
        )?,
    };
    let (result, stopped) = py
        .detach(|| {
            let index = || {
                trace
                    .size_index
                    .get_or_init(|| SizeIndex::new(&trace.inner))
            };
            let selected = match (&sizes, &size_ranges) {
                (Some(sizes), _) => index().select(sizes),
                (None, Some(ranges)) => index().select_ranges(ranges),
                (None, None) => {
                    return replay_until(&trace.inner, &configuration, properties, stop)
                }
            };
            replay_selected_until(&trace.inner, &configuration, properties, selected, stop)
        })
        .map_err(|e| config_error(py, &e, None))?;
    Ok((
        PyReplayResult {
            inner: Arc::new(result),
            source: None,
        },
        stopped,
    ))
}

/// For each of `sizes`, the index of the dynamic pool of `config` that a fresh memory
/// management routes it to, or None when none serves it (size 0, or a size no pool
/// takes).
#[pyfunction]
#[pyo3(signature = (config, sizes, properties = None))]
pub(crate) fn pool_routes(
    py: Python<'_>,
    config: &PyMemoryConfiguration,
    sizes: Vec<u64>,
    properties: Option<&PyMemoryDeviceProperties>,
) -> PyResult<Vec<Option<usize>>> {
    let properties = properties.map(|p| p.inner).unwrap_or_default();
    routes(&config.inner, properties, &sizes).map_err(|e| config_error(py, &e, None))
}

/// What one pool of a layout did during a replay.
#[pyclass(name = "PoolReplay", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyPoolReplay {
    result: Arc<ReplayResult>,
    index: usize,
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
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
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

/// The memory of a replay over time: one sample per run of consecutive events, with
/// the smallest, largest and last bytes in use and reserved of the run (so the exact
/// peaks are kept) and every pool's bytes at the run's end. Columns are lists.
#[pyclass(name = "Timeline", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyTimeline {
    result: Arc<ReplayResult>,
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
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
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
