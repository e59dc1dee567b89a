//! What the recorded run's own allocator reserved: PyTorch's reserved bytes over time,
//! as a snapshot's segment events or a profiler trace's "Total Reserved" show them.
//!
//! A [`Recording`] is part of a trace's header (the v1 field `recorded`, absent when the
//! source file holds no such figures; readers that do not know the field pass over it).
//! Its curve is a step function over the trace's events: each [`ReservedPoint`] says how
//! many bytes were reserved from just before event `event` (after the first `event`
//! events of the trace) until the next point. Several points may share an event index:
//! the allocator reserved and returned memory between two block events, and the peak
//! counts those moments too.
//!
//! A recording may also carry the run's allocator settings ([`Recording::settings`]),
//! where the file gave them (a snapshot's `allocator_settings`): the v1 field
//! `settings` holds them as the name of the model with those settings
//! (`"torch_expandable(max_split_size_mb=512)"`), absent when the file did not say and
//! in traces written before the field.

use serde::{Deserialize, Serialize};

use super::format::TraceEvent;
use super::torch_model::TorchSettings;

/// The most points a recording keeps. Past it, runs of consecutive points become one
/// point each, holding the run's largest value at the run's first event, so the peak
/// stays exact and the curve never reads lower than the recording. 16,384 points of
/// the v1 field's `[event, t, reserved]` form take well under 1 MiB, the longest line
/// a trace file may have ([`super::format::MAX_LINE_BYTES`]).
pub const MAX_RECORDED_POINTS: usize = 16_384;

/// How much of the run a recording covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Coverage {
    /// From the start: nothing was reserved before the first point.
    Start,
    /// A window that began later: the first point's bytes were already reserved when
    /// recording began (a snapshot whose history started late, or whose ring buffer
    /// dropped its oldest entries; a profiler started mid-run).
    Window,
}

impl Coverage {
    /// The coverage as the v1 field spells it: `"start"` or `"window"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Coverage::Start => "start",
            Coverage::Window => "window",
        }
    }
}

/// One step of a recorded curve: `reserved` bytes from just before event `event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(usize, u64, u64)", into = "(usize, u64, u64)")]
pub struct ReservedPoint {
    /// The number of trace events before this point (0: before the first event).
    pub event: usize,
    /// The time in ns the file gives the change.
    pub t: u64,
    /// Bytes reserved from here until the next point.
    pub reserved: u64,
}

impl From<(usize, u64, u64)> for ReservedPoint {
    fn from((event, t, reserved): (usize, u64, u64)) -> Self {
        Self { event, t, reserved }
    }
}

impl From<ReservedPoint> for (usize, u64, u64) {
    fn from(point: ReservedPoint) -> Self {
        (point.event, point.t, point.reserved)
    }
}

/// PyTorch's own reserved bytes over a trace, as the source file recorded them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recording {
    /// Where the figures come from (`"torch-snapshot segments"`, ...).
    pub source: String,
    /// The device they are of (`"cuda:0"`).
    pub device: String,
    /// From the start, or a window.
    pub covers: Coverage,
    /// Whether the run used expandable segments (`segment_map` events or segments
    /// marked expandable); `None` when the file does not say.
    #[serde(default)]
    pub expandable_segments: Option<bool>,
    /// The curve. Invariant: `event` never decreases from one point to the next and
    /// never passes the trace's event count (checked by [`Recording::check`]).
    pub points: Vec<ReservedPoint>,
    /// The run's allocator settings, where the file gave them (a snapshot's
    /// `allocator_settings`), as the model of PyTorch's allocator that runs with them;
    /// `None` when it did not. Written as the model's name; a name that does not read
    /// as one refuses the header.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "settings_name"
    )]
    pub settings: Option<TorchSettings>,
}

/// The `settings` field as the v1 header holds it: the model's name.
mod settings_name {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::trace::torch_model::TorchSettings;

    pub(super) fn serialize<S: Serializer>(
        settings: &Option<TorchSettings>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match settings {
            Some(settings) => serializer.serialize_some(&settings.to_string()),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<TorchSettings>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|name| {
                TorchSettings::parse(&name)
                    .map_err(|e| D::Error::custom(format!("recorded settings: {e}")))
            })
            .transpose()
    }
}

impl Recording {
    /// A recording of `points`, thinned to [`MAX_RECORDED_POINTS`] when longer.
    ///
    /// Fails, naming the point, when the events of the points go backwards.
    pub fn new(
        source: String,
        device: String,
        covers: Coverage,
        expandable_segments: Option<bool>,
        points: Vec<ReservedPoint>,
    ) -> Result<Self, String> {
        let recording = Self {
            source,
            device,
            covers,
            expandable_segments,
            points: thin(points),
            settings: None,
        };
        recording.check(usize::MAX)?;
        Ok(recording)
    }

    /// The recording with the run's allocator settings (None: the file did not say).
    pub fn with_settings(mut self, settings: Option<TorchSettings>) -> Self {
        self.settings = settings;
        self
    }

    /// Checks the points' invariant against a trace of `events` events, and that the
    /// settings, where given, agree with `expandable_segments` (the import derives one
    /// from the other; a header edited to say both ways made `cubepool report` say both).
    pub fn check(&self, events: usize) -> Result<(), String> {
        if let Some(settings) = &self.settings {
            if self.expandable_segments != Some(settings.expandable_segments) {
                let said = match self.expandable_segments {
                    Some(true) => "true",
                    Some(false) => "false",
                    None => "not said",
                };
                return Err(format!(
                    "recorded settings {settings} say expandable segments are {}, \
                     recorded expandable_segments is {said}",
                    if settings.expandable_segments {
                        "on"
                    } else {
                        "off"
                    },
                ));
            }
        }
        let mut last = 0;
        for (index, point) in self.points.iter().enumerate() {
            if point.event < last {
                return Err(format!(
                    "recorded point {index} is at event {}, before the previous point's {last}",
                    point.event
                ));
            }
            if point.event > events {
                return Err(format!(
                    "recorded point {index} is at event {}, past the trace's {events} events",
                    point.event
                ));
            }
            last = point.event;
        }
        Ok(())
    }

    /// The largest bytes reserved and the first point that holds them (0 and None for
    /// a recording without points).
    pub fn peak(&self) -> (u64, Option<ReservedPoint>) {
        self.points.iter().fold((0, None), |(best, at), point| {
            if point.reserved > best || at.is_none() {
                (point.reserved, Some(*point))
            } else {
                (best, at)
            }
        })
    }

    /// Where the curve says less is reserved than the trace of `events` (allocation
    /// `id` of `sizes[id]` bytes) holds live then: the first such point's event, its
    /// reserved bytes and the live bytes; `None` where it never does. Every point and
    /// the bytes in force between points are checked (the live bytes after each
    /// event): an allocator reserves at least what it hands out, so such a curve is
    /// not this trace's (a profiler's CPU "Total Reserved", always 0, say).
    pub fn below_live(&self, events: &[TraceEvent], sizes: &[u64]) -> Option<(usize, u64, u64)> {
        let mut points = self.points.iter().peekable();
        let mut in_force: Option<u64> = None;
        let mut live: u64 = 0;
        for done in 0..=events.len() {
            if let Some(event) = done.checked_sub(1).and_then(|last| events.get(last)) {
                live = match *event {
                    TraceEvent::Alloc { size, .. } => live.saturating_add(size),
                    TraceEvent::Free { id, .. } => {
                        live.saturating_sub(sizes.get(id as usize).copied().unwrap_or(0))
                    }
                };
            }
            while let Some(point) = points.next_if(|point| point.event <= done) {
                in_force = Some(point.reserved);
                if point.reserved < live {
                    return Some((done, point.reserved, live));
                }
            }
            if let Some(reserved) = in_force.filter(|&reserved| reserved < live) {
                return Some((done, reserved, live));
            }
        }
        None
    }

    /// The bytes reserved when recording began (the first point's; 0 without points).
    pub fn initial(&self) -> u64 {
        self.points.first().map_or(0, |point| point.reserved)
    }

    /// The recording of a trace cut after `events` events: the points up to the cut.
    pub fn prefix(&self, events: usize) -> Recording {
        let mut cut = self.clone();
        cut.points.retain(|point| point.event <= events);
        cut
    }
}

/// `points` with runs merged into their largest value when there are more than
/// [`MAX_RECORDED_POINTS`].
fn thin(points: Vec<ReservedPoint>) -> Vec<ReservedPoint> {
    if points.len() <= MAX_RECORDED_POINTS {
        return points;
    }
    let run = points.len().div_ceil(MAX_RECORDED_POINTS);
    points
        .chunks(run)
        .map(|chunk| ReservedPoint {
            reserved: chunk.iter().map(|p| p.reserved).max().unwrap_or_default(),
            ..chunk[0]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(values: &[(usize, u64)]) -> Vec<ReservedPoint> {
        values
            .iter()
            .map(|&(event, reserved)| ReservedPoint {
                event,
                t: event as u64,
                reserved,
            })
            .collect()
    }

    fn recording(values: &[(usize, u64)]) -> Result<Recording, String> {
        Recording::new(
            "test".into(),
            "cuda:0".into(),
            Coverage::Start,
            None,
            points(values),
        )
    }

    fn alloc(id: u32, size: u64) -> TraceEvent {
        TraceEvent::Alloc { t: 0, id, size }
    }

    fn free(id: u32) -> TraceEvent {
        TraceEvent::Free { t: 0, id }
    }

    #[test]
    fn a_curve_under_the_live_bytes_is_found_at_its_first_such_moment() {
        // Live after each event: 100, 150, 50, 250.
        let events = [alloc(0, 100), alloc(1, 50), free(0), alloc(2, 200)];
        let sizes = [100, 50, 200];
        let covers = recording(&[(0, 0), (1, 100), (2, 150), (4, 250)]).unwrap();
        assert_eq!(covers.below_live(&events, &sizes), None);
        // A point below what is live when it is written.
        let low_point = recording(&[(0, 0), (1, 100), (2, 149)]).unwrap();
        assert_eq!(low_point.below_live(&events, &sizes), Some((2, 149, 150)));
        // Bytes in force between points: 150 from event 2 on, under 250 after four.
        let stale = recording(&[(0, 0), (1, 100), (2, 150)]).unwrap();
        assert_eq!(stale.below_live(&events, &sizes), Some((4, 150, 250)));
        // Two points at one moment: each is a moment at those live bytes.
        let dip = recording(&[(0, 0), (1, 100), (2, 300), (2, 120), (2, 300)]).unwrap();
        assert_eq!(dip.below_live(&events, &sizes), Some((2, 120, 150)));
        // A window that begins late says nothing of the events before it.
        let late = recording(&[(3, 50), (4, 250)]).unwrap();
        assert_eq!(late.below_live(&events, &sizes), None);
        // A profiler's CPU figures: 0 under every live byte.
        let zeros = recording(&[(1, 0), (2, 0), (3, 0), (4, 0)]).unwrap();
        assert_eq!(zeros.below_live(&events, &sizes), Some((1, 0, 100)));
    }

    #[test]
    fn the_peak_is_the_first_largest_point() {
        let recorded = recording(&[(0, 0), (1, 20), (1, 50), (2, 30), (4, 50)]).unwrap();
        let (peak, at) = recorded.peak();
        assert_eq!((peak, at.map(|p| p.event)), (50, Some(1)));
        assert_eq!(recorded.initial(), 0);
        assert_eq!(recorded.prefix(1).points.len(), 3);
        assert_eq!(recording(&[]).unwrap().peak(), (0, None));
    }

    #[test]
    fn points_going_backwards_or_past_the_trace_are_refused() {
        let error = recording(&[(3, 1), (2, 1)]).unwrap_err();
        assert!(error.contains("point 1 is at event 2"), "{error}");
        let error = recording(&[(0, 1), (5, 1)]).unwrap().check(4).unwrap_err();
        assert!(error.contains("past the trace's 4 events"), "{error}");
    }

    #[test]
    fn settings_travel_as_the_models_name_and_stay_out_when_unsaid() {
        let plain = recording(&[(0, 1)]).unwrap();
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("settings"), "{text}");
        assert_eq!(serde_json::from_str::<Recording>(&text).unwrap(), plain);
        let settings = TorchSettings::parse(
            "torch_expandable(max_split_size_mb=512, roundup_power2_divisions=[256:1,>:8])",
        )
        .unwrap();
        let with = plain.clone().with_settings(Some(settings));
        let text = serde_json::to_string(&with).unwrap();
        assert!(
            text.contains(
                r#""settings":"torch_expandable(max_split_size_mb=512, roundup_power2_divisions=[256:1,>:8])""#
            ),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Recording>(&text).unwrap(), with);
        let bad = text.replace("max_split_size_mb=512", "max_split_size_mb=5");
        let error = serde_json::from_str::<Recording>(&bad)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("max_split_size_mb must be at least 20"),
            "{error}"
        );
    }

    #[test]
    fn settings_that_contradict_the_expandable_flag_are_refused() {
        // A header saying expandable_segments false beside settings of the expandable
        // model made `cubepool report` say both (helper-148's find).
        let expandable = TorchSettings::parse("torch_expandable").unwrap();
        let plain = recording(&[(0, 1)]).unwrap();
        for flag in [Some(false), None] {
            let mut said = plain.clone().with_settings(Some(expandable));
            said.expandable_segments = flag;
            let error = said.check(1).unwrap_err();
            assert!(
                error.contains("recorded settings torch_expandable"),
                "{error}"
            );
        }
        let mut agreeing = plain.with_settings(Some(expandable));
        agreeing.expandable_segments = Some(true);
        agreeing.check(1).unwrap();
    }

    #[test]
    fn thinning_keeps_the_peak_and_never_reads_lower() {
        let values: Vec<(usize, u64)> = (0..3 * MAX_RECORDED_POINTS + 7)
            .map(|i| (i, (i as u64 * 7919) % 1000))
            .collect();
        let many = recording(&values).unwrap();
        assert!(many.points.len() <= MAX_RECORDED_POINTS);
        assert_eq!(many.peak().0, 999);
        // Each kept point covers its run: at the run's first event it is at least as
        // high as every original point of the run.
        for pair in many.points.windows(2) {
            for &(event, value) in &values[pair[0].event..pair[1].event] {
                assert!(pair[0].reserved >= value, "event {event}");
            }
        }
    }
}
