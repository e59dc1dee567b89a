//! Buffers with lifetimes and sizes, checked once: the input of every placer.

use crate::report::grouped;
use crate::trace::{Trace, TraceEvent};

/// One buffer of the dynamic storage allocation problem: `size` bytes live from time
/// `lower` (inclusive) to `upper` (exclusive). Two buffers whose lifetimes intersect
/// may not share a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    /// The first time the buffer is live.
    pub lower: u64,
    /// The first time after `lower` that the buffer is no longer live.
    pub upper: u64,
    /// Bytes the buffer takes.
    pub size: u64,
}

impl Buffer {
    /// Whether the lifetimes of `self` and `other` intersect.
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// Why a placement could not be made or returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// A buffer's lifetime is empty or reversed.
    #[error("buffer {index}: lifetime [{lower}, {upper}) is empty (lower must be below upper)")]
    EmptyLifetime {
        /// The buffer's index in the input.
        index: usize,
        /// Its lower time.
        lower: u64,
        /// Its upper time.
        upper: u64,
    },
    /// The sizes add up past 2^64 bytes, so offsets could not be written.
    #[error("the buffers' sizes add up to more than 2^64 bytes")]
    SizesOverflow,
    /// No placement fits the capacity: the peak live bytes exceed it, or the exact
    /// search went through every canonical placement.
    #[error(
        "no placement fits in capacity {}: {why}; the best height found is {} (the lower \
         bound, peak live bytes, is {})",
        grouped(*.capacity), grouped(*.best_height), grouped(*.lower_bound)
    )]
    Infeasible {
        /// The capacity asked for.
        capacity: u64,
        /// The lowest height of a placement found.
        best_height: u64,
        /// Peak live bytes.
        lower_bound: u64,
        /// How infeasibility was shown.
        why: InfeasibleBecause,
    },
    /// The time limit passed before a placement within the capacity was found.
    #[error(
        "no placement within capacity {} was found in the time limit of {secs} s; the \
         best height found is {} (the lower bound, peak live bytes, is {})",
        grouped(*.capacity), grouped(*.best_height), grouped(*.lower_bound),
        secs = .time_limit.as_secs_f64()
    )]
    TimeLimit {
        /// The capacity asked for.
        capacity: u64,
        /// The lowest height of a placement found.
        best_height: u64,
        /// Peak live bytes.
        lower_bound: u64,
        /// The time limit.
        time_limit: std::time::Duration,
    },
    /// The search was stopped by its caller ([`super::place_until`]'s flag) before it
    /// ended.
    #[error("the placement was stopped before it ended")]
    Stopped,
    /// The independent checker rejected a placement a placer made: a bug in cubepool,
    /// reported instead of returning a wrong placement.
    #[error("internal error: the placement made fails its check: {0}")]
    CheckFailed(#[from] super::check::Violation),
}

/// How a capacity was shown to be too small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InfeasibleBecause {
    /// The peak live bytes exceed the capacity.
    PeakLive,
    /// The exact search explored every canonical placement.
    Exhausted,
}

impl std::fmt::Display for InfeasibleBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InfeasibleBecause::PeakLive => "the peak live bytes exceed it",
            InfeasibleBecause::Exhausted => "the exact search proved it",
        })
    }
}

/// Buffers that passed validation, with their lower bound.
///
/// Invariants: every buffer has `lower < upper`; the sizes add up to at most
/// `u64::MAX`, so no offset a placer computes (at most the sum of the sizes below a
/// buffer) nor any top overflows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    buffers: Vec<Buffer>,
    /// The most bytes live at one time: no placement is lower.
    lower_bound: u64,
}

impl Problem {
    /// Checks `buffers` (non-empty lifetimes, sizes that add up within 64 bits).
    pub fn new(buffers: Vec<Buffer>) -> Result<Self, PlacementError> {
        let mut total: u64 = 0;
        for (index, buffer) in buffers.iter().enumerate() {
            if buffer.lower >= buffer.upper {
                return Err(PlacementError::EmptyLifetime {
                    index,
                    lower: buffer.lower,
                    upper: buffer.upper,
                });
            }
            total = total
                .checked_add(buffer.size)
                .ok_or(PlacementError::SizesOverflow)?;
        }
        let lower_bound = peak_live(&buffers);
        Ok(Self {
            buffers,
            lower_bound,
        })
    }

    /// The allocations of `trace` as buffers, by event index: allocation `id` is live
    /// from the index of its alloc event to the index of its free event (or the
    /// trace's length if never freed). Buffer `i` is allocation id `i`. The lower
    /// bound is then the trace's peak live bytes.
    pub fn from_trace(trace: &Trace) -> Result<Self, PlacementError> {
        let end = trace.events.len() as u64;
        let mut buffers: Vec<Buffer> = trace
            .sizes
            .iter()
            .map(|&size| Buffer {
                lower: 0,
                upper: end,
                size,
            })
            .collect();
        for (index, event) in trace.events.iter().enumerate() {
            let index = index as u64;
            match *event {
                TraceEvent::Alloc { id, .. } => {
                    if let Some(buffer) = buffers.get_mut(id as usize) {
                        buffer.lower = index;
                    }
                }
                TraceEvent::Free { id, .. } => {
                    if let Some(buffer) = buffers.get_mut(id as usize) {
                        buffer.upper = index;
                    }
                }
            }
        }
        Self::new(buffers)
    }

    /// The buffers, in input order.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// The number of buffers.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Whether there are no buffers.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// Peak live bytes: the most bytes live at one time, which no placement beats.
    pub fn lower_bound(&self) -> u64 {
        self.lower_bound
    }
}

/// The most bytes live at one time. Ends sort before starts at the same time, since
/// lifetimes are half-open.
fn peak_live(buffers: &[Buffer]) -> u64 {
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(buffers.len() * 2);
    for buffer in buffers {
        events.push((buffer.lower, true, buffer.size));
        events.push((buffer.upper, false, buffer.size));
    }
    // `false` (an end) sorts before `true` (a start).
    events.sort_unstable();
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, start, size) in events {
        if start {
            // Bounded by the sum of the sizes, which fits (checked by the caller).
            live += size;
            peak = peak.max(live);
        } else {
            live -= size;
        }
    }
    peak
}
