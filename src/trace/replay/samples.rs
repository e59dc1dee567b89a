//! The time series: a [`Sample`] for each run of consecutive events, and the runs'
//! opening and closing in the [`Replayer`].

use super::memory::Replayable;
use super::replayer::Replayer;
use crate::trace::TraceEvent;

/// The memory of one run of consecutive events.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sample {
    /// The index of the run's first event.
    pub first_event: usize,
    /// The number of events in the run (at least one).
    pub events: usize,
    /// The time of the run's first event, in ns.
    pub t_start: u64,
    /// The time of the run's last event, in ns.
    pub t_end: u64,
    /// The fewest bytes in use before the run or after any of its events.
    pub in_use_min: u64,
    /// The most bytes in use before the run or after any of its events.
    pub in_use_max: u64,
    /// The bytes in use after the run's last event.
    pub in_use_end: u64,
    /// The fewest bytes reserved before the run or after any of its events.
    pub reserved_min: u64,
    /// The most bytes reserved before the run or after any of its events.
    pub reserved_max: u64,
    /// The bytes reserved after the run's last event.
    pub reserved_end: u64,
}

impl<A: Replayable> Replayer<'_, A> {
    /// Starts a run: its extremes start from the current state, so runs join up.
    pub(super) fn open_run(&mut self) {
        self.run_in_use = (self.in_use, self.in_use);
        self.run_reserved = (self.reserved, self.reserved);
    }
    /// Ends a run of events: records its sample and every pool's bytes.
    #[inline(never)]
    pub(super) fn close_run(&mut self, first_event: usize, events: &[TraceEvent]) {
        let counts = self.memory.storage_counts();
        if counts != self.storage_seen {
            self.storage_seen = counts;
            self.memory.pool_reserved(&mut self.pool_reserved);
        }
        self.samples.push(Sample {
            first_event,
            events: events.len(),
            t_start: events.first().map_or(0, TraceEvent::t),
            t_end: events.last().map_or(0, TraceEvent::t),
            in_use_min: self.run_in_use.0,
            in_use_max: self.run_in_use.1,
            in_use_end: self.in_use,
            reserved_min: self.run_reserved.0,
            reserved_max: self.run_reserved.1,
            reserved_end: self.reserved,
        });
        for (pool, reserved) in self.pool_reserved.iter().enumerate() {
            self.reserved_series[pool].push(*reserved);
            self.in_use_series[pool].push(self.pool_in_use[pool]);
        }
    }
}
