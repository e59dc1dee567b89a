//! The event API the stream gate needs ([`StreamEvents`]): record an event on a stream
//! when a block is freed, ask later whether the stream's work before it is done, or
//! wait for it. CUDA's events implement it on a GPU (`CudaEvents`); [`HostEvents`]
//! serves host storage, whose work is never asynchronous.

/// A stream, as the allocator's callers name it: `cudaStream_t`'s value (0 is the
/// legacy default stream).
pub type Stream = u64;

/// Events on streams.
pub trait StreamEvents: Send {
    /// One recorded event.
    type Event: Send;

    /// Records an event on `stream`: it completes when every piece of work submitted to
    /// `stream` before this call is done.
    fn record(&mut self, stream: Stream) -> Result<Self::Event, String>;

    /// Whether `event` has completed (never blocks).
    fn query(&mut self, event: &Self::Event) -> bool;

    /// Blocks until `event` has completed.
    fn wait(&mut self, event: &Self::Event);

    /// Takes back an event that is no longer needed (for reuse).
    fn recycle(&mut self, event: Self::Event);
}

/// Events of host storage: the host runs no work behind the caller's back, so every
/// event is complete when recorded.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostEvents;

impl StreamEvents for HostEvents {
    type Event = ();

    fn record(&mut self, _stream: Stream) -> Result<(), String> {
        Ok(())
    }

    fn query(&mut self, _event: &()) -> bool {
        true
    }

    fn wait(&mut self, _event: &()) {}

    fn recycle(&mut self, _event: ()) {}
}

/// Events whose completion the caller drives (fake streams, for tests of stream
/// bookkeeping without a device): each record on a stream takes that stream's next
/// ticket; [`ManualEvents::complete`] says how far a stream's work has run, and a wait
/// runs the stream up to the event (recorded in [`ManualEvents::waited`]).
#[derive(Debug, Default, Clone)]
pub struct ManualEvents {
    recorded: std::collections::HashMap<Stream, u64>,
    done: std::collections::HashMap<Stream, u64>,
    waited: Vec<(Stream, u64)>,
    /// A stream on which recording fails (to test that path).
    pub failing: Option<Stream>,
}

impl ManualEvents {
    /// Marks `stream`'s work up to its `ticket`-th event as done.
    pub fn complete(&mut self, stream: Stream, ticket: u64) {
        let done = self.done.entry(stream).or_default();
        *done = (*done).max(ticket);
    }

    /// The events waited for so far, as `(stream, ticket)`.
    pub fn waited(&self) -> &[(Stream, u64)] {
        &self.waited
    }
}

impl StreamEvents for ManualEvents {
    type Event = (Stream, u64);

    fn record(&mut self, stream: Stream) -> Result<(Stream, u64), String> {
        if self.failing == Some(stream) {
            return Err(format!(
                "recording on stream {stream} fails (ManualEvents::failing)"
            ));
        }
        let ticket = self.recorded.entry(stream).or_default();
        *ticket += 1;
        Ok((stream, *ticket))
    }

    fn query(&mut self, event: &(Stream, u64)) -> bool {
        self.done.get(&event.0).copied().unwrap_or(0) >= event.1
    }

    fn wait(&mut self, event: &(Stream, u64)) {
        self.waited.push(*event);
        self.complete(event.0, event.1);
    }

    fn recycle(&mut self, _event: (Stream, u64)) {}
}
