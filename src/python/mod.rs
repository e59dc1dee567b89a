//! The only module that knows about pyo3: thin wrappers over the core.
#![allow(unsafe_code)]

mod args;
mod at_peak;
mod buffer_export;
mod config;
mod cuda_device;
mod cuda_dlpack;
mod cuda_torch;
mod disco_frames;
mod errors;
mod gil_cell;
mod handles;
mod layout;
mod management;
mod method_o;
mod pickling;
mod placement;
mod recording;
mod report;
mod result_dict;
mod shared_bindings;
mod taint;
mod tensor;
mod torch_model;
mod trace;
mod trace_builder;
mod unpickle;
mod values;

use pyo3::prelude::*;

/// The compiled half of the `cubepool` package. It needs the GIL: memory managements
/// (and the handles dropped while one is busy) are guarded by it (`gil_cell`).
#[pymodule(gil_used = true)]
fn _cubepool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The GIL guards memory managements (`gil_cell`): refuse an interpreter without one.
    let sys = m.py().import("sys")?;
    if let Ok(is_gil_enabled) = sys.getattr("_is_gil_enabled") {
        if !is_gil_enabled.call0()?.is_truthy()? {
            return Err(pyo3::exceptions::PyImportError::new_err(
                "cubepool needs the GIL; run Python with the GIL enabled (PYTHON_GIL=1)",
            ));
        }
    }
    errors::bind_classes(m.py())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "EXCLUSIVE_MEMORY_ONLY",
        crate::config::EXCLUSIVE_MEMORY_ONLY,
    )?;
    m.add_class::<config::PyMemoryDeviceProperties>()?;
    m.add_class::<config::PyPoolType>()?;
    m.add_class::<config::PyMemoryPoolOptions>()?;
    m.add_class::<config::PyMemoryConfiguration>()?;
    m.add_class::<management::PyMemoryManagement>()?;
    management::RESERVE.install(&m.py().get_type::<management::PyMemoryManagement>())?;
    m.add_class::<management::PersistentWindow>()?;
    m.add_class::<handles::PyHandle>()?;
    m.add_class::<handles::PyBinding>()?;
    m.add_class::<values::PyMemoryUsage>()?;
    m.add_class::<values::PyResource>()?;
    m.add_class::<shared_bindings::PySharedMemoryBindings>()?;
    m.add_class::<report::PyMemoryPoolKind>()?;
    m.add_class::<report::PyMemoryPoolReport>()?;
    m.add_class::<report::PyMemoryReport>()?;
    m.add_class::<report::PyMemoryRecord>()?;
    m.add_class::<taint::PyFailureId>()?;
    m.add_class::<taint::PyClaim>()?;
    m.add_class::<taint::PySkipped>()?;
    m.add_class::<taint::PyErrorGraph>()?;
    m.add_class::<trace::PyTrace>()?;
    m.add_class::<trace_builder::PyTraceBuilder>()?;
    m.add_class::<recording::PyRecording>()?;
    m.add_class::<trace::PyReplayResult>()?;
    m.add_class::<trace::PyPoolReplay>()?;
    m.add_class::<trace::PyTimeline>()?;
    m.add_class::<at_peak::PyAtPeak>()?;
    m.add_class::<at_peak::PyReservedSegment>()?;
    m.add_class::<at_peak::PyPinnedBlock>()?;
    m.add_class::<torch_model::PyTorchAllocatorModel>()?;
    m.add_class::<disco_frames::PySmallFrameMac>()?;
    m.add_function(wrap_pyfunction!(optimal_align, m)?)?;
    m.add_function(wrap_pyfunction!(trace::load_trace_v1, m)?)?;
    m.add_function(wrap_pyfunction!(trace::replay_trace, m)?)?;
    m.add_function(wrap_pyfunction!(torch_model::replay_torch_model, m)?)?;
    m.add_function(wrap_pyfunction!(trace::replay_until_bound, m)?)?;
    m.add_function(wrap_pyfunction!(trace::pool_routes, m)?)?;
    m.add_function(wrap_pyfunction!(layout::pool_spec, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(config::plan_file_granule, m)?)?;
    m.add_function(wrap_pyfunction!(unpickle::restricted_unpickle, m)?)?;
    m.add_class::<placement::PyPlacement>()?;
    m.add_function(wrap_pyfunction!(placement::place_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(placement::place_csv, m)?)?;
    tensor::register(m)?;
    cuda_torch::register(m)?;
    Ok(())
}

/// A best-effort alignment for row-aligned tensors: `elem_size` for unit rows, else
/// the next power of two of the row's bytes clamped to `[16, buffer_align]`.
#[pyfunction]
fn optimal_align(
    #[pyo3(from_py_with = args::shape)] shape: usize,
    #[pyo3(from_py_with = args::elem_size)] elem_size: usize,
    #[pyo3(from_py_with = args::buffer_align)] buffer_align: usize,
) -> usize {
    crate::config::optimal_align(shape, elem_size, buffer_align)
}
