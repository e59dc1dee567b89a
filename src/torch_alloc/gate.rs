//! Stream-safe reuse: a block freed on one stream is not handed to another stream
//! before the work the first stream had queued at the free is done.
//!
//! Blocks go back to the pools at once when freed, so the stream that freed a block
//! can reuse it at once (its own later work runs after the earlier work, in stream
//! order). At the free the gate records an event on that stream; when the pools hand
//! a block to a *different* stream, the gate finds the in-flight frees of other streams
//! that overlap its bytes and waits for the latest one's event (an event that completed
//! already costs nothing). Completed frees are dropped from the front of each stream's
//! queue as they are found (events of one stream complete in order).

use std::collections::{BTreeMap, VecDeque};

use super::events::{Stream, StreamEvents};

/// A block freed on a stream whose event may not have completed yet.
struct InFlight<Event> {
    address: u64,
    size: u64,
    event: Event,
}

/// The in-flight frees of every stream. Invariant: each queue is in the order of its
/// frees (so of its events).
pub struct StreamGate<E: StreamEvents> {
    events: E,
    in_flight: BTreeMap<Stream, VecDeque<InFlight<E::Event>>>,
    /// Cross-stream waits made so far (each one an event that had not completed when
    /// its bytes were handed to another stream).
    waits: u64,
}

impl<E: StreamEvents> StreamGate<E> {
    /// A gate over `events` with nothing in flight.
    pub fn new(events: E) -> Self {
        Self {
            events,
            in_flight: BTreeMap::new(),
            waits: 0,
        }
    }

    /// Records the free of `size` bytes at `address` on `stream`.
    pub fn freed(&mut self, stream: Stream, address: u64, size: u64) -> Result<(), String> {
        let event = self.events.record(stream)?;
        self.in_flight
            .entry(stream)
            .or_default()
            .push_back(InFlight {
                address,
                size,
                event,
            });
        Ok(())
    }

    /// Drops the frees whose events have completed, from the front of each queue.
    pub fn prune(&mut self) {
        for queue in self.in_flight.values_mut() {
            while let Some(front) = queue.front() {
                if !self.events.query(&front.event) {
                    break;
                }
                if let Some(done) = queue.pop_front() {
                    self.events.recycle(done.event);
                }
            }
        }
        self.in_flight.retain(|_, queue| !queue.is_empty());
    }

    /// Makes `size` bytes at `address`, just handed to `stream`, safe to use there:
    /// waits for the latest in-flight free of every other stream that overlaps them.
    pub fn acquire(&mut self, stream: Stream, address: u64, size: u64) {
        let end = address.saturating_add(size.max(1));
        for (&other, queue) in self.in_flight.iter_mut() {
            if other == stream {
                continue;
            }
            let latest = queue.iter().rposition(|free| {
                free.address < end && address < free.address.saturating_add(free.size.max(1))
            });
            if let Some(position) = latest {
                if !self.events.query(&queue[position].event) {
                    self.events.wait(&queue[position].event);
                    self.waits += 1;
                }
                // Every earlier free of that stream completed too (stream order).
                for done in queue.drain(..=position) {
                    self.events.recycle(done.event);
                }
            }
        }
        self.in_flight.retain(|_, queue| !queue.is_empty());
    }

    /// Waits for every in-flight free (before giving memory back to the device).
    pub fn drain(&mut self) {
        for (_, queue) in std::mem::take(&mut self.in_flight) {
            for done in queue {
                self.events.wait(&done.event);
                self.events.recycle(done.event);
            }
        }
    }

    /// The frees still in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.values().map(VecDeque::len).sum()
    }

    /// Cross-stream waits made so far.
    pub fn waits(&self) -> u64 {
        self.waits
    }
}

impl<E: StreamEvents> Drop for StreamGate<E> {
    /// Gives every event still in flight back to the event API (which destroys its
    /// events when dropped: CUDA frees an event recorded but not completed once it
    /// completes).
    fn drop(&mut self) {
        for (_, queue) in std::mem::take(&mut self.in_flight) {
            for free in queue {
                self.events.recycle(free.event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch_alloc::ManualEvents;

    #[test]
    fn same_stream_reuse_never_waits() {
        let mut gate = StreamGate::new(ManualEvents::default());
        gate.freed(1, 0, 100).unwrap();
        gate.acquire(1, 0, 100);
        assert_eq!(gate.waits(), 0);
        assert_eq!(
            gate.in_flight(),
            1,
            "the free stays in flight for other streams"
        );
    }

    #[test]
    fn other_stream_waits_for_the_latest_overlapping_free() {
        let mut gate = StreamGate::new(ManualEvents::default());
        gate.freed(1, 0, 100).unwrap(); // ticket 1
        gate.freed(1, 500, 100).unwrap(); // ticket 2
        gate.freed(1, 1000, 100).unwrap(); // ticket 3
        gate.acquire(2, 550, 10);
        assert_eq!(gate.waits(), 1);
        assert_eq!(gate.events.waited(), [(1, 2)]);
        // Tickets 1 and 2 are done; 3 is still in flight.
        assert_eq!(gate.in_flight(), 1);
        // Bytes that no in-flight free covers cost no wait.
        gate.acquire(2, 200, 100);
        assert_eq!(gate.waits(), 1);
    }

    #[test]
    fn completed_frees_cost_no_wait_and_are_pruned() {
        let mut gate = StreamGate::new(ManualEvents::default());
        gate.freed(1, 0, 100).unwrap();
        gate.freed(1, 100, 100).unwrap();
        gate.events.complete(1, 1);
        gate.prune();
        assert_eq!(gate.in_flight(), 1);
        gate.events.complete(1, 2);
        gate.acquire(3, 0, 200);
        assert_eq!(gate.waits(), 0);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn drain_waits_for_everything() {
        let mut gate = StreamGate::new(ManualEvents::default());
        gate.freed(1, 0, 100).unwrap();
        gate.freed(2, 100, 100).unwrap();
        gate.drain();
        assert_eq!(gate.in_flight(), 0);
        assert_eq!(gate.events.waited().len(), 2);
    }

    #[test]
    fn a_failed_record_is_an_error() {
        let mut events = ManualEvents::default();
        events.failing = Some(666);
        let mut gate = StreamGate::new(events);
        assert!(gate.freed(666, 0, 100).is_err());
        assert_eq!(gate.in_flight(), 0);
    }
}
