//! DLPack export of handles (`__dlpack__`, `__dlpack_device__`): the reserved bytes as
//! a 1-D uint8 tensor on the handle's device (`kDLCUDA` for `device="cuda:N"`,
//! `kDLCPU` on the host), so `torch.from_dlpack(handle)`, `cupy.from_dlpack(handle)`
//! and `numpy.from_dlpack(handle)` see the same bytes without a copy.
//!
//! The capsule holds a binding of the reservation and the memory management's state,
//! so the bytes stay reserved (and the storage alive) until the consumer lets go,
//! even after `handle.release()`.

use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::errors::pool_error;
use super::handles::Target;
use super::management::ManagementState;
use super::tensor::dlpack::{export_bytes, RawExport};
use crate::tensor::{DataType, Device};

/// DLPack's `kDLCUDA`.
const KDL_CUDA: i32 = 2;

/// The DLPack device of a memory management's bytes.
pub(crate) fn dlpack_device(state: &ManagementState) -> Device {
    match state.cuda_ordinal() {
        Some(ordinal) => Device {
            device_type: KDL_CUDA,
            device_id: ordinal,
        },
        None => Device::CPU0,
    }
}

/// `handle.__dlpack__(stream=, max_version=, dl_device=, copy=)`.
///
/// `stream` is accepted for device memory and ignored: cubepool queues no work on
/// the bytes, so they are ready on any stream. On the host it must be None. A copy
/// (`copy=True`) or another device is a BufferError: cubepool does not copy.
pub(crate) fn export_handle<'py>(
    handle: &Bound<'py, PyAny>,
    state: &Arc<ManagementState>,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<(u64, u64)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = handle.py();
    let device = dlpack_device(state);
    if state.cuda_ordinal().is_none() && stream.is_some_and(|s| !s.is_none()) {
        return Err(PyBufferError::new_err(
            "host memory has no streams: only stream=None is supported",
        ));
    }
    if let Some(asked) = dl_device {
        if asked != (device.device_type, device.device_id) {
            return Err(PyBufferError::new_err(format!(
                "the handle's bytes are on DLPack device ({}, {}), not {asked:?}; cubepool does \
                 not copy between devices",
                device.device_type, device.device_id
            )));
        }
    }
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "copy=True: cubepool exports its own bytes and does not copy them",
        ));
    }
    let binding = Target::of(handle, "__dlpack__ needs a ManagedMemoryHandle")?
        .bound_binding(py, "exporting it to DLPack")?;
    let resource = state.with(py, |memory| memory.resource(&binding))?;
    let resource = resource.map_err(|e| pool_error(py, e))?;
    let len = i64::try_from(resource.size)
        .map_err(|_| PyBufferError::new_err("the reservation is too large for DLPack"))?;
    let raw = RawExport {
        data: resource.address as *mut u8,
        device,
        dtype: DataType::UINT8,
        shape: vec![len],
        strides: vec![1],
        owner: Box::new((binding, Arc::clone(state))),
    };
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    export_bytes(py, raw, versioned)
}
