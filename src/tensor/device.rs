//! Devices (`DLDevice`): a DLPack device type and an ordinal.

use std::fmt;

use super::error::TensorError;

/// DLPack's `kDLCPU`.
pub const CPU: i32 = 1;

/// DLPack device types and the names TVM's `DLDeviceType2Str` gives them.
const DEVICE_NAMES: &[(i32, &str)] = &[
    (1, "cpu"),
    (2, "cuda"),
    (3, "cuda_host"),
    (4, "opencl"),
    (7, "vulkan"),
    (8, "metal"),
    (9, "vpi"),
    (10, "rocm"),
    (11, "rocm_host"),
    (12, "ext_dev"),
    (13, "cuda_managed"),
    (14, "oneapi"),
    (15, "webgpu"),
    (16, "hexagon"),
    (17, "maia"),
];

/// The name of a DLPack device type (TVM's `DLDeviceType2Str`).
pub fn device_type_to_str(device_type: i32) -> Result<&'static str, TensorError> {
    DEVICE_NAMES
        .iter()
        .find(|(t, _)| *t == device_type)
        .map(|(_, name)| *name)
        .ok_or(TensorError::UnknownDeviceType { device_type })
}

/// A device: DLPack device type plus ordinal. cubepool allocates only on `cpu:0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    /// DLPack device type (`kDLCPU` = 1, `kDLCUDA` = 2, ...).
    pub device_type: i32,
    /// Device ordinal.
    pub device_id: i32,
}

impl Device {
    /// The host, `cpu:0`.
    pub const CPU0: Device = Device {
        device_type: CPU,
        device_id: 0,
    };

    /// Builds a device from a known DLPack device type and a non-negative ordinal.
    pub fn new(device_type: i32, device_id: i32) -> Result<Device, TensorError> {
        device_type_to_str(device_type)?;
        if device_id < 0 {
            return Err(TensorError::InvalidDevice {
                name: format!("{device_type}:{device_id}"),
            });
        }
        Ok(Device {
            device_type,
            device_id,
        })
    }

    /// Parses `"cpu"`, `"cpu:0"`, `"cuda:1"`, ... (names as `device_type_to_str` gives them).
    pub fn parse(name: &str) -> Result<Device, TensorError> {
        let invalid = || TensorError::InvalidDevice {
            name: name.to_owned(),
        };
        let (kind, id) = match name.split_once(':') {
            Some((kind, id)) => {
                if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid());
                }
                (kind, id.parse::<i32>().map_err(|_| invalid())?)
            }
            None => (name, 0),
        };
        let device_type = DEVICE_NAMES
            .iter()
            .find(|(_, n)| *n == kind)
            .map(|(t, _)| *t)
            .ok_or_else(invalid)?;
        Ok(Device {
            device_type,
            device_id: id,
        })
    }

    /// Whether the device's memory is host memory cubepool can read and write (`cpu:N`).
    pub fn is_cpu(self) -> bool {
        self.device_type == CPU
    }

    /// Fails unless the device is the host (`cpu:0`), the only device cubepool allocates on.
    pub fn require_cpu(self) -> Result<(), TensorError> {
        if self == Device::CPU0 {
            Ok(())
        } else {
            Err(TensorError::UnsupportedDevice { device: self })
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match device_type_to_str(self.device_type) {
            Ok(name) => write!(f, "{name}:{}", self.device_id),
            Err(_) => write!(f, "device{}:{}", self.device_type, self.device_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::CPU0);
        assert_eq!(Device::parse("cpu:0").unwrap(), Device::CPU0);
        let cuda = Device::parse("cuda:3").unwrap();
        assert_eq!((cuda.device_type, cuda.device_id), (2, 3));
        assert_eq!(cuda.to_string(), "cuda:3");
        for bad in [
            "",
            "cpu:",
            "cpu:-1",
            "gpu",
            "cpu:0:1",
            "cpu:x",
            "cpu:99999999999",
        ] {
            assert!(Device::parse(bad).is_err(), "{bad}");
        }
        assert!(Device::new(1, -1).is_err());
        assert!(Device::new(99, 0).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(device_type_to_str(1).unwrap(), "cpu");
        assert_eq!(device_type_to_str(13).unwrap(), "cuda_managed");
        assert!(device_type_to_str(0).is_err());
        assert!(Device::parse("cuda:0").unwrap().require_cpu().is_err());
    }
}
