//! Handles and bindings: shared descriptors of one reservation.
//!
//! A [`ManagedMemoryHandle`] and a [`ManagedMemoryBinding`] share one descriptor. The
//! reservation stays in use while any handle or binding refers to it; when the last
//! one is dropped, the descriptor pushes itself onto a lock-free release list, and
//! memory management frees the reservation at its next operation (so dropping never
//! takes the lock of the memory management, from any thread).
//!
//! Descriptors are recycled: memory management keeps every descriptor it issued in a
//! [`DescriptorTable`] and reuses one once it has been released and no handle refers to
//! it any more (`Arc::get_mut` proves that), so a reserve + drop pair allocates
//! nothing and costs a handful of atomic operations. All of it is safe Rust.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::pool::SlotId;

/// The unique id of one reservation; never reused within a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ManagedMemoryId(pub u64);

impl ManagedMemoryId {
    /// A fresh id. Threads take ids from the global counter in blocks, so the hot
    /// path touches no shared cache line.
    pub fn next() -> Self {
        const BLOCK: u64 = 1024;
        static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static RANGE: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        RANGE.with(|range| {
            let (mut next, mut end) = range.get();
            if next == end {
                next = NEXT_BLOCK.fetch_add(BLOCK, Ordering::Relaxed);
                end = next + BLOCK;
            }
            range.set((next + 1, end));
            Self(next)
        })
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

/// The lock-free list of released descriptors: a Treiber stack of table indices,
/// linked through the descriptors' `next` fields, taken whole by the drainer (so no
/// ABA problem can arise).
#[derive(Debug, Default)]
struct ReleaseList {
    /// `index + 1` of the most recently released descriptor, 0 when empty.
    head: AtomicU64,
}

/// The state a handle and its bindings share.
#[derive(Debug)]
struct Descriptor {
    /// This descriptor's index in its table.
    index: u32,
    id: ManagedMemoryId,
    /// The identity of the memory management that made it.
    owner: u64,
    location: Location,
    size: u64,
    /// Live handles and bindings. Invariant: the reservation is in use while
    /// positive; the one that takes it to zero pushes the descriptor on `list`.
    users: AtomicUsize,
    /// Live bindings (so `users - bindings` is the number of handles).
    bindings: AtomicUsize,
    /// The next released descriptor's `index + 1` (0: none), while on `list`.
    next: AtomicU64,
    list: Arc<ReleaseList>,
}

impl Descriptor {
    fn add_user(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    fn remove_user(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut head = self.list.head.load(Ordering::Relaxed);
            loop {
                self.next.store(head, Ordering::Relaxed);
                match self.list.head.compare_exchange_weak(
                    head,
                    u64::from(self.index) + 1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(actual) => head = actual,
                }
            }
        }
    }
}

/// Every descriptor one memory management issued, for recycling.
#[derive(Debug, Default)]
pub(crate) struct DescriptorTable {
    descriptors: Vec<Arc<Descriptor>>,
    /// Indices released and drained, free to reissue (LIFO, so reuse is deterministic).
    vacant: Vec<u32>,
    list: Arc<ReleaseList>,
}

impl DescriptorTable {
    /// A handle to a new reservation.
    pub(crate) fn issue(
        &mut self,
        id: ManagedMemoryId,
        owner: u64,
        location: Location,
        size: u64,
    ) -> ManagedMemoryHandle {
        let fresh = |index: u32, list: &Arc<ReleaseList>| Descriptor {
            index,
            id,
            owner,
            location,
            size,
            users: AtomicUsize::new(1),
            bindings: AtomicUsize::new(0),
            next: AtomicU64::new(0),
            list: Arc::clone(list),
        };
        let index = match self.vacant.pop() {
            Some(index) => {
                let slot = &mut self.descriptors[index as usize];
                match Arc::get_mut(slot) {
                    // No handle refers to it any more: reuse it in place.
                    Some(descriptor) => {
                        descriptor.id = id;
                        descriptor.owner = owner;
                        descriptor.location = location;
                        descriptor.size = size;
                        *descriptor.users.get_mut() = 1;
                        *descriptor.bindings.get_mut() = 0;
                    }
                    // A dropping handle still holds it: leave it to that handle.
                    None => *slot = Arc::new(fresh(index, &self.list)),
                }
                index
            }
            None => {
                let index = u32::try_from(self.descriptors.len())
                    .expect("fewer than 2^32 live reservations");
                self.descriptors.push(Arc::new(fresh(index, &self.list)));
                index
            }
        };
        ManagedMemoryHandle {
            descriptor: Arc::clone(&self.descriptors[index as usize]),
        }
    }

    /// Moves the location and id of every released reservation into `out` (which is
    /// cleared first) and makes their descriptors reusable.
    pub(crate) fn drain_into(&mut self, out: &mut Vec<(Location, ManagedMemoryId)>) {
        out.clear();
        if self.list.head.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut cursor = self.list.head.swap(0, Ordering::AcqRel);
        while let Some(index) = cursor.checked_sub(1) {
            let descriptor = &self.descriptors[index as usize];
            out.push((descriptor.location, descriptor.id));
            cursor = descriptor.next.load(Ordering::Acquire);
            self.vacant.push(index as u32);
        }
    }
}

/// A handle to reserved memory. Clones share the reservation; it is freed when the
/// last handle and binding are dropped.
#[derive(Debug)]
pub struct ManagedMemoryHandle {
    descriptor: Arc<Descriptor>,
}

impl ManagedMemoryHandle {
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
        let users = self.descriptor.users.load(Ordering::Acquire);
        users.saturating_sub(self.descriptor.bindings.load(Ordering::Acquire)) == 1
    }

    /// A binding to the same reservation, which keeps it in use.
    pub fn binding(&self) -> ManagedMemoryBinding {
        self.descriptor.bindings.fetch_add(1, Ordering::AcqRel);
        self.descriptor.add_user();
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
        self.descriptor.add_user();
        Self {
            descriptor: Arc::clone(&self.descriptor),
        }
    }
}

impl Drop for ManagedMemoryHandle {
    fn drop(&mut self) {
        self.descriptor.remove_user();
    }
}

/// A binding of a reservation, as a launch holds it: it keeps the memory in use but
/// does not count as a handle for [`ManagedMemoryHandle::can_mut`].
#[derive(Debug)]
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

impl Clone for ManagedMemoryBinding {
    fn clone(&self) -> Self {
        self.descriptor.bindings.fetch_add(1, Ordering::AcqRel);
        self.descriptor.add_user();
        Self {
            descriptor: Arc::clone(&self.descriptor),
        }
    }
}

impl Drop for ManagedMemoryBinding {
    fn drop(&mut self) {
        self.descriptor.bindings.fetch_sub(1, Ordering::AcqRel);
        self.descriptor.remove_user();
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
