//! The replay loop: the [`Replayer`], one replay's state, its step over one event,
//! and its result; and the high-water marks ([`Peaks`]).

use super::memory::Replayable;
use super::samples::Sample;
use super::{Failures, PoolReplay, ReplayResult};
use crate::trace::{Trace, TraceEvent};

/// The state of one replay: the memory, where each live allocation is, and the
/// measurements so far.
pub(super) struct Replayer<'a, A: Replayable> {
    trace: &'a Trace,
    pub(super) memory: A,
    /// Where each allocation of the trace lives, by dense id, while it is live.
    pub(super) slots: Vec<Option<A::Slot>>,
    /// Reservations served and bytes in use per dynamic pool, indexed by the u8 of a
    /// slot's `PoolRef::Dynamic` (so the compiler drops the bounds checks).
    served: [u64; 256],
    pub(super) pool_in_use: [u64; 256],
    /// Each pool's bytes reserved, and the storage's (allocations, frees) when they were
    /// read: pools only change their reservations when these counts change.
    pub(super) pool_reserved: Vec<u64>,
    pub(super) storage_seen: (u64, u64),
    pub(super) in_use: u64,
    pub(super) reserved: u64,
    /// The extremes of the current run: in use (min, max), reserved (min, max).
    pub(super) run_in_use: (u64, u64),
    pub(super) run_reserved: (u64, u64),
    peak: Peaks,
    failures: Failures,
    first_failed: Option<usize>,
    pub(super) samples: Vec<Sample>,
    pub(super) reserved_series: Vec<Vec<u64>>,
    pub(super) in_use_series: Vec<Vec<u64>>,
    /// The events at which a phase other than the first starts (step boundaries), in
    /// order, and the index of the next one not yet crossed.
    boundaries: Vec<usize>,
    next_boundary: usize,
    /// Whether the memory's reserves may give pages back before they return
    /// ([`Replayable::may_hold_within_reserve`]): then each reserve's most is read.
    within_reserve: bool,
}

impl<'a, A: Replayable> Replayer<'a, A> {
    pub(super) fn new(trace: &'a Trace, memory: A, samples: usize) -> Self {
        let pools = memory.pool_count();
        let series = || (0..pools).map(|_| Vec::with_capacity(samples)).collect();
        Self {
            trace,
            slots: vec![None; trace.allocations as usize],
            served: [0; 256],
            pool_in_use: [0; 256],
            pool_reserved: vec![0; pools],
            storage_seen: (0, 0),
            in_use: 0,
            reserved: 0,
            run_in_use: (0, 0),
            run_reserved: (0, 0),
            peak: Peaks::default(),
            failures: Failures::default(),
            first_failed: None,
            samples: Vec::with_capacity(samples),
            reserved_series: series(),
            in_use_series: series(),
            boundaries: {
                let mut starts: Vec<usize> = trace
                    .header
                    .phases
                    .iter()
                    .map(|phase| phase.first_event)
                    .filter(|&first| first > 0)
                    .collect();
                starts.sort_unstable();
                starts
            },
            next_boundary: 0,
            within_reserve: memory.may_hold_within_reserve(),
            memory,
        }
    }

    /// Tells the memory of every step boundary at or before event `index` not yet told.
    #[cold]
    #[inline(never)]
    fn cross_boundaries(&mut self, index: usize) {
        while self
            .boundaries
            .get(self.next_boundary)
            .is_some_and(|&first| first <= index)
        {
            self.memory.step_boundary();
            self.next_boundary += 1;
        }
    }

    #[inline(always)]
    pub(super) fn step(&mut self, index: usize, event: &TraceEvent) {
        if self
            .boundaries
            .get(self.next_boundary)
            .is_some_and(|&first| first <= index)
        {
            self.cross_boundaries(index);
        }
        match *event {
            TraceEvent::Alloc { id, size, .. } => {
                let outcome = self.memory.reserve(size);
                // Reserving may map pages, and release some (periodic or out-of-memory
                // cleanup); most reservations do neither. What a periodic cleanup gave
                // back was held until it ran: the reserve's most counts for the peak.
                self.read_reserved();
                let most = if self.within_reserve {
                    self.most_within_reserve()
                } else {
                    self.reserved
                };
                match outcome {
                    Ok(slot) => {
                        self.slots[id as usize] = Some(slot);
                        if let Some(pool) = self.memory.pool_of(slot) {
                            self.served[pool as usize] += 1;
                            self.pool_in_use[pool as usize] += size;
                        }
                        self.in_use += size;
                        self.run_in_use.1 = self.run_in_use.1.max(self.in_use);
                        self.peak.update(index, self.in_use, most);
                    }
                    Err(failure) => {
                        self.failures.count(failure);
                        self.first_failed.get_or_insert(index);
                    }
                }
            }
            TraceEvent::Free { id, .. } => {
                if let Some(slot) = self.slots[id as usize].take() {
                    let size = self.trace.sizes[id as usize];
                    self.in_use -= size;
                    self.run_in_use.0 = self.run_in_use.0.min(self.in_use);
                    if let Some(pool) = self.memory.pool_of(slot) {
                        self.pool_in_use[pool as usize] -= size;
                    }
                    self.memory.release(slot);
                    // A release may give storage back (a virtual pool unmapping at once,
                    // `keep=0`): the timeline's reserved bytes fall with it.
                    self.read_reserved();
                }
            }
        }
    }

    /// The most reserved so far, within reserves too (the peak of the result).
    #[inline]
    pub(super) fn peak_reserved(&self) -> u64 {
        self.peak.reserved
    }

    /// The most the last reserve held (before its periodic cleanup gave pages back),
    /// counted in the run's extremes. Called only where reserves may give pages back
    /// (`within_reserve`), so that other replays pay one test of a flag a reserve.
    #[inline(never)]
    fn most_within_reserve(&mut self) -> u64 {
        let most = self.memory.reserved_within_reserve().max(self.reserved);
        self.run_reserved.1 = self.run_reserved.1.max(most);
        most
    }

    /// Reads the bytes held from the device after a reserve or a release, and moves the
    /// sample's low and high marks where they changed.
    #[inline(always)]
    fn read_reserved(&mut self) {
        let reserved = self.memory.bytes_reserved();
        if reserved != self.reserved {
            self.reserved = reserved;
            self.run_reserved.0 = self.run_reserved.0.min(reserved);
            self.run_reserved.1 = self.run_reserved.1.max(reserved);
        }
    }

    pub(super) fn finish(mut self, seconds: f64) -> ReplayResult {
        let (summaries, final_usage) = self.memory.pool_summaries();
        let pools = summaries
            .into_iter()
            .zip(self.served)
            .zip(self.reserved_series.into_iter().zip(self.in_use_series))
            .map(
                |(((pool, usage, stats), reservations), (reserved, in_use))| PoolReplay {
                    pool,
                    reservations,
                    final_usage: usage,
                    stats,
                    reserved_series: reserved,
                    in_use_series: in_use,
                },
            )
            .collect();
        let (storage_allocations, storage_frees) = self.memory.storage_counts();
        let peak = self.peak;
        ReplayResult {
            events: self.trace.events.len(),
            peak_reserved: peak.reserved,
            peak_reserved_event: peak.reserved_event,
            peak_in_use: peak.in_use,
            peak_in_use_event: peak.in_use_event,
            peak_live: self.trace.peak_live,
            utilization: if self.failures.total() > 0 {
                f64::NAN
            } else if peak.reserved == 0 {
                1.0
            } else {
                self.trace.peak_live as f64 / peak.reserved as f64
            },
            seconds,
            storage_allocations,
            storage_frees,
            final_usage,
            failed_reserves: self.failures.total(),
            failures: self.failures,
            first_failed_event: self.first_failed,
            samples: self.samples,
            pools,
        }
    }
}

/// The high-water marks of a replay and the events that first reached them.
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    pub(super) in_use: u64,
    in_use_event: usize,
    pub(super) reserved: u64,
    reserved_event: usize,
}

impl Peaks {
    #[inline]
    fn update(&mut self, event: usize, in_use: u64, reserved: u64) {
        if in_use > self.in_use {
            self.in_use = in_use;
            self.in_use_event = event;
        }
        if reserved > self.reserved {
            self.reserved = reserved;
            self.reserved_event = event;
        }
    }
}
