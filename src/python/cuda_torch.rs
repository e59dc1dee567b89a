//! The Python side of cubepool as PyTorch's allocator (`cubepool.torch` wraps these):
//! installing the allocator behind the extension's C entry points, its statistics,
//! trace recording and error log; and `cudaMemGetInfo` for checks.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::config::{config_arg, PyMemoryDeviceProperties};
use super::cuda_device::parse_device;
use super::errors::{config_error, device_unavailable, invalid_argument, trace_format_error};
use super::trace::PyTrace;
use crate::config::MemoryDeviceProperties;
use crate::management::MemoryManagement;
use crate::storage::{ComputeStorage, HostStorage};
use crate::torch_alloc::{self, AllocError, HostEvents, StreamAllocator, StreamEvents};

/// The alignment of every block unless properties say otherwise: PyTorch's own
/// allocator rounds every block to 512 bytes.
const TORCH_ALIGNMENT: u64 = 512;

/// The names of the C entry points, for `CUDAPluggableAllocator(path, alloc, free)`.
#[pyfunction]
pub(crate) fn torch_allocator_symbols() -> (&'static str, &'static str) {
    ("cubepool_torch_alloc", "cubepool_torch_free")
}

fn boxed<S: ComputeStorage + 'static, E: StreamEvents + 'static>(
    py: Python<'_>,
    storage: S,
    events: E,
    properties: MemoryDeviceProperties,
    configuration: crate::config::MemoryConfiguration,
    ordinal: i32,
) -> PyResult<Box<dyn torch_alloc::DeviceAllocator>> {
    let memory = MemoryManagement::from_configuration(storage, properties, configuration)
        .map_err(|e| config_error(py, &e, None))?
        .with_name("torch");
    Ok(Box::new(StreamAllocator::new(memory, events, ordinal)))
}

/// Installs a fresh allocator behind the C entry points: pools from `config` (as
/// `MemoryManagement` reads it), on `device` ("cuda:N"; "cpu" serves host memory,
/// for tests without a GPU). Refused while the current one has live allocations.
#[pyfunction]
#[pyo3(signature = (config = None, device = "cuda:0", properties = None))]
pub(crate) fn torch_allocator_install(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
    device: &str,
    properties: Option<&PyMemoryDeviceProperties>,
) -> PyResult<()> {
    let configuration = config_arg(py, config)?;
    let properties = properties
        .map(|p| p.inner)
        .unwrap_or(MemoryDeviceProperties {
            alignment: TORCH_ALIGNMENT,
            ..MemoryDeviceProperties::default()
        });
    let allocator = match parse_device(py, device)? {
        None => boxed(
            py,
            HostStorage::new(),
            HostEvents,
            properties,
            configuration,
            0,
        )?,
        Some(ordinal) => cuda_allocator(py, ordinal, properties, configuration)?,
    };
    torch_alloc::install(allocator).map_err(|live| {
        invalid_argument(
            py,
            format!(
                "cubepool's allocator has {live} live allocation(s); it cannot be replaced \
                 until they are freed"
            ),
        )
    })
}

#[cfg(target_os = "linux")]
fn cuda_allocator(
    py: Python<'_>,
    ordinal: i32,
    properties: MemoryDeviceProperties,
    configuration: crate::config::MemoryConfiguration,
) -> PyResult<Box<dyn torch_alloc::DeviceAllocator>> {
    use crate::storage::cuda::{CudaEvents, CudaStorage};
    let storage = CudaStorage::new(ordinal).map_err(|e| device_unavailable(py, &e))?;
    let events = CudaEvents::new(ordinal).map_err(|e| device_unavailable(py, &e))?;
    boxed(py, storage, events, properties, configuration, ordinal)
}

#[cfg(not(target_os = "linux"))]
fn cuda_allocator(
    py: Python<'_>,
    _ordinal: i32,
    _properties: MemoryDeviceProperties,
    _configuration: crate::config::MemoryConfiguration,
) -> PyResult<Box<dyn torch_alloc::DeviceAllocator>> {
    Err(device_unavailable(
        py,
        &crate::storage::cuda::CudaError::Unsupported,
    ))
}

/// Runs `f` on the installed allocator; InvalidArgument when none is.
fn with_installed<T>(
    py: Python<'_>,
    f: impl FnOnce(&mut dyn torch_alloc::DeviceAllocator) -> T,
) -> PyResult<T> {
    torch_alloc::with_allocator(f).map_err(|e: AllocError| invalid_argument(py, e.to_string()))
}

/// The installed allocator's statistics under `torch.cuda.memory_stats()` keys.
#[pyfunction]
pub(crate) fn torch_allocator_stats(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let stats = with_installed(py, |a| a.memory_stats())?;
    let dict = PyDict::new(py);
    for (key, value) in stats.to_flat() {
        dict.set_item(key, value)?;
    }
    Ok(dict.unbind())
}

/// Starts recording the allocator's calls as a trace named `workload`; InvalidArgument
/// while a recording is in progress (they do not nest).
#[pyfunction]
pub(crate) fn torch_allocator_start_trace(py: Python<'_>, workload: &str) -> PyResult<()> {
    if with_installed(py, |a| a.start_trace(workload))? {
        return Ok(());
    }
    Err(invalid_argument(
        py,
        "a recording is in progress already (cubepool.torch.record blocks do not nest; \
         end the first)"
            .to_string(),
    ))
}

/// Stops recording and returns the trace (None when none was recording).
#[pyfunction]
pub(crate) fn torch_allocator_stop_trace(py: Python<'_>) -> PyResult<Option<PyTrace>> {
    match with_installed(py, |a| a.stop_trace())? {
        None => Ok(None),
        Some(Ok(trace)) => Ok(Some(PyTrace::from(trace))),
        Some(Err(error)) => Err(trace_format_error(py, error, None, None)),
    }
}

/// The installed allocator's state: live allocations, frees still in flight on
/// their streams, cross-stream waits, the last error and the count of each kind.
#[pyfunction]
pub(crate) fn torch_allocator_state(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let (live, (in_flight, waits)) = with_installed(py, |a| (a.live(), a.stream_counts()))?;
    let dict = PyDict::new(py);
    dict.set_item("live", live)?;
    dict.set_item("in_flight_frees", in_flight)?;
    dict.set_item("cross_stream_waits", waits)?;
    dict.set_item("last_error", torch_alloc::last_error())?;
    let errors = PyDict::new(py);
    for (kind, count) in torch_alloc::error_counts() {
        errors.set_item(kind, count)?;
    }
    dict.set_item("errors", errors)?;
    Ok(dict.unbind())
}

/// Gives every free page of the installed allocator back to the device.
#[pyfunction]
pub(crate) fn torch_allocator_empty_cache(py: Python<'_>) -> PyResult<()> {
    with_installed(py, |a| a.empty_cache())
}

/// `cuMemGetInfo` of device `device` ("cuda:N"): `(free, total)` bytes.
#[pyfunction]
#[pyo3(signature = (device = "cuda:0"))]
pub(crate) fn cuda_memory_info(py: Python<'_>, device: &str) -> PyResult<(u64, u64)> {
    let Some(ordinal) = parse_device(py, device)? else {
        return Err(invalid_argument(
            py,
            "cuda_memory_info needs a CUDA device".to_string(),
        ));
    };
    memory_info(py, ordinal)
}

#[cfg(target_os = "linux")]
fn memory_info(py: Python<'_>, ordinal: i32) -> PyResult<(u64, u64)> {
    crate::storage::cuda::device_memory_info(ordinal).map_err(|e| device_unavailable(py, &e))
}

#[cfg(not(target_os = "linux"))]
fn memory_info(py: Python<'_>, _ordinal: i32) -> PyResult<(u64, u64)> {
    Err(device_unavailable(
        py,
        &crate::storage::cuda::CudaError::Unsupported,
    ))
}

/// Registers the functions of this module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(torch_allocator_symbols, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_install, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_start_trace, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_stop_trace, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_state, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_memory_info, m)?)?;
    Ok(())
}
