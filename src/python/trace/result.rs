//! The `ReplayResult` class: a replay's figures, its dict form, and `at_peak()` over
//! what it replayed (`ReplaySource`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::{PyPoolReplay, PyTimeline, PyTrace};
use crate::python::at_peak::PyAtPeak;
use crate::python::errors::{config_error, invalid_argument};
use crate::python::management::PyMemoryUsage;
use crate::python::pickling::{reduce_by, Reduced};
use crate::python::result_dict::{replayed_entries, result_from_json};
use crate::report::human_size;
use crate::trace::{at_peak, ReplayResult, Replayed, Trace};

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

    /// The result itself: it never changes, so a copy is the same object, and keeps
    /// what it replayed (a copy through the dict would lose the trace `at_peak` reads).
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The result itself, as [`__copy__`](Self::__copy__).
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
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
                replayed.set_item(key, crate::python::report::json_to_py(py, &value)?)?;
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
