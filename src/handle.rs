//! Handles and bindings: shared descriptors of one reservation.
//!
//! A [`ManagedMemoryHandle`] and a [`ManagedMemoryBinding`] point at one descriptor.
//! The reservation stays in use while any handle or binding refers to it; when the
//! last one is dropped, the descriptor is handed back lock-free, and memory
//! management frees the reservation at its next operation (so dropping never takes
//! the lock of the memory management, from any thread).
//!
//! The hand-back goes through the dropping thread's release ring for the table
//! (`rings`: plain stores, no atomic read-modify-write), or, when that cannot be used
//! (the ring is full, the thread is exiting, the drop re-enters the hand-back, the
//! table is closed), through the table's release list (one compare-and-swap).
//!
//! Descriptors are recycled: memory management keeps every descriptor it issued in a
//! `DescriptorTable` and reissues one once it has been drained, so in steady state a
//! reserve + drop pair on one thread allocates nothing and needs no atomic
//! read-modify-write (the first hand-back of a thread to a table makes its ring).
//!
//! # Invariants (the unsafe code below relies on them)
//!
//! 1. Descriptors live in chunks owned by one `DescriptorBlock` block and never move; the
//!    block (and every chunk) is freed exactly once, by whoever brings its close count
//!    to zero after the table was dropped (the close protocol, see `DescriptorBlock::refs`).
//! 2. A descriptor is in exactly one of three states: *vacant* (in the table's
//!    `vacant` stack, a `VacantStack`, `users == 0`, referred to by nothing else),
//!    *live* (`users > 0`, or `users == 0` while its last user is pushing it), or
//!    *released* (on the release list, or on a release ring between its `head` and
//!    `tail` while the table is open, or pending in the table; `users == 0`,
//!    untouched by its last user after the push). When the table closes, what its
//!    last drain of a ring did not take counts as live, and takes the closed path
//!    later (`rings`, protocol 5).
//! 3. A descriptor's `fields` are written only by the table, only while it is vacant;
//!    handles read them only while they hold a user, so reads never race writes.
//! 4. While the table is open, only the table touches `DescriptorBlock::chunks`.

#![allow(unsafe_code)]

mod rings;

pub use rings::live_release_rings;

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicIsize, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::pool::SlotId;

/// The unique id of one reservation; never reused within a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ManagedMemoryId(pub u64);

/// Ids are taken from the global counter in blocks, so the hot path touches no
/// shared cache line.
static NEXT_ID_BLOCK: AtomicU64 = AtomicU64::new(1);

/// A block of ids taken from the global counter, handed out one by one.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdBlock {
    next: u64,
    end: u64,
}

impl IdBlock {
    const LEN: u64 = 1024;

    /// The next id of the block, taking a new block when this one is used up.
    #[inline]
    pub(crate) fn take(&mut self) -> ManagedMemoryId {
        if self.next == self.end {
            self.next = NEXT_ID_BLOCK.fetch_add(Self::LEN, Ordering::Relaxed);
            self.end = self.next + Self::LEN;
        }
        // Wrapping: ids come from a 64-bit counter that never gets near its end.
        let id = self.next;
        self.next = id.wrapping_add(1);
        ManagedMemoryId(id)
    }
}

impl ManagedMemoryId {
    /// A fresh id (from this thread's block of ids).
    pub fn next() -> Self {
        thread_local! {
            static BLOCK: std::cell::Cell<IdBlock> = const {
                std::cell::Cell::new(IdBlock { next: 0, end: 0 })
            };
        }
        BLOCK.with(|block| {
            let mut ids = block.get();
            let id = ids.take();
            block.set(ids);
            id
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

/// Which reservation: its pool and its slot in that pool. A key, not an address:
/// where the bytes are is a [`Placement`](crate::pool::Placement) inside the pool, or
/// a [`Resource`](crate::Resource) as memory management reports it.
///
/// The vocabulary: a [`PoolRef`] names a pool of a memory management, a [`SlotId`] a
/// slot inside one pool, and a `SlotRef` both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotRef {
    /// The pool.
    pub pool: PoolRef,
    /// The slot inside the pool.
    pub slot: SlotId,
}

/// The former name of [`SlotRef`], kept so that code written against it builds.
pub type Location = SlotRef;

impl SlotRef {
    /// The slot of a zero-byte reservation.
    pub(crate) const EMPTY: SlotRef = SlotRef {
        pool: PoolRef::Empty,
        slot: SlotId {
            index: 0,
            generation: 0,
        },
    };
}

/// Descriptor blocks made and not yet freed, in the whole process.
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

/// The number of descriptor blocks (one per memory management, kept until its last
/// handle or binding is gone) not yet freed in this process. For leak tests of the
/// close protocol; not a stable interface.
#[doc(hidden)]
pub fn live_descriptor_blocks() -> usize {
    LIVE_BLOCKS.load(Ordering::SeqCst)
}

/// What a descriptor tells about its reservation; written only while it is vacant.
#[derive(Debug, Clone, Copy)]
struct Fields {
    id: ManagedMemoryId,
    slot_ref: SlotRef,
    size: u64,
}

/// The state a handle and its bindings share: one cache line, so dropping a handle
/// touches one line of memory management's state.
#[repr(align(64))]
struct Descriptor {
    /// Invariant 3: written by the table only while vacant.
    fields: UnsafeCell<Fields>,
    /// Live handles and bindings. The reservation is in use while positive; the user
    /// that takes it to zero hands the descriptor back (on its thread's ring, or the
    /// release list).
    users: AtomicUsize,
    /// Live handles (bindings excluded), for `can_mut`: a clone adds one, dropping a
    /// handle that is not the sole user removes one. A handle that reads 1 is the
    /// only handle, and stays so while it lives (only a handle can make another).
    handles: AtomicUsize,
    /// The next released descriptor, while on the release list.
    next: AtomicPtr<Descriptor>,
    /// The block that owns this descriptor's chunk.
    shared: NonNull<DescriptorBlock>,
}

/// The block shared by a table and every descriptor it issued.
struct DescriptorBlock {
    /// The identity of the memory management that made the table.
    owner: u64,
    /// The release list: a Treiber stack of released descriptors, linked through
    /// `next` and taken whole by the table (so no ABA problem can arise). Null when
    /// empty; [`DescriptorBlock::closed`] once the table was dropped.
    head: AtomicPtr<Descriptor>,
    /// The close count: 0 while the table is open. On close the table adds the number
    /// of live descriptors, and each live descriptor subtracts one when it comes back:
    /// from its last user, or, when it was left on a ring, from whoever releases the
    /// ring's leftovers (`rings`, protocol 5). Subtractions may come before the
    /// addition (the count goes below zero meanwhile); the operation that brings it to
    /// zero frees the block.
    refs: AtomicIsize,
    /// Every chunk of descriptors (from `Box::into_raw`). Invariant 4.
    chunks: UnsafeCell<Vec<NonNull<[Descriptor]>>>,
    /// Release rings that joined the table and that it has not taken in yet, linked
    /// through their `next_new`; a marker once the table closed (see `rings`).
    new_rings: AtomicPtr<rings::Ring>,
}

impl DescriptorBlock {
    /// The marker `head` holds once the table is dropped: the block's own address,
    /// which no descriptor has.
    fn closed(this: NonNull<DescriptorBlock>) -> *mut Descriptor {
        this.as_ptr().cast()
    }

    /// Frees the block and every chunk.
    ///
    /// # Safety
    /// Called once, by the operation that brought `refs` to zero after close: no
    /// handle, binding or table refers to the block any more.
    unsafe fn free(this: NonNull<DescriptorBlock>) {
        // SAFETY: the block came from `Box::into_raw` and nothing refers to it.
        let shared = unsafe { Box::from_raw(this.as_ptr()) };
        LIVE_BLOCKS.fetch_sub(1, Ordering::SeqCst);
        for chunk in shared.chunks.into_inner() {
            // SAFETY: each chunk came from `Box::into_raw`, and is freed once, here.
            drop(unsafe { Box::from_raw(chunk.as_ptr()) });
        }
    }

    /// The closed path of a live descriptor whose last user is gone: one decrement of
    /// the close count, and the block is freed by the decrement that empties it.
    ///
    /// # Safety
    /// `descriptor` is live with no user left, its table is closed, and nothing
    /// touches it afterwards.
    unsafe fn release_closed(descriptor: NonNull<Descriptor>) {
        // SAFETY: a live descriptor keeps its block alive (invariant 1).
        let shared_ptr = unsafe { descriptor.as_ref() }.shared;
        // SAFETY: as above.
        let shared = unsafe { shared_ptr.as_ref() };
        if shared.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: this was the last live descriptor of a closed table.
            unsafe { DescriptorBlock::free(shared_ptr) };
        }
    }
}

impl Descriptor {
    /// The reservation's fields.
    ///
    /// # Safety
    /// The caller holds a user of this descriptor (invariant 3), or is the table.
    #[inline]
    unsafe fn fields(&self) -> &Fields {
        // SAFETY: by the caller's contract no write is in progress.
        unsafe { &*self.fields.get() }
    }

    fn add_user(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops one user; the last one hands the descriptor back.
    ///
    /// # Safety
    /// The caller held a user of the descriptor `this` points to, and neither it nor
    /// anything derived from it touches the descriptor afterwards.
    #[inline]
    unsafe fn remove_user(this: NonNull<Descriptor>) {
        // SAFETY: the caller's user keeps the descriptor and its block alive.
        let users = unsafe { this.as_ref() }.users.load(Ordering::Acquire);
        // SAFETY: passed on from the caller; `users` was just read.
        unsafe { Descriptor::remove_user_seen(this, users) }
    }

    /// [`Descriptor::remove_user`] when the caller read `users` (with `Acquire`)
    /// after the last change its own user made: a sole user's count cannot change
    /// under it, so a count of 1 read before is still 1 (the handle's drop reads it
    /// once for both its checks).
    ///
    /// # Safety
    /// As for [`Descriptor::remove_user`].
    #[inline]
    unsafe fn remove_user_seen(this: NonNull<Descriptor>, users: usize) {
        // SAFETY: the caller's user keeps the descriptor and its block alive.
        let descriptor = unsafe { this.as_ref() };
        // A sole user needs no read-modify-write: only a holder of a user can add
        // one, so the count cannot change under it. Otherwise AcqRel: every other
        // user's accesses happen before the push below.
        if users == 1 {
            descriptor.users.store(0, Ordering::Relaxed);
        } else if descriptor.users.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // SAFETY: the descriptor is live with no user left, and `shared` its block.
        unsafe { rings::hand_back(this, descriptor.shared) }
    }

    /// Pushes a descriptor whose last user is gone on its table's release list (the
    /// fallback of the rings), or takes the closed path when the table is gone.
    ///
    /// # Safety
    /// `this` is live with no user left, `shared_ptr` is its block, and the caller
    /// touches neither afterwards.
    #[cold]
    #[inline(never)]
    unsafe fn push_released(this: NonNull<Descriptor>, shared_ptr: NonNull<DescriptorBlock>) {
        // SAFETY: the caller's descriptor keeps it alive.
        let descriptor = unsafe { this.as_ref() };
        // SAFETY: the block outlives its live descriptors (invariant 1).
        let shared = unsafe { shared_ptr.as_ref() };
        let closed = DescriptorBlock::closed(shared_ptr);
        let mut head = shared.head.load(Ordering::Relaxed);
        loop {
            if head == closed {
                // The table is gone: nobody will reissue this descriptor.
                // SAFETY: live, no user left, and the table is closed.
                unsafe { DescriptorBlock::release_closed(this) };
                return;
            }
            descriptor.next.store(head, Ordering::Relaxed);
            match shared.head.compare_exchange_weak(
                head,
                this.as_ptr(),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                // Released: from now on the descriptor belongs to the table.
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }
}

/// The table's vacant descriptors: a stack, reissued last in, first out (so reuse is
/// deterministic), whose top is kept in a field of its own. A reserve + drop loop
/// pushes the dropped handle's descriptor and pops it again at the next issue: a
/// field's store and load where a `Vec`'s push and pop each read its length and check
/// its capacity or emptiness (2 to 4 instructions of the dropped-handle FIFO step of
/// `examples/peer_loops.rs`, callgrind, as the compiler allocates registers).
/// Invariant: `top` is the last pushed of the descriptors not popped since, when there
/// is one; the rest are in `below`, in the order they were pushed (a `top` of `None`
/// with `below` not empty is `below`'s last on top).
#[derive(Default)]
struct VacantStack {
    top: Option<NonNull<Descriptor>>,
    below: Vec<NonNull<Descriptor>>,
}

impl VacantStack {
    /// Pushes a vacant descriptor on top.
    #[inline(always)]
    fn push(&mut self, descriptor: NonNull<Descriptor>) {
        if let Some(top) = self.top.replace(descriptor) {
            self.below.push(top);
        }
    }

    /// Takes the descriptor on top, if any.
    #[inline(always)]
    fn pop(&mut self) -> Option<NonNull<Descriptor>> {
        self.top.take().or_else(|| self.below.pop())
    }

    /// The number of vacant descriptors.
    fn len(&self) -> usize {
        self.below.len() + usize::from(self.top.is_some())
    }
}

/// Every descriptor one memory management issued, for recycling.
pub(crate) struct DescriptorTable {
    shared: NonNull<DescriptorBlock>,
    /// Vacant descriptors, reissued LIFO so reuse is deterministic.
    vacant: VacantStack,
    /// The release rings of the threads that hand descriptors back.
    consumer: rings::Consumer,
    /// Released descriptors taken from the release list, not yet freed: empty
    /// between operations (see [`DescriptorTable::drain_released`]).
    pending: Vec<NonNull<Descriptor>>,
    /// Descriptors made so far, in every chunk together.
    made: usize,
}

// SAFETY: the table's pointers name its own block, which is shared with handles only
// through atomics and the invariants above, and the consumer's side of release rings,
// shared with their producer threads by the ring protocol (`rings`); all mutation
// goes through `&mut self`.
unsafe impl Send for DescriptorTable {}
// SAFETY: `&DescriptorTable` gives access to nothing.
unsafe impl Sync for DescriptorTable {}

impl std::fmt::Debug for DescriptorTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DescriptorTable")
            .field("made", &self.made)
            .field("vacant", &self.vacant.len())
            .finish_non_exhaustive()
    }
}

impl DescriptorTable {
    /// Descriptors per chunk.
    const CHUNK: usize = 64;

    /// An empty table for the memory management with identity `owner`.
    pub(crate) fn new(owner: u64) -> Self {
        let shared = Box::new(DescriptorBlock {
            owner,
            head: AtomicPtr::new(std::ptr::null_mut()),
            refs: AtomicIsize::new(0),
            chunks: UnsafeCell::new(Vec::new()),
            new_rings: AtomicPtr::new(std::ptr::null_mut()),
        });
        LIVE_BLOCKS.fetch_add(1, Ordering::SeqCst);
        Self {
            shared: NonNull::from(Box::leak(shared)),
            vacant: VacantStack::default(),
            consumer: rings::Consumer::default(),
            pending: Vec::new(),
            made: 0,
        }
    }

    #[inline]
    fn shared(&self) -> &DescriptorBlock {
        // SAFETY: the table keeps its block alive (its close count stays above zero
        // until `drop`).
        unsafe { self.shared.as_ref() }
    }

    /// Makes a chunk of vacant descriptors.
    fn grow(&mut self) {
        let chunk: Box<[Descriptor]> = (0..Self::CHUNK)
            .map(|_| Descriptor {
                fields: UnsafeCell::new(Fields {
                    id: ManagedMemoryId(0),
                    slot_ref: SlotRef::EMPTY,
                    size: 0,
                }),
                users: AtomicUsize::new(0),
                handles: AtomicUsize::new(0),
                next: AtomicPtr::new(std::ptr::null_mut()),
                shared: self.shared,
            })
            .collect();
        let chunk = NonNull::from(Box::leak(chunk));
        // SAFETY: only the table touches the chunk list while it is open (invariant 4).
        unsafe { (*self.shared().chunks.get()).push(chunk) };
        let first = chunk.cast::<Descriptor>();
        // Reversed, so the chunk's first descriptor is reissued first.
        for index in (0..Self::CHUNK).rev() {
            // SAFETY: `index` is inside the chunk.
            self.vacant.push(unsafe { first.add(index) });
        }
        self.made += Self::CHUNK;
    }

    /// Makes a chunk of vacant descriptors and takes the first.
    #[cold]
    #[inline(never)]
    fn grow_and_pop(&mut self) -> NonNull<Descriptor> {
        self.grow();
        let Some(pointer) = self.vacant.pop() else {
            unreachable!("grow made vacant descriptors")
        };
        pointer
    }

    /// A handle to a new reservation.
    #[inline]
    pub(crate) fn issue(
        &mut self,
        id: ManagedMemoryId,
        slot_ref: SlotRef,
        size: u64,
    ) -> ManagedMemoryHandle {
        let pointer = match self.vacant.pop() {
            Some(pointer) => pointer,
            None => self.grow_and_pop(),
        };
        // SAFETY: a vacant descriptor is referred to by nothing but the table
        // (invariant 2), so writing its fields races nothing.
        unsafe {
            let descriptor = pointer.as_ref();
            debug_assert_eq!(descriptor.users.load(Ordering::Relaxed), 0);
            *descriptor.fields.get() = Fields { id, slot_ref, size };
            descriptor.handles.store(1, Ordering::Relaxed);
            descriptor.users.store(1, Ordering::Relaxed);
        }
        ManagedMemoryHandle {
            descriptor: pointer,
        }
    }

    /// Hands `free` the slot and id of every reservation released since the last
    /// call, from this table's rings and its release list; each descriptor is vacant
    /// (reissued by later calls of [`DescriptorTable::issue`]) from the moment `free`
    /// gets its reservation.
    ///
    /// They come in the order they were released (each ring's in its order, then the
    /// release list's, oldest first), so dropped handles free their reservations in
    /// the order `release` would have: placement, and so every figure of a replay,
    /// does not depend on how a handle went back (`tests/drop_order.rs`).
    ///
    /// The rings' descriptors go to `free` as they are read off the rings, with no
    /// list in between: moving them through `pending` first cost the dropped-handle
    /// loop about 40 instructions a step (`examples/peer_loops.rs` under callgrind).
    #[inline(always)]
    pub(crate) fn drain_released(&mut self, mut free: impl FnMut(SlotRef, ManagedMemoryId)) {
        // SAFETY: the table keeps its block alive (see `shared`); the block is not
        // borrowed from `self`, so the vacant list can be filled alongside.
        let shared = unsafe { self.shared.as_ref() };
        let vacant = &mut self.vacant;
        // `free` moved in, not borrowed: the inlined drain then reaches what `free`
        // captured through one pointer, not two (a load less per descriptor).
        let mut take = move |pointer: NonNull<Descriptor>| {
            // SAFETY: a descriptor taken off a ring or the release list was released
            // and belongs to the table (invariant 2); the table reads the fields of a
            // descriptor it owns.
            let fields = *unsafe { pointer.as_ref().fields() };
            vacant.push(pointer);
            free(fields.slot_ref, fields.id);
        };
        self.consumer.drain_each(shared, &mut take);
        if !shared.head.load(Ordering::Relaxed).is_null() {
            Self::drain_list(&mut self.pending, shared, &mut take);
        }
    }

    /// [`DescriptorTable::drain_released`] of the release list (the fallback of the
    /// rings): taken whole, then handed out oldest first.
    #[cold]
    #[inline(never)]
    fn drain_list(
        pending: &mut Vec<NonNull<Descriptor>>,
        shared: &DescriptorBlock,
        take: &mut impl FnMut(NonNull<Descriptor>),
    ) {
        // The list is a stack, newest first: `pending` pops its oldest first.
        Self::take_list(pending, shared, std::ptr::null_mut());
        while let Some(pointer) = pending.pop() {
            take(pointer);
        }
    }

    /// Takes the release list whole (the fallback of the rings) into `pending` (the
    /// table's), leaving `replacement` in its place: null while the table is open,
    /// [`DescriptorBlock::closed`] when it closes.
    #[cold]
    fn take_list(
        pending: &mut Vec<NonNull<Descriptor>>,
        shared: &DescriptorBlock,
        replacement: *mut Descriptor,
    ) {
        // Acquire: every push (and what its last user did before) happens before this;
        // Release: for the close, the table's accesses happen before the closed path.
        let mut cursor = shared.head.swap(replacement, Ordering::AcqRel);
        while let Some(pointer) = NonNull::new(cursor) {
            // SAFETY: a released descriptor belongs to the table (invariant 2).
            cursor = unsafe { pointer.as_ref() }.next.load(Ordering::Relaxed);
            pending.push(pointer);
        }
    }

    /// Takes back `handle` when it is this table's and the last user of its
    /// reservation: its descriptor becomes vacant at once, with no atomic
    /// read-modify-write, and the reservation's slot and id are returned for
    /// freeing. Otherwise the handle is handed back (dropping it is the way out).
    #[inline]
    pub(crate) fn retire(
        &mut self,
        handle: ManagedMemoryHandle,
    ) -> Result<(SlotRef, ManagedMemoryId), ManagedMemoryHandle> {
        let descriptor = handle.descriptor();
        // A sole user: only a holder of a user can add one, so the count cannot
        // change under this handle (Acquire: other users' past accesses happen
        // before the reuse).
        if descriptor.shared != self.shared || descriptor.users.load(Ordering::Acquire) != 1 {
            return Err(handle);
        }
        descriptor.users.store(0, Ordering::Relaxed);
        let fields = *handle.fields();
        let pointer = handle.descriptor;
        // The handle's user is given up above; its drop must not give it up again.
        std::mem::forget(handle);
        // No user and never pushed: the descriptor is vacant (invariant 2).
        self.vacant.push(pointer);
        Ok((fields.slot_ref, fields.id))
    }
}

impl Drop for DescriptorTable {
    /// Closes the table: released descriptors are forgotten, live ones free the block
    /// when the last of them comes back (or the table does, if none is live). One
    /// left on a ring comes back when its thread next hands back or exits (`rings`,
    /// protocol 5).
    fn drop(&mut self) {
        // SAFETY: the table keeps its block alive until the close count is settled.
        let shared = unsafe { self.shared.as_ref() };
        // Rings first: a ring that fails to join after this hands back through the
        // release list, which is closed next. What both hold is released: forgotten.
        let rings = std::mem::take(&mut self.consumer).close(shared, &mut self.pending);
        Self::take_list(
            &mut self.pending,
            shared,
            DescriptorBlock::closed(self.shared),
        );
        // Exact: after the swap no descriptor can join the list, every ring's
        // consumer is gone (what its last drain did not take counts as live, and takes
        // the closed path later), and only the table changes `vacant` and `made`.
        let live = self.made - self.vacant.len() - self.pending.len();
        // `made` counts allocated descriptors, far below `isize::MAX`.
        let live = live as isize;
        if shared.refs.fetch_add(live, Ordering::AcqRel) + live == 0 {
            // SAFETY: no descriptor is live and the table is closing: nothing refers
            // to the block any more (rings never dereference it).
            unsafe { DescriptorBlock::free(self.shared) };
        }
        // SAFETY: the close count is settled and the rings came from `close`.
        unsafe { rings::Consumer::leave(rings) };
    }
}

/// A handle to reserved memory. Clones share the reservation; it is freed when the
/// last handle and binding are dropped.
pub struct ManagedMemoryHandle {
    /// Invariant: this handle holds one user of the descriptor.
    descriptor: NonNull<Descriptor>,
}

/// A binding of a reservation, as a launch holds it: it keeps the memory in use but
/// does not count as a handle for [`ManagedMemoryHandle::can_mut`].
pub struct ManagedMemoryBinding {
    /// Invariant: this binding holds one user of the descriptor.
    descriptor: NonNull<Descriptor>,
}

// SAFETY: a handle or binding only reads its descriptor's fields (never written while
// it holds a user) and changes its counts atomically; the last user's release is
// lock-free and thread-agnostic.
unsafe impl Send for ManagedMemoryHandle {}
// SAFETY: as for `Send`; `&self` methods only read or change counts atomically.
unsafe impl Sync for ManagedMemoryHandle {}
// SAFETY: as for `ManagedMemoryHandle`.
unsafe impl Send for ManagedMemoryBinding {}
// SAFETY: as for `ManagedMemoryHandle`.
unsafe impl Sync for ManagedMemoryBinding {}

/// The accessors handles and bindings share.
macro_rules! descriptor_accessors {
    ($type:ty) => {
        impl $type {
            #[inline]
            fn descriptor(&self) -> &Descriptor {
                // SAFETY: the user this value holds keeps the descriptor alive.
                unsafe { self.descriptor.as_ref() }
            }

            #[inline]
            fn fields(&self) -> &Fields {
                // SAFETY: this value holds a user (invariant 3).
                unsafe { self.descriptor().fields() }
            }

            /// The reservation's id.
            #[inline]
            pub fn id(&self) -> ManagedMemoryId {
                self.fields().id
            }

            /// The bytes reserved.
            #[inline]
            pub fn size(&self) -> u64 {
                self.fields().size
            }

            pub(crate) fn owner(&self) -> u64 {
                // SAFETY: the block outlives its live descriptors (invariant 1).
                unsafe { self.descriptor().shared.as_ref() }.owner
            }

            #[inline]
            pub(crate) fn slot_ref(&self) -> SlotRef {
                self.fields().slot_ref
            }
        }

        impl std::fmt::Debug for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($type))
                    .field("id", &self.id())
                    .field("size", &self.size())
                    .field("slot_ref", &self.slot_ref())
                    .finish()
            }
        }

        impl MemoryHandle for $type {
            fn memory_id(&self) -> ManagedMemoryId {
                self.id()
            }
            fn address_of(&self) -> (u64, SlotRef) {
                (self.owner(), self.slot_ref())
            }
        }
    };
}

descriptor_accessors!(ManagedMemoryHandle);
descriptor_accessors!(ManagedMemoryBinding);

impl ManagedMemoryHandle {
    /// Whether this is the only handle to the reservation (bindings do not count), so
    /// that it may be written in place.
    pub fn can_mut(&self) -> bool {
        // Acquire: what another handle did before its drop happens before the write
        // this answer allows.
        self.descriptor().handles.load(Ordering::Acquire) == 1
    }

    /// A binding to the same reservation, which keeps it in use.
    pub fn binding(&self) -> ManagedMemoryBinding {
        self.descriptor().add_user();
        ManagedMemoryBinding {
            descriptor: self.descriptor,
        }
    }
}

impl Clone for ManagedMemoryHandle {
    fn clone(&self) -> Self {
        let descriptor = self.descriptor();
        descriptor.add_user();
        descriptor.handles.fetch_add(1, Ordering::Relaxed);
        Self {
            descriptor: self.descriptor,
        }
    }
}

impl Drop for ManagedMemoryHandle {
    #[inline]
    fn drop(&mut self) {
        // A sole user leaves the handle count as it is (the descriptor is reissued
        // with a fresh one); otherwise another handle may ask `can_mut`.
        let users = self.descriptor().users.load(Ordering::Acquire);
        if users != 1 {
            self.drop_shared();
        } else {
            // SAFETY: this handle holds a user and is gone after this call; it is the
            // sole user, read above, so the count is still 1.
            unsafe { Descriptor::remove_user_seen(self.descriptor, users) }
        }
    }
}

impl ManagedMemoryHandle {
    /// The drop of a handle that shares its reservation with other handles or
    /// bindings.
    #[cold]
    #[inline(never)]
    fn drop_shared(&mut self) {
        self.descriptor().handles.fetch_sub(1, Ordering::Release);
        // SAFETY: this handle holds a user and is gone after its drop, which called
        // this.
        unsafe { Descriptor::remove_user(self.descriptor) }
    }
}

impl Clone for ManagedMemoryBinding {
    fn clone(&self) -> Self {
        self.descriptor().add_user();
        Self {
            descriptor: self.descriptor,
        }
    }
}

impl Drop for ManagedMemoryBinding {
    fn drop(&mut self) {
        // SAFETY: this binding holds a user and is gone after this call.
        unsafe { Descriptor::remove_user(self.descriptor) }
    }
}

/// Anything that names a reservation: a handle or a binding.
pub trait MemoryHandle {
    /// The reservation's id.
    fn memory_id(&self) -> ManagedMemoryId;
    /// The identity of the memory management that made it, and the slot that names
    /// the reservation there (a key, not a byte address: for the bytes, ask
    /// [`MemoryManagement::resource`](crate::MemoryManagement::resource)).
    fn address_of(&self) -> (u64, SlotRef);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor is one 64-byte cache line of its own, so handles dropped on
    /// different threads never write the same line (BENCHMARKS.md's reading of the
    /// FIFO's cache misses, `benches/report.py`, counts one line a dropped handle).
    #[test]
    fn a_descriptor_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Descriptor>(), 64);
        assert_eq!(std::mem::align_of::<Descriptor>(), 64);
    }

    /// The vacant stack is last in, first out across its top field and the rest.
    #[test]
    fn the_vacant_stack_is_last_in_first_out() {
        let mut places = [0u64; 4];
        let [a, b, c, d] = places.each_mut().map(|place| NonNull::from(place).cast());
        let mut stack = VacantStack::default();
        assert_eq!(stack.pop(), None);
        for descriptor in [a, b, c] {
            stack.push(descriptor);
        }
        assert_eq!(stack.len(), 3);
        assert_eq!((stack.pop(), stack.pop()), (Some(c), Some(b)));
        stack.push(d);
        assert_eq!(stack.len(), 2);
        assert_eq!(
            (stack.pop(), stack.pop(), stack.pop()),
            (Some(d), Some(a), None)
        );
        assert_eq!(stack.len(), 0);
    }
}
