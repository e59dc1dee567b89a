//! The release policy: idle chunks unmapped, coldest first, down to the bytes kept.

use super::{Calls, Chunks, ARENAS};
use crate::pool::bins::SegmentIndex;
use crate::storage::{StorageId, VirtualMemory};

/// The idle spans, longest idle first, in which a trim looks for a chunk that frees
/// the bytes it must free alone (one call, where unmapping the longest idle chunks
/// might take several); past them it unmaps the longest idle. The bound keeps a trim's
/// cost constant: unbounded, the search walked 127 spans a call on average in the
/// steady state of `examples/peer_loops.rs` (each span a chunk elsewhere in memory),
/// and bounded at 64 the step on storage without bytes took 270 against 379 ns (best
/// of 6, interleaved) and 1,044 against 1,074 instructions, with the same storage
/// calls there (28.78 per 100 steps, `examples/default_calls.rs -- steady`) and on
/// every shared and captured trace, as captured and with every size x128
/// (`examples/default_calls.rs TRACE...`). The traces' calls were the same with a
/// bound of 16 or 32 too; the steady state made 29.25 calls per 100 steps at 16.
pub(super) const TRIM_SPANS: u64 = 64;

impl Chunks {
    /// Unmaps idle chunks until at most `keep` idle bytes are left: the longest idle
    /// of those that alone suffice (in the [`TRIM_SPANS`] spans idle longest), else
    /// the longest idle, and again (one call per
    /// chunk: a chunk that suffices alone frees the bytes in one call, where the
    /// longest idle might take several). `ranges` names each arena's range.
    pub(crate) fn trim(
        &mut self,
        memory: &mut dyn VirtualMemory,
        ranges: [Option<StorageId>; ARENAS],
        keep: u64,
    ) -> Calls {
        self.list_unlisted();
        let mut calls = Calls::default();
        while self.idle_bytes > keep {
            let Some(index) = self
                .enough_alone(self.idle_bytes - keep)
                .or_else(|| self.longest_idle())
            else {
                break;
            };
            let Some(range) = ranges[self.chunk(index).arena] else {
                break;
            };
            if !self.unmap(memory, range, index) {
                break;
            }
            calls.unmaps += 1;
        }
        calls
    }

    /// The chunk idle longest: the head of the oldest span.
    fn longest_idle(&self) -> Option<SegmentIndex> {
        self.idle_head.get()
    }

    /// The idle chunk idle longest of those of at least `bytes` bytes in the
    /// [`TRIM_SPANS`] spans idle longest, if any. A span whose bound on its largest
    /// chunk is smaller holds none, and its chunks are not visited; a span whose
    /// chunks were all visited in vain gets the largest as its bound, so that the
    /// next search passes it by unless it asks for no more than that largest or
    /// the span grows.
    ///
    /// Before the bounds, this search visited every chunk of each span long enough
    /// to hold `bytes`: in the steady state of `examples/peer_loops.rs`, where it
    /// fails more often than not, 228 thousand of the 247 thousand spans it walked
    /// in a million steps held no chunk that sufficed (1.29 million chunks visited,
    /// each a lookup in the table and a chunk elsewhere in memory). With them it
    /// walks 31 thousand spans and visits 84 thousand chunks, finds the same chunks
    /// (the same placements and calls on every shared and captured trace, as
    /// captured, x16 and x128, `examples/placements.rs`), and the step on storage
    /// without bytes went from 1,012 to 999 instructions (callgrind) and from
    /// 144.5-147.5 to 139.4-145.4 ns (five rounds, the builds in turn; the build
    /// before also had the granule table's links and counts together, a change that
    /// moved the step by half an instruction).
    pub(super) fn enough_alone(&mut self, bytes: u64) -> Option<SegmentIndex> {
        let mut cursor = self.idle_head;
        let mut spans = 0;
        while let Some(span) = self.chunks.linked(cursor) {
            spans += 1;
            if spans > TRIM_SPANS {
                return None;
            }
            let next = span.next;
            if span.span_largest * self.granule >= bytes {
                let (arena, mut g, end) = (span.arena, span.start, span.span_end);
                let mut largest = 0;
                while g < end {
                    let index = self.at(arena, g).get()?;
                    let chunk = self.chunk(index);
                    if chunk.granules * self.granule >= bytes {
                        return Some(index);
                    }
                    largest = largest.max(chunk.granules);
                    g += chunk.granules;
                }
                let head = cursor.followed();
                self.chunk_mut(head).span_largest = largest;
            }
            cursor = next;
        }
        None
    }
}
