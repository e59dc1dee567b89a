//! Failure identities and where each failure came from.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::AllocId;
use super::AllocRange;

/// The next id to hand out. Starts at 1 so that 0 never names a failure.
static NEXT_FAILURE: AtomicU64 = AtomicU64::new(1);

/// The id a tainted allocation carries, naming the failure that left its bytes unwritten.
///
/// Ids come from one process-wide counter and are never reused within a process (the
/// counter would wrap only after 2^64 failures), so an id held after its failure left the
/// graph can never be mistaken for a newer failure. Ids order by creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FailureId(u64);

impl FailureId {
    /// Mints a fresh id, distinct from every id minted before in this process.
    pub(crate) fn mint() -> Self {
        Self(NEXT_FAILURE.fetch_add(1, Ordering::Relaxed))
    }

    /// The number behind the id (at least 1).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FailureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failure#{}", self.0)
    }
}

/// Where a failure came from: the root of every chain of skipped launches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A launch that failed (`launch(.., fail: Some(message))`).
    FailedLaunch {
        /// The kernel that failed.
        kernel: String,
        /// The ranges it should have written, which it tainted.
        writes: Vec<AllocRange>,
    },
    /// A reservation that failed: minted by the first launch that needed the allocation
    /// that never received memory (later launches needing it reuse the failure while it
    /// is still in the graph).
    Unallocated {
        /// The allocation without memory.
        alloc: AllocId,
        /// The size that was requested.
        size: u64,
        /// Why the reservation failed, as the caller gave it.
        reason: String,
    },
}

/// One failure's entry in the graph.
#[derive(Debug, Clone)]
pub(crate) struct FailureRecord {
    /// What went wrong, in words. For [`Origin::FailedLaunch`] the caller's message; for
    /// [`Origin::Unallocated`] a sentence naming the reservation and its reason.
    pub(crate) message: String,
    /// Where the failure came from.
    pub(crate) origin: Origin,
    /// Invariant: exactly the number of allocations whose [`Taint`](super::Taint) names
    /// this failure, and at least 1 (a failure nobody carries is removed at once).
    pub(crate) carriers: usize,
    /// The launches this failure stopped, oldest first. Invariant: at most
    /// [`MAX_SKIPPED_PER_FAILURE`](super::MAX_SKIPPED_PER_FAILURE) entries, each with
    /// `failure` equal to this record's id.
    pub(crate) skipped: Vec<super::Skipped>,
    /// How many skipped launches arrived after `skipped` was full and were not kept.
    pub(crate) skipped_dropped: u64,
}
