//! Keeps host buffers alive until the device has read them.
//!
//! A copy from host memory to a device is asynchronous: after it is enqueued, the
//! host buffer must live until the device has read it. A [`PendingDropQueue`] takes
//! such buffers (anything [`StagedBytes`]: byte vectors, shared arrays,
//! [`SharedMemoryBindings`]) and drops them only once a [`Fence`] recorded after
//! their copies signals:
//!
//! 1. [`PendingDropQueue::push`] stages an item and says whether the staged batch has
//!    reached the [`FlushPolicy`] (64 items or 64 MiB by default);
//! 2. [`PendingDropQueue::flush`] seals the staged batch behind a fence the caller
//!    recorded after enqueuing their copies, frees every earlier batch whose fence has
//!    signaled, and waits for the oldest batches while more than
//!    [`FlushPolicy::max_pending_batches`] are pending (so held memory stays bounded);
//! 3. [`PendingDropQueue::poll`] frees signaled batches without waiting, and
//!    [`PendingDropQueue::sync`] waits for them all.
//!
//! Batches are freed in the order they were sealed (fences of one stream signal in
//! order). Dropping the queue waits for every pending fence; staged items, which no
//! fence covers yet, are dropped at once: flush before dropping a queue whose items
//! the device may still read.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::shared_bindings::SharedMemoryBindings;

/// A device signal: it signals once the device has finished every command
/// submitted before it was recorded.
pub trait Fence {
    /// Blocks until the fence signals.
    fn sync(self);

    /// Whether the fence has signaled, without blocking.
    fn is_signaled(&self) -> bool;
}

/// The shared state of a [`HostFence`] and its signal.
#[derive(Debug, Default)]
struct FenceState {
    signaled: Mutex<bool>,
    changed: Condvar,
}

/// A fence signaled from the host, by its [`HostFenceSignal`] (a copy thread, a
/// callback, a test).
#[derive(Debug, Clone)]
pub struct HostFence {
    state: Arc<FenceState>,
}

/// The signaling side of a [`HostFence`].
///
/// Dropping it signals the fence too: whoever holds the signal is the one reading
/// the buffers, and once it is gone nothing reads them, so no waiter blocks forever.
#[derive(Debug)]
pub struct HostFenceSignal {
    state: Arc<FenceState>,
}

impl HostFence {
    /// A fence and the signal that signals it.
    pub fn new() -> (HostFence, HostFenceSignal) {
        let state = Arc::new(FenceState::default());
        (
            HostFence {
                state: Arc::clone(&state),
            },
            HostFenceSignal { state },
        )
    }

    /// A fence that has already signaled.
    pub fn signaled() -> HostFence {
        let (fence, signal) = Self::new();
        signal.signal();
        fence
    }
}

impl HostFenceSignal {
    /// Signals the fence, waking every waiter.
    pub fn signal(&self) {
        let mut signaled = self
            .state
            .signaled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *signaled = true;
        self.state.changed.notify_all();
    }
}

impl Drop for HostFenceSignal {
    fn drop(&mut self) {
        self.signal();
    }
}

impl Fence for HostFence {
    fn sync(self) {
        let mut signaled = self
            .state
            .signaled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while !*signaled {
            signaled = self
                .state
                .changed
                .wait(signaled)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn is_signaled(&self) -> bool {
        *self
            .state
            .signaled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Something a [`PendingDropQueue`] holds, with the bytes it keeps alive.
pub trait StagedBytes {
    /// The bytes the item keeps alive (what [`FlushPolicy::max_bytes`] counts).
    fn staged_bytes(&self) -> u64;
}

fn bytes_of<T>(len: usize) -> u64 {
    (len as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

impl<T> StagedBytes for Vec<T> {
    fn staged_bytes(&self) -> u64 {
        bytes_of::<T>(self.len())
    }
}

impl<T> StagedBytes for Box<[T]> {
    fn staged_bytes(&self) -> u64 {
        bytes_of::<T>(self.len())
    }
}

impl<T> StagedBytes for Arc<[T]> {
    fn staged_bytes(&self) -> u64 {
        bytes_of::<T>(self.len())
    }
}

impl<T> StagedBytes for Arc<Vec<T>> {
    fn staged_bytes(&self) -> u64 {
        bytes_of::<T>(self.len())
    }
}

impl StagedBytes for SharedMemoryBindings {
    fn staged_bytes(&self) -> u64 {
        self.bytes()
    }
}

/// When a [`PendingDropQueue`] asks to be flushed, and how many sealed batches it
/// keeps before waiting for the oldest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Flush once this many items are staged.
    pub max_items: usize,
    /// Flush once the staged items keep this many bytes alive.
    pub max_bytes: u64,
    /// The most sealed batches kept waiting for their fences; a flush that seals one
    /// more waits for the oldest. At least 1 is kept.
    pub max_pending_batches: usize,
}

impl Default for FlushPolicy {
    /// 64 items or 64 MiB, and one batch in flight (CubeCL's double buffering).
    fn default() -> Self {
        Self {
            max_items: 64,
            max_bytes: 64 * 1024 * 1024,
            max_pending_batches: 1,
        }
    }
}

/// Items sealed behind one fence.
struct Batch<T, F> {
    items: Vec<T>,
    fence: F,
}

/// Keeps items (host buffers) alive until a fence recorded after their use signals
/// (see the [module documentation](self)).
pub struct PendingDropQueue<T, F: Fence> {
    policy: FlushPolicy,
    /// Items not yet behind a fence.
    staged: Vec<T>,
    /// The bytes the staged items keep alive.
    staged_bytes: u64,
    /// Sealed batches, oldest first.
    pending: VecDeque<Batch<T, F>>,
}

impl<T, F: Fence> std::fmt::Debug for PendingDropQueue<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingDropQueue")
            .field("policy", &self.policy)
            .field("staged", &self.staged.len())
            .field("staged_bytes", &self.staged_bytes)
            .field("pending_batches", &self.pending.len())
            .finish()
    }
}

impl<T: StagedBytes, F: Fence> Default for PendingDropQueue<T, F> {
    fn default() -> Self {
        Self::new(FlushPolicy::default())
    }
}

impl<T: StagedBytes, F: Fence> PendingDropQueue<T, F> {
    /// An empty queue with this policy.
    pub fn new(policy: FlushPolicy) -> Self {
        Self {
            policy,
            staged: Vec::new(),
            staged_bytes: 0,
            pending: VecDeque::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &FlushPolicy {
        &self.policy
    }

    /// Stages `item` (its copy enqueued, no fence recorded after it yet); returns
    /// whether the staged batch has reached the policy and should be flushed.
    pub fn push(&mut self, item: T) -> bool {
        self.staged_bytes = self.staged_bytes.saturating_add(item.staged_bytes());
        self.staged.push(item);
        self.should_flush()
    }

    /// Stages `item`, and flushes behind `fence()` when the policy says so.
    pub fn push_with(&mut self, item: T, fence: impl FnOnce() -> F) {
        if self.push(item) {
            self.flush(fence());
        }
    }

    /// Whether the staged batch has reached the policy.
    pub fn should_flush(&self) -> bool {
        self.staged.len() >= self.policy.max_items || self.staged_bytes >= self.policy.max_bytes
    }

    /// Seals the staged items behind `fence` (recorded after their copies), frees the
    /// batches whose fences have signaled, and waits for the oldest batches while
    /// more than the policy's `max_pending_batches` are pending. With nothing staged,
    /// the fence is not kept.
    pub fn flush(&mut self, fence: F) {
        if !self.staged.is_empty() {
            let items = std::mem::take(&mut self.staged);
            self.staged_bytes = 0;
            self.pending.push_back(Batch { items, fence });
        }
        self.poll();
        while self.pending.len() > self.policy.max_pending_batches.max(1) {
            if let Some(batch) = self.pending.pop_front() {
                batch.fence.sync();
                drop(batch.items);
            }
        }
    }

    /// Frees, oldest first, every batch whose fence has signaled, without waiting;
    /// returns the number of items freed.
    pub fn poll(&mut self) -> usize {
        let mut freed = 0;
        while self
            .pending
            .front()
            .is_some_and(|batch| batch.fence.is_signaled())
        {
            if let Some(batch) = self.pending.pop_front() {
                freed += batch.items.len();
            }
        }
        freed
    }

    /// Waits for every sealed batch's fence and frees it; returns the number of items
    /// freed. Staged items stay staged.
    pub fn sync(&mut self) -> usize {
        let mut freed = 0;
        while let Some(batch) = self.pending.pop_front() {
            batch.fence.sync();
            freed += batch.items.len();
        }
        freed
    }

    /// The number of staged items (not yet behind a fence).
    pub fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// The bytes the staged items keep alive.
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }

    /// The number of items sealed behind fences that have not been freed.
    pub fn pending_len(&self) -> usize {
        self.pending.iter().map(|batch| batch.items.len()).sum()
    }

    /// The number of sealed batches that have not been freed.
    pub fn pending_batches(&self) -> usize {
        self.pending.len()
    }
}

impl<T, F: Fence> Drop for PendingDropQueue<T, F> {
    /// Waits for every pending fence before the items behind it are dropped.
    fn drop(&mut self) {
        while let Some(batch) = self.pending.pop_front() {
            batch.fence.sync();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Weak;
    use std::time::Duration;

    use super::*;

    /// A buffer whose release the test can observe.
    fn buffer(len: usize) -> (Arc<Vec<u8>>, Weak<Vec<u8>>) {
        let buffer = Arc::new(vec![7u8; len]);
        let weak = Arc::downgrade(&buffer);
        (buffer, weak)
    }

    /// An item that claims many bytes without holding them.
    struct Claimed(u64);

    impl StagedBytes for Claimed {
        fn staged_bytes(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_buffer_lives_until_its_fence_signals() {
        let mut queue: PendingDropQueue<Arc<Vec<u8>>, HostFence> = PendingDropQueue::default();
        let (item, weak) = buffer(4096);
        queue.push(item);
        let (fence, signal) = HostFence::new();
        queue.flush(fence);
        assert_eq!((queue.staged_len(), queue.pending_len()), (0, 1));
        assert_eq!(queue.poll(), 0);
        assert!(weak.upgrade().is_some(), "released before its fence");
        signal.signal();
        assert_eq!(queue.poll(), 1);
        assert!(weak.upgrade().is_none(), "kept after its fence");
    }

    #[test]
    fn the_default_policy_flushes_at_64_items_or_64_mib() {
        let mut queue: PendingDropQueue<Claimed, HostFence> = PendingDropQueue::default();
        for _ in 0..63 {
            assert!(!queue.push(Claimed(1)));
        }
        assert!(queue.push(Claimed(1)));
        queue.flush(HostFence::signaled());
        assert!(!queue.push(Claimed(64 * 1024 * 1024 - 1)));
        assert!(queue.push(Claimed(1)));
        let policy = FlushPolicy {
            max_items: 2,
            max_bytes: 10,
            max_pending_batches: 1,
        };
        let mut small: PendingDropQueue<Vec<u32>, HostFence> = PendingDropQueue::new(policy);
        assert!(small.push(vec![0; 3]), "12 bytes pass 10");
    }

    #[test]
    fn a_flush_waits_for_the_oldest_batch_past_the_limit() {
        let mut queue: PendingDropQueue<Arc<Vec<u8>>, HostFence> = PendingDropQueue::default();
        let (first, first_weak) = buffer(16);
        queue.push(first);
        let (fence, signal) = HostFence::new();
        queue.flush(fence);
        let signaled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&signaled);
        let device = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
            signal.signal();
        });
        let (second, second_weak) = buffer(16);
        queue.push(second);
        // A second sealed batch passes max_pending_batches = 1: wait for the first.
        queue.flush(HostFence::new().0);
        assert!(
            signaled.load(Ordering::SeqCst),
            "freed before the fence signaled"
        );
        assert!(first_weak.upgrade().is_none());
        assert!(second_weak.upgrade().is_some());
        device.join().unwrap();
        // The second fence's signal was dropped with it, which signals it.
        assert_eq!(queue.sync(), 1);
        assert!(second_weak.upgrade().is_none());
    }

    #[test]
    fn dropping_the_queue_waits_for_pending_fences() {
        let (item, weak) = buffer(8);
        let (fence, signal) = HostFence::new();
        let waiter = std::thread::spawn(move || {
            let mut queue: PendingDropQueue<Arc<Vec<u8>>, HostFence> = PendingDropQueue::default();
            queue.push(item);
            queue.flush(fence);
            drop(queue);
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(weak.upgrade().is_some(), "dropped before its fence");
        drop(signal);
        waiter.join().unwrap();
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn batches_free_in_order() {
        let mut queue: PendingDropQueue<Arc<Vec<u8>>, HostFence> =
            PendingDropQueue::new(FlushPolicy {
                max_pending_batches: 4,
                ..FlushPolicy::default()
            });
        let (a, a_weak) = buffer(1);
        let (b, b_weak) = buffer(1);
        let (fence_a, signal_a) = HostFence::new();
        queue.push(a);
        queue.flush(fence_a);
        queue.push(b);
        queue.flush(HostFence::signaled());
        // b's fence signaled, but a's did not: b waits behind a.
        assert_eq!(queue.poll(), 0);
        assert!(b_weak.upgrade().is_some());
        signal_a.signal();
        assert_eq!(queue.poll(), 2);
        assert!(a_weak.upgrade().is_none() && b_weak.upgrade().is_none());
        assert_eq!(queue.pending_batches(), 0);
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn shared_bindings_stay_in_use_until_the_fence() {
        use crate::{MemoryConfiguration, MemoryDeviceProperties, MemoryManagement};
        let mut mm = MemoryManagement::from_configuration(
            crate::VirtualStorage::new(),
            MemoryDeviceProperties::default(),
            MemoryConfiguration::SubSlices,
        )
        .unwrap();
        let handle = mm.reserve(1 << 20).unwrap();
        let mut shared = SharedMemoryBindings::new();
        shared.pin(&handle);
        drop(handle);
        let mut queue: PendingDropQueue<SharedMemoryBindings, HostFence> =
            PendingDropQueue::default();
        queue.push(shared);
        let (fence, signal) = HostFence::new();
        queue.flush(fence);
        assert_eq!(mm.memory_usage().bytes_in_use, 1 << 20);
        signal.signal();
        queue.poll();
        assert_eq!(mm.memory_usage().bytes_in_use, 0);
    }
}
