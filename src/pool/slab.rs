//! An index arena with generations: the storage of pages, slices and buffers.

use super::bins::Link;

/// Names one entry of a `Slab`; the generation tells a reused index from the
/// entry it once named, so a stale id is never mistaken for a live one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId {
    /// The index in the arena.
    pub index: u32,
    /// The generation of the entry at `index` when the id was made.
    pub generation: u32,
}

#[derive(Debug, Clone)]
struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// A `Vec` of entries addressed by [`SlotId`], with a LIFO stack of vacant indices
/// (so reuse is deterministic). Invariant: fewer than `u32::MAX` entries, so every
/// index it hands out is a `bins::SegmentIndex`.
#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    /// Invariant: exactly the indices whose entry holds no value.
    vacant: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            vacant: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// The bytes of one entry (a value's slot and its generation), for pools that
    /// keep it a power of two, so an index becomes an address by a shift.
    pub(crate) const ENTRY_BYTES: usize = std::mem::size_of::<Entry<T>>();

    /// Stores a value and returns its id.
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> SlotId {
        self.len += 1;
        if let Some(index) = self.vacant.pop() {
            let entry = &mut self.entries[index as usize];
            entry.generation = entry.generation.wrapping_add(1);
            entry.value = Some(value);
            return SlotId {
                index,
                generation: entry.generation,
            };
        }
        // Below `u32::MAX`, which the pools' links keep for "none" (`bins::Link`).
        let index = u32::try_from(self.entries.len())
            .ok()
            .filter(|&index| index < u32::MAX)
            .expect("a pool holds fewer than 2^32 - 1 entries");
        self.entries.push(Entry {
            generation: 0,
            value: Some(value),
        });
        SlotId {
            index,
            generation: 0,
        }
    }

    /// Removes the value `id` names, if it is live.
    pub(crate) fn remove(&mut self, id: SlotId) -> Option<T> {
        let entry = self.entries.get_mut(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        let value = entry.value.take()?;
        self.vacant.push(id.index);
        self.len -= 1;
        Some(value)
    }

    /// A new id for the live value `id` names (its generation moved on), so that `id`
    /// names nothing from now on; `None`, changing nothing, where `id` names no live
    /// value. For a pool that keeps a value across a free and its reuse (a cached page):
    /// each reuse must be told from the one before.
    pub(crate) fn renew(&mut self, id: SlotId) -> Option<SlotId> {
        let entry = self.entries.get_mut(id.index as usize)?;
        if entry.generation != id.generation || entry.value.is_none() {
            return None;
        }
        entry.generation = entry.generation.wrapping_add(1);
        Some(SlotId {
            index: id.index,
            generation: entry.generation,
        })
    }

    /// The value `id` names, if it is live.
    pub(crate) fn get(&self, id: SlotId) -> Option<&T> {
        let entry = self.entries.get(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        entry.value.as_ref()
    }

    /// The value `id` names, if it is live.
    pub(crate) fn get_mut(&mut self, id: SlotId) -> Option<&mut T> {
        let entry = self.entries.get_mut(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        entry.value.as_mut()
    }

    /// The value at `index`, if live (for links inside a pool, which always name
    /// live entries and need no generation check).
    /// The value a link names (`None` for `None`, or a vacant entry).
    #[inline(always)]
    pub(crate) fn linked(&self, link: Link) -> Option<&T> {
        self.entries.get(link.position())?.value.as_ref()
    }

    /// The value a link names (`None` for `None`, or a vacant entry).
    #[inline(always)]
    pub(crate) fn linked_mut(&mut self, link: Link) -> Option<&mut T> {
        self.entries.get_mut(link.position())?.value.as_mut()
    }

    #[inline]
    pub(crate) fn at(&self, index: u32) -> Option<&T> {
        self.entries.get(index as usize)?.value.as_ref()
    }

    /// The value at `index`, if live.
    #[inline]
    pub(crate) fn at_mut(&mut self, index: u32) -> Option<&mut T> {
        self.entries.get_mut(index as usize)?.value.as_mut()
    }

    /// The id of the live value at `index`.
    #[inline]
    pub(crate) fn id_at(&self, index: u32) -> Option<SlotId> {
        let entry = self.entries.get(index as usize)?;
        entry.value.as_ref().map(|_| SlotId {
            index,
            generation: entry.generation,
        })
    }

    /// Drops the value at `index`, if live, without moving it out (for a caller that
    /// has read what it needs).
    #[inline]
    pub(crate) fn discard_at(&mut self, index: u32) {
        if let Some(entry) = self.entries.get_mut(index as usize) {
            if entry.value.is_some() {
                entry.value = None;
                self.vacant.push(index);
                self.len -= 1;
            }
        }
    }

    /// The number of live values.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Live values with their ids, in index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotId, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| {
                entry.value.as_ref().map(|value| {
                    (
                        SlotId {
                            index: index as u32,
                            generation: entry.generation,
                        },
                        value,
                    )
                })
            })
    }
}
