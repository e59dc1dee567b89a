//! One allocation per page; free pages reused best-fit when they waste at most 1/8.
//!
//! Unlike CubeCL, a new page is sized to the request rounded up to the alignment (no
//! running-average inflation, CubeCL issue 1614), and a free page is reused only when
//! the bytes it would leave unused are at most an eighth of it, so a small request
//! never holds a large page.

use std::collections::BTreeSet;

use super::whole_pages::{padded, WholePages};
use super::{ensure, extent_of, AcceptRule, Books, MemoryPool, Placement, Released, SlotId};
use crate::error::PoolError;
use crate::storage::ComputeStorage;

/// How many periodic checks a page must stay free before it is released.
const CHECKS_BEFORE_RELEASE: u32 = 5;

/// A pool of pages that each hold one allocation of at most `max_alloc_size` bytes.
#[derive(Debug, Clone)]
pub struct ExclusivePool {
    max_alloc_size: u64,
    alignment: u64,
    /// Reservations between periodic checks, when pages are released periodically.
    check_every: Option<u64>,
    last_check: u64,
    /// Beside each page: the periodic checks it has stayed free through.
    pages: WholePages<u32>,
    /// Invariant: exactly the free pages, keyed by (page size, index, generation).
    free: BTreeSet<(u64, u32, u32)>,
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
            pages: WholePages::default(),
            free: BTreeSet::new(),
        }
    }

    /// The extent a used page's reservation counts in use: its size padded to the
    /// alignment (the page may be larger, by at most an eighth).
    fn extent_in(alignment: u64, size: u64, page_size: u64) -> u64 {
        extent_of(size, alignment).unwrap_or(page_size)
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
        let extent = padded(size, self.alignment, self.max_alloc_size)?;
        let reusable = self
            .free
            .range((extent, 0, 0)..)
            .next()
            .copied()
            // At most an eighth left unused, divided rather than multiplied: the
            // same test for integers, with no overflow on a page past 2^61 bytes.
            .filter(|&(page_size, _, _)| page_size - extent <= page_size / 8);
        let id = match reusable {
            Some(key) => {
                self.free.remove(&key);
                SlotId {
                    index: key.1,
                    generation: key.2,
                }
            }
            None => self.pages.make(storage, size, extent, self.alignment)?,
        };
        Ok(self.pages.hand_out(id, size, extent))
    }

    #[inline]
    fn release(&mut self, slot: SlotId) -> Result<Released, PoolError> {
        let alignment = self.alignment;
        let (released, page_size, free) =
            self.pages
                .take_back(slot, "page", "exclusive pool", |size, page_size| {
                    Self::extent_in(alignment, size, page_size)
                })?;
        self.free.insert((page_size, free.index, free.generation));
        Ok(released)
    }

    fn locate(&self, slot: SlotId) -> Option<Placement> {
        self.pages.locate(slot)
    }

    fn extent_of(&self, slot: SlotId) -> Option<u64> {
        let placement = self.pages.locate(slot)?;
        Some(Self::extent_in(
            self.alignment,
            placement.size,
            placement.storage.size,
        ))
    }

    fn cleanup(&mut self, storage: &mut dyn ComputeStorage, reserve_count: u64, explicit: bool) {
        if !explicit {
            match self.check_every {
                // Reserves since the last check, modulo 2^64: memory management's count
                // wraps, and a count past `u64::MAX - every` must not overflow a sum. A
                // count that went back reads as many reserves: a check now.
                Some(every) if reserve_count.wrapping_sub(self.last_check) >= every => {
                    self.last_check = reserve_count;
                }
                _ => return,
            }
        }
        let free: Vec<(u64, u32, u32)> = self.free.iter().copied().collect();
        for key in free {
            let id = SlotId {
                index: key.1,
                generation: key.2,
            };
            let Some(page) = self.pages.get_mut(id) else {
                continue;
            };
            page.extra += 1;
            if explicit || page.extra >= CHECKS_BEFORE_RELEASE {
                self.free.remove(&key);
                self.pages.give_up(storage, id);
            }
        }
    }

    fn books(&self) -> &Books {
        &self.pages.books
    }

    fn books_mut(&mut self) -> &mut Books {
        &mut self.pages.books
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut free = 0usize;
        for (id, page) in self.pages.iter() {
            let key = (page.storage.size, id.index, id.generation);
            if page.used {
                let extent = extent_of(page.size, self.alignment).unwrap_or(u64::MAX);
                ensure(extent <= page.storage.size, || {
                    "allocation larger than its page".into()
                })?;
                ensure(!self.free.contains(&key), || {
                    "used page in the free index".into()
                })?;
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
        self.pages.check_books("page", |size, page_size| {
            Self::extent_in(self.alignment, size, page_size)
        })
    }
}
