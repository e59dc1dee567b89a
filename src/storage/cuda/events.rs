//! [`CudaEvents`]: the stream gate's events on a GPU (`cuEventCreate` without timing,
//! `cuEventRecord`, `cuEventQuery`, `cuEventSynchronize`), reused through a free list.
#![allow(unsafe_code)]

use super::context::DeviceContext;
use super::driver::{Opaque, ERROR_NOT_READY, EVENT_DISABLE_TIMING, SUCCESS};
use super::CudaError;
use crate::torch_alloc::{Stream, StreamEvents};

/// A `CUevent` of [`CudaEvents`].
pub struct CudaEvent(Opaque);

// SAFETY: a CUevent may be used from any thread.
unsafe impl Send for CudaEvent {}

/// Events of one device's primary context.
pub struct CudaEvents {
    context: DeviceContext,
    /// Events recorded and completed, ready to record again.
    spare: Vec<CudaEvent>,
}

impl CudaEvents {
    /// Events on device `ordinal` (loads the driver on first use).
    pub fn new(ordinal: i32) -> Result<Self, CudaError> {
        Ok(Self {
            context: DeviceContext::new(ordinal)?,
            spare: Vec::new(),
        })
    }
}

impl StreamEvents for CudaEvents {
    type Event = CudaEvent;

    fn record(&mut self, stream: Stream) -> Result<CudaEvent, String> {
        let driver = self.context.driver;
        self.context.make_current().map_err(|e| e.to_string())?;
        let event = match self.spare.pop() {
            Some(event) => event,
            None => {
                let mut raw: Opaque = std::ptr::null_mut();
                // SAFETY: the driver writes one CUevent.
                let code = unsafe { (driver.event_create)(&mut raw, EVENT_DISABLE_TIMING) };
                driver
                    .check(code, "cuEventCreate")
                    .map_err(|e| e.to_string())?;
                CudaEvent(raw)
            }
        };
        // SAFETY: a live event; `stream` is a CUstream of this context (the caller's,
        // from PyTorch), 0 the legacy default stream.
        let code = unsafe { (driver.event_record)(event.0, stream as Opaque) };
        if let Err(error) = driver.check(code, "cuEventRecord") {
            self.spare.push(event);
            return Err(error.to_string());
        }
        Ok(event)
    }

    fn query(&mut self, event: &CudaEvent) -> bool {
        // SAFETY: a live, recorded event.
        let code = unsafe { (self.context.driver.event_query)(event.0) };
        // Any error but "not ready" ends the wait: the event will never complete.
        code == SUCCESS || code != ERROR_NOT_READY
    }

    fn wait(&mut self, event: &CudaEvent) {
        // SAFETY: a live, recorded event.
        unsafe { (self.context.driver.event_synchronize)(event.0) };
    }

    fn recycle(&mut self, event: CudaEvent) {
        self.spare.push(event);
    }
}

impl Drop for CudaEvents {
    fn drop(&mut self) {
        for event in self.spare.drain(..) {
            // SAFETY: each spare event is live and destroyed once.
            unsafe { (self.context.driver.event_destroy)(event.0) };
        }
    }
}
