//! Pages that hold one reservation each, as the exclusive and the direct pool keep
//! them: a page is made from one storage buffer, handed out whole, taken back and
//! given up to the storage the same way in both, with the pool's books kept here. The
//! pools differ only in how they find a free page to reuse and when they give free
//! pages up, which stays in each (`exclusive.rs`, `direct.rs`).
//!
//! Invariant (checked by [`WholePages::check_books`]): the books' usage is the sum
//! over the pages (every page's bytes reserved, every used page's size and extent in
//! use), and their page count is the number of pages.

use super::{
    books_full, ensure, extent_of, unpaddable, zero_size, Books, Placement, Released, Slab, SlotId,
};
use crate::error::PoolError;
use crate::storage::{ComputeStorage, StorageHandle};
use crate::usage::MemoryUsage;

/// The bytes a page for `size` bytes spans: `size` padded to `alignment`, or
/// [`PoolError::BufferTooBig`] (against `max_accepted`) where that overflows, and
/// [`PoolError::InvalidArgument`] for a size of 0 (a pool places at least one byte) or
/// an alignment of 0 ([`unpaddable`]).
pub(crate) fn padded(size: u64, alignment: u64, max_accepted: u64) -> Result<u64, PoolError> {
    match extent_of(size, alignment) {
        // Only a size of 0 pads to 0.
        Some(0) => Err(zero_size()),
        Some(extent) => Ok(extent),
        None => Err(unpaddable(size, alignment, max_accepted)),
    }
}

/// One page: its storage buffer and the reservation it holds.
#[derive(Debug, Clone)]
pub(crate) struct WholePage<T> {
    /// The buffer, whose size is the page's.
    pub(crate) storage: StorageHandle,
    /// The bytes asked for while used; 0 while free.
    pub(crate) size: u64,
    /// Whether a reservation holds the page.
    pub(crate) used: bool,
    /// What the pool keeps beside each page; reset to its default when the page is
    /// handed out.
    pub(crate) extra: T,
}

/// The pages of one pool and its books.
#[derive(Debug, Clone, Default)]
pub(crate) struct WholePages<T> {
    pages: Slab<WholePage<T>>,
    /// The pool's usage and statistics.
    pub(crate) books: Books,
}

impl<T: Default> WholePages<T> {
    /// Makes a free page of `extent` bytes from a new storage buffer, for a request of
    /// `size` bytes.
    ///
    /// A page that would take the pool's books past `u64::MAX` bytes is refused
    /// ([`PoolError::PoolCapacityExceeded`], before the storage is asked): a storage
    /// that grants buffers without address space (one of the public
    /// [`ComputeStorage`]s a caller writes) could grant them, and the sum overflowed.
    pub(crate) fn make(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
        extent: u64,
        alignment: u64,
    ) -> Result<SlotId, PoolError> {
        let usage = &self.books.usage;
        let Some(reserved) = usage.bytes_reserved.checked_add(extent) else {
            return Err(books_full(size, usage));
        };
        let buffer = storage.alloc(extent, alignment)?;
        self.books.usage.bytes_reserved = reserved;
        let id = self.pages.insert(WholePage {
            storage: buffer,
            size: 0,
            used: false,
            extra: T::default(),
        });
        self.books.stats.page_mapped(&self.books.usage);
        Ok(id)
    }

    /// Hands free page `id` out to a reservation of `size` bytes padded to `extent`.
    /// The caller found `id` among its free pages (or just made it): a free page
    /// of this pool.
    pub(crate) fn hand_out(&mut self, id: SlotId, size: u64, extent: u64) -> Placement {
        let page = self
            .pages
            .get_mut(id)
            .expect("the page was just found free or made");
        debug_assert!(!page.used, "a page handed out twice");
        page.used = true;
        page.size = size;
        page.extra = T::default();
        let storage = page.storage;
        self.books.usage.add(size, extent);
        self.books.stats.allocated(size, &self.books.usage);
        Placement {
            slot: id,
            storage,
            offset: 0,
            size,
        }
    }

    /// Takes back the reservation on page `slot`, counting `extent(size, page size)`
    /// bytes out of use; returns what was freed, the page's size and the page's new
    /// id, under which the caller lists it free: `slot` names nothing from now on, so
    /// a stale id of the reservation cannot free the next one the page holds. A page
    /// that is not in use is [`PoolError::NotFound`], which names it as `what`
    /// (`"page"`, `"buffer"`) of `pool`.
    pub(crate) fn take_back(
        &mut self,
        slot: SlotId,
        what: &str,
        pool: &str,
        extent: impl FnOnce(u64, u64) -> u64,
    ) -> Result<(Released, u64, SlotId), PoolError> {
        let page = match self.pages.get_mut(slot) {
            Some(page) if page.used => page,
            _ => {
                return Err(PoolError::NotFound {
                    reason: format!("{what} {} is not reserved in this {pool}", slot.index),
                })
            }
        };
        page.used = false;
        let size = std::mem::take(&mut page.size);
        let page_size = page.storage.size;
        let extent = extent(size, page_size);
        self.books.usage.remove(size, extent);
        let free = self
            .pages
            .renew(slot)
            .expect("the page was just found live");
        Ok((Released { size, extent }, page_size, free))
    }

    /// Where the reservation on page `slot` is, while one holds it.
    pub(crate) fn locate(&self, slot: SlotId) -> Option<Placement> {
        let page = self.pages.get(slot).filter(|page| page.used)?;
        Some(Placement {
            slot,
            storage: page.storage,
            offset: 0,
            size: page.size,
        })
    }

    /// Gives page `id` back to the storage, if it is a page of this pool; returns it.
    /// The caller takes it off its index of free pages.
    pub(crate) fn give_up(
        &mut self,
        storage: &mut dyn ComputeStorage,
        id: SlotId,
    ) -> Option<WholePage<T>> {
        let page = self.pages.remove(id)?;
        storage.dealloc(page.storage.id);
        // Saturating: a caller may have rewritten the usage (`books_mut`).
        self.books.usage.bytes_reserved = self
            .books
            .usage
            .bytes_reserved
            .saturating_sub(page.storage.size);
        self.books.stats.page_unmapped();
        Some(page)
    }

    /// Page `id`, to update what the pool keeps beside it.
    pub(crate) fn get_mut(&mut self, id: SlotId) -> Option<&mut WholePage<T>> {
        self.pages.get_mut(id)
    }

    /// Every page with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotId, &WholePage<T>)> {
        self.pages.iter()
    }

    /// Checks the books against the pages (the module's invariant), with a used page's
    /// extent given by `extent(size, page size)` as the pool counts it; `page` names
    /// a page in the message (`"page"`, `"buffer"`).
    pub(crate) fn check_books(
        &self,
        page: &str,
        extent: impl Fn(u64, u64) -> u64,
    ) -> Result<(), String> {
        let mut usage = MemoryUsage::default();
        for (_, page) in self.pages.iter() {
            usage.bytes_reserved += page.storage.size;
            if page.used {
                usage.add(page.size, extent(page.size, page.storage.size));
            }
        }
        ensure(usage == self.books.usage, || {
            format!(
                "usage drifted: books say {:?}, {page}s say {usage:?}",
                self.books.usage
            )
        })?;
        ensure(self.books.stats.pages == self.pages.len() as u64, || {
            format!("{page} count drifted")
        })
    }
}
