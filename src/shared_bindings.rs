//! Bindings pinned for another stream until released.
//!
//! When one stream hands a buffer to another (a copy on a second queue, a kernel
//! on another stream), the memory must stay in use until that stream is done with
//! it, even if every handle of the first stream is dropped. A
//! [`SharedMemoryBindings`] holds a binding of each such reservation: the memory
//! stays reserved (its bytes in use) until the set is released or dropped. To release
//! it when a device event signals, stage it in a
//! [`PendingDropQueue`](crate::drop_queue::PendingDropQueue) behind that event's
//! fence.

use crate::handle::{ManagedMemoryBinding, ManagedMemoryHandle};

/// A set of bindings shared with another stream: every reservation in it stays in
/// use until the set is released (or dropped).
#[derive(Debug, Clone, Default)]
pub struct SharedMemoryBindings {
    bindings: Vec<ManagedMemoryBinding>,
}

impl SharedMemoryBindings {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pins a binding's reservation.
    pub fn push(&mut self, binding: ManagedMemoryBinding) {
        self.bindings.push(binding);
    }

    /// Pins a handle's reservation (through a binding of it, so the handle's
    /// `can_mut` is unchanged).
    pub fn pin(&mut self, handle: &ManagedMemoryHandle) {
        self.bindings.push(handle.binding());
    }

    /// The pinned bindings.
    pub fn bindings(&self) -> &[ManagedMemoryBinding] {
        &self.bindings
    }

    /// The number of pinned bindings.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    /// Whether nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    /// The bytes the pinned bindings hold (a reservation pinned twice counts twice).
    pub fn bytes(&self) -> u64 {
        self.bindings
            .iter()
            .map(ManagedMemoryBinding::size)
            .fold(0, u64::saturating_add)
    }

    /// Unpins everything: reservations with no other handle or binding are freed at
    /// the memory management's next operation.
    pub fn release(&mut self) {
        self.bindings.clear();
    }
}

impl Extend<ManagedMemoryBinding> for SharedMemoryBindings {
    fn extend<I: IntoIterator<Item = ManagedMemoryBinding>>(&mut self, iter: I) {
        self.bindings.extend(iter);
    }
}

impl FromIterator<ManagedMemoryBinding> for SharedMemoryBindings {
    fn from_iter<I: IntoIterator<Item = ManagedMemoryBinding>>(iter: I) -> Self {
        Self {
            bindings: iter.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MemoryConfiguration, MemoryDeviceProperties};
    use crate::management::MemoryManagement;
    use crate::storage::VirtualStorage;

    fn memory() -> MemoryManagement<VirtualStorage> {
        MemoryManagement::from_configuration(
            VirtualStorage::new(),
            MemoryDeviceProperties::default(),
            MemoryConfiguration::ExclusivePages,
        )
        .unwrap()
    }

    #[test]
    fn pinned_memory_stays_in_use_until_released() {
        let mut mm = memory();
        let a = mm.reserve(1000).unwrap();
        let b = mm.reserve(24).unwrap();
        let mut shared = SharedMemoryBindings::new();
        shared.pin(&a);
        shared.push(b.binding());
        assert!(a.can_mut(), "a binding does not count as a handle");
        assert_eq!((shared.len(), shared.bytes()), (2, 1024));
        drop((a, b));
        assert_eq!(mm.memory_usage().bytes_in_use, 1024);
        shared.release();
        assert!(shared.is_empty());
        assert_eq!(mm.memory_usage().bytes_in_use, 0);
        mm.check_invariants().unwrap();
    }

    #[test]
    fn dropping_the_set_releases_it() {
        let mut mm = memory();
        let handle = mm.reserve(64).unwrap();
        let shared: SharedMemoryBindings = [handle.binding()].into_iter().collect();
        drop(handle);
        let copy = shared.clone();
        drop(shared);
        assert_eq!(
            mm.memory_usage().number_allocs,
            1,
            "the clone still pins it"
        );
        drop(copy);
        assert_eq!(mm.memory_usage().number_allocs, 0);
    }
}
