//! The granule table: each granule's chunk and live count, how the table is named
//! and grown, and the lookups of a block's granules in it.

use super::Chunks;
use crate::pool::bins::Link;

/// The granules of one arena's range: each one's chunk and live count, in two
/// arrays of one length (see [`Chunks::table`] for how long), so that naming a chunk
/// in a run of granules and scanning a run for a mapped one are a fill and a scan
/// of contiguous 4-byte links, which the compiler does four to sixteen at a time.
///
/// In one array of (link, count) pairs, as before, the links of a run were 8 bytes
/// apart. At GPU scale, where blocks span hundreds of granules, the functions that
/// step through a block's granules (the claim's, the map's, the unmap's and the
/// table's growth) took 0.72 of the `replay` function's 1.87 million instructions
/// of lstm-train x128, their own instructions only. Apart, they take 0.45 million
/// (the fills' `memset` included) and that replay 1.60 million, and bert-dynamic
/// x128's 3.38 against 3.52 million
/// (callgrind of `replay_ab TRACE compact virtual_pages 0`, with glibc's `rep stos`
/// and `rep movs` turned off, `GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=...`,
/// as callgrind counts each of their bytes an instruction). In time, against
/// `compact`'s in the same run, lstm-train x128 went from 3.19x to 2.49x, bert-dynamic
/// x128 from 2.72x to 2.43x and conv-dynamic x128 from 2.22x to 2.05x (`replay_ab
/// TRACE compact virtual_pages 15`, both builds twice). The fast paths, which read a
/// granule's count and then, maybe, its link, pay a second bounds check: the FIFO
/// step of `examples/peer_loops.rs` went from 430 to 432 instructions and the shared
/// traces' replays 0.5-0.6 % more; the placements and calls of every shared and
/// captured trace, as captured and x128, are the same (`examples/placements.rs`).
#[derive(Debug, Clone, Default)]
pub(super) struct GranuleTable {
    /// Each granule's chunk ([`Link::NONE`]: unmapped).
    pub(super) chunk: Vec<Link>,
    /// Each granule's count of the live blocks that start or end in it (the one
    /// block a granule lies inside is not counted). Invariant: zero when unmapped,
    /// but while a block that claimed it waits for [`Chunks::map_missing`]. An edge
    /// granule past the table's end at its block's claim has no entry to count it
    /// in: [`Chunks::map_missing`] counts it once the storage has mapped it (see
    /// `Pending::booked`).
    pub(super) live: Vec<u32>,
}

/// How long a [`GranuleTable`] is and the room its arrays hold, to bring it back to
/// after a failed map ([`GranuleTable::cut_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TableSize {
    /// The number of granules.
    pub(super) len: usize,
    /// The room of the chunk links and of the live counts.
    pub(super) room: (usize, usize),
}

impl GranuleTable {
    /// The number of granules in the table. Invariant: both arrays are this long.
    #[inline]
    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.chunk.len(), self.live.len());
        self.live.len()
    }

    /// Lengthens both arrays to `end` granules, the new ones unmapped (room
    /// reserved by the caller, or allocated here).
    #[inline]
    pub(super) fn extend_unmapped(&mut self, end: usize) {
        self.chunk.resize(end, Link::NONE);
        self.live.resize(end, 0);
    }

    /// Its length and room now, for [`GranuleTable::cut_back`].
    pub(super) fn size(&self) -> TableSize {
        TableSize {
            len: self.len(),
            room: (self.chunk.capacity(), self.live.capacity()),
        }
    }

    /// Shortens it to `size.len` granules and gives back the room grown past
    /// `size.room`: the table as it was before maps that were then undone. The
    /// granules cut must be unmapped and counted in no block (checked in debug
    /// builds).
    #[cold]
    pub(super) fn cut_back(&mut self, size: TableSize) {
        debug_assert!(self.chunk[size.len.min(self.len())..]
            .iter()
            .all(|link| link.is_none()));
        debug_assert!(self.live[size.len.min(self.len())..]
            .iter()
            .all(|&live| live == 0));
        self.chunk.truncate(size.len);
        self.live.truncate(size.len);
        if self.chunk.capacity() > size.room.0 {
            self.chunk.shrink_to(size.room.0);
        }
        if self.live.capacity() > size.room.1 {
            self.live.shrink_to(size.room.1);
        }
    }
}

/// Names `chunk` in every one of `granules`: a fill of contiguous links, which the
/// compiler writes many at a time.
#[inline]
pub(super) fn name_chunk(granules: &mut [Link], chunk: Link) {
    granules.fill(chunk);
}

/// The entries the granule table first makes room for: 128 GiB of 2 MiB granules in
/// 512 KiB of the host's address space, which the host backs only as entries are
/// written (the table's length follows the highest granule mapped), so that a range
/// up to that size never copies its table.
pub(super) const FIRST_ROOM: usize = 1 << 16;

/// Grows `table` to `end` granules, all unmapped; `None`, leaving it as it was, where
/// the host has no memory for them (or `end` entries exceed the address space). A
/// run the storage mapped in a range of many granules (a 2 PiB run in granules of
/// 2 KiB) would otherwise abort the process on the allocation of its entries.
///
/// The room grows as `Vec`'s does (at least doubling), from [`FIRST_ROOM`] entries.
/// Reserved exactly, as it was in stop 62, every block past the table's end copied
/// the whole table: `grow_table` took 12 % of a replay's instructions at GPU scale
/// (lstm-train x128, 0.25 of the `replay` function's 2.06 million, callgrind of
/// `examples/replay_ab.rs`); the replay ran 2.02 million doubling from empty, 1.87
/// million from [`FIRST_ROOM`] (the shared traces' 0.04-1.1 % fewer).
///
/// Nor does its room grow past the memory the process can take from the host at that
/// moment (Linux's `MemAvailable`, and the room under each memory limit of the
/// process's control groups, see `host_memory`; no bound where the system does not
/// say): the entries are written as the table lengthens,
/// and the kernel lets an allocation through that it cannot back (overcommit), then
/// kills the process while the entries are filled. A rough guard, taken where the
/// room grows (for the whole new room), not a reservation of the memory. The default
/// layout's table is at most 4 MiB (1 TiB of 2 MiB granules), but a layout's granule
/// is the user's: a one-line trace of a 256 GiB block replayed in 64-byte granules on
/// simulated storage asks for 32 GiB of entries (2^32 granules), a 64 MiB block in
/// 1-byte granules for 512 MiB. Refused, the map is out of memory, a typed error, and
/// what was reserved stays.
#[cold]
#[inline(never)]
pub(super) fn grow_table(table: &mut GranuleTable, end: u64) -> Option<()> {
    let end = usize::try_from(end).ok()?;
    // The host's memory is read only where the room grows past its first (512 KiB,
    // which every range of the shared traces' replays stays within): a few times in
    // a large table's life, not where the table lengthens within its room.
    if end > table.chunk.capacity().max(FIRST_ROOM) {
        return grow_table_within(table, end, crate::host_memory::available());
    }
    lengthen(table, end)
}

/// [`grow_table`] on a host with `available` bytes of memory (`None`: not known).
#[cold]
#[inline(never)]
pub(super) fn grow_table_within(
    table: &mut GranuleTable,
    end: usize,
    available: Option<u64>,
) -> Option<()> {
    // The whole room the growth makes (`Vec` at least doubles it), which the table
    // then lengthens into unchecked: checked now, entries not yet written included.
    let room = end
        .max(FIRST_ROOM)
        .max(table.chunk.capacity().saturating_mul(2));
    let more = room.saturating_sub(table.len()) as u128;
    if available.is_some_and(|available| more * ENTRY_BYTES > u128::from(available)) {
        return None;
    }
    lengthen(table, end)
}

/// Lengthens `table` to `end` granules, all unmapped, its room grown as `Vec`'s (at
/// least doubling) from [`FIRST_ROOM`]; `None`, leaving it as it was, where the
/// allocator refuses the room.
#[inline]
fn lengthen(table: &mut GranuleTable, end: usize) -> Option<()> {
    let more = end.max(FIRST_ROOM) - table.len();
    table.chunk.try_reserve(more).ok()?;
    table.live.try_reserve(more).ok()?;
    table.extend_unmapped(end);
    Some(())
}

/// The host bytes of one granule's entries (its chunk link and live count).
const ENTRY_BYTES: u128 = (std::mem::size_of::<Link>() + std::mem::size_of::<u32>()) as u128;

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
            .chunk
            .get(g as usize)
            .copied()
            .unwrap_or(Link::NONE)
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

    /// The number of unmapped granules of `arena` from `g` (unmapped, below `to`) up
    /// to the first mapped one or `to`: one tight scan of the table, where a step per
    /// granule through [`Chunks::at`] made the claim of a block of hundreds of fresh
    /// granules most of a replay's instructions at GPU scale. The granules past the
    /// table's end are unmapped, and counted without a scan.
    #[inline]
    pub(super) fn unmapped_run(&self, arena: usize, g: u64, to: u64) -> u64 {
        let links = &self.table[arena].chunk;
        let Some(granules) = links.get(g as usize..(to as usize).min(links.len())) else {
            return to - g;
        };
        // Sixteen links at a time with no exit inside a block (compared together,
        // where a test per link made the scan of lstm-train x128's claims 335
        // thousand instructions more), then one by one in the first block that holds
        // a mapped one.
        let blocks = granules.chunks_exact(16);
        let whole = blocks
            .take_while(|block| block.iter().fold(true, |all, link| all & link.is_none()))
            .count()
            * 16;
        let rest = &granules[whole..];
        match rest.iter().position(|link| link.is_some()) {
            Some(mapped) => (whole + mapped) as u64,
            None => to - g,
        }
    }
}
