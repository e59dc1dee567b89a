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
    /// [`TRIM_SPANS`] spans idle longest, if any (a span smaller than that holds none).
    fn enough_alone(&self, bytes: u64) -> Option<SegmentIndex> {
        let mut cursor = self.idle_head;
        let mut spans = 0;
        while let Some(span) = self.chunks.linked(cursor) {
            spans += 1;
            if spans > TRIM_SPANS {
                return None;
            }
            if (span.span_end - span.start) * self.granule >= bytes {
                let mut g = span.start;
                while g < span.span_end {
                    let index = self.at(span.arena, g).get()?;
                    let chunk = self.chunk(index);
                    if chunk.granules * self.granule >= bytes {
                        return Some(index);
                    }
                    g += chunk.granules;
                }
            }
            cursor = span.next;
        }
        None
    }
}
