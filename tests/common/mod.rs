//! Helpers shared by the integration test binaries (each compiles this module on its
//! own).

use cubepool::{HostStorage, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement};

/// Memory management with the default layout and device properties over host memory.
pub fn host_memory() -> MemoryManagement<HostStorage> {
    MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::default(),
    )
    .unwrap()
}
