//! Building traces from Python: the header read from a dict into the typed
//! [`TraceHeader`] (no JSON text in between), and [`PyTraceBuilder`], which takes
//! events one typed call at a time and checks them as they come ([`TraceBuilder`]).

use std::collections::HashMap;

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyMapping, PyString, PyTuple};

use super::errors::{invalid_argument, trace_error, trace_format_error, type_name};
use super::trace::PyTrace;
use crate::trace::format::{TraceBuilder, TraceError};
use crate::trace::stacks::MAX_FRAMES;
use crate::trace::{Coverage, Phase, Recording, ReservedPoint, TorchSettings, Trace, TraceHeader};

/// The header of a v1 dict (`format` and `version` are the file's and are not kept;
/// other keys the format does not name are passed over, as the file reader does).
pub(crate) fn header_from_dict(header: &Bound<'_, PyAny>) -> PyResult<TraceHeader> {
    let py = header.py();
    let malformed = |message: String| {
        trace_format_error(py, format!("malformed header: {message}"), None, Some(1))
    };
    let header = header
        .cast::<PyMapping>()
        .map_err(|_| malformed(format!("expected a dict, got {}", type_name(header))))?;
    // A key's value; None where the key is missing or None. Any other error of the
    // mapping's (an interrupt, a failing `__getitem__`) is raised as it is, not taken
    // for a missing key.
    let value = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        match header.get_item(key) {
            Ok(value) => Ok(Some(value).filter(|value| !value.is_none())),
            Err(error) if error.is_instance_of::<PyKeyError>(py) => Ok(None),
            Err(error) => Err(error),
        }
    };
    let text = |key: &str| -> PyResult<String> {
        let Some(value) = value(key)? else {
            return Ok(String::new());
        };
        value
            .extract::<String>()
            .map_err(|_| malformed(format!("{key:?} must be a str, got {}", type_name(&value))))
    };
    let phases = match value("phases")? {
        Some(phases) => phases_from_list(&phases).map_err(malformed)?,
        None => Vec::new(),
    };
    let recorded = match value("recorded")? {
        Some(recorded) => Some(recording_from_dict(&recorded).map_err(malformed)?),
        None => None,
    };
    Ok(TraceHeader {
        workload: text("workload")?,
        source: text("source")?,
        model: text("model")?,
        notes: text("notes")?,
        phases,
        recorded,
    })
}

/// The recording of a header: a dict of `source`, `device`, `covers` (`"start"` or
/// `"window"`), `expandable_segments` (a bool or None), `points`, a list of
/// `(event, t_ns, reserved)` triples whose events never decrease, and optionally
/// `settings` (None, or the name of a model of PyTorch's allocator).
fn recording_from_dict(recorded: &Bound<'_, PyAny>) -> Result<Recording, String> {
    let recorded = recorded
        .cast::<PyDict>()
        .map_err(|_| format!("\"recorded\" must be a dict, got {}", type_name(recorded)))?;
    let field = |key: &str| recorded.get_item(key).ok().flatten();
    let text = |key: &str| -> Result<String, String> {
        field(key)
            .ok_or_else(|| format!("\"recorded\" has no {key:?}"))?
            .extract::<String>()
            .map_err(|_| format!("\"recorded\"[{key:?}] must be a str"))
    };
    let covers = match text("covers")?.as_str() {
        "start" => Coverage::Start,
        "window" => Coverage::Window,
        other => {
            return Err(format!(
                "\"recorded\"[\"covers\"] must be \"start\" or \"window\", got {:?}",
                other.chars().take(40).collect::<String>()
            ))
        }
    };
    let expandable_segments = match field("expandable_segments") {
        None => None,
        Some(value) if value.is_none() => None,
        Some(value) => Some(value.extract::<bool>().map_err(|_| {
            "\"recorded\"[\"expandable_segments\"] must be a bool or None".to_string()
        })?),
    };
    let points = field("points").ok_or("\"recorded\" has no \"points\"")?;
    let points = points
        .try_iter()
        .map_err(|_| "\"recorded\"[\"points\"] must be a list".to_string())?
        .enumerate()
        .map(|(index, point)| {
            let bad = || {
                format!(
                    "\"recorded\"[\"points\"][{index}] must be (event, t_ns, reserved), \
                     three non-negative 64-bit ints"
                )
            };
            let point = point.map_err(|_| bad())?;
            // A tuple, or a list as `Trace.header` gives the points back (a header read
            // from a file holds JSON arrays); no other sequence (bytes are not three ints).
            let sequence = point.is_instance_of::<pyo3::types::PyTuple>()
                || point.is_instance_of::<pyo3::types::PyList>();
            if !sequence || point.len().ok() != Some(3) {
                return Err(bad());
            }
            let values: Vec<u64> = point.extract().map_err(|_| bad())?;
            let [event, t, reserved] = values[..] else {
                return Err(bad());
            };
            let event = usize::try_from(event).map_err(|_| bad())?;
            Ok(ReservedPoint { event, t, reserved })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let settings = match field("settings") {
        None => None,
        Some(value) if value.is_none() => None,
        Some(value) => {
            let name = value.extract::<String>().map_err(|_| {
                "\"recorded\"[\"settings\"] must be a str (a model's name) or None".to_string()
            })?;
            Some(
                TorchSettings::parse(&name)
                    .map_err(|e| format!("\"recorded\"[\"settings\"]: {e}"))?,
            )
        }
    };
    Recording::new(
        text("source")?,
        text("device")?,
        covers,
        expandable_segments,
        points,
    )
    .map(|recording| recording.with_settings(settings))
}

/// The trace a builder finished, or a `TraceFormatError` when its header does not fit
/// its events (phases out of order or past the end, recorded points past the end:
/// `TraceHeader::check`, which `TraceBuilder::finish` runs).
pub(crate) fn checked(py: Python<'_>, trace: Result<Trace, TraceError>) -> PyResult<Trace> {
    trace.map_err(|error| trace_error(py, None, error))
}

/// The phases of a header: a list of `{"name", "first_event", "t"}` dicts (`t` 0 when
/// absent).
fn phases_from_list(phases: &Bound<'_, PyAny>) -> Result<Vec<Phase>, String> {
    let list = phases
        .cast::<PyList>()
        .map_err(|_| format!("\"phases\" must be a list, got {}", type_name(phases)))?;
    list.iter()
        .enumerate()
        .map(|(index, phase)| {
            let phase = phase.cast::<PyDict>().map_err(|_| {
                format!("phases[{index}] must be a dict, got {}", type_name(&phase))
            })?;
            let field = |key: &str| phase.get_item(key).ok().flatten();
            let count = |key: &str, default: Option<u64>| -> Result<u64, String> {
                match field(key) {
                    None => default.ok_or_else(|| format!("phases[{index}] has no {key:?}")),
                    Some(value) if value.is_instance_of::<pyo3::types::PyBool>() => {
                        Err(format!("phases[{index}][{key:?}] must be an int, got bool"))
                    }
                    Some(value) => value.extract::<u64>().map_err(|_| {
                        format!(
                            "phases[{index}][{key:?}] must be a non-negative 64-bit int, got {}",
                            value.repr().map(|r| r.to_string()).unwrap_or_default()
                        )
                    }),
                }
            };
            let name = field("name")
                .ok_or_else(|| format!("phases[{index}] has no \"name\""))?
                .extract::<String>()
                .map_err(|_| format!("phases[{index}][\"name\"] must be a str"))?;
            let first_event = usize::try_from(count("first_event", None)?)
                .map_err(|_| format!("phases[{index}][\"first_event\"] is past usize"))?;
            Ok(Phase {
                name,
                first_event,
                t: count("t", Some(0))?,
            })
        })
        .collect()
}

/// Builds a trace event by event: `alloc(t, id, size)` and `free(t, id)` with the
/// caller's ids (any distinct 64-bit ints; the trace makes them dense), then `finish()`.
/// Each event is checked as it is added (a free names a live id, an id is not reused
/// while live, time never goes backwards): a bad one raises `TraceFormatError` naming
/// its index and leaves the builder as it was.
#[pyclass(name = "TraceBuilder", module = "cubepool._cubepool")]
pub(crate) struct PyTraceBuilder {
    /// `None` once finished.
    inner: Option<TraceBuilder>,
    /// Stacks given as tuples, known by identity (see [`StacksSeen`]).
    stacks_seen: StacksSeen,
}

/// Each stack given as a tuple of at most [`MAX_FRAMES`] `str`s, by the tuple's
/// identity: the tuple (held, so that its identity stays its own) and the first
/// allocation made from it. An importer gives one tuple for each distinct stack
/// (`importers/snapshot.py`), so its frames are read once, not for every allocation
/// (64 frames took 6 us an allocation). A tuple and the `str`s in it are immutable and
/// hold nothing else, so the stack never changes and the cache makes no reference
/// cycle.
///
/// Invariant: `chars` is the characters of the held tuples' `str`s, at most
/// [`SEEN_CHARS`] once an insert is done: a caller that makes a new tuple for every
/// allocation (`tuple(traceback.format_stack())`) would otherwise have every one held
/// until `finish()` (3.5 KB an allocation of 40 frames, where the trace keeps each
/// distinct frame once), so the cache is emptied when it would pass that.
#[derive(Default)]
struct StacksSeen {
    by_identity: HashMap<usize, (Py<PyTuple>, u32)>,
    chars: usize,
}

/// The characters [`StacksSeen`] holds at most: 2,000 stacks of 64 frames of 128
/// characters.
const SEEN_CHARS: usize = 1 << 24;

impl StacksSeen {
    /// The allocation made first from the stack `tuple`, if it is held.
    fn get(&self, tuple: &Bound<'_, PyTuple>) -> Option<u32> {
        self.by_identity
            .get(&(tuple.as_ptr() as usize))
            .map(|seen| seen.1)
    }

    /// Holds `tuple` as the stack of allocation `first`, where it may be known by
    /// identity: a non-empty tuple of at most [`MAX_FRAMES`] plain `str`s (a `str`
    /// subclass may hold anything).
    fn insert(&mut self, tuple: &Bound<'_, PyTuple>, first: u32) {
        if tuple.is_empty() || tuple.len() > MAX_FRAMES {
            return;
        }
        let mut chars = 0usize;
        for frame in tuple.iter() {
            let Ok(frame) = frame.cast_exact::<PyString>() else {
                return;
            };
            chars = chars.saturating_add(frame.len().unwrap_or(usize::MAX));
        }
        if chars > SEEN_CHARS {
            return;
        }
        if self.chars + chars > SEEN_CHARS {
            *self = Self::default();
        }
        self.chars += chars;
        self.by_identity
            .insert(tuple.as_ptr() as usize, (tuple.clone().unbind(), first));
    }
}

impl PyTraceBuilder {
    fn builder(&mut self, py: Python<'_>) -> PyResult<&mut TraceBuilder> {
        self.inner.as_mut().ok_or_else(|| {
            invalid_argument(
                py,
                "this TraceBuilder is finished: start a new one".to_string(),
            )
        })
    }

    /// Adds one event with `add`, naming it by its index when it is refused.
    fn add(
        &mut self,
        py: Python<'_>,
        add: impl FnOnce(&mut TraceBuilder) -> Result<(), String>,
    ) -> PyResult<()> {
        let builder = self.builder(py)?;
        let index = builder.len();
        add(builder).map_err(|message| {
            trace_format_error(py, format!("event {index}: {message}"), None, None)
        })
    }
}

#[pymethods]
impl PyTraceBuilder {
    /// A builder for a trace with this v1 header dict (`workload`, `source`, `model`,
    /// `notes`, `phases`; `format` and `version` are allowed and not kept).
    #[new]
    #[pyo3(signature = (header = None))]
    fn new(header: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let header = match header {
            Some(header) if !header.is_none() => header_from_dict(header)?,
            _ => TraceHeader::default(),
        };
        Ok(Self {
            inner: Some(TraceBuilder::new(header)),
            stacks_seen: StacksSeen::default(),
        })
    }

    /// Adds an allocation of `size` bytes at `t` ns under the caller's `id`; `frames`,
    /// where the source has them, is its allocation stack, innermost frame first (at
    /// most 64 frames of 240 characters are kept).
    /// A stack given as a tuple of `str`s is read once and known by the tuple's
    /// identity after that.
    #[pyo3(signature = (t, id, size, frames = None))]
    fn alloc(
        slf: &Bound<'_, Self>,
        #[pyo3(from_py_with = crate::python::args::event_time)] t: u64,
        #[pyo3(from_py_with = crate::python::args::alloc_id)] id: u64,
        #[pyo3(from_py_with = crate::python::args::alloc_size)] size: u64,
        frames: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let tuple = frames.and_then(|frames| frames.cast_exact::<PyTuple>().ok());
        if let Some(tuple) = tuple {
            let like = slf.try_borrow()?.stacks_seen.get(tuple);
            if let Some(like) = like {
                return slf
                    .try_borrow_mut()?
                    .add(py, |builder| builder.alloc_like(t, id, size, like));
            }
        }
        let frames = match frames {
            Some(frames) => crate::python::args::opt_frames(frames)?,
            None => None,
        };
        // Borrowed after the arguments are read: reading `frames` may run Python code
        // that adds events of its own (a sequence's `__getitem__`), which then come first.
        let mut this = slf.try_borrow_mut()?;
        let dense = this.builder(py)?.allocations();
        this.add(py, |builder| builder.alloc_with_frames(t, id, size, frames))?;
        if let (Some(tuple), Ok(dense)) = (tuple, u32::try_from(dense)) {
            this.stacks_seen.insert(tuple, dense);
        }
        Ok(())
    }

    /// Adds the free at `t` ns of the live allocation the caller named `id`.
    fn free(
        slf: &Bound<'_, Self>,
        #[pyo3(from_py_with = crate::python::args::event_time)] t: u64,
        #[pyo3(from_py_with = crate::python::args::alloc_id)] id: u64,
    ) -> PyResult<()> {
        // Borrowed after the arguments are read, as in `alloc` (an `__index__` may add
        // events of its own).
        slf.try_borrow_mut()?
            .add(slf.py(), |builder| builder.free(t, id))
    }

    /// The events added so far.
    fn __len__(&self) -> usize {
        self.inner.as_ref().map_or(0, TraceBuilder::len)
    }

    /// The finished trace, under `header` when given (a v1 header dict, for a header
    /// that says what the events were: counts, phases); the builder takes no more
    /// events. A header that does not parse or does not fit the events (a
    /// `TraceFormatError`) leaves the builder as it was, its events and its own header
    /// kept, to finish under another.
    #[pyo3(signature = (header = None))]
    fn finish(slf: &Bound<'_, Self>, header: Option<&Bound<'_, PyAny>>) -> PyResult<PyTrace> {
        let py = slf.py();
        // Read before the builder is borrowed: a mapping's methods are Python code,
        // which may add events or finish the builder itself.
        let header = match header {
            Some(header) if !header.is_none() => Some(header_from_dict(header)?),
            _ => None,
        };
        let mut this = slf.try_borrow_mut()?;
        let builder = this.builder(py)?;
        let previous = header.map(|header| builder.set_header(header));
        // Checked before the builder is taken: a header that does not fit leaves the
        // builder as it was, to finish under another.
        if let Err(error) = builder.check_header() {
            if let Some(previous) = previous {
                builder.set_header(previous);
            }
            return Err(trace_error(py, None, error));
        }
        let builder = std::mem::take(builder);
        this.inner = None;
        this.stacks_seen = StacksSeen::default();
        Ok(checked(py, builder.finish())?.into())
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(builder) => format!("<TraceBuilder events={}>", builder.len()),
            None => "<TraceBuilder finished>".to_string(),
        }
    }
}
