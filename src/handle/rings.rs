//! Release rings: handing a dropped handle's descriptor back with no atomic
//! read-modify-write.
//!
//! An atomic read-modify-write is a full fence on x86: it waits for every store
//! before it to drain, and on a reserve + drop loop that wait was a third of a step.
//! So each thread that hands back descriptors of a table gets a ring of its own for
//! that table: a bounded single-producer, single-consumer queue. The thread pushes
//! with plain stores; the table (the one consumer, always behind `&mut`) drains every
//! ring at its next operation with plain loads. Read-modify-writes remain only where
//! a ring is made, joins its table, or is left (rare), and on the fallback: the
//! release list, used when a ring is full, when the thread-local rings are gone
//! (during thread exit) or busy (a drop re-entering the hand-back), or when the
//! table is closed and the thread has no ring for it.
//!
//! # Protocol (the unsafe code relies on it)
//!
//! 1. A ring is made by its producer thread with two references: the thread's and
//!    the table's. It joins the table through `DescriptorBlock::new_rings` (a push that fails
//!    once the table closed it, and then the ring is freed unshared). Whoever drops
//!    the last reference frees it, first releasing the descriptors left on it
//!    ([`Ring::release_leftovers`]).
//! 2. Only the producer thread writes `tail` and the slots. Only the consumer writes
//!    `head`, until it sets `consumer_gone`; after that the producer does, and in the
//!    end whoever drops the last reference (ordered after the other side by the
//!    reference count).
//! 3. The consumer sets `consumer_gone` when its table closes: after its last drain,
//!    and before the block can be freed, so a thread that finds a ring of a freed
//!    block (whose address a new block may reuse) always sees it set.
//! 4. The producer sets `producer_gone` when it leaves (thread exit, or pruning a ring
//!    whose table closed) and pushes nothing after. A consumer that sees it drains the
//!    ring one last time and drops its reference.
//! 5. Descriptors left on a ring after the consumer's last drain (pushed after it,
//!    or before it but not yet visible to it) are counted live by the close, so
//!    whoever releases them takes the closed path of a live descriptor: one
//!    decrement of the close count each. The producer releases them as soon as it
//!    sees `consumer_gone` (it looks again after every push), or when it leaves.
//!
//! 6. A producer's fast path finds its ring through `FIRST`, a copy of the key and
//!    address of the thread's first ring without a destructor: it names a ring only
//!    while the thread's list holds it first (every change to the list clears it
//!    first and names the new first ring after; the list's destructor clears it), so
//!    the ring it names is alive, and the checks of rule 3 and 5 apply to it as to
//!    the list's first ring.
//!
//! A producer thread keeps a ring of a closed table until it next hands back or
//! exits; a thread whose thread-local values are never destroyed (the process exits
//! first) keeps its rings, and whatever is left on them, until the process ends.

#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use super::{Descriptor, DescriptorBlock};

/// Descriptors one ring holds; a full ring falls back to the release list.
const CAPACITY: usize = 256;

/// Rings made and not yet freed, in the whole process (for leak tests).
static LIVE_RINGS: AtomicUsize = AtomicUsize::new(0);

/// The number of release rings not yet freed in this process. For leak tests of the
/// ring protocol; not a stable interface.
#[doc(hidden)]
pub fn live_release_rings() -> usize {
    LIVE_RINGS.load(Ordering::SeqCst)
}

/// What `DescriptorBlock::new_rings` holds once the table closed: an address no ring has.
fn closed_marker() -> *mut Ring {
    NonNull::<Ring>::dangling().as_ptr()
}

/// A cache line of its own, so the producer's and the consumer's writes do not
/// share one.
#[repr(align(64))]
struct Line<T>(T);

/// The producer's side of a ring: read and written by the producer only, except
/// `count`, which the consumer reads.
struct Tail {
    /// The count of pushes.
    count: AtomicUsize,
    /// The consumer's count of pops as the producer last read it (a lower bound), plus
    /// [`CAPACITY`] (wrapping): the count of pushes at which the ring looks full, so a
    /// push reads the consumer's line only then. Kept as the limit, not the count
    /// seen, so the push compares its count with it instead of subtracting first (2
    /// instructions of the dropped-handle FIFO step, `examples/peer_loops.rs` under
    /// callgrind). Invariant: the pushes since the count seen are at most
    /// `CAPACITY`, so the ring looks full exactly when `count` equals this.
    full_at: AtomicUsize,
}

/// A bounded single-producer, single-consumer queue of released descriptors.
pub(super) struct Ring {
    /// The producer's line (protocol 2).
    tail: Line<Tail>,
    /// The count of pops: written by the consumer only, or by the producer once
    /// `consumer_gone` is set (protocol 2).
    head: Line<AtomicUsize>,
    /// Set once by the consumer when its table closes (protocol 3).
    consumer_gone: AtomicBool,
    /// Set once by the producer when it leaves (protocol 4).
    producer_gone: AtomicBool,
    /// References: the producer's and the consumer's (protocol 1).
    refs: AtomicUsize,
    /// The next ring on `DescriptorBlock::new_rings`, while on it.
    next_new: AtomicPtr<Ring>,
    /// The address of the table's block: compared, never dereferenced (the block may
    /// be gone while the producer still holds the ring).
    key: usize,
    /// Pushed descriptors, at `count % CAPACITY`; those in `head..tail` are released
    /// while the table is open, and live leftovers after it closed (protocol 5).
    slots: [AtomicPtr<Descriptor>; CAPACITY],
}

impl Ring {
    /// A new ring for the block `shared`, with both references.
    fn new(shared: NonNull<DescriptorBlock>) -> NonNull<Ring> {
        LIVE_RINGS.fetch_add(1, Ordering::SeqCst);
        let ring = Box::new(Ring {
            tail: Line(Tail {
                count: AtomicUsize::new(0),
                full_at: AtomicUsize::new(CAPACITY),
            }),
            head: Line(AtomicUsize::new(0)),
            consumer_gone: AtomicBool::new(false),
            producer_gone: AtomicBool::new(false),
            refs: AtomicUsize::new(2),
            next_new: AtomicPtr::new(std::ptr::null_mut()),
            key: shared.as_ptr() as usize,
            slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        });
        NonNull::from(Box::leak(ring))
    }

    /// Frees a ring nobody refers to.
    ///
    /// # Safety
    /// `ring` came from [`Ring::new`] and no reference to it remains.
    unsafe fn free(ring: NonNull<Ring>) {
        // SAFETY: by the caller's contract.
        drop(unsafe { Box::from_raw(ring.as_ptr()) });
        LIVE_RINGS.fetch_sub(1, Ordering::SeqCst);
    }

    /// Pushes a released descriptor; false when the ring is full. Producer only.
    #[inline]
    fn push(&self, descriptor: NonNull<Descriptor>) -> bool {
        let producer = &self.tail.0;
        let tail = producer.count.load(Ordering::Relaxed);
        if tail == producer.full_at.load(Ordering::Relaxed) {
            // Acquire: the consumer read a slot before it moved `head` past it (a
            // count seen earlier was read the same way, so it is safe to use too).
            let head = self.head.0.load(Ordering::Acquire);
            producer
                .full_at
                .store(head.wrapping_add(CAPACITY), Ordering::Relaxed);
            if tail.wrapping_sub(head) >= CAPACITY {
                return false;
            }
        }
        self.slots[tail % CAPACITY].store(descriptor.as_ptr(), Ordering::Relaxed);
        // Release: the slot, and everything the last user did, before the count.
        producer
            .count
            .store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Takes every descriptor pushed so far, appending it to `out` newest first (the
    /// table pops them from the end of `out`, so they are freed in the order they
    /// were pushed). Consumer only (or the producer once `consumer_gone` is set).
    #[inline]
    fn drain_into(&self, out: &mut Vec<NonNull<Descriptor>>) {
        // Acquire: synchronizes with the push that wrote this count.
        let tail = self.tail.0.count.load(Ordering::Acquire);
        let head = self.head.0.load(Ordering::Relaxed);
        if head == tail {
            return;
        }
        let mut cursor = tail;
        while cursor != head {
            cursor = cursor.wrapping_sub(1);
            let pointer = self.slots[cursor % CAPACITY].load(Ordering::Relaxed);
            // Pushed pointers are never null.
            out.extend(NonNull::new(pointer));
        }
        // Release: the slots were read before the producer may overwrite them.
        self.head.0.store(tail, Ordering::Release);
    }

    /// Takes every descriptor pushed so far, oldest first, handing each to `take`.
    /// `head` moves past a slot before its descriptor is handed on, so a `take` that
    /// unwinds leaves no descriptor to be taken twice. Consumer only.
    #[inline(always)]
    fn drain_each(&self, take: &mut (impl FnMut(NonNull<Descriptor>) + ?Sized)) {
        // Acquire: synchronizes with the push that wrote this count.
        let tail = self.tail.0.count.load(Ordering::Acquire);
        let mut head = self.head.0.load(Ordering::Relaxed);
        while head != tail {
            let pointer = self.slots[head % CAPACITY].load(Ordering::Relaxed);
            head = head.wrapping_add(1);
            // Release: the slot was read before the producer may overwrite it.
            self.head.0.store(head, Ordering::Release);
            // Pushed pointers are never null.
            if let Some(pointer) = NonNull::new(pointer) {
                take(pointer);
            }
        }
    }

    /// Releases the descriptors left on a ring whose consumer is gone: each takes the
    /// closed path (protocol 5).
    ///
    /// # Safety
    /// The caller may write `head` (the consumer is gone, or the caller is it and
    /// the producer is gone), and the descriptors on the ring are live ones of a
    /// closed table.
    unsafe fn release_leftovers(&self) {
        let mut left = Vec::new();
        self.drain_into(&mut left);
        for descriptor in left {
            // SAFETY: a leftover descriptor is counted live by its closed table.
            unsafe { DescriptorBlock::release_closed(descriptor) };
        }
    }

    /// Drops one reference; the last one releases the leftovers and frees the ring.
    ///
    /// # Safety
    /// The caller holds a reference, and gave up writing the ring (it set its
    /// `*_gone` flag or the other side had left) before calling.
    unsafe fn drop_reference(ring: NonNull<Ring>) {
        // SAFETY: the caller's reference keeps the ring alive.
        let this = unsafe { ring.as_ref() };
        // AcqRel: the other side's accesses happen before whoever frees the ring.
        if this.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: both sides are gone, so this call owns `head`; descriptors still
            // on the ring were pushed after the consumer's last drain, when its table
            // closed (a consumer that left an open table drained the ring after its
            // producer left), so they are live ones of a closed table.
            unsafe { this.release_leftovers() };
            // SAFETY: the last reference is gone.
            unsafe { Ring::free(ring) };
        }
    }

    /// The producer leaves the ring (its thread exits, or its table closed).
    ///
    /// # Safety
    /// Called by the ring's producer, once, with the producer's reference.
    unsafe fn producer_leaves(ring: NonNull<Ring>) {
        // SAFETY: the producer's reference keeps the ring alive.
        let this = unsafe { ring.as_ref() };
        // Release: every push happens before a consumer that sees the flag.
        this.producer_gone.store(true, Ordering::Release);
        // Acquire: the consumer's last `head` happens before the leftovers are read.
        if this.consumer_gone.load(Ordering::Acquire) {
            // SAFETY: the consumer is gone (protocol 2, 3 and 5).
            unsafe { this.release_leftovers() };
        }
        // SAFETY: the producer's reference, given up after its last write.
        unsafe { Ring::drop_reference(ring) };
    }
}

/// The consumer's side: every ring that joined one table.
#[derive(Default)]
pub(super) struct Consumer {
    rings: Vec<NonNull<Ring>>,
}

impl Consumer {
    /// Takes in the rings that joined the table since the last drain.
    #[cold]
    fn adopt(&mut self, shared: &DescriptorBlock) {
        // Acquire: each ring's making happens before it is read here.
        let mut cursor = shared
            .new_rings
            .swap(std::ptr::null_mut(), Ordering::Acquire);
        self.adopt_list(&mut cursor);
    }

    fn adopt_list(&mut self, cursor: &mut *mut Ring) {
        while let Some(ring) = NonNull::new(*cursor) {
            // SAFETY: a ring on the list holds the consumer's reference.
            *cursor = unsafe { ring.as_ref() }.next_new.load(Ordering::Relaxed);
            self.rings.push(ring);
        }
    }

    /// Hands every descriptor pushed on the table's rings to `take` (each ring's
    /// oldest first, ring by ring), and drops the rings whose
    /// producers left.
    #[inline(always)]
    pub(super) fn drain_each(
        &mut self,
        shared: &DescriptorBlock,
        take: &mut impl FnMut(NonNull<Descriptor>),
    ) {
        if !shared.new_rings.load(Ordering::Relaxed).is_null() {
            self.adopt(shared);
        }
        let mut index = 0;
        while let Some(&ring) = self.rings.get(index) {
            // SAFETY: the consumer's reference keeps the ring alive.
            let this = unsafe { ring.as_ref() };
            this.drain_each(take);
            // Acquire: every push happens before this; drain once more for the
            // pushes between the drain above and the flag.
            if this.producer_gone.load(Ordering::Acquire) {
                self.retire_ring(index, take);
            } else {
                // Wrapping: below the count of rings, no overflow to check.
                index = index.wrapping_add(1);
            }
        }
    }

    /// Drains ring `index`, whose producer left, a last time and drops it.
    #[cold]
    #[inline(never)]
    fn retire_ring(&mut self, index: usize, take: &mut impl FnMut(NonNull<Descriptor>)) {
        let ring = self.rings.swap_remove(index);
        // SAFETY: the consumer's reference keeps the ring alive.
        unsafe { ring.as_ref() }.drain_each(take);
        // SAFETY: the producer is gone and the ring is drained; the consumer gives
        // up its reference and never touches the ring again.
        unsafe { Ring::drop_reference(ring) };
    }

    /// The table closes: takes in the last rings (and stops new ones from joining),
    /// appends what they hold to `out`, and marks every ring's consumer gone. Returns
    /// the rings, whose references [`Consumer::leave`] drops once the close count is
    /// settled.
    pub(super) fn close(
        mut self,
        shared: &DescriptorBlock,
        out: &mut Vec<NonNull<Descriptor>>,
    ) -> Vec<NonNull<Ring>> {
        let mut cursor = shared.new_rings.swap(closed_marker(), Ordering::AcqRel);
        self.adopt_list(&mut cursor);
        for &ring in &self.rings {
            // SAFETY: the consumer's reference keeps the ring alive.
            let this = unsafe { ring.as_ref() };
            this.drain_into(out);
            // Release: the last `head` happens before a producer that sees the flag.
            this.consumer_gone.store(true, Ordering::Release);
        }
        std::mem::take(&mut self.rings)
    }

    /// Drops the consumer's reference of each ring returned by [`Consumer::close`].
    ///
    /// # Safety
    /// The close count of the table was settled (live descriptors left on the rings
    /// were counted) and the rings came from `close`.
    pub(super) unsafe fn leave(rings: Vec<NonNull<Ring>>) {
        for ring in rings {
            // SAFETY: the consumer's reference, given up after its last write.
            unsafe { Ring::drop_reference(ring) };
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        debug_assert!(
            self.rings.is_empty(),
            "a consumer leaves its rings through close"
        );
    }
}

/// The rings of one thread, one per table it handed descriptors back to.
struct ThreadRings {
    rings: RefCell<Vec<NonNull<Ring>>>,
}

impl Drop for ThreadRings {
    fn drop(&mut self) {
        // The cache names the first ring, which is about to be left.
        FIRST.set(NO_RING);
        for ring in self.rings.get_mut().drain(..) {
            // SAFETY: this thread is each ring's producer and leaves it once.
            unsafe { Ring::producer_leaves(ring) };
        }
    }
}

/// What [`FIRST`] holds when it names no ring: key 0, which no block has.
const NO_RING: (usize, *const Ring) = (0, std::ptr::null());

thread_local! {
    static THREAD_RINGS: ThreadRings = const {
        ThreadRings { rings: RefCell::new(Vec::new()) }
    };

    /// The key and the address of this thread's first ring (`THREAD_RINGS`' first),
    /// or [`NO_RING`]: the hand-back's fast path. Invariant: when it names a ring,
    /// that ring is the first of `THREAD_RINGS`, which keeps it alive; every change
    /// to `THREAD_RINGS` sets it to [`NO_RING`] first and names the new first ring
    /// after (`refresh_first`). It has no destructor, so reading it is a plain
    /// thread-local load, where `THREAD_RINGS` (whose destructor leaves the rings)
    /// is checked for its state and borrowed; both cost the dropped-handle loop
    /// about 35 instructions a step (`examples/peer_loops.rs` under callgrind).
    static FIRST: Cell<(usize, *const Ring)> = const { Cell::new(NO_RING) };
}

/// Names `rings`' first ring in [`FIRST`] (or none).
#[inline]
fn refresh_first(rings: &[NonNull<Ring>]) {
    let first = rings.first().map_or(NO_RING, |ring| {
        // SAFETY: this thread's reference keeps its rings alive.
        (unsafe { ring.as_ref() }.key, ring.as_ptr().cast_const())
    });
    FIRST.set(first);
}

/// Hands a released descriptor back through this thread's ring for its table, or,
/// when it cannot, through the table's release list (or the closed path).
///
/// Every call it makes is its last action, so the fast path needs no stack frame.
///
/// # Safety
/// `descriptor` is live with no user left (its last user is handing it back), and
/// `shared` is its block; the caller touches neither afterwards.
#[inline(always)]
pub(super) unsafe fn hand_back(descriptor: NonNull<Descriptor>, shared: NonNull<DescriptorBlock>) {
    let (key, first) = FIRST.get();
    if key == shared.as_ptr() as usize {
        // SAFETY: `FIRST` names a ring only while this thread's reference keeps it
        // alive (its invariant).
        let ring = unsafe { &*first };
        // The flag before the push: a ring whose table closed may share its key with
        // a new block at the same address (protocol 3).
        if !ring.consumer_gone.load(Ordering::Acquire) && ring.push(descriptor) {
            // The flag again after the push: a close that raced it left it over
            // (protocol 5).
            if ring.consumer_gone.load(Ordering::Acquire) {
                leave_closed();
            }
            return;
        }
    }
    // SAFETY: passed on from the caller.
    unsafe { hand_back_slow(descriptor, shared) }
}

/// [`hand_back`] through `THREAD_RINGS`, when [`FIRST`] does not name an open ring
/// of the table or that ring is full; the release list when no ring takes it.
///
/// # Safety
/// As for [`hand_back`].
#[cold]
#[inline(never)]
unsafe fn hand_back_slow(descriptor: NonNull<Descriptor>, shared: NonNull<DescriptorBlock>) {
    let pushed = THREAD_RINGS
        .try_with(|thread| {
            let Ok(mut rings) = thread.rings.try_borrow_mut() else {
                return false;
            };
            FIRST.set(NO_RING);
            // SAFETY: passed on from the caller.
            let pushed = unsafe { hand_back_on(&mut rings, descriptor, shared) };
            refresh_first(&rings);
            pushed
        })
        .unwrap_or(false);
    if !pushed {
        // SAFETY: passed on from the caller; no ring took the descriptor.
        unsafe { Descriptor::push_released(descriptor, shared) }
    }
}

/// Leaves this thread's rings whose table closed, after the fast path pushed on
/// one (protocol 5: the producer releases what it left there).
#[cold]
#[inline(never)]
fn leave_closed() {
    let _ = THREAD_RINGS.try_with(|thread| {
        if let Ok(mut rings) = thread.rings.try_borrow_mut() {
            FIRST.set(NO_RING);
            prune(&mut rings);
            refresh_first(&rings);
        }
    });
}

/// [`hand_back`] on this thread's rings.
///
/// # Safety
/// As for [`hand_back`].
#[inline]
unsafe fn hand_back_on(
    rings: &mut Vec<NonNull<Ring>>,
    descriptor: NonNull<Descriptor>,
    shared: NonNull<DescriptorBlock>,
) -> bool {
    let key = shared.as_ptr() as usize;
    // The most recent table first: a thread mostly hands back to one. The flag is
    // checked before the push: a ring whose table closed may share its key with a new
    // block at the same address (protocol 3).
    let ready = rings.first().is_some_and(|first| {
        // SAFETY: this thread's reference keeps its rings alive.
        let ring = unsafe { first.as_ref() };
        ring.key == key && !ring.consumer_gone.load(Ordering::Acquire)
    });
    if !ready {
        prune(rings);
        let position = rings.iter().position(|ring| {
            // SAFETY: as above.
            unsafe { ring.as_ref() }.key == key
        });
        let position = match position {
            Some(position) => position,
            None => {
                // SAFETY: the descriptor is live, so its block is alive (parent
                // invariant 1) and its table open or counting it.
                let Some(ring) = join(unsafe { shared.as_ref() }) else {
                    return false;
                };
                rings.push(ring);
                rings.len() - 1
            }
        };
        rings.swap(0, position);
    }
    // SAFETY: as above.
    let ring = unsafe { rings[0].as_ref() };
    let pushed = ring.push(descriptor);
    // The flag again after the push: a close that raced it left it over (protocol 5).
    if ring.consumer_gone.load(Ordering::Acquire) {
        leave_first(rings);
    }
    pushed
}

/// Leaves this thread's first ring, whose table closed.
#[cold]
fn leave_first(rings: &mut Vec<NonNull<Ring>>) {
    let ring = rings.swap_remove(0);
    // SAFETY: this thread is the ring's producer and leaves it once.
    unsafe { Ring::producer_leaves(ring) };
}

/// Leaves every ring of this thread whose table closed.
#[cold]
fn prune(rings: &mut Vec<NonNull<Ring>>) {
    rings.retain(|&ring| {
        // SAFETY: this thread's reference keeps its rings alive.
        let closed = unsafe { ring.as_ref() }
            .consumer_gone
            .load(Ordering::Acquire);
        if closed {
            // SAFETY: this thread is the ring's producer and leaves it once.
            unsafe { Ring::producer_leaves(ring) };
        }
        !closed
    });
}

/// Makes a ring for this thread and the table of `shared`; None when the table is
/// closed.
#[cold]
fn join(shared: &DescriptorBlock) -> Option<NonNull<Ring>> {
    let closed = closed_marker();
    let mut head = shared.new_rings.load(Ordering::Relaxed);
    if head == closed {
        return None;
    }
    let ring = Ring::new(NonNull::from(shared));
    loop {
        if head == closed {
            // SAFETY: the ring was never shared.
            unsafe { Ring::free(ring) };
            return None;
        }
        // SAFETY: the ring is not shared yet.
        unsafe { ring.as_ref() }
            .next_new
            .store(head, Ordering::Relaxed);
        match shared.new_rings.compare_exchange_weak(
            head,
            ring.as_ptr(),
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Some(ring),
            Err(actual) => head = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring takes `CAPACITY` descriptors, refuses the next, and takes as many again
    /// as the consumer drained, round after round (the push's limit follows `head`).
    #[test]
    fn a_ring_is_full_at_capacity_and_takes_what_was_drained() {
        let ring = Ring::new(NonNull::dangling());
        // SAFETY: the ring lives until it is freed below.
        let this = unsafe { ring.as_ref() };
        let mut places = vec![0u64; CAPACITY + 1];
        // Never dereferenced: the ring stores and hands back pointers only.
        let pointers: Vec<NonNull<Descriptor>> = places
            .iter_mut()
            .map(|place| NonNull::from(place).cast())
            .collect();
        let mut taken = Vec::new();
        for round in 0..3 {
            for &pointer in &pointers[..CAPACITY] {
                assert!(this.push(pointer), "round {round}");
            }
            assert!(!this.push(pointers[CAPACITY]), "full in round {round}");
            // Part of it drained: exactly that much room.
            let mut drained = 0;
            while drained < 10 {
                let head = this.head.0.load(Ordering::Relaxed);
                let pointer = this.slots[head % CAPACITY].load(Ordering::Relaxed);
                this.head.0.store(head + 1, Ordering::Relaxed);
                taken.push(NonNull::new(pointer).unwrap());
                drained += 1;
            }
            for &pointer in &pointers[..10] {
                assert!(this.push(pointer), "round {round}");
            }
            assert!(
                !this.push(pointers[CAPACITY]),
                "full again in round {round}"
            );
            this.drain_each(&mut |pointer| taken.push(pointer));
        }
        let mut expected = Vec::new();
        for _ in 0..3 {
            expected.extend_from_slice(&pointers[..CAPACITY]);
            expected.extend_from_slice(&pointers[..10]);
        }
        assert_eq!(taken, expected);
        // SAFETY: made above and never shared: no reference to it remains.
        unsafe { Ring::free(ring) };
    }
}
