//! Where reservations are (their resources) and the error graph that names them.

use super::{MemoryManagement, Resource, EMPTY_PLACEMENT};
use crate::error::PoolError;
use crate::errors::{AllocId, ErrorGraph};
use crate::handle::{MemoryHandle, PoolRef, SlotRef};
use crate::pool::{MemoryPool, Placement};
use crate::storage::ComputeStorage;

impl<S: ComputeStorage> MemoryManagement<S> {
    /// The error/taint graph of this memory management's reservations.
    pub fn error_graph(&self) -> &ErrorGraph {
        &self.held.errors
    }

    /// The error/taint graph, to record launches and writes (after freeing dropped
    /// handles, so no released reservation is named).
    pub fn error_graph_mut(&mut self) -> &mut ErrorGraph {
        self.flush_releases();
        &mut self.held.errors
    }

    /// The id the [error graph](Self::error_graph) knows the reservation of a handle or
    /// binding by. A handle of another memory management is refused: its id would name
    /// an unrelated allocation here, or one this graph never sees released (so a failure
    /// tainting it would stay in the graph for good). Use this, not the handle's raw id,
    /// to build the graph's [`AllocId`]s.
    pub fn alloc_id(&self, handle: &impl MemoryHandle) -> Result<AllocId, PoolError> {
        let (owner, _) = handle.address_of();
        if owner != self.identity {
            return Err(PoolError::NotFound {
                reason: "the handle belongs to another MemoryManagement".to_string(),
            });
        }
        Ok(AllocId(handle.memory_id().0))
    }

    /// Where the reservation of a handle or binding is.
    pub fn resource(&mut self, handle: &impl MemoryHandle) -> Result<Resource, PoolError> {
        let (owner, slot_ref) = handle.address_of();
        if owner != self.identity {
            return Err(PoolError::NotFound {
                reason: "the handle belongs to another MemoryManagement".to_string(),
            });
        }
        self.locate(slot_ref)
    }

    /// The bytes the reservation at `slot_ref` spans in its pool (its size padded, or
    /// the page or buffer it holds whole: what its release counts out of use); 0 for a
    /// reservation of no bytes, `None` for a slot not reserved.
    pub(crate) fn extent_at(&self, slot_ref: SlotRef) -> Option<u64> {
        match slot_ref.pool {
            PoolRef::Empty => Some(0),
            PoolRef::Persistent => self.held.persistent.extent_of(slot_ref.slot),
            PoolRef::Dynamic(index) => self
                .held
                .pools
                .get(index as usize)?
                .extent_of(slot_ref.slot),
        }
    }

    /// The index [`Resource::pool`] gives `pool`: dynamic pools by their index, the
    /// persistent pool next after them, and `None` for no pool.
    fn pool_index(&self, pool: PoolRef) -> Option<usize> {
        match pool {
            PoolRef::Empty => None,
            PoolRef::Persistent => Some(self.held.pools.len()),
            PoolRef::Dynamic(index) => Some(index as usize),
        }
    }

    /// The resource of `placement`, made by `pool`.
    pub(super) fn resource_at(&self, pool: PoolRef, placement: &Placement) -> Resource {
        match self.pool_index(pool) {
            None => Resource {
                pool: None,
                storage_id: None,
                offset: 0,
                size: 0,
                address: 0,
            },
            Some(index) => Resource {
                pool: Some(index),
                storage_id: Some(placement.storage.id.0),
                offset: placement.offset,
                size: placement.size,
                // Wrapping: a caller's storage may hand out a buffer whose address
                // range passes 2^64 (`StorageHandle::address`), which must not panic here.
                address: placement.storage.address.wrapping_add(placement.offset),
            },
        }
    }

    /// Where the reservation in slot `slot_ref` is.
    pub fn locate(&self, slot_ref: SlotRef) -> Result<Resource, PoolError> {
        let placement = match slot_ref.pool {
            PoolRef::Empty => Some(EMPTY_PLACEMENT),
            PoolRef::Persistent => self.held.persistent.locate(slot_ref.slot),
            PoolRef::Dynamic(index) => self
                .held
                .pools
                .get(index as usize)
                .and_then(|pool| pool.locate(slot_ref.slot)),
        };
        match placement {
            Some(placement) => Ok(self.resource_at(slot_ref.pool, &placement)),
            None => Err(PoolError::NotFound {
                reason: format!(
                    "slot {} of pool {} is not reserved",
                    slot_ref.slot.index,
                    self.pool_index(slot_ref.pool).unwrap_or_default()
                ),
            }),
        }
    }
}
