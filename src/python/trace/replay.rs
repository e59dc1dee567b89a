//! The replay functions: `replay_trace`, `replay_until` and `pool_routes`.

use std::sync::Arc;

use pyo3::prelude::*;

use super::{PyReplayResult, PyTrace, ReplaySource};
use crate::python::config::{PyMemoryConfiguration, PyMemoryDeviceProperties};
use crate::python::errors::{config_error, invalid_argument, opt_byte_size_arg, opt_size_arg};
use crate::trace::{
    replay, replay_selected_until, replay_until, routes, ReplayOptions, Replayed, SizeIndex,
    StopWhen, DEFAULT_SAMPLES,
};

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
        None => crate::python::config::configured(py)?,
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
    #[pyo3(from_py_with = crate::python::args::opt_sizes)] sizes: Option<Vec<u64>>,
    #[pyo3(from_py_with = crate::python::args::opt_size_ranges)] size_ranges: Option<
        Vec<(u64, u64)>,
    >,
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
    #[pyo3(from_py_with = crate::python::args::sizes)] sizes: Vec<u64>,
    properties: Option<&PyMemoryDeviceProperties>,
) -> PyResult<Vec<Option<usize>>> {
    let properties = properties.map(|p| p.inner).unwrap_or_default();
    routes(&config.inner, properties, &sizes).map_err(|e| config_error(py, &e, None))
}
