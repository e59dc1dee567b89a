//! What a read finds, and what a launch did.

use std::fmt;

use super::{AllocRange, FailureId};

/// Why the bytes of one buffer cannot be trusted, as a read finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The bytes were never written because of `failure`.
    Failed {
        /// The failure the bytes carry.
        failure: FailureId,
        /// The tainted bytes: one maximal run of `failure` within the range read,
        /// clipped to it.
        memory: AllocRange,
    },
    /// The buffer has no memory: it was created, but its reservation failed.
    Unallocated {
        /// The range that was read (all of it lies in the missing buffer).
        memory: AllocRange,
    },
}

impl Claim {
    /// The bytes the claim is about.
    pub fn memory(&self) -> &AllocRange {
        match self {
            Claim::Failed { memory, .. } | Claim::Unallocated { memory } => memory,
        }
    }

    /// The failure the bytes carry, for [`Claim::Failed`].
    pub fn failure(&self) -> Option<FailureId> {
        match self {
            Claim::Failed { failure, .. } => Some(*failure),
            Claim::Unallocated { .. } => None,
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claim::Failed { failure, memory } => write!(f, "{memory} carry {failure}"),
            Claim::Unallocated { memory } => {
                write!(f, "{memory} have no memory (the reservation failed)")
            }
        }
    }
}

/// One launch a failure stopped: the kernel that did not run, the buffer whose claim
/// stopped it, and what it would have produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The kernel that did not run.
    pub kernel: String,
    /// The claim that stopped it: the first one found among its reads, in order, then
    /// among its writes (only a write to a buffer without memory stops a launch).
    pub needed: Claim,
    /// Every range the launch should have written, as given. Each one with memory now
    /// carries `failure`; a buffer without memory stays [unallocated](Claim::Unallocated).
    pub produced: Vec<AllocRange>,
    /// The failure the produced ranges inherit: the needed claim's failure, or for an
    /// [`Claim::Unallocated`] claim the failure describing the failed reservation (one
    /// per unallocated buffer while it is in the graph, minted on first need).
    pub failure: FailureId,
}

/// What [`ErrorGraph::launch`](super::ErrorGraph::launch) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchOutcome {
    /// The launch ran: every range it wrote is now clean.
    Ran,
    /// The launch did not run because an input had a claim; its writes inherit the
    /// failure. Takes precedence over a requested failure: a launch that never ran
    /// cannot fail.
    Skipped(Skipped),
    /// The launch failed: its writes carry this new failure.
    Failed(FailureId),
}
