//! The error/taint graph: failures that leave bytes unwritten, tracked through launches.
//!
//! In an asynchronous runtime a kernel can fail after its caller has moved on. The
//! buffers it should have written hold garbage, and every later launch that reads them
//! produces garbage too. The [`ErrorGraph`] follows this so that a read can say *why* its
//! bytes cannot be trusted, all the way back to the first failure:
//!
//! - a failed launch mints a [`FailureId`] and taints the ranges it should have written;
//! - a launch that reads a tainted range (or a buffer whose reservation failed) does not
//!   run: it is [`Skipped`], and the ranges it should have written inherit the failure;
//! - writing a range (a launch that ran, or a host write) clears the taint there;
//! - a failure leaves the graph as soon as no live allocation carries it any more.
//!
//! The graph knows allocations only by an opaque [`AllocId`] the caller supplies; it does
//! not know their sizes (except for [unallocated](ErrorGraph::mark_unallocated) ones), so
//! bounds checking against the allocation belongs to the caller. When nothing is tainted
//! [`ErrorGraph::is_empty`] answers in O(1) and every operation returns early, so the
//! untainted path costs a branch.
//!
//! ```
//! use cubepool::errors::{AllocId, ErrorGraph, LaunchOutcome};
//!
//! let (a, b) = (AllocId(1), AllocId(2));
//! let mut graph = ErrorGraph::new();
//! let LaunchOutcome::Failed(failure) =
//!     graph.launch("matmul", &[], &[(a, 0..64)], Some("illegal address".into()))?
//! else { unreachable!() };
//! // `relu` reads the garbage: it is skipped, and `b` inherits the failure.
//! let LaunchOutcome::Skipped(skipped) = graph.launch("relu", &[(a, 0..64)], &[(b, 0..64)], None)?
//! else { unreachable!() };
//! assert_eq!(skipped.failure, failure);
//! assert_eq!(graph.claim(b, 0..8)?.and_then(|c| c.failure()), Some(failure));
//! println!("{}", graph.report(b).unwrap());
//! // Freeing both carriers retires the failure.
//! graph.release(a);
//! graph.release(b);
//! assert!(graph.is_empty());
//! # Ok::<(), cubepool::errors::GraphError>(())
//! ```
//!
//! Pure Rust, no `unsafe`, no pyo3: the Python skin lives in `src/python/`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod claim;
mod failure;
mod graph;
mod report;
mod taint;

#[cfg(test)]
mod tests;

use std::fmt;
use std::ops::Range;

pub use claim::{Claim, LaunchOutcome, Skipped};
pub use failure::{FailureId, Origin};
pub use graph::{ErrorGraph, MAX_SKIPPED_PER_FAILURE};
pub use taint::{Taint, TaintChange};

/// The identity of one allocation, as the caller names it (the management uses the
/// `ManagedMemoryId` of a reservation). The graph never interprets the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocId(pub u64);

impl fmt::Display for AllocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "alloc#{}", self.0)
    }
}

/// A byte range of one allocation: `range.start..range.end`, offsets from the start of
/// the allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AllocRange {
    /// The allocation.
    pub alloc: AllocId,
    /// The bytes, relative to the start of the allocation.
    pub range: Range<u64>,
}

impl AllocRange {
    /// A range of `alloc`.
    pub fn new(alloc: AllocId, range: Range<u64>) -> Self {
        Self { alloc, range }
    }

    /// Whether this range shares at least one byte with `other`.
    pub fn overlaps(&self, other: &AllocRange) -> bool {
        self.alloc == other.alloc
            && self.range.start < other.range.end
            && other.range.start < self.range.end
    }
}

impl fmt::Display for AllocRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes {}..{}",
            self.alloc, self.range.start, self.range.end
        )
    }
}

/// Why the error graph refused an operation. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// A range whose start lies after its end.
    #[error("range {start}..{end} of {alloc} is reversed (start > end)")]
    ReversedRange {
        /// The allocation the range names.
        alloc: AllocId,
        /// The start given.
        start: u64,
        /// The end given.
        end: u64,
    },
    /// A host write to an allocation that has no memory (its reservation failed).
    #[error("{alloc} has no memory (its reservation failed), so it cannot be written")]
    Unallocated {
        /// The allocation.
        alloc: AllocId,
    },
    /// [`ErrorGraph::mark_unallocated`] on an allocation the graph already tracks
    /// (tainted, or already unallocated): a handle is bound at most once.
    #[error("{alloc} is already tracked by the error graph and cannot be marked unallocated")]
    AlreadyTracked {
        /// The allocation.
        alloc: AllocId,
    },
}

/// A broken internal invariant, found by [`ErrorGraph::check_invariants`] or
/// [`Taint::check_invariants`]. Seeing one is a bug in cubepool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("error graph invariant broken: {0}")]
pub struct InvariantViolation(pub String);

/// Rejects a reversed range.
fn check_range(alloc: AllocId, range: &Range<u64>) -> Result<(), GraphError> {
    if range.start > range.end {
        return Err(GraphError::ReversedRange {
            alloc,
            start: range.start,
            end: range.end,
        });
    }
    Ok(())
}
