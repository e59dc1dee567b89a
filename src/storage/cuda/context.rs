//! One device's primary context (the context the CUDA runtime, and so PyTorch and
//! CuPy, use), made current on the calling thread before each batch of driver calls.
#![allow(unsafe_code)]

use std::ffi::c_int;

use super::driver::{Driver, Opaque};
use super::CudaError;

/// The primary context of device `ordinal`, retained for the life of the process
/// (never released: other libraries of the process share it).
#[derive(Clone, Copy)]
pub(crate) struct DeviceContext {
    pub(crate) driver: &'static Driver,
    pub(crate) ordinal: c_int,
    context: Opaque,
}

// SAFETY: a CUcontext may be made current on any thread; the driver API is thread-safe.
unsafe impl Send for DeviceContext {}
// SAFETY: as above; the value is only read.
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// Loads the driver (once per process) and retains device `ordinal`'s primary
    /// context.
    pub(crate) fn new(ordinal: c_int) -> Result<Self, CudaError> {
        let driver = Driver::global()?;
        let mut count: c_int = 0;
        // SAFETY: the driver writes one int.
        driver.check(
            unsafe { (driver.device_get_count)(&mut count) },
            "cuDeviceGetCount",
        )?;
        if ordinal < 0 || ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let mut device: c_int = 0;
        // SAFETY: the driver writes one CUdevice (an int).
        driver.check(
            unsafe { (driver.device_get)(&mut device, ordinal) },
            "cuDeviceGet",
        )?;
        let mut context: Opaque = std::ptr::null_mut();
        // SAFETY: the driver writes one CUcontext.
        driver.check(
            unsafe { (driver.primary_ctx_retain)(&mut context, device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let this = Self {
            driver,
            ordinal,
            context,
        };
        this.make_current()?;
        Ok(this)
    }

    /// Makes the context current on this thread, unless it already is.
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        let mut current: Opaque = std::ptr::null_mut();
        // SAFETY: the driver writes one CUcontext.
        let code = unsafe { (self.driver.ctx_get_current)(&mut current) };
        self.driver.check(code, "cuCtxGetCurrent")?;
        if current != self.context {
            // SAFETY: a context retained in `new`, never released.
            let code = unsafe { (self.driver.ctx_set_current)(self.context) };
            self.driver.check(code, "cuCtxSetCurrent")?;
        }
        Ok(())
    }
}
