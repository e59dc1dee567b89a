//! The granule table: each granule's chunk and live count, how the table is named
//! and grown, and the lookups of a block's granules in it.

use super::Chunks;
use crate::pool::bins::Link;

/// One granule of an arena's range: the chunk mapping it and the live blocks whose
/// edge it is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Granule {
    /// The chunk holding it ([`Link::NONE`]: unmapped).
    pub(super) chunk: Link,
    /// The live blocks that start or end in it (the one block a granule lies inside
    /// is not counted). Invariant: zero when unmapped, but while a block that
    /// claimed it waits for [`Chunks::map_missing`].
    pub(super) live: u32,
}

impl Granule {
    pub(super) const UNMAPPED: Self = Self {
        chunk: Link::NONE,
        live: 0,
    };
}

/// Names `chunk` in every one of `granules` (their live counts unchanged): four at a
/// time, which took the write of a run of hundreds of granules from 4 instructions a
/// granule to under 2 (a map's and an unmap's, `examples/replay_ab.rs` of traces at
/// GPU scale, callgrind).
#[inline]
pub(super) fn name_chunk(granules: &mut [Granule], chunk: Link) {
    let mut quads = granules.chunks_exact_mut(4);
    for quad in &mut quads {
        for granule in quad {
            granule.chunk = chunk;
        }
    }
    for granule in quads.into_remainder() {
        granule.chunk = chunk;
    }
}

/// What [`Chunks::claim`] returns where the host has no memory for the table's entries
/// of a block's granules: no count of bytes to map can be (they lie in a range of
/// address space, below `u64::MAX`).
pub(crate) const NO_ROOM: u64 = u64::MAX;

/// The entries the granule table first makes room for: 128 GiB of 2 MiB granules in
/// 512 KiB of the host's address space, which the host backs only as entries are
/// written (the table's length follows the highest granule claimed), so that a range
/// up to that size never copies its table.
pub(super) const FIRST_ROOM: usize = 1 << 16;

/// Grows `table` to `end` granules, all unmapped; `None`, leaving it as it was, where
/// the host has no memory for them (or `end` entries exceed the address space). A
/// block of a range of many granules (a 2 PiB request in granules of 2 KiB) would
/// otherwise abort the process on the allocation of its entries.
///
/// The room grows as `Vec`'s does (at least doubling), from [`FIRST_ROOM`] entries.
/// Reserved exactly, as it was in stop 62, every block past the table's end copied
/// the whole table: `grow_table` took 12 % of a replay's instructions at GPU scale
/// (lstm-train x128, 0.25 of the `replay` function's 2.06 million, callgrind of
/// `examples/replay_ab.rs`); the replay ran 2.02 million doubling from empty, 1.87
/// million from [`FIRST_ROOM`] (the shared traces' 0.04-1.1 % fewer).
#[cold]
#[inline(never)]
pub(super) fn grow_table(table: &mut Vec<Granule>, end: u64) -> Option<()> {
    let end = usize::try_from(end).ok()?;
    table.try_reserve(end.max(FIRST_ROOM) - table.len()).ok()?;
    table.resize(end, Granule::UNMAPPED);
    Some(())
}

impl Chunks {
    /// The granules `[first, end)` that `extent` bytes at `offset` touch.
    /// Blocks lie in a range of address space, so `offset + extent + granule` is far
    /// below `u64::MAX` and the sums need no overflow check.
    #[inline]
    pub(super) fn span(&self, offset: u64, extent: u64) -> (u64, u64) {
        let mask = self.granule.wrapping_sub(1);
        debug_assert!(offset
            .checked_add(extent)
            .and_then(|end| end.checked_add(mask))
            .is_some());
        let end = offset.wrapping_add(extent).wrapping_add(mask);
        (offset >> self.shift, end >> self.shift)
    }

    /// The chunk holding granule `g` of `arena` ([`Link::NONE`] where unmapped).
    #[inline]
    pub(super) fn at(&self, arena: usize, g: u64) -> Link {
        self.table[arena]
            .get(g as usize)
            .map_or(Link::NONE, |granule| granule.chunk)
    }

    /// The granule `extent` bytes at `offset` lie in when they lie in one, as
    /// [`Chunks::span`] finds it (its granules `[first, end)` with `end = first + 1`),
    /// in fewer instructions: the granules of the first and the last byte, compared.
    /// For `extent = 0`, `span` gives one granule exactly when `offset` is inside a
    /// granule, not at its start, and so does this (the "last byte" is the one
    /// before `offset`, in the same granule then, in the one before at a start, or
    /// wrapped to the top of the address space at 0). Shifts by `shift` (below 64,
    /// the granule being a power of two) need no check; with the checks the build
    /// adds (`overflow-checks`) and the span's end, the fast paths of
    /// [`Chunks::claim`] and [`Chunks::uncover`] ran 5 instructions more, both
    /// together (the FIFO step of `examples/peer_loops.rs`, callgrind).
    #[inline(always)]
    pub(super) fn sole_granule(&self, offset: u64, extent: u64) -> Option<u64> {
        let first = offset.wrapping_shr(self.shift);
        let last = offset
            .wrapping_add(extent)
            .wrapping_sub(1)
            .wrapping_shr(self.shift);
        (first == last).then_some(first)
    }

    /// The granules `[first, end)` that `extent` bytes at `offset` cover wholly (no
    /// other block touches them while this one lives); empty where there is none.
    #[inline]
    pub(super) fn inner(&self, offset: u64, extent: u64) -> (u64, u64) {
        let mask = self.granule - 1;
        let first = (offset + mask) >> self.shift;
        let end = (offset + extent) >> self.shift;
        (first, end.max(first))
    }

    /// The number of unmapped granules of `arena` from `g` (unmapped, below `to`, in
    /// the table) up to the first mapped one or `to`: one tight scan of the table,
    /// where a step per granule through [`Chunks::at`] made the claim of a block of
    /// hundreds of fresh granules most of a replay's instructions at GPU scale.
    #[inline]
    pub(super) fn unmapped_run(&self, arena: usize, g: u64, to: u64) -> u64 {
        let granules = &self.table[arena][g as usize..to as usize];
        // Eight granules at a time with no exit inside a block (a tighter loop than
        // a test per granule: the scan of lstm-train x128's claims took 335 thousand
        // instructions fewer than `position` alone), then one by one in the first
        // block that holds a mapped one.
        let blocks = granules.chunks_exact(8);
        let whole = blocks
            .take_while(|block| block.iter().fold(true, |all, g| all & g.chunk.is_none()))
            .count()
            * 8;
        let rest = &granules[whole..];
        (whole
            + rest
                .iter()
                .position(|granule| granule.chunk.is_some())
                .unwrap_or(rest.len())) as u64
    }
}
