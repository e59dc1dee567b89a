//! Handles and bindings: shared descriptors of one reservation.
//!
//! A [`ManagedMemoryHandle`] and a [`ManagedMemoryBinding`] share one descriptor. The
//! reservation stays in use while any handle or binding refers to it; when the last
//! one is dropped the descriptor queues its location for release, and memory
//! management frees it at its next operation (so dropping never needs the lock of the
//! memory management, from any thread).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::pool::SlotId;

/// The unique id of one reservation; never reused within a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ManagedMemoryId(pub u64);

impl ManagedMemoryId {
    /// A fresh id.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Which pool of a memory management holds a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolRef {
    /// The dynamic pool at this index of the configuration.
    Dynamic(u8),
    /// The persistent pool.
    Persistent,
    /// No pool: a zero-byte reservation holds no memory.
    Empty,
}

/// Where a reservation lives: its pool and its slot in that pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    /// The pool.
    pub pool: PoolRef,
    /// The slot inside the pool.
    pub slot: SlotId,
}

impl Location {
    /// The location of a zero-byte reservation.
    pub(crate) const EMPTY: Location = Location {
        pool: PoolRef::Empty,
        slot: SlotId {
            index: 0,
            generation: 0,
        },
    };
}

/// Locations whose last handle or binding was dropped, waiting to be freed.
#[derive(Debug, Default)]
pub(crate) struct ReleaseQueue {
    pending: Mutex<Vec<(Location, ManagedMemoryId)>>,
    /// A hint of `pending.len()`, so an empty queue is drained without locking.
    /// Written under the lock; a stale zero only delays a release to the next drain.
    queued: AtomicUsize,
}

impl ReleaseQueue {
    fn push(&self, location: Location, id: ManagedMemoryId) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.push((location, id));
        self.queued.store(pending.len(), Ordering::Release);
    }

    /// Moves every pending location (with its reservation's id) into `out` (which is
    /// cleared first).
    pub(crate) fn drain_into(&self, out: &mut Vec<(Location, ManagedMemoryId)>) {
        out.clear();
        if self.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *pending, out);
        self.queued.store(0, Ordering::Release);
    }
}

/// The state a handle and its bindings share.
#[derive(Debug)]
struct Descriptor {
    id: ManagedMemoryId,
    /// The identity of the memory management that made it.
    owner: u64,
    location: Location,
    size: u64,
    /// The number of live handles (bindings do not count).
    handles: AtomicUsize,
    releases: Arc<ReleaseQueue>,
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // Zero-byte and unbound handles are queued too: the release of their id lets
        // the error graph forget them.
        self.releases.push(self.location, self.id);
    }
}

/// A handle to reserved memory. Clones share the reservation; it is freed when the
/// last handle and binding are dropped.
#[derive(Debug)]
pub struct ManagedMemoryHandle {
    descriptor: Arc<Descriptor>,
}

impl ManagedMemoryHandle {
    pub(crate) fn new(
        id: ManagedMemoryId,
        owner: u64,
        location: Location,
        size: u64,
        releases: Arc<ReleaseQueue>,
    ) -> Self {
        Self {
            descriptor: Arc::new(Descriptor {
                id,
                owner,
                location,
                size,
                handles: AtomicUsize::new(1),
                releases,
            }),
        }
    }

    /// The reservation's id.
    pub fn id(&self) -> ManagedMemoryId {
        self.descriptor.id
    }

    /// The bytes reserved.
    pub fn size(&self) -> u64 {
        self.descriptor.size
    }

    /// Whether this is the only handle to the reservation (bindings do not count), so
    /// that it may be written in place.
    pub fn can_mut(&self) -> bool {
        self.descriptor.handles.load(Ordering::Acquire) == 1
    }

    /// A binding to the same reservation, which keeps it in use.
    pub fn binding(&self) -> ManagedMemoryBinding {
        ManagedMemoryBinding {
            descriptor: Arc::clone(&self.descriptor),
        }
    }

    pub(crate) fn owner(&self) -> u64 {
        self.descriptor.owner
    }

    pub(crate) fn location(&self) -> Location {
        self.descriptor.location
    }
}

impl Clone for ManagedMemoryHandle {
    fn clone(&self) -> Self {
        self.descriptor.handles.fetch_add(1, Ordering::AcqRel);
        Self {
            descriptor: Arc::clone(&self.descriptor),
        }
    }
}

impl Drop for ManagedMemoryHandle {
    fn drop(&mut self) {
        self.descriptor.handles.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A binding of a reservation, as a launch holds it: it keeps the memory in use but
/// does not count as a handle for [`ManagedMemoryHandle::can_mut`].
#[derive(Debug, Clone)]
pub struct ManagedMemoryBinding {
    descriptor: Arc<Descriptor>,
}

impl ManagedMemoryBinding {
    /// The reservation's id.
    pub fn id(&self) -> ManagedMemoryId {
        self.descriptor.id
    }

    /// The bytes reserved.
    pub fn size(&self) -> u64 {
        self.descriptor.size
    }

    pub(crate) fn owner(&self) -> u64 {
        self.descriptor.owner
    }

    pub(crate) fn location(&self) -> Location {
        self.descriptor.location
    }
}

/// Anything that names a reservation: a handle or a binding.
pub trait MemoryHandle {
    /// The reservation's id.
    fn memory_id(&self) -> ManagedMemoryId;
    /// The identity of the memory management that made it, and where it lives.
    fn address_of(&self) -> (u64, Location);
}

impl MemoryHandle for ManagedMemoryHandle {
    fn memory_id(&self) -> ManagedMemoryId {
        self.id()
    }
    fn address_of(&self) -> (u64, Location) {
        (self.owner(), self.location())
    }
}

impl MemoryHandle for ManagedMemoryBinding {
    fn memory_id(&self) -> ManagedMemoryId {
        self.id()
    }
    fn address_of(&self) -> (u64, Location) {
        (self.owner(), self.location())
    }
}
