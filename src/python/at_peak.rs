//! Python classes for why reserved exceeds live ([`crate::trace::at_peak`]): the
//! address space of a replay at its peak, its segments and the live blocks that pin
//! them, with their allocation stacks where the trace has them.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::errors::size_arg;
use crate::report::{grouped, human_size};
use crate::trace::{AtPeak, PinnedBlock, ReservedSegment, Trace};

/// What a view and its parts share: the view and the trace that was replayed (for the
/// blocks' stacks).
pub(crate) struct Shared {
    view: AtPeak,
    trace: Arc<Trace>,
    /// What was replayed, in words ("default", "torch_expandable", a layout's text).
    replayed: String,
}

/// The address space of a replay at its peak of reserved bytes: every reserved segment
/// (a storage buffer, a mapped run of a virtual range, a segment of the torch model)
/// with its live and free bytes and the live blocks that pin it, and what the gap
/// between reserved and requested bytes is made of: `free_in_pinned` (free bytes in
/// segments a live block holds, which cannot be given back) + `rounding` (bytes of live
/// blocks beyond their requests) + `idle` (segments with no live block, kept for reuse)
/// = `reserved - requested`. From `ReplayResult.at_peak()`.
#[pyclass(name = "AtPeak", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyAtPeak {
    shared: Arc<Shared>,
}

impl PyAtPeak {
    /// The view of `view`, a replay of `trace` through `replayed` (in words).
    pub(crate) fn new(view: AtPeak, trace: Arc<Trace>, replayed: String) -> Self {
        Self {
            shared: Arc::new(Shared {
                view,
                trace,
                replayed,
            }),
        }
    }

    fn view(&self) -> &AtPeak {
        &self.shared.view
    }

    /// The view in a few lines, with the `top` pinned segments (see `text`).
    fn text_of(&self, top: usize) -> String {
        let view = self.view();
        let mut out = format!(
            "At its peak (after event {}), {} reserves {} in {} segments; live blocks \
             hold {} and asked for {}.\n",
            grouped(view.event as u64),
            self.shared.replayed,
            human_size(view.reserved),
            view.segments.len(),
            human_size(self.live()),
            human_size(view.requested),
        );
        out.push_str(&format!(
            "The gap, {}: {} free inside {} pinned segments, {} rounding, {} in {} idle \
             segments.\n",
            human_size(self.gap()),
            human_size(view.free_in_pinned),
            self.pinned_segments(),
            human_size(view.rounding),
            human_size(view.idle),
            self.idle_segments(),
        ));
        let order = self.by_free();
        if order.is_empty() || top == 0 {
            return out;
        }
        let shown = order.len().min(top);
        out.push_str(&format!(
            "Pinned segments with the most free bytes ({shown} of {}):\n",
            order.len()
        ));
        out.push_str(&format!(
            "  {:<22} {:>11} {:>11} {:>11} {:>7}  largest pinning block\n",
            "segment at", "size", "live", "free", "blocks"
        ));
        for &index in order.iter().take(top) {
            let segment = &view.segments[index];
            let largest = segment
                .blocks
                .iter()
                .max_by_key(|b| (b.size, std::cmp::Reverse(b.id)))
                .copied();
            let block = largest.map_or(String::new(), |b| {
                let frame = self
                    .shared
                    .trace
                    .stacks
                    .get(b.id)
                    .and_then(|frames| named_frame(&frames))
                    .map_or(String::new(), |f| format!(" from {}", one_line(f)));
                format!("{} (allocation {}){frame}", human_size(b.size), b.id)
            });
            out.push_str(&format!(
                "  {:<22} {:>11} {:>11} {:>11} {:>7}  {block}\n",
                place_text(segment),
                human_size(segment.size),
                human_size(segment.live),
                human_size(segment.free()),
                segment.blocks.len(),
            ));
        }
        out
    }

    /// The pinned segments' indexes, the most free bytes first (then by place).
    fn by_free(&self) -> Vec<usize> {
        let segments = &self.view().segments;
        let mut order: Vec<usize> = (0..segments.len())
            .filter(|&i| !segments[i].blocks.is_empty())
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(segments[i].free()));
        order
    }
}

#[pymethods]
impl PyAtPeak {
    /// The index of the event after which the peak was first reached.
    #[getter]
    fn event(&self) -> usize {
        self.view().event
    }
    /// What was replayed: a layout's text or a torch model's name.
    #[getter]
    fn replayed(&self) -> &str {
        &self.shared.replayed
    }
    /// Bytes reserved at the peak (the segments' sizes together).
    #[getter]
    fn reserved(&self) -> u64 {
        self.view().reserved
    }
    /// Bytes of the live blocks (with their rounding).
    #[getter]
    fn live(&self) -> u64 {
        self.view().segments.iter().map(|s| s.live).sum()
    }
    /// Bytes the live blocks' requests asked for.
    #[getter]
    fn requested(&self) -> u64 {
        self.view().requested
    }
    /// `reserved - requested`: what the three parts below add up to.
    #[getter]
    fn gap(&self) -> u64 {
        self.view().reserved - self.view().requested
    }
    /// Free bytes inside segments that hold a live block.
    #[getter]
    fn free_in_pinned(&self) -> u64 {
        self.view().free_in_pinned
    }
    /// Bytes of live blocks beyond what their requests asked for.
    #[getter]
    fn rounding(&self) -> u64 {
        self.view().rounding
    }
    /// Bytes of segments without a live block.
    #[getter]
    fn idle(&self) -> u64 {
        self.view().idle
    }
    /// The reserved segments, by place (group, then start).
    #[getter]
    fn segments(&self) -> Vec<PyReservedSegment> {
        (0..self.view().segments.len())
            .map(|index| PyReservedSegment {
                shared: Arc::clone(&self.shared),
                index,
            })
            .collect()
    }
    /// Segments that hold at least one live block.
    #[getter]
    fn pinned_segments(&self) -> usize {
        self.view()
            .segments
            .iter()
            .filter(|s| !s.blocks.is_empty())
            .count()
    }
    /// Segments without a live block.
    #[getter]
    fn idle_segments(&self) -> usize {
        self.view().segments.len() - self.pinned_segments()
    }

    /// The view as a JSON-ready dict: the figures above and `segments`, each a dict
    /// with `group`, `start`, `size`, `live`, `free`, `requested` and `blocks` (each
    /// `id`, `start`, `size`, `requested`, `frames`; `frames` None where the trace has
    /// no stack).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("event", self.event())?;
        dict.set_item("replayed", self.replayed())?;
        dict.set_item("reserved", self.reserved())?;
        dict.set_item("live", self.live())?;
        dict.set_item("requested", self.requested())?;
        dict.set_item("gap", self.gap())?;
        dict.set_item("free_in_pinned", self.free_in_pinned())?;
        dict.set_item("rounding", self.rounding())?;
        dict.set_item("idle", self.idle())?;
        let segments = PyList::empty(py);
        for segment in self.segments() {
            segments.append(segment.to_dict(py)?)?;
        }
        dict.set_item("segments", segments)?;
        Ok(dict.unbind())
    }

    /// The view in a few lines: the peak, what the gap is made of, and the `top`
    /// pinned segments with the most free bytes, each with its largest pinning block
    /// (and that block's innermost frame, where the trace has stacks).
    // `top` is read by `size_arg` so a bad value names it; the text signature keeps the
    // documented default.
    #[pyo3(signature = (top = None), text_signature = "($self, top=5)")]
    fn text(&self, top: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
        let top = match top {
            Some(top) => usize::try_from(size_arg(top, "top")?).unwrap_or(usize::MAX),
            None => 5,
        };
        Ok(self.text_of(top))
    }

    fn __str__(&self) -> String {
        self.text_of(5)
    }

    fn __repr__(&self) -> String {
        let view = self.view();
        format!(
            "<AtPeak event={} reserved={} requested={} free_in_pinned={} rounding={} idle={} segments={}>",
            view.event,
            view.reserved,
            view.requested,
            view.free_in_pinned,
            view.rounding,
            view.idle,
            view.segments.len()
        )
    }
}

/// A segment's place in words, `group:offset` (`3:0x800000`: the storage buffer or
/// virtual range, and the offset in it; the torch model's single address space is
/// group 0, its offsets addresses).
/// The frame a block is named by in one line: the innermost in Python code (a
/// `.py` file: the user's line, where a snapshot recorded with `stacks="all"` starts
/// with the allocator's and ATen's C++ frames), else the innermost.
fn named_frame<'a>(frames: &[&'a str]) -> Option<&'a str> {
    frames
        .iter()
        .find(|frame| frame.contains(".py:") || frame.ends_with(".py)"))
        .or(frames.first())
        .copied()
}

fn place_text(segment: &ReservedSegment) -> String {
    format!("{}:{:#x}", segment.place.group, segment.place.start)
}

/// One reserved segment at the peak (see `AtPeak`).
#[pyclass(name = "ReservedSegment", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyReservedSegment {
    shared: Arc<Shared>,
    index: usize,
}

impl PyReservedSegment {
    fn segment(&self) -> &ReservedSegment {
        &self.shared.view.segments[self.index]
    }
}

#[pymethods]
impl PyReservedSegment {
    /// The storage buffer or virtual range it is in (0 for the torch model's single
    /// address space).
    #[getter]
    fn group(&self) -> u64 {
        self.segment().place.group
    }
    /// Its offset in the buffer or range (its address, for the torch model).
    #[getter]
    fn start(&self) -> u64 {
        self.segment().place.start
    }
    /// Its bytes reserved from the device.
    #[getter]
    fn size(&self) -> u64 {
        self.segment().size
    }
    /// Bytes of its live blocks.
    #[getter]
    fn live(&self) -> u64 {
        self.segment().live
    }
    /// Bytes no live block holds.
    #[getter]
    fn free(&self) -> u64 {
        self.segment().free()
    }
    /// Bytes its live blocks' requests asked for.
    #[getter]
    fn requested(&self) -> u64 {
        self.segment().requested
    }
    /// The live blocks inside it (that pin it), by place.
    #[getter]
    fn blocks(&self) -> Vec<PyPinnedBlock> {
        self.segment()
            .blocks
            .iter()
            .map(|&block| PyPinnedBlock {
                block,
                trace: Arc::clone(&self.shared.trace),
            })
            .collect()
    }

    /// The segment as a JSON-ready dict (see `AtPeak.to_dict`).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("group", self.group())?;
        dict.set_item("start", self.start())?;
        dict.set_item("size", self.size())?;
        dict.set_item("live", self.live())?;
        dict.set_item("free", self.free())?;
        dict.set_item("requested", self.requested())?;
        let blocks = PyList::empty(py);
        for block in self.blocks() {
            blocks.append(block.to_dict(py)?)?;
        }
        dict.set_item("blocks", blocks)?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        let s = self.segment();
        format!(
            "<ReservedSegment {} size={} live={} free={} blocks={}>",
            place_text(s),
            s.size,
            s.live,
            s.free(),
            s.blocks.len()
        )
    }
}

/// A live block at the peak, or the part of one inside a segment (see `AtPeak`).
#[pyclass(name = "PinnedBlock", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyPinnedBlock {
    block: PinnedBlock,
    trace: Arc<Trace>,
}

#[pymethods]
impl PyPinnedBlock {
    /// The allocation's dense id in the trace.
    #[getter]
    fn id(&self) -> u32 {
        self.block.id
    }
    /// Where it starts in its buffer or range (its address, for the torch model).
    #[getter]
    fn start(&self) -> u64 {
        self.block.place.start
    }
    /// Its bytes inside the segment, with rounding.
    #[getter]
    fn size(&self) -> u64 {
        self.block.size
    }
    /// The bytes its request asked for (the part inside the segment).
    #[getter]
    fn requested(&self) -> u64 {
        self.block.requested
    }
    /// Its allocation stack, innermost frame first, where the trace has one (a PyTorch
    /// snapshot's `frames`); None otherwise.
    #[getter]
    fn frames(&self) -> Option<Vec<String>> {
        self.trace
            .stacks
            .get(self.block.id)
            .map(|frames| frames.into_iter().map(str::to_owned).collect())
    }

    /// The block as a JSON-ready dict (see `AtPeak.to_dict`).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("id", self.id())?;
        dict.set_item("start", self.start())?;
        dict.set_item("size", self.size())?;
        dict.set_item("requested", self.requested())?;
        dict.set_item("frames", self.frames())?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "<PinnedBlock id={} start={:#x} size={} requested={}>",
            self.block.id, self.block.place.start, self.block.size, self.block.requested
        )
    }
}

/// `text` for one line of the table: its newlines and tabs written as `\\n` and
/// `\\t`, so that a frame from a trace cannot begin lines of its own (the command
/// line shows other control characters as escapes itself).
fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(['\n', '\t']) {
        text.replace('\n', "\\n").replace('\t', "\\t").into()
    } else {
        text.into()
    }
}
