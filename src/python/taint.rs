//! The error/taint graph from Python: the classes FailureId, Claim, Skipped and
//! ErrorGraph, and the graph writes `MemoryManagement.launch`, `write` and `claim`
//! (whose methods only call the functions here).

use std::ops::Range;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::errors::{handle_released, invalid_argument, opt_size_arg, size_arg};
use super::handles::{PyHandle, Target};
use super::management::ManagementState;
use crate::errors::{AllocId, AllocRange, Claim, ErrorGraph, FailureId, GraphError, Skipped};

/// The id of one failure; never reused within a process.
#[pyclass(
    name = "FailureId",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    ord,
    skip_from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PyFailureId {
    pub(crate) inner: FailureId,
}

#[pymethods]
impl PyFailureId {
    /// The failure's number.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.get()
    }

    fn __repr__(&self) -> String {
        format!("FailureId({})", self.inner.get())
    }
}

/// Why the bytes of a range cannot be trusted: a failure left them unwritten
/// (`kind == "failed"`), or the buffer never got memory (`kind == "unallocated"`).
#[pyclass(
    name = "Claim",
    module = "cubepool._cubepool",
    frozen,
    eq,
    skip_from_py_object
)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyClaim {
    inner: Claim,
}

#[pymethods]
impl PyClaim {
    /// "failed" or "unallocated".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner {
            Claim::Failed { .. } => "failed",
            Claim::Unallocated { .. } => "unallocated",
        }
    }

    /// The failure that left the bytes unwritten (None when unallocated).
    #[getter]
    fn failure(&self) -> Option<PyFailureId> {
        self.inner.failure().map(|inner| PyFailureId { inner })
    }

    /// The id of the allocation the claim is on.
    #[getter]
    fn alloc(&self) -> u64 {
        self.inner.memory().alloc.0
    }

    /// The first byte of the claimed range.
    #[getter]
    fn start(&self) -> u64 {
        self.inner.memory().range.start
    }

    /// One past the last byte of the claimed range.
    #[getter]
    fn end(&self) -> u64 {
        self.inner.memory().range.end
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        let memory = self.inner.memory();
        let failure = self
            .inner
            .failure()
            .map_or("None".to_string(), |f| format!("FailureId({})", f.get()));
        format!(
            "Claim(kind={:?}, failure={failure}, alloc={}, start={}, end={})",
            self.kind(),
            memory.alloc.0,
            memory.range.start,
            memory.range.end
        )
    }
}

fn range_tuple(memory: &AllocRange) -> (u64, u64, u64) {
    (memory.alloc.0, memory.range.start, memory.range.end)
}

/// A launch that did not run because an input had a claim; its outputs inherited
/// `failure`.
#[pyclass(
    name = "Skipped",
    module = "cubepool._cubepool",
    frozen,
    skip_from_py_object
)]
#[derive(Clone)]
pub(crate) struct PySkipped {
    inner: Skipped,
}

#[pymethods]
impl PySkipped {
    /// The kernel that did not run.
    #[getter]
    fn kernel(&self) -> &str {
        &self.inner.kernel
    }

    /// The claim of the input that stopped it.
    #[getter]
    fn needed(&self) -> PyClaim {
        PyClaim {
            inner: self.inner.needed.clone(),
        }
    }

    /// What it would have written, as (alloc, start, end) ranges.
    #[getter]
    fn produced(&self) -> Vec<(u64, u64, u64)> {
        self.inner.produced.iter().map(range_tuple).collect()
    }

    /// The failure its outputs carry.
    #[getter]
    fn failure(&self) -> PyFailureId {
        PyFailureId {
            inner: self.inner.failure,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Skipped(kernel={:?}, needed={}, failure=FailureId({}))",
            self.inner.kernel,
            PyClaim {
                inner: self.inner.needed.clone()
            }
            .__repr__(),
            self.inner.failure.get()
        )
    }
}

/// A live view of a MemoryManagement's error graph: every failure some reservation
/// still carries.
#[pyclass(name = "ErrorGraph", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyErrorGraph {
    pub(crate) state: Arc<ManagementState>,
}

impl PyErrorGraph {
    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&ErrorGraph) -> T) -> PyResult<T> {
        self.state.with(py, |memory| f(memory.error_graph_mut()))
    }
}

#[pymethods]
impl PyErrorGraph {
    /// The failures still carried, oldest first.
    fn failures(&self, py: Python<'_>) -> PyResult<Vec<PyFailureId>> {
        self.with(py, |graph| {
            graph
                .failures()
                .map(|inner| PyFailureId { inner })
                .collect()
        })
    }

    /// How many live reservations carry `failure`.
    fn carriers(&self, py: Python<'_>, failure: &PyFailureId) -> PyResult<usize> {
        self.with(py, |graph| graph.carriers(failure.inner))
    }

    /// The launches `failure` stopped (the first 16 are kept).
    fn skipped(&self, py: Python<'_>, failure: &PyFailureId) -> PyResult<Vec<PySkipped>> {
        self.with(py, |graph| {
            graph
                .skipped(failure.inner)
                .iter()
                .map(|s| PySkipped { inner: s.clone() })
                .collect()
        })
    }

    /// How many skipped launches of `failure` were counted but not kept.
    fn skipped_dropped(&self, py: Python<'_>, failure: &PyFailureId) -> PyResult<u64> {
        self.with(py, |graph| graph.skipped_dropped(failure.inner))
    }

    /// The message of `failure`, or None once it left the graph.
    fn message(&self, py: Python<'_>, failure: &PyFailureId) -> PyResult<Option<String>> {
        self.with(py, |graph| graph.message(failure.inner).map(str::to_string))
    }

    /// Why the bytes of a handle or binding cannot be trusted, in text: the claim, the
    /// chain of skipped launches, and the original failure; None when they can.
    fn report(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let (alloc, _) = target_extent(py, &self.state, target)?;
        self.with(py, |graph| graph.report(alloc))
    }

    /// Whether no failure is carried.
    fn is_empty(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, ErrorGraph::is_empty)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |graph| graph.failures().len())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |graph| {
            format!("<ErrorGraph failures={}>", graph.failures().len())
        })
    }
}

/// The allocation id and size of a handle or binding (for an unbound handle whose
/// reservation failed, the size it asked for).
///
/// A handle or binding of another MemoryManagement is refused: allocation ids are
/// only meaningful to the management that minted them, so a foreign one would taint
/// (or clear) an unrelated allocation here, or taint one this graph never sees
/// released.
fn target_extent(
    py: Python<'_>,
    state: &Arc<ManagementState>,
    target: &Bound<'_, PyAny>,
) -> PyResult<(AllocId, u64)> {
    let expected =
        "expected a ManagedMemoryHandle, a ManagedMemoryBinding or a (handle, start, end) tuple";
    match Target::of_state(target, state, expected)? {
        Target::Binding(binding) => {
            let binding = &binding.get().binding;
            Ok((AllocId(binding.id().0), binding.size()))
        }
        Target::Handle(handle) => {
            let handle = handle.get();
            if handle.released() {
                return Err(handle_released(py));
            }
            let alloc = AllocId(handle.id_value());
            if let Some(size) = handle.bound_size() {
                return Ok((alloc, size));
            }
            let unallocated = state.with(py, |memory| {
                memory
                    .error_graph()
                    .unallocated(alloc)
                    .map(|(size, _)| size)
            })?;
            unallocated.map(|size| (alloc, size)).ok_or_else(|| {
                invalid_argument(
                    py,
                    format!(
                        "handle {} is not bound to memory (call mm.bind(handle, size))",
                        alloc.0
                    ),
                )
            })
        }
    }
}

/// A handle, binding or `(handle, start, end)` tuple as an allocation range, checked
/// against the allocation's size.
fn target_range(
    py: Python<'_>,
    state: &Arc<ManagementState>,
    item: &Bound<'_, PyAny>,
) -> PyResult<(AllocId, Range<u64>)> {
    if let Ok(tuple) = item.cast::<PyTuple>() {
        if tuple.len() != 3 {
            return Err(PyTypeError::new_err(
                "a range is a (handle, start, end) tuple",
            ));
        }
        // The bounds before the extent, as in `argument_range`.
        let start = size_arg(&tuple.get_item(1)?, "start")?;
        let end = size_arg(&tuple.get_item(2)?, "end")?;
        let (alloc, size) = target_extent(py, state, &tuple.get_item(0)?)?;
        return checked_range(py, alloc, size, start, Some(end));
    }
    let (alloc, size) = target_extent(py, state, item)?;
    Ok((alloc, 0..size))
}

/// `start..end` (end defaulting to `size`) if it lies inside `0..size`.
fn checked_range(
    py: Python<'_>,
    alloc: AllocId,
    size: u64,
    start: u64,
    end: Option<u64>,
) -> PyResult<(AllocId, Range<u64>)> {
    let end = end.unwrap_or(size);
    if start > end || end > size {
        return Err(invalid_argument(
            py,
            format!(
                "range {start}..{end} is outside allocation {} of {size} bytes",
                alloc.0
            ),
        ));
    }
    Ok((alloc, start..end))
}

/// The Python exception for a refused graph operation.
fn graph_error(py: Python<'_>, error: GraphError) -> PyErr {
    invalid_argument(py, error.to_string())
}

/// Python objects for a launch's outcome: None, a Skipped, or the new FailureId.
fn outcome_object(py: Python<'_>, outcome: crate::errors::LaunchOutcome) -> PyResult<Py<PyAny>> {
    use crate::errors::LaunchOutcome;
    Ok(match outcome {
        LaunchOutcome::Ran => py.None(),
        LaunchOutcome::Skipped(inner) => Py::new(py, PySkipped { inner })?.into_any(),
        LaunchOutcome::Failed(inner) => Py::new(py, PyFailureId { inner })?.into_any(),
    })
}

/// `MemoryManagement.launch`: records a launch of `kernel` that reads and writes the
/// given handles, bindings or `(handle, start, end)` ranges; returns None, a Skipped or
/// the new FailureId.
pub(crate) fn launch<'py>(
    py: Python<'py>,
    state: &Arc<ManagementState>,
    kernel: &str,
    reads: Option<&Bound<'py, PyAny>>,
    writes: Option<&Bound<'py, PyAny>>,
    fail: Option<String>,
) -> PyResult<Py<PyAny>> {
    // The handles named, with the size each was bound to when its range was taken, kept
    // to be checked again under the lock: taking the ranges runs Python code (an
    // iterator's, an `__index__`), which may release a handle already taken (and a launch
    // must not taint an allocation that is gone: no release would ever clear it) or bind
    // one (whose range was then taken from its unallocated claim, past its bytes).
    let mut handles: Vec<(Bound<'_, PyHandle>, Option<u64>)> = Vec::new();
    // The bindings named, held until the launch is recorded: a binding keeps its
    // allocation while it lives, and the code that reads the arguments may drop the
    // caller's last reference to one whose range was taken (the allocation would go,
    // and the failure would be recorded on an allocation no release would clear).
    let mut bindings: Vec<Bound<'py, PyAny>> = Vec::new();
    let mut ranges = |items: Option<&Bound<'py, PyAny>>| -> PyResult<Vec<_>> {
        let mut ranges = Vec::new();
        for item in items
            .map(|items| items.try_iter())
            .transpose()?
            .into_iter()
            .flatten()
        {
            let item = item?;
            ranges.push(target_range(py, state, &item)?);
            let target = match item.cast::<PyTuple>() {
                Ok(tuple) => tuple.get_item(0)?,
                Err(_) => item,
            };
            match target.cast_into::<PyHandle>() {
                Ok(handle) => {
                    let bound = handle.get().bound_size();
                    handles.push((handle, bound));
                }
                Err(error) => bindings.push(error.into_inner()),
            }
        }
        Ok(ranges)
    };
    let (reads, writes) = (ranges(reads)?, ranges(writes)?);
    let outcome = state.with(py, |memory| {
        if handles.iter().any(|(handle, _)| handle.get().released()) {
            return Err(Changed::Released);
        }
        if let Some((handle, _)) = handles
            .iter()
            .find(|(handle, bound)| handle.get().bound_size() != *bound)
        {
            return Err(Changed::Bound(handle.get().id_value()));
        }
        Ok(memory
            .error_graph_mut()
            .launch(kernel, &reads, &writes, fail))
    })?;
    drop(bindings);
    let outcome = outcome.map_err(|changed| match changed {
        Changed::Released => handle_released(py),
        Changed::Bound(id) => invalid_argument(
            py,
            format!(
                "handle {id} was bound while the launch's arguments were read; its range was \
                 taken before: launch again"
            ),
        ),
    })?;
    outcome_object(py, outcome.map_err(|e| graph_error(py, e))?)
}

/// A handle a launch named that changed while its arguments were read.
enum Changed {
    /// Released.
    Released,
    /// Bound, with this id.
    Bound(u64),
}

/// The allocation range `start..end` (defaults: 0 and the end) of a handle or binding.
fn argument_range(
    py: Python<'_>,
    state: &Arc<ManagementState>,
    target: &Bound<'_, PyAny>,
    start: Option<&Bound<'_, PyAny>>,
    end: Option<&Bound<'_, PyAny>>,
) -> PyResult<(AllocId, Range<u64>)> {
    // The bounds first: converting them may run Python code (`__index__`), which
    // could bind or release the target, so its extent is read after them.
    let start = opt_size_arg(start, "start")?.unwrap_or(0);
    let end = opt_size_arg(end, "end")?;
    let (alloc, size) = target_extent(py, state, target)?;
    checked_range(py, alloc, size, start, end)
}

/// `MemoryManagement.write`: records a host write of `start..end` of a handle or
/// binding, which clears any taint there.
pub(crate) fn write(
    py: Python<'_>,
    state: &Arc<ManagementState>,
    target: &Bound<'_, PyAny>,
    start: Option<&Bound<'_, PyAny>>,
    end: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let (alloc, range) = argument_range(py, state, target, start, end)?;
    let written = state.with(py, |memory| memory.error_graph_mut().write(alloc, range))?;
    written.map_err(|e| graph_error(py, e))
}

/// `MemoryManagement.claim`: the first claim in `start..end` of a handle or binding,
/// or None when its bytes can be trusted.
pub(crate) fn claim(
    py: Python<'_>,
    state: &Arc<ManagementState>,
    target: &Bound<'_, PyAny>,
    start: Option<&Bound<'_, PyAny>>,
    end: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<PyClaim>> {
    let (alloc, range) = argument_range(py, state, target, start, end)?;
    let claim = state.with(py, |memory| memory.error_graph_mut().claim(alloc, range))?;
    Ok(claim
        .map_err(|e| graph_error(py, e))?
        .map(|inner| PyClaim { inner }))
}
