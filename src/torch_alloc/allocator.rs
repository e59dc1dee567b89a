//! [`StreamAllocator`]: a memory management serving PyTorch's allocator calls
//! (`alloc(size, device, stream)` / `free(ptr, size, device, stream)`) by address,
//! with stream-safe reuse ([`StreamGate`]) and an optional trace of the run.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use thiserror::Error;

use super::events::{Stream, StreamEvents};
use super::gate::StreamGate;
use crate::error::PoolError;
use crate::handle::ManagedMemoryHandle;
use crate::management::MemoryManagement;
use crate::stats::MemoryStats;
use crate::storage::ComputeStorage;
use crate::trace::format::TraceBuilder;
use crate::trace::{Trace, TraceHeader};

/// Why an allocator call failed. The C entry points return NULL (alloc) or do
/// nothing (free) and keep the error for `cubepool.torch.last_error()`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AllocError {
    /// No allocator is configured (`cubepool.torch.use()` was not called).
    #[error("cubepool's allocator is not configured (call cubepool.torch.use() first)")]
    NotConfigured,
    /// A device other than the one the allocator serves.
    #[error("device {device} asked for, but cubepool's allocator serves device {serves}")]
    WrongDevice {
        /// The device the caller named.
        device: i32,
        /// The device configured.
        serves: i32,
    },
    /// A negative size.
    #[error("size must be non-negative, got {size}")]
    BadSize {
        /// The size given.
        size: i64,
    },
    /// The pools could not serve the size (out of memory, over capacity, too big).
    #[error("{0}")]
    Pool(PoolError),
    /// A free of a pointer this allocator never handed out.
    #[error("free of unknown pointer {ptr:#x}: cubepool did not allocate it")]
    UnknownPointer {
        /// The pointer given.
        ptr: u64,
    },
    /// A second free of a pointer.
    #[error("double free of pointer {ptr:#x}")]
    DoubleFree {
        /// The pointer given.
        ptr: u64,
    },
    /// A free whose size is not the size allocated.
    #[error(
        "free of pointer {ptr:#x} with size {size}, but {allocated} bytes were allocated there"
    )]
    SizeMismatch {
        /// The pointer given.
        ptr: u64,
        /// The size given.
        size: u64,
        /// The size allocated.
        allocated: u64,
    },
    /// The storage placed a new block at address 0 (what PyTorch reads as a failed
    /// allocation) or at one already handed out: a storage whose buffers have no
    /// addresses of their own cannot serve PyTorch. The block was given back.
    #[error(
        "the storage placed a block of {size} bytes at {address:#x}, which is 0 or already \
         handed out: PyTorch needs a storage with real, distinct addresses"
    )]
    AddressTaken {
        /// The address the storage gave.
        address: u64,
        /// The size asked for.
        size: u64,
    },
    /// The stream's event could not be recorded (a device error); the block was kept
    /// out of the pools rather than risk handing it to another stream.
    #[error("could not record an event on stream {stream:#x}: {reason}")]
    Event {
        /// The stream.
        stream: u64,
        /// The driver's error.
        reason: String,
    },
}

/// A live allocation.
struct Live {
    handle: ManagedMemoryHandle,
    size: u64,
    /// The stream it was allocated for, whose work its free is ordered after.
    stream: Stream,
    /// Its number among every allocation made (its id in a trace).
    trace_id: u64,
}

/// A trace being recorded.
struct Recording {
    builder: TraceBuilder,
    start: Instant,
    /// The number of the first allocation made while recording: frees of earlier
    /// ones are left out (the trace starts with nothing live).
    first: u64,
    /// The first event the builder refused (never expected: ids are fresh).
    error: Option<String>,
}

impl Recording {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The object-safe face of [`StreamAllocator`], so one global serves any storage.
pub trait DeviceAllocator: Send {
    /// Allocates `size` bytes on `device` for use on `stream`; `0` for zero bytes.
    fn alloc(&mut self, size: i64, device: i32, stream: Stream) -> Result<u64, AllocError>;
    /// Frees `ptr` (of `size` bytes); `0` does nothing. The free is ordered after the
    /// work of the stream `ptr` was allocated for (PyTorch names that `stream` here).
    fn free(&mut self, ptr: u64, size: i64, device: i32, stream: Stream) -> Result<(), AllocError>;
    /// The statistics under `torch.cuda.memory_stats()` keys.
    fn memory_stats(&mut self) -> MemoryStats;
    /// Starts recording a trace; `false`, and the recording in progress left as it
    /// was, when one is (recordings do not nest: a second would end the first's).
    fn start_trace(&mut self, workload: &str) -> bool;
    /// Stops recording and returns the trace (`None` when none was recording).
    fn stop_trace(&mut self) -> Option<Result<Trace, String>>;
    /// Allocations live now.
    fn live(&self) -> usize;
    /// Frees whose events are still in flight, and cross-stream waits made so far.
    fn stream_counts(&self) -> (usize, u64);
    /// Gives every free page back to the device (after in-flight work completes).
    fn empty_cache(&mut self);
}

/// PyTorch's allocator calls served by a memory management over storage `S`, with
/// events `E` for stream-safe reuse.
///
/// Invariants: `live` holds exactly the allocations handed out and not freed; an
/// address is in `freed` only while no live allocation starts there.
pub struct StreamAllocator<S: ComputeStorage, E: StreamEvents> {
    memory: MemoryManagement<S>,
    gate: StreamGate<E>,
    device: i32,
    live: HashMap<u64, Live>,
    /// Addresses freed and not handed out again (to tell a double free from an
    /// unknown pointer).
    freed: HashSet<u64>,
    /// Allocations made so far (the next one's number).
    allocations: u64,
    recording: Option<Recording>,
}

impl<S: ComputeStorage, E: StreamEvents> StreamAllocator<S, E> {
    /// An allocator for `device` over `memory`, with `events`.
    pub fn new(memory: MemoryManagement<S>, events: E, device: i32) -> Self {
        Self {
            memory,
            gate: StreamGate::new(events),
            device,
            live: HashMap::new(),
            freed: HashSet::new(),
            allocations: 0,
            recording: None,
        }
    }

    fn check_device(&self, device: i32) -> Result<(), AllocError> {
        if device != self.device {
            return Err(AllocError::WrongDevice {
                device,
                serves: self.device,
            });
        }
        Ok(())
    }

    /// Reserves `size` bytes. Out of memory, the memory management gives its free pages
    /// back and tries once more itself, counting one retry and, where that fails too,
    /// one out-of-memory, as PyTorch does. (A second round here, after waiting for the
    /// frees in flight, found nothing new: a block is back in its pool from its free on,
    /// its event only orders the next user's stream after it; it counted every failure
    /// twice.)
    fn reserve(&mut self, size: u64) -> Result<(ManagedMemoryHandle, u64), PoolError> {
        let (handle, resource) = self.memory.reserve_located(size)?;
        Ok((handle, resource.address))
    }
}

impl<S: ComputeStorage, E: StreamEvents> DeviceAllocator for StreamAllocator<S, E> {
    fn alloc(&mut self, size: i64, device: i32, stream: Stream) -> Result<u64, AllocError> {
        self.check_device(device)?;
        let size = u64::try_from(size).map_err(|_| AllocError::BadSize { size })?;
        if size == 0 {
            return Ok(0);
        }
        self.gate.prune();
        let (handle, address) = self.reserve(size).map_err(AllocError::Pool)?;
        if address == 0 || self.live.contains_key(&address) {
            // Handed out, the block would be NULL to PyTorch, or take the place of the
            // live one in `live` (which would free it under its user): given back now.
            self.memory.release(handle);
            return Err(AllocError::AddressTaken { address, size });
        }
        self.gate.acquire(stream, address, size);
        self.freed.remove(&address);
        let trace_id = self.allocations;
        self.allocations += 1;
        if let Some(recording) = &mut self.recording {
            let t = recording.now();
            if let Err(error) = recording.builder.alloc(t, trace_id, size) {
                recording.error.get_or_insert(error);
            }
        }
        self.live.insert(
            address,
            Live {
                handle,
                size,
                stream,
                trace_id,
            },
        );
        Ok(address)
    }

    fn free(&mut self, ptr: u64, size: i64, device: i32, _: Stream) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        self.check_device(device)?;
        let Some(live) = self.live.get(&ptr) else {
            if self.freed.contains(&ptr) {
                return Err(AllocError::DoubleFree { ptr });
            }
            return Err(AllocError::UnknownPointer { ptr });
        };
        let size = u64::try_from(size).map_err(|_| AllocError::BadSize { size })?;
        if size != live.size {
            return Err(AllocError::SizeMismatch {
                ptr,
                size,
                allocated: live.size,
            });
        }
        // The event first: a block whose event failed stays out of the pools. It goes on
        // the stream the block was allocated for, whose work uses it, whatever stream
        // the call names (PyTorch names that one; an event on another stream would let
        // the next user's stream overtake the allocation stream's work).
        let stream = live.stream;
        let recorded = self.gate.freed(stream, ptr, size);
        let Some(live) = self.live.remove(&ptr) else {
            return Err(AllocError::UnknownPointer { ptr });
        };
        if let Err(reason) = recorded {
            // Leaked on purpose: handing it out could race the stream's work.
            std::mem::forget(live.handle);
            return Err(AllocError::Event { stream, reason });
        }
        self.memory.release(live.handle);
        self.freed.insert(ptr);
        if let Some(recording) = &mut self.recording {
            // Allocations made before the recording started are not in the trace.
            if live.trace_id >= recording.first {
                let t = recording.now();
                if let Err(error) = recording.builder.free(t, live.trace_id) {
                    recording.error.get_or_insert(error);
                }
            }
        }
        Ok(())
    }

    fn memory_stats(&mut self) -> MemoryStats {
        self.memory.memory_stats()
    }

    fn start_trace(&mut self, workload: &str) -> bool {
        if self.recording.is_some() {
            return false;
        }
        let header = TraceHeader {
            workload: workload.to_string(),
            source: "cubepool.torch".to_string(),
            ..TraceHeader::default()
        };
        self.recording = Some(Recording {
            builder: TraceBuilder::new(header),
            start: Instant::now(),
            first: self.allocations,
            error: None,
        });
        true
    }

    fn stop_trace(&mut self) -> Option<Result<Trace, String>> {
        let recording = self.recording.take()?;
        Some(match recording.error {
            Some(error) => Err(error),
            None => recording
                .builder
                .finish()
                .map_err(|error| error.to_string()),
        })
    }

    fn live(&self) -> usize {
        self.live.len()
    }

    fn stream_counts(&self) -> (usize, u64) {
        (self.gate.in_flight(), self.gate.waits())
    }

    fn empty_cache(&mut self) {
        self.gate.drain();
        self.memory.cleanup(true);
    }
}
