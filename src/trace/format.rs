//! The cubepool trace v1 format: a JSON header line, then one event per line.
//!
//! ```text
//! {"format": "cubepool-trace", "version": 1, "workload": "...", "phases": [...]}
//! {"t": 0, "op": "alloc", "id": 0, "size": 1024}
//! {"t": 5, "op": "free", "id": 0}
//! ```
//!
//! An allocation line may carry its stack frames, innermost first (`"frames": ["f
//! (model.py:12)", ...]`, see [`super::stacks`]); readers that predate the field pass
//! over it, as they pass over every field they do not know.
//!
//! Readers accept the same text gzip-compressed (detected by its magic bytes). Every
//! malformed line is a [`TraceError::Parse`] naming its line number.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::recording::Recording;
use super::stacks::{Stacks, StacksBuilder};

/// The longest event line a trace may have.
pub const MAX_LINE_BYTES: u64 = 1 << 20;

/// The longest header line a trace may have: a header holds the phases (a PyTorch
/// profiler trace of 40,000 steps converts to a header of about 2 MiB), so it has a
/// bound of its own, still a bound, so that a hostile file cannot make one line take
/// all memory. [`Trace::write`] refuses a header past it, so that every file it
/// writes reads back.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;
use thiserror::Error;

/// Why a trace could not be read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not what the format says.
    #[error("line {line}: {message}")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace is past one of the [`ReadLimits`] of the read.
    #[error(
        "line {line}: the trace holds more than {bound}={max} {}; raise the bound with {bound}",
        limit_unit(bound)
    )]
    TooLarge {
        /// The 1-based line at which the bound was passed.
        line: usize,
        /// The field of [`ReadLimits`] passed: `"max_events"` or `"max_bytes"`.
        bound: &'static str,
        /// Its value.
        max: u64,
    },
}

/// What a bound of [`ReadLimits`] counts, for messages.
pub fn limit_unit(bound: &str) -> &'static str {
    if bound == "max_events" {
        "events"
    } else {
        "bytes of text (after decompression)"
    }
}

/// Bounds on what reading a trace may build, so that a small compressed file cannot
/// make a read take all memory: past one, the read stops with [`TraceError::TooLarge`].
/// `None` is no bound ([`Trace::read`] and [`Trace::load`] have none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadLimits {
    /// The most events (allocations and frees) the trace may hold.
    pub max_events: Option<u64>,
    /// The most bytes of text the trace may hold, after decompression.
    pub max_bytes: Option<u64>,
}

/// A named part of a trace (setup, step0, ...), starting at an event index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    /// The phase's name.
    pub name: String,
    /// The index of its first event.
    pub first_event: usize,
    /// Its start time in ns, if recorded.
    #[serde(default)]
    pub t: u64,
}

/// The header line of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TraceHeader {
    /// The workload's name.
    #[serde(default)]
    pub workload: String,
    /// Where the trace came from.
    #[serde(default)]
    pub source: String,
    /// The model that ran.
    #[serde(default)]
    pub model: String,
    /// Free-form notes.
    #[serde(default)]
    pub notes: String,
    /// The phases, if recorded (not written when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<Phase>,
    /// What the recorded run's own allocator reserved over the trace, where the source
    /// file showed it (not written when it did not; readers that predate the field pass
    /// over it). Its points never pass the trace's events (checked when read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Recording>,
}

impl TraceHeader {
    /// Checks the header against a trace of `events` events: its phases start in
    /// order, none past the last event (a phase may start at `events`, holding none),
    /// and its recording's points pass none of them ([`Recording::check`]). A file cut
    /// short keeps a header that promises more: this is what tells ([`Trace::read`]
    /// says so then).
    pub fn check(&self, events: usize) -> Result<(), String> {
        let mut last: Option<&Phase> = None;
        for phase in &self.phases {
            if phase.first_event > events {
                return Err(format!(
                    "phase {:?} starts at event {}, past the trace's {events} events",
                    phase.name, phase.first_event
                ));
            }
            if let Some(previous) = last.filter(|previous| previous.first_event > phase.first_event)
            {
                return Err(format!(
                    "phase {:?} starts at event {}, before the phase {:?} listed ahead of it \
                     (at event {})",
                    phase.name, phase.first_event, previous.name, previous.first_event
                ));
            }
            last = Some(phase);
        }
        match &self.recorded {
            Some(recorded) => recorded.check(events),
            None => Ok(()),
        }
    }
}

/// One event of a trace. Ids are dense: the n-th allocation of the trace has id n.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// An allocation of `size` bytes.
    Alloc {
        /// Time in ns since the start.
        t: u64,
        /// Dense allocation id.
        id: u32,
        /// Bytes asked for.
        size: u64,
    },
    /// The free of allocation `id`.
    Free {
        /// Time in ns since the start.
        t: u64,
        /// Dense allocation id.
        id: u32,
    },
}

impl TraceEvent {
    /// The event's time in ns since the start.
    pub fn t(&self) -> u64 {
        match *self {
            Self::Alloc { t, .. } | Self::Free { t, .. } => t,
        }
    }
}

/// An allocation trace.
///
/// Its invariants hold for every `Trace`, because only the crate's checked readers and
/// builders make one ([`Trace::read`], [`Trace::load`], [`TraceBuilder::finish`],
/// [`Trace::prefix`] and the analyses that derive a trace from another); its fields are
/// private, read through [`Trace::header`], [`Trace::events`], [`Trace::allocations`],
/// [`Trace::sizes`], [`Trace::peak_live`] and [`Trace::stacks`]:
///
/// - its events are in time order (no time before the previous event's);
/// - ids are dense: the n-th allocation of the trace has id n;
/// - every free names an earlier, still-live allocation;
/// - `sizes()[id]` is allocation `id`'s size, and `allocations() == sizes().len()`;
/// - `peak_live()` is the largest sum of live allocation sizes at any point;
/// - the stacks, where there are any, are indexed by those dense ids;
/// - the header fits the events ([`TraceHeader::check`]: phases in order, none past the
///   last event, recorded points none past it). (Its text is not bounded here:
///   [`Trace::write`] refuses a header whose line, with its newline, passes
///   [`MAX_HEADER_BYTES`], which the reader would refuse.)
///
/// So the public functions that take a trace (replay, the analyses) index it by id
/// without a check that could fail. A trace of other events or another header is made
/// by a [`TraceBuilder`], which checks both; code outside the crate cannot write a
/// field:
///
/// ```compile_fail,E0616
/// let mut trace = cubepool::trace::Trace::read(
///     &b"{\"format\":\"cubepool-trace\",\"version\":1}\n"[..],
/// )
/// .unwrap();
/// trace.sizes.push(64); // error[E0616]: field `sizes` of struct `Trace` is private
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The header.
    pub(crate) header: TraceHeader,
    /// Events in time order; every free names an earlier, still-live allocation.
    pub(crate) events: Vec<TraceEvent>,
    /// The number of allocations (dense ids are `0..allocations`).
    pub(crate) allocations: u32,
    /// The sizes of the allocations, by dense id.
    pub(crate) sizes: Vec<u64>,
    /// The largest sum of live allocation sizes at any point.
    pub(crate) peak_live: u64,
    /// The allocations' stack frames, where the source had them (empty when it had
    /// none).
    pub(crate) stacks: Stacks,
}

/// What an event line does: the `op` field of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// An allocation (the line has a `size`).
    Alloc,
    /// The free of a live allocation.
    Free,
}

impl Op {
    /// The op as the format spells it: `"alloc"` or `"free"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::Free => "free",
        }
    }
}

/// The format's name in every header.
pub const FORMAT_NAME: &str = "cubepool-trace";
/// The one version of the format.
pub const FORMAT_VERSION: u64 = 1;

/// A header line as it is read: the format's name and version, then the header.
#[derive(Deserialize)]
struct RawHeader {
    format: Option<String>,
    version: Option<u64>,
    #[serde(flatten)]
    header: TraceHeader,
}

/// A header line as it is written: the format's name and version first.
#[derive(Serialize)]
struct HeaderLine<'a> {
    format: &'static str,
    version: u64,
    #[serde(flatten)]
    header: &'a TraceHeader,
}

/// An event line as it is read.
#[derive(Deserialize)]
struct RawEvent {
    #[serde(default, deserialize_with = "whole")]
    t: u64,
    op: Op,
    #[serde(deserialize_with = "whole")]
    id: u64,
    #[serde(default, deserialize_with = "whole_some")]
    size: Option<u64>,
    /// The allocation's stack frames, innermost first (optional).
    #[serde(default)]
    frames: Option<Vec<String>>,
}

/// A field of an event line that is a whole number from 0 to 2^64 - 1. JSON's reader
/// takes an integer past 2^64 - 1 as a float, and serde then called it "invalid type:
/// floating point `1.8446744073709552e19`, expected u64" of a number the file writes
/// without a point; this says what is wrong with it.
fn whole<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Whole;

    impl serde::de::Visitor<'_> for Whole {
        type Value = u64;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number from 0 to 2^64 - 1")
        }

        fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<u64, E> {
            Ok(value)
        }

        fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<u64, E> {
            u64::try_from(value).map_err(|_| E::custom(format!("{value} is negative")))
        }

        fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<u64, E> {
            // 2^64 as a float: an integer this large or larger does not fit.
            const PAST: f64 = 18_446_744_073_709_551_616.0;
            Err(E::custom(if value >= PAST {
                "a number past 2^64 - 1 (the largest a size, time or id can be)".to_string()
            } else if value.fract() == 0.0 {
                format!("{value} is written with a point or an exponent (write digits alone)")
            } else {
                format!("{value} is not a whole number")
            }))
        }
    }

    deserializer.deserialize_u64(Whole)
}

/// [`whole`] of an optional field (absent or `null`: `None`).
fn whole_some<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Field(#[serde(deserialize_with = "whole")] u64);

    Ok(Option::<Field>::deserialize(deserializer)?.map(|Field(value)| value))
}

/// Builds a [`Trace`] from events with arbitrary ids, checking that they pair up and
/// that their times never go backwards (the invariant every consumer of a trace relies
/// on: replay timelines, plans and `convert` take `t` as a clock).
#[derive(Debug, Default)]
pub struct TraceBuilder {
    header: TraceHeader,
    events: Vec<TraceEvent>,
    /// The time of the last event added (0 before the first).
    last_t: u64,
    sizes: Vec<u64>,
    /// Original id -> dense id of every live allocation.
    live: HashMap<u64, u32>,
    live_bytes: u64,
    peak_live: u64,
    stacks: StacksBuilder,
}

impl TraceBuilder {
    /// A builder for a trace with this header.
    pub fn new(header: TraceHeader) -> Self {
        Self {
            header,
            ..Self::default()
        }
    }

    /// Refuses a time earlier than the previous event's, then moves the clock to `t`.
    fn advance(&mut self, t: u64) -> Result<(), String> {
        if t < self.last_t {
            return Err(format!(
                "time goes backwards: t={t} ns is before the previous event's t={} ns \
                 (a trace's events must be in time order)",
                self.last_t
            ));
        }
        self.last_t = t;
        Ok(())
    }

    /// Adds an allocation of `size` bytes under the caller's `id`.
    pub fn alloc(&mut self, t: u64, id: u64, size: u64) -> Result<(), String> {
        self.alloc_with_frames(t, id, size, None)
    }

    /// Adds an allocation of `size` bytes under the caller's `id`, made from the stack
    /// `frames` (innermost first; cut as [`super::stacks`] says).
    pub fn alloc_with_frames(
        &mut self,
        t: u64,
        id: u64,
        size: u64,
        frames: Option<Vec<String>>,
    ) -> Result<(), String> {
        self.alloc_as(t, id, size, |stacks, dense| stacks.push(dense, frames))
    }

    /// Adds an allocation of `size` bytes under the caller's `id`, made from the same
    /// stack as the earlier allocation `like` (the index [`TraceBuilder::allocations`]
    /// counted before it was added): what a caller that knows two stacks are one (the
    /// same immutable object) adds without the frames again.
    pub fn alloc_like(&mut self, t: u64, id: u64, size: u64, like: u32) -> Result<(), String> {
        if like as usize >= self.sizes.len() {
            return Err(format!(
                "alloc like allocation {like}, of {} so far",
                self.sizes.len()
            ));
        }
        self.alloc_as(t, id, size, |stacks, dense| stacks.push_like(dense, like))
    }

    /// The allocations added so far (the next one's index).
    pub fn allocations(&self) -> usize {
        self.sizes.len()
    }

    /// Adds an allocation, its stack recorded by `stack` (given the stacks and its
    /// index) once every check has passed.
    fn alloc_as(
        &mut self,
        t: u64,
        id: u64,
        size: u64,
        stack: impl FnOnce(&mut StacksBuilder, u32),
    ) -> Result<(), String> {
        if self.live.contains_key(&id) {
            return Err(format!("alloc of id {id}, which is already live"));
        }
        let live_bytes = self.live_bytes.checked_add(size).ok_or_else(|| {
            format!(
                "live bytes overflow 64 bits: {} bytes live plus this allocation's {size}",
                self.live_bytes
            )
        })?;
        // Ids are below `u32::MAX`, so that the count of allocations fits a `u32` too.
        let dense = u32::try_from(self.sizes.len())
            .ok()
            .filter(|&dense| dense < u32::MAX)
            .ok_or_else(|| "more than 2^32 - 1 allocations".to_string())?;
        self.advance(t)?;
        self.live.insert(id, dense);
        stack(&mut self.stacks, dense);
        self.sizes.push(size);
        self.events.push(TraceEvent::Alloc { t, id: dense, size });
        self.live_bytes = live_bytes;
        self.peak_live = self.peak_live.max(self.live_bytes);
        Ok(())
    }

    /// Adds the free of the live allocation the caller named `id`.
    pub fn free(&mut self, t: u64, id: u64) -> Result<(), String> {
        let dense = *self
            .live
            .get(&id)
            .ok_or_else(|| format!("free of id {id}, which is not live"))?;
        self.advance(t)?;
        self.live.remove(&id);
        self.live_bytes -= self.sizes[dense as usize];
        self.events.push(TraceEvent::Free { t, id: dense });
        Ok(())
    }

    /// Replaces the header (one that describes the events can be known only after them),
    /// returning the one it replaces. It is checked against the events by
    /// [`TraceBuilder::finish`] (and [`TraceBuilder::check_header`]).
    pub fn set_header(&mut self, header: TraceHeader) -> TraceHeader {
        std::mem::replace(&mut self.header, header)
    }

    /// The number of events added.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was added.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Checks the header against the events added so far, as [`TraceBuilder::finish`]
    /// does (with its error), keeping the builder: a caller can set another header.
    pub fn check_header(&self) -> Result<(), TraceError> {
        self.header
            .check(self.events.len())
            .map_err(|message| TraceError::Parse {
                line: 1,
                message: format!("malformed header: {message}"),
            })
    }

    /// Leaves out a recording that says less is reserved than the trace holds live
    /// ([`Recording::below_live`]), as the importers do, and says so in the notes: the
    /// trace is sound, the recording is not its allocator's account of it.
    fn leave_out_contradicting_recording(&mut self) {
        let Some(recorded) = &self.header.recorded else {
            return;
        };
        let Some((events, reserved, live)) = recorded.below_live(&self.events, &self.sizes) else {
            return;
        };
        let note = format!(
            "The recording of reserved bytes ({}, {}) was left out: after {events} \
             event{} it says {reserved} bytes reserved, under the {live} bytes the trace \
             holds live then.",
            recorded.source,
            recorded.device,
            if events == 1 { "" } else { "s" }
        );
        self.header.recorded = None;
        if !self.header.notes.is_empty() {
            self.header.notes.push(' ');
        }
        self.header.notes.push_str(&note);
    }

    /// The finished trace, once its header fits its events ([`TraceHeader::check`]:
    /// phases in order and none past the last event, recorded points none past it).
    ///
    /// Fails with [`TraceError::Parse`] at line 1 (the header's line when the trace is
    /// written), its message `malformed header: ` and what is wrong, as
    /// [`Trace::read`] refuses such a header.
    pub fn finish(mut self) -> Result<Trace, TraceError> {
        self.check_header()?;
        self.leave_out_contradicting_recording();
        Ok(Trace {
            header: self.header,
            events: self.events,
            allocations: self.sizes.len() as u32,
            stacks: self.stacks.finish(self.sizes.len()),
            sizes: self.sizes,
            peak_live: self.peak_live,
        })
    }
}

impl Trace {
    /// Reads a trace file (`.jsonl`, or gzip-compressed text under any name); a path
    /// that is not a regular file (a folder, a FIFO, a device, a stream that would keep
    /// a read waiting) is a [`TraceError::Io`] saying so, never waited on.
    pub fn load(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
        Self::load_limited(path, ReadLimits::default())
    }

    /// [`Trace::load`] within `limits`.
    pub fn load_limited(path: impl AsRef<Path>, limits: ReadLimits) -> Result<Trace, TraceError> {
        let path = path.as_ref();
        let io = |source| TraceError::Io {
            path: path.display().to_string(),
            source,
        };
        // Opened without waiting and only where it is a regular file: a FIFO or a
        // stream such as /proc/kmsg would keep the read waiting (crate::regular_file).
        let file = crate::regular_file::open_regular_file(path).map_err(io)?;
        Self::read_limited(file, limits).map_err(|error| match error {
            TraceError::Io { source, .. } => io(crate::regular_file::read_error(source)),
            parse => parse,
        })
    }

    /// Reads a trace from bytes (plain or gzip-compressed text; a UTF-8 byte order mark
    /// at the start is passed over).
    pub fn read(reader: impl Read) -> Result<Trace, TraceError> {
        Self::read_limited(reader, ReadLimits::default())
    }

    /// [`Trace::read`] within `limits`.
    pub fn read_limited(reader: impl Read, limits: ReadLimits) -> Result<Trace, TraceError> {
        let mut reader = BufReader::new(reader);
        let gzip = reader
            .fill_buf()
            .map_err(|source| TraceError::Io {
                path: String::new(),
                source,
            })?
            .starts_with(&[0x1f, 0x8b]);
        if gzip {
            let text = BufReader::new(flate2::read::MultiGzDecoder::new(reader));
            Self::read_lines(text, limits)
        } else {
            Self::read_lines(reader, limits)
        }
    }

    fn read_lines(mut reader: impl BufRead, limits: ReadLimits) -> Result<Trace, TraceError> {
        let mut builder: Option<TraceBuilder> = None;
        let mut buffer = Vec::new();
        let mut bytes_left = limits.max_bytes;
        for number in 1.. {
            let parse = |message: String| TraceError::Parse {
                line: number,
                message,
            };
            buffer.clear();
            // Bounded, so a hostile file cannot make one line take all memory.
            let (bound, what) = match builder {
                None => (MAX_HEADER_BYTES, "header line"),
                Some(_) => (MAX_LINE_BYTES, "line"),
            };
            let read = reader
                .by_ref()
                .take(bound + 1)
                .read_until(b'\n', &mut buffer)
                .map_err(|e| parse(format!("unreadable input: {e}")))?;
            if read == 0 {
                break;
            }
            if buffer.len() as u64 > bound {
                return Err(parse(format!("{what} longer than {bound} bytes")));
            }
            if let Some(left) = bytes_left.as_mut() {
                *left = left.checked_sub(read as u64).ok_or(TraceError::TooLarge {
                    line: number,
                    bound: "max_bytes",
                    max: limits.max_bytes.unwrap_or_default(),
                })?;
            }
            let mut line =
                std::str::from_utf8(&buffer).map_err(|e| parse(format!("not UTF-8 text: {e}")))?;
            if number == 1 {
                // A UTF-8 byte order mark, which editors on Windows start text with, is
                // no part of the header (the format is told past it, as Python's
                // readers tell every format).
                line = line.strip_prefix('\u{feff}').unwrap_or(line);
            }
            if line.trim().is_empty() {
                continue;
            }
            match builder.as_mut() {
                None => builder = Some(TraceBuilder::new(parse_header(line).map_err(parse)?)),
                Some(builder) => {
                    if let Some(max) = limits.max_events {
                        if builder.events.len() as u64 >= max {
                            return Err(TraceError::TooLarge {
                                line: number,
                                bound: "max_events",
                                max,
                            });
                        }
                    }
                    let event: RawEvent = serde_json::from_str(line)
                        .map_err(|e| parse(format!("not an event: {e}")))?;
                    match event.op {
                        Op::Alloc => {
                            let size = event
                                .size
                                .ok_or_else(|| parse("alloc without a size".to_string()))?;
                            builder.alloc_with_frames(event.t, event.id, size, event.frames)
                        }
                        Op::Free => builder.free(event.t, event.id),
                    }
                    .map_err(parse)?;
                }
            }
        }
        let builder = builder.ok_or(TraceError::Parse {
            line: 1,
            message: "empty trace: no header line".to_string(),
        })?;
        // Against no bound of events the check tells only the order of the phases and
        // points: a header in order that does not fit names events past the file's end.
        let cut_short = builder.header.check(usize::MAX).is_ok();
        builder.finish().map_err(|error| match error {
            TraceError::Parse { line, message } if cut_short => TraceError::Parse {
                line,
                message: format!("{message} (a file cut short?)"),
            },
            error => error,
        })
    }

    /// Writes the trace as v1 JSON Lines: the header line (`format` and `version` first,
    /// then the header's fields in their declared order), then one line per event. What
    /// [`Trace::read`] reads back is this trace. A header longer than the reader's bound
    /// ([`MAX_HEADER_BYTES`]: notes or phases of many megabytes) is refused with
    /// [`std::io::ErrorKind::InvalidData`] before anything is written. Event lines stay
    /// within [`MAX_LINE_BYTES`]: their frames are cut to fit ([`super::stacks`]).
    pub fn write(&self, out: impl Write) -> std::io::Result<()> {
        let line = serde_json::to_vec(&HeaderLine {
            format: FORMAT_NAME,
            version: FORMAT_VERSION,
            header: &self.header,
        })?;
        // The reader counts the line with its newline.
        if line.len() as u64 + 1 > MAX_HEADER_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the trace's header is {} bytes ({} phases, notes of {} bytes), over \
                     the {MAX_HEADER_BYTES} a trace's header line may have: no reader \
                     would read it back",
                    line.len(),
                    self.header.phases.len(),
                    self.header.notes.len(),
                ),
            ));
        }
        let mut out = BufWriter::new(out);
        out.write_all(&line)?;
        out.write_all(b"\n")?;
        for event in &self.events {
            match *event {
                TraceEvent::Alloc { t, id, size } => match self.stacks.get(id) {
                    None => writeln!(out, r#"{{"t":{t},"op":"alloc","id":{id},"size":{size}}}"#)?,
                    Some(frames) => {
                        write!(
                            out,
                            r#"{{"t":{t},"op":"alloc","id":{id},"size":{size},"frames":"#
                        )?;
                        serde_json::to_writer(&mut out, &frames)?;
                        writeln!(out, "}}")?
                    }
                },
                TraceEvent::Free { t, id } => {
                    writeln!(out, r#"{{"t":{t},"op":"free","id":{id}}}"#)?
                }
            }
        }
        out.flush()
    }

    /// Writes the trace to `path` ([`Trace::write`]), gzip-compressed when the name ends
    /// in `.gz`. The text goes to a temporary file beside `path` that replaces it only
    /// once complete, so no partial file is ever left under the name, and a failed
    /// save leaves the file it would replace as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TraceError> {
        let path = path.as_ref();
        let gzip = path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().ends_with(".gz"));
        crate::atomic_file::write_atomic(path, |file| {
            if gzip {
                let mut gzip = flate2::GzBuilder::new().write(file, flate2::Compression::default());
                self.write(&mut gzip)?;
                gzip.finish()?;
                Ok(())
            } else {
                self.write(file)
            }
        })
        .map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// The trace's first `events` events (all of them when it has fewer), as a trace of
    /// its own: allocations still live at the cut stay live (never freed), the phases
    /// that start before the cut are kept, and `peak_live` is that of the prefix.
    pub fn prefix(&self, events: usize) -> Trace {
        let events = &self.events[..events.min(self.events.len())];
        let mut allocations = 0u32;
        let (mut live, mut peak_live) = (0u64, 0u64);
        for event in events {
            match *event {
                TraceEvent::Alloc { size, .. } => {
                    allocations += 1;
                    live += size;
                    peak_live = peak_live.max(live);
                }
                TraceEvent::Free { id, .. } => live -= self.sizes[id as usize],
            }
        }
        let mut header = self.header.clone();
        header
            .phases
            .retain(|phase| phase.first_event < events.len());
        header.recorded = header
            .recorded
            .map(|recorded| recorded.prefix(events.len()));
        Trace {
            header,
            events: events.to_vec(),
            allocations,
            sizes: self.sizes[..allocations as usize].to_vec(),
            peak_live,
            stacks: self.stacks.prefix(allocations as usize),
        }
    }

    /// The header: the workload, source, model, notes, phases and recording.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The events in time order. Ids are dense (the n-th allocation has id n) and every
    /// free names an earlier, still-live allocation.
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// The number of allocations: their dense ids are `0..allocations()`, and it is
    /// `sizes().len()`.
    pub fn allocations(&self) -> u32 {
        self.allocations
    }

    /// The sizes of the allocations in bytes, by dense id: `sizes()[id]` is the size of
    /// allocation `id`.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The largest sum of live allocation sizes at any point of the trace (0 for a
    /// trace without allocations).
    pub fn peak_live(&self) -> u64 {
        self.peak_live
    }

    /// The allocations' stack frames by dense id, where the source had them (empty
    /// when it had none).
    pub fn stacks(&self) -> &Stacks {
        &self.stacks
    }

    /// The number of events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the trace has no events.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

fn parse_header(line: &str) -> Result<TraceHeader, String> {
    let raw: RawHeader =
        serde_json::from_str(line).map_err(|e| format!("malformed header: {e}"))?;
    if raw.format.as_deref() != Some(FORMAT_NAME) {
        return Err(format!(
            "the header's format is {:?}, expected {FORMAT_NAME:?}",
            raw.format.unwrap_or_default()
        ));
    }
    match raw.version {
        Some(FORMAT_VERSION) => {}
        Some(version) => {
            return Err(format!(
                "unsupported trace version {version}: this cubepool reads version \
                 {FORMAT_VERSION}"
            ))
        }
        None => {
            return Err(format!(
                "the header has no version (this cubepool reads version {FORMAT_VERSION})"
            ))
        }
    }
    Ok(raw.header)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"format":"cubepool-trace","version":1,"workload":"w"}"#;

    fn read(text: &str) -> Result<Trace, TraceError> {
        Trace::read(text.as_bytes())
    }

    #[test]
    fn reads_events_and_peak_live() {
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n{}\n",
            r#"{"t":1,"op":"alloc","id":7,"size":100}"#,
            r#"{"t":2,"op":"alloc","id":9,"size":50}"#,
            r#"{"t":3,"op":"free","id":7}"#,
            r#"{"t":4,"op":"alloc","id":10,"size":20}"#,
        );
        let trace = read(&text).unwrap();
        assert_eq!(trace.len(), 4);
        assert_eq!(trace.peak_live, 150);
        assert_eq!(trace.events[2], TraceEvent::Free { t: 3, id: 0 });
        assert_eq!(trace.header.workload, "w");
    }

    #[test]
    fn frames_are_kept_written_and_read_back() {
        // A line without frames, one with, one with an unknown field a later version
        // might add (passed over, as readers that predate `frames` pass over it).
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n",
            r#"{"t":1,"op":"alloc","id":7,"size":100}"#,
            r#"{"t":2,"op":"alloc","id":9,"size":50,"frames":["f (a.py:3)","main (m.py:1)"]}"#,
            r#"{"t":3,"op":"alloc","id":4,"size":5,"later":[1]}"#,
        );
        let trace = read(&text).unwrap();
        assert_eq!(trace.stacks.get(0), None);
        assert_eq!(
            trace.stacks.get(1).unwrap(),
            ["f (a.py:3)", "main (m.py:1)"]
        );
        assert_eq!(trace.stacks.get(2), None);
        let mut written = Vec::new();
        trace.write(&mut written).unwrap();
        let text = String::from_utf8(written).unwrap();
        assert!(text.contains(r#""size":50,"frames":["f (a.py:3)","main (m.py:1)"]}"#));
        assert_eq!(read(&text).unwrap(), trace);
        assert_eq!(trace.prefix(1).stacks, Stacks::default());
        assert_eq!(trace.prefix(2).stacks.get(1), trace.stacks.get(1));
        let bad = format!(
            "{HEADER}\n{}\n",
            r#"{"t":1,"op":"alloc","id":7,"size":1,"frames":[3]}"#
        );
        assert!(matches!(read(&bad), Err(TraceError::Parse { line: 2, .. })));
    }

    #[test]
    fn errors_name_the_line() {
        let bad = |text: &str| match read(text) {
            Err(TraceError::Parse { line, message }) => (line, message),
            other => panic!("expected a parse error, got {other:?}"),
        };
        assert_eq!(bad("").0, 1);
        assert_eq!(bad("{\"format\":\"x\",\"version\":1}").0, 1);
        let (line, message) = bad(&format!("{HEADER}\n{{\"t\":1,\"op\":\"free\",\"id\":3}}"));
        assert_eq!(line, 2);
        assert!(message.contains("not live"), "{message}");
        let (line, _) = bad(&format!(
            "{HEADER}\n\n{{\"t\":1,\"op\":\"alloc\",\"id\":3,\"size\":-1}}"
        ));
        assert_eq!(line, 3);
        let (_, message) = bad(&format!("{HEADER}\n{{\"t\":1,\"op\":\"grow\",\"id\":3}}"));
        assert!(message.contains("unknown variant `grow`"), "{message}");
    }

    #[test]
    fn a_byte_order_mark_before_the_header_is_passed_over() {
        let text = format!("{HEADER}\n{{\"t\":0,\"op\":\"alloc\",\"id\":0,\"size\":8}}\n");
        let with_mark = read(&format!("\u{feff}{text}")).unwrap();
        assert_eq!(with_mark.events(), read(&text).unwrap().events());
        // Only at the start of the file.
        let inner = text.replace("{\"t\"", "\u{feff}{\"t\"");
        assert!(matches!(
            read(&inner),
            Err(TraceError::Parse { line: 2, .. })
        ));
    }

    /// A size, time or id that is no whole number of 64 bits is refused saying so (an
    /// integer past 2^64 - 1 was called a "floating point" of the wrong type), and a
    /// missing time or a null size read as before.
    #[test]
    fn numbers_out_of_range_are_refused_saying_what_is_wrong() {
        let message = |line: &str| match read(&format!("{HEADER}\n{line}\n")) {
            Err(TraceError::Parse { line: 2, message }) => message,
            other => panic!("expected a parse error at line 2, got {other:?}"),
        };
        let past = message(r#"{"t":0,"op":"alloc","id":0,"size":18446744073709551616}"#);
        assert!(past.contains("past 2^64 - 1"), "{past}");
        assert!(!past.contains("floating point"), "{past}");
        let t = message(r#"{"t":99999999999999999999999,"op":"free","id":0}"#);
        assert!(t.contains("past 2^64 - 1"), "{t}");
        let negative = message(r#"{"t":0,"op":"alloc","id":-2,"size":8}"#);
        assert!(negative.contains("-2 is negative"), "{negative}");
        let fraction = message(r#"{"t":0,"op":"alloc","id":0,"size":1.5}"#);
        assert!(fraction.contains("1.5 is not a whole number"), "{fraction}");
        let point = message(r#"{"t":0,"op":"alloc","id":0,"size":8.0}"#);
        assert!(point.contains("written with a point"), "{point}");
        let missing = message(r#"{"t":0,"op":"alloc","id":0}"#);
        assert!(missing.contains("alloc without a size"), "{missing}");
        let null = message(r#"{"op":"alloc","id":0,"size":null}"#);
        assert!(null.contains("alloc without a size"), "{null}");
        let largest = format!(
            "{HEADER}\n{}\n",
            r#"{"t":18446744073709551615,"op":"alloc","id":0,"size":18446744073709551615}"#
        );
        assert!(read(&largest).is_ok());
    }

    #[test]
    fn time_going_backwards_is_refused_at_its_line() {
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n",
            r#"{"t":9,"op":"alloc","id":0,"size":8}"#,
            r#"{"t":9,"op":"alloc","id":1,"size":8}"#,
            r#"{"t":5,"op":"free","id":0}"#,
        );
        match read(&text) {
            Err(TraceError::Parse { line, message }) => {
                assert_eq!(line, 4);
                assert!(message.contains("time goes backwards"), "{message}");
                assert!(
                    message.contains("t=5") && message.contains("t=9"),
                    "{message}"
                );
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        let mut builder = TraceBuilder::new(TraceHeader::default());
        builder.alloc(3, 0, 8).unwrap();
        let error = builder.alloc(2, 1, 8).unwrap_err();
        assert!(error.contains("time goes backwards"), "{error}");
    }

    #[test]
    fn live_byte_overflow_names_the_sizes() {
        let mut builder = TraceBuilder::new(TraceHeader::default());
        builder.alloc(0, 0, u64::MAX).unwrap();
        let error = builder.alloc(0, 1, 2).unwrap_err();
        assert!(error.contains("live bytes overflow 64 bits"), "{error}");
        assert!(error.contains(&u64::MAX.to_string()), "{error}");
    }

    #[test]
    fn limits_bound_events_and_bytes() {
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n",
            r#"{"t":1,"op":"alloc","id":0,"size":8}"#,
            r#"{"t":2,"op":"alloc","id":1,"size":8}"#,
            r#"{"t":3,"op":"free","id":0}"#,
        );
        let limited = |max_events, max_bytes| {
            Trace::read_limited(
                text.as_bytes(),
                ReadLimits {
                    max_events,
                    max_bytes,
                },
            )
        };
        assert_eq!(limited(Some(3), Some(text.len() as u64)).unwrap().len(), 3);
        let error = limited(Some(2), None).unwrap_err();
        assert!(matches!(
            error,
            TraceError::TooLarge {
                line: 4,
                bound: "max_events",
                max: 2
            }
        ));
        assert!(
            error.to_string().contains("more than max_events=2 events"),
            "{error}"
        );
        let error = limited(None, Some(text.len() as u64 - 1)).unwrap_err();
        assert!(matches!(
            error,
            TraceError::TooLarge {
                line: 4,
                bound: "max_bytes",
                ..
            }
        ));
    }

    #[test]
    fn reads_gzip() {
        use std::io::Write;
        let text = format!("{HEADER}\n{{\"t\":1,\"op\":\"alloc\",\"id\":0,\"size\":8}}\n");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text.as_bytes()).unwrap();
        let trace = Trace::read(&encoder.finish().unwrap()[..]).unwrap();
        assert_eq!(trace.peak_live, 8);
    }

    #[test]
    fn writing_and_reading_back_gives_the_same_trace() {
        let text = format!(
            "{}\n{}\n{}\n{}\n",
            r#"{"format":"cubepool-trace","version":1,"workload":"w","source":"s \"q\"","model":"m","notes":"n","phases":[{"name":"setup","first_event":0,"t":0}]}"#,
            r#"{"t":1,"op":"alloc","id":0,"size":100}"#,
            r#"{"t":2,"op":"alloc","id":1,"size":50}"#,
            r#"{"t":3,"op":"free","id":0}"#,
        );
        let trace = read(&text).unwrap();
        let mut written = Vec::new();
        trace.write(&mut written).unwrap();
        // The lines of a file in the format's own layout come back byte for byte.
        assert_eq!(String::from_utf8(written.clone()).unwrap(), text);
        assert_eq!(Trace::read(&written[..]).unwrap(), trace);
    }

    #[test]
    fn a_header_without_phases_is_written_without_them() {
        let trace = TraceBuilder::new(TraceHeader::default()).finish().unwrap();
        let mut written = Vec::new();
        trace.write(&mut written).unwrap();
        assert_eq!(
            String::from_utf8(written).unwrap(),
            "{\"format\":\"cubepool-trace\",\"version\":1,\"workload\":\"\",\"source\":\"\",\"model\":\"\",\"notes\":\"\"}\n"
        );
    }

    #[test]
    fn save_writes_gzip_by_name_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("cubepool-save-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut builder = TraceBuilder::new(TraceHeader::default());
        builder.alloc(0, 7, 8).unwrap();
        builder.free(1, 7).unwrap();
        let trace = builder.finish().unwrap();
        for name in ["t.jsonl", "t.jsonl.gz"] {
            let path = dir.join(name);
            trace.save(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), name.ends_with(".gz"));
            assert_eq!(Trace::load(&path).unwrap(), trace);
        }
        let error = trace.save(dir.join("missing").join("t.jsonl")).unwrap_err();
        assert!(matches!(error, TraceError::Io { .. }), "{error}");
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["t.jsonl", "t.jsonl.gz"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn phases_out_of_order_or_past_the_end_are_malformed() {
        let events = format!(
            "{}\n{}\n",
            r#"{"t":1,"op":"alloc","id":0,"size":100}"#, r#"{"t":2,"op":"free","id":0}"#,
        );
        let with = |phases: &str| {
            read(&format!(
                "{{\"format\":\"cubepool-trace\",\"version\":1,\"phases\":{phases}}}\n{events}"
            ))
        };
        let past = with(r#"[{"name":"setup","first_event":0},{"name":"step0","first_event":5}]"#);
        let message = past.unwrap_err().to_string();
        assert!(
            message.contains("line 1")
                && message
                    .contains(r#"phase "step0" starts at event 5, past the trace's 2 events"#),
            "{message}"
        );
        let backwards =
            with(r#"[{"name":"step0","first_event":1},{"name":"setup","first_event":0}]"#);
        let message = backwards.unwrap_err().to_string();
        assert!(
            message.contains(r#"phase "setup" starts at event 0, before the phase "step0""#),
            "{message}"
        );
        // In order, the last one starting at the end (holding no event): accepted.
        let fine = with(
            r#"[{"name":"a","first_event":0},{"name":"b","first_event":0},{"name":"c","first_event":2}]"#,
        );
        assert_eq!(fine.unwrap().header.phases.len(), 3);
    }

    #[test]
    fn a_prefix_is_a_trace_of_its_own() {
        let text = format!(
            "{}\n{}\n{}\n{}\n{}\n",
            r#"{"format":"cubepool-trace","version":1,"phases":[{"name":"setup","first_event":0},{"name":"step0","first_event":2}]}"#,
            r#"{"t":1,"op":"alloc","id":0,"size":100}"#,
            r#"{"t":2,"op":"alloc","id":1,"size":50}"#,
            r#"{"t":3,"op":"free","id":0}"#,
            r#"{"t":4,"op":"alloc","id":2,"size":200}"#,
        );
        let trace = read(&text).unwrap();
        let head = trace.prefix(2);
        assert_eq!((head.len(), head.allocations, head.peak_live), (2, 2, 150));
        assert_eq!(head.sizes, vec![100, 50]);
        assert_eq!(head.header.phases.len(), 1);
        assert_eq!(trace.prefix(3).peak_live, 150);
        assert_eq!(trace.prefix(99), trace);
        assert_eq!(trace.prefix(0).allocations, 0);
    }
}
