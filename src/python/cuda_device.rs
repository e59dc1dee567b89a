//! `device=` of `MemoryManagement`: the name parsed ("cpu", "cpu:0", "cuda",
//! "cuda:N"), the storage made for it, and its default device properties.

use pyo3::prelude::*;

use super::errors::{device_unavailable, invalid_argument};
use crate::config::MemoryDeviceProperties;
use crate::storage::DeviceStorage;

/// The alignment of a CUDA memory management's slices unless properties say
/// otherwise: what `cudaMalloc` guarantees, and what vectorised kernels expect.
const CUDA_ALIGNMENT: u64 = 256;

/// The CUDA ordinal `device` names, or `None` for the host; InvalidArgument naming the
/// accepted forms otherwise.
pub(crate) fn parse_device(py: Python<'_>, device: &str) -> PyResult<Option<i32>> {
    let bad = || {
        invalid_argument(
            py,
            format!("device must be \"cpu\" or \"cuda:N\" (N a device ordinal), got {device:?}"),
        )
    };
    let (kind, ordinal) = match device.split_once(':') {
        Some((kind, ordinal)) => {
            if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            (kind, ordinal.parse::<i32>().map_err(|_| bad())?)
        }
        None => (device, 0),
    };
    match kind {
        "cpu" if ordinal == 0 => Ok(None),
        "cuda" => Ok(Some(ordinal)),
        _ => Err(bad()),
    }
}

/// The storage for a device: host memory, or CUDA device `ordinal`
/// (DeviceUnavailable when the driver or the device is missing).
pub(crate) fn storage_for(py: Python<'_>, ordinal: Option<i32>) -> PyResult<DeviceStorage> {
    match ordinal {
        None => Ok(DeviceStorage::host()),
        Some(ordinal) => DeviceStorage::cuda(ordinal).map_err(|e| device_unavailable(py, &e)),
    }
}

/// The properties a memory management gets when none are given: the defaults, with
/// 256-byte alignment on a CUDA device.
pub(crate) fn default_properties(ordinal: Option<i32>) -> MemoryDeviceProperties {
    let mut properties = MemoryDeviceProperties::default();
    if ordinal.is_some() {
        properties.alignment = properties.alignment.max(CUDA_ALIGNMENT);
    }
    properties
}

/// "cpu" or "cuda:N".
pub(crate) fn device_name(ordinal: Option<i32>) -> String {
    match ordinal {
        None => "cpu".to_string(),
        Some(ordinal) => format!("cuda:{ordinal}"),
    }
}
