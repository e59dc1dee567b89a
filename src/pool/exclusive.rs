//! One allocation per page; free pages reused best-fit when they waste at most 1/8.
//!
//! Unlike CubeCL, a new page is sized to the request rounded up to the alignment (no
//! running-average inflation, CubeCL issue 1614), and a free page is reused only when
//! the bytes it would leave unused are at most an eighth of it, so a small request
//! never holds a large page.

use std::collections::BTreeSet;

use super::{ensure, extent_of, AcceptRule, Books, MemoryPool, Placement, Released, Slab, SlotId};
use crate::error::PoolError;
use crate::storage::{ComputeStorage, StorageHandle};
use crate::usage::MemoryUsage;

/// How many periodic checks a page must stay free before it is released.
const CHECKS_BEFORE_RELEASE: u32 = 5;

#[derive(Debug, Clone)]
struct Page {
    storage: StorageHandle,
    /// The bytes asked for, when used.
    size: u64,
    used: bool,
    /// Periodic checks this page has stayed free through.
    free_checks: u32,
}

/// A pool of pages that each hold one allocation of at most `max_alloc_size` bytes.
#[derive(Debug, Clone)]
pub struct ExclusivePool {
    max_alloc_size: u64,
    alignment: u64,
    /// Reservations between periodic checks, when pages are released periodically.
    check_every: Option<u64>,
    last_check: u64,
    pages: Slab<Page>,
    /// Invariant: exactly the free pages, keyed by (page size, index).
    free: BTreeSet<(u64, u32, u32)>,
    books: Books,
}

impl ExclusivePool {
    /// A pool for sizes up to `max_alloc_size`; with a `dealloc_period`, pages that
    /// stay free through five checks `dealloc_period / 5` reservations apart are
    /// released.
    pub fn new(max_alloc_size: u64, alignment: u64, dealloc_period: Option<u64>) -> Self {
        Self {
            max_alloc_size,
            alignment,
            check_every: dealloc_period.map(|period| (period / 5).max(1)),
            last_check: 0,
            pages: Slab::default(),
            free: BTreeSet::new(),
            books: Books::default(),
        }
    }

    fn unmap(&mut self, storage: &mut dyn ComputeStorage, id: SlotId) {
        if let Some(page) = self.pages.remove(id) {
            self.free
                .remove(&(page.storage.size, id.index, id.generation));
            storage.dealloc(page.storage.id);
            self.books.usage.bytes_reserved -= page.storage.size;
            self.books.stats.page_unmapped();
        }
    }
}

impl MemoryPool for ExclusivePool {
    fn accept_rule(&self) -> AcceptRule {
        AcceptRule::up_to(self.max_alloc_size)
    }

    fn reserve(
        &mut self,
        storage: &mut dyn ComputeStorage,
        size: u64,
    ) -> Result<Placement, PoolError> {
        let extent = extent_of(size, self.alignment).ok_or(PoolError::BufferTooBig {
            size,
            max_accepted: self.max_alloc_size,
        })?;
        let reusable = self
            .free
            .range((extent, 0, 0)..)
            .next()
            .copied()
            .filter(|&(page_size, _, _)| (page_size - extent) * 8 <= page_size);
        let id = match reusable {
            Some(key) => {
                self.free.remove(&key);
                SlotId {
                    index: key.1,
                    generation: key.2,
                }
            }
            None => {
                let handle = storage.alloc(extent, self.alignment)?;
                self.books.usage.bytes_reserved += extent;
                let id = self.pages.insert(Page {
                    storage: handle,
                    size: 0,
                    used: false,
                    free_checks: 0,
                });
                self.books.stats.page_mapped(&self.books.usage);
                id
            }
        };
        let page = self
            .pages
            .get_mut(id)
            .expect("the page was just found or made");
        page.used = true;
        page.size = size;
        page.free_checks = 0;
        let handle = page.storage;
        self.books.usage.add(size, extent);
        self.books.stats.allocated(size, &self.books.usage);
        Ok(Placement {
            slot: id,
            storage: handle,
            offset: 0,
            size,
        })
    }

    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        let alignment = self.alignment;
        let page = match self.pages.get_mut(slot) {
            Some(page) if page.used => page,
            _ => {
                return Err(PoolError::NotFound {
                    reason: format!("page {} is not reserved in this exclusive pool", slot.index),
                })
            }
        };
        page.used = false;
        let size = std::mem::take(&mut page.size);
        let page_size = page.storage.size;
        let extent = extent_of(size, alignment).unwrap_or(page_size);
        self.books.usage.remove(size, extent);
        self.free.insert((page_size, slot.index, slot.generation));
        Ok(Released { size, extent })
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        let page = self.pages.get(slot).filter(|page| page.used)?;
        Some(Placement {
            slot,
            storage: page.storage,
            offset: 0,
            size: page.size,
        })
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool) {
        if !explicit {
            match self.check_every {
                Some(every) if reserve_count >= self.last_check + every => {
                    self.last_check = reserve_count;
                }
                _ => return,
            }
        }
        let free: Vec<SlotId> = self
            .free
            .iter()
            .map(|&(_, index, generation)| SlotId { index, generation })
            .collect();
        for id in free {
            let Some(page) = self.pages.get_mut(id) else {
                continue;
            };
            page.free_checks += 1;
            if explicit || page.free_checks >= CHECKS_BEFORE_RELEASE {
                self.unmap(storage, id);
            }
        }
    }

    fn books(&self) -> &Books {
        &self.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut usage = MemoryUsage::default();
        let mut free = 0usize;
        for (id, page) in self.pages.iter() {
            usage.bytes_reserved += page.storage.size;
            let key = (page.storage.size, id.index, id.generation);
            if page.used {
                let extent = extent_of(page.size, self.alignment).unwrap_or(u64::MAX);
                ensure(extent <= page.storage.size, || {
                    "allocation larger than its page".into()
                })?;
                ensure(!self.free.contains(&key), || {
                    "used page in the free index".into()
                })?;
                usage.add(page.size, extent);
            } else {
                ensure(self.free.contains(&key), || {
                    "free page missing from the free index".into()
                })?;
                free += 1;
            }
            ensure(page.storage.size % self.alignment == 0, || {
                "page not aligned".into()
            })?;
        }
        ensure(free == self.free.len(), || {
            "free index holds stale entries".into()
        })?;
        ensure(usage == self.books.usage, || {
            format!(
                "usage drifted: books say {:?}, pages say {usage:?}",
                self.books.usage
            )
        })?;
        ensure(self.books.stats.pages == self.pages.len() as u64, || {
            "page count drifted".into()
        })
    }
}
