//! The Python class of the PyTorch caching allocator model, and its replay.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::errors::{invalid_argument, opt_byte_size_arg, opt_size_arg, size_arg, type_name};
use super::pickling::{reduce_by, Reduced};
use super::trace::{PyReplayResult, PyTrace, ReplaySource};
use crate::trace::{
    replay_torch, ReplayOptions, Replayed, TorchSettings, TorchSettingsError, DEFAULT_SAMPLES,
    ROUNDUP_INTERVALS,
};

fn settings_error(py: Python<'_>, error: TorchSettingsError) -> PyErr {
    invalid_argument(py, error.to_string())
}

/// The `roundup_power2_divisions` argument: one value for every size, or one per
/// interval.
enum Divisions {
    /// An int: every interval (a power of two).
    Every(u64),
    /// 16 ints, interval by interval (each 0 or a power of two).
    Table([u64; ROUNDUP_INTERVALS]),
}

/// Reads `roundup_power2_divisions`: None, an int, or a list or tuple of 16 ints;
/// `TypeError` naming it for another type, `InvalidArgument` for another length or a
/// negative int.
fn divisions_arg(value: &Bound<'_, PyAny>) -> PyResult<Option<Divisions>> {
    const WHAT: &str = "roundup_power2_divisions";
    if value.is_none() {
        return Ok(None);
    }
    if !(value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>()) {
        if value.is_instance_of::<pyo3::types::PyInt>() {
            return size_arg(value, WHAT).map(|d| Some(Divisions::Every(d)));
        }
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{WHAT} must be None, an int or a list of {ROUNDUP_INTERVALS} ints (one per size \
             interval), got {}",
            type_name(value)
        )));
    }
    let len = value.len()?;
    if len != ROUNDUP_INTERVALS {
        return Err(invalid_argument(
            value.py(),
            format!(
                "{WHAT} takes {ROUNDUP_INTERVALS} values, one per size interval (1, 2, 4, ... \
                 32768 MiB), got {len}"
            ),
        ));
    }
    let mut table = [0; ROUNDUP_INTERVALS];
    for (index, slot) in table.iter_mut().enumerate() {
        *slot = size_arg(&value.get_item(index)?, &format!("{WHAT}[{index}]"))?;
    }
    Ok(Some(Divisions::Table(table)))
}

/// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) with
/// its default settings, or with expandable_segments:True, max_split_size_mb and
/// roundup_power2_divisions (one value, or one per size interval as in its list form
/// [256:1,>:8]) as PYTORCH_CUDA_ALLOC_CONF spells them. It is a model for
/// comparing replays with what PyTorch would reserve, not a pool layout to allocate
/// from: use it wherever a replay takes a layout (replay, compare, plot, sweep,
/// --config torch).
#[pyclass(
    name = "TorchAllocatorModel",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyTorchAllocatorModel {
    pub(crate) inner: TorchSettings,
}

#[pymethods]
impl PyTorchAllocatorModel {
    /// PyTorch's defaults, or expandable segments; max_split_size_mb (at least 20) and
    /// roundup_power2_divisions as in PYTORCH_CUDA_ALLOC_CONF: an int for every size (a
    /// power of two), or 16 ints, one per size interval (interval i: sizes in
    /// [2^i, 2^(i+1)) MiB, the first every size under 2 MiB, the last every size from
    /// 32 GiB), each 0 or a power of two.
    #[new]
    #[pyo3(signature = (expandable_segments = false, *, max_split_size_mb = None, roundup_power2_divisions = None))]
    fn new(
        py: Python<'_>,
        expandable_segments: bool,
        #[pyo3(from_py_with = super::args::max_split_size_mb)] max_split_size_mb: Option<u64>,
        #[pyo3(from_py_with = divisions_arg)] roundup_power2_divisions: Option<Divisions>,
    ) -> PyResult<Self> {
        let settings = TorchSettings {
            expandable_segments,
            ..TorchSettings::default()
        }
        .with_max_split_size_mb(max_split_size_mb)
        .and_then(|s| match roundup_power2_divisions {
            None => Ok(s),
            Some(Divisions::Every(divisions)) => s.with_roundup_power2_divisions(Some(divisions)),
            Some(Divisions::Table(table)) => s.with_roundup_power2_divisions_table(table),
        })
        .map_err(|e| settings_error(py, e))?;
        Ok(Self { inner: settings })
    }

    /// Reads a model's name: "torch" or "torch_expandable", optionally with options,
    /// e.g. "torch(max_split_size_mb=128, roundup_power2_divisions=4)" (key:value as in
    /// PYTORCH_CUDA_ALLOC_CONF works too). Raises InvalidArgument naming the problem.
    #[staticmethod]
    fn parse(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<Self> {
        // Text with a lone surrogate (a byte of a file name that is not UTF-8) names no
        // model: refused as the parser refuses a wrong name, not by the conversion's
        // UnicodeEncodeError.
        let Ok(text) = text.to_str() else {
            return Err(invalid_argument(
                py,
                "a model's name is text: this one holds a lone surrogate (a byte that is \
                 not UTF-8)"
                    .to_string(),
            ));
        };
        TorchSettings::parse(text)
            .map(|inner| Self { inner })
            .map_err(|e| settings_error(py, e))
    }

    /// The names `parse` reads without options.
    #[staticmethod]
    fn names() -> Vec<&'static str> {
        TorchSettings::NAMES.to_vec()
    }

    /// The model's name, which `parse` reads back.
    #[getter]
    fn name(&self) -> String {
        self.inner.to_string()
    }

    /// Whether the model uses expandable segments.
    #[getter]
    fn expandable_segments(&self) -> bool {
        self.inner.expandable_segments
    }

    /// max_split_size_mb, or None (no limit).
    #[getter]
    fn max_split_size_mb(&self) -> Option<u64> {
        self.inner.max_split_size_mb()
    }

    /// roundup_power2_divisions as the constructor takes them: None at PyTorch's
    /// default (0 everywhere), the int every size interval has, else the 16 values,
    /// one per interval.
    #[getter]
    fn roundup_power2_divisions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.inner.uniform_roundup_power2_divisions() {
            Some(0) => Ok(py.None().into_bound(py)),
            Some(divisions) => Ok(divisions.into_pyobject(py)?.into_any()),
            None => PyList::new(py, self.inner.roundup_power2_divisions).map(|l| l.into_any()),
        }
    }

    /// Pickles as its name (`TorchAllocatorModel.parse(name)`).
    /// Pickles as its text (`TorchAllocatorModel.parse(str(m))`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        reduce_by(slf.as_any(), "parse", slf.get().inner.to_string())
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("TorchAllocatorModel.parse({:?})", self.inner.to_string())
    }
}

/// Replays `trace` through the model of PyTorch's caching allocator, in Rust with the
/// GIL released. With `limit` (the device's memory), the model returns its cached
/// segments and retries before a request fails, as PyTorch does; failures are counted
/// in `failed_reserves`. The result has the shape of `replay_trace`'s, with two pools:
/// the small pool (requests up to 1 MiB), then the large pool.
#[pyfunction]
// `samples` is read by `size_arg` so a bad value names it; the text signature keeps
// the documented default.
#[pyo3(
    signature = (trace, model, *, limit = None, samples = None),
    text_signature = "(trace, model, *, limit=None, samples=512)"
)]
pub(crate) fn replay_torch_model(
    py: Python<'_>,
    trace: &PyTrace,
    model: &PyTorchAllocatorModel,
    limit: Option<&Bound<'_, PyAny>>,
    samples: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyReplayResult> {
    // As the layouts' replay reads it: refused by name where it is no count (-1, True),
    // and a count beyond usize keeps every event, as usize::MAX does.
    let samples = opt_size_arg(samples, "samples")?.map_or(DEFAULT_SAMPLES, |n| {
        usize::try_from(n).unwrap_or(usize::MAX)
    });
    let options = ReplayOptions {
        limit: opt_byte_size_arg(limit, "limit")?,
        samples,
    };
    let trace = Arc::clone(&trace.inner);
    let settings = model.inner;
    let result = py.detach(|| replay_torch(&trace, settings, options));
    Ok(PyReplayResult {
        inner: Arc::new(result),
        source: Some(Arc::new(ReplaySource::new(
            trace,
            Replayed::Torch(settings),
            options.limit,
        ))),
    })
}
