//! What a planner asks of a trace, answered in one pass over its events, and the
//! variants of a trace it replays (a step run once more, twins, reordered events).
//!
//! These are the per-event loops of `cubepool.plan`, in Rust so that a trace of
//! millions of events never crosses into Python. Each one is specified exactly (the
//! planner's results depend on it), including how ties and randomness are resolved:
//! randomness is never drawn here, the caller passes its draws in.

use std::collections::HashMap;

use super::format::TraceBuilder;
use super::{Phase, Trace, TraceEvent, TraceHeader};

/// Why a trace variant could not be made from the arguments given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum VariantError {
    /// An event index past the end of the trace.
    #[error("{what} is {index}, but the trace has only {len} events")]
    IndexOutOfRange {
        /// Which argument.
        what: &'static str,
        /// Its value.
        index: usize,
        /// The trace's number of events.
        len: usize,
    },
    /// A start after the end of the range it starts.
    #[error("the range starts at event {start}, after its end {cut}")]
    EmptyRange {
        /// The first event.
        start: usize,
        /// The event after the last.
        cut: usize,
    },
    /// An allocation id the trace does not have.
    #[error("allocation {id} is not in the trace ({allocations} allocations)")]
    UnknownAllocation {
        /// The id.
        id: u32,
        /// The trace's number of allocations.
        allocations: u32,
    },
    /// Not one random draw per event that moves.
    #[error("{given} random draws for {needed} events")]
    DrawCount {
        /// Draws given.
        given: usize,
        /// Events from the start on.
        needed: usize,
    },
    /// A window that is negative or not finite.
    #[error("the window must be a finite number >= 0, got {0}")]
    BadWindow(f64),
    /// A random draw outside `[0, 1]` (or NaN), which would move its event anywhere.
    #[error("draws[{index}] must be a number from 0 to 1 (as random.random() draws), got {draw}")]
    BadDraw {
        /// The draw's index.
        index: usize,
        /// The draw.
        draw: f64,
    },
    /// The variant is not a trace (more than 2^32 allocations, live bytes past 64 bits, or
    /// a header that does not fit its events).
    #[error("the variant is not a valid trace: {0}")]
    Invalid(String),
}

impl Trace {
    /// The distinct sizes the trace allocates, ascending.
    pub fn distinct_sizes(&self) -> Vec<u64> {
        let mut sizes = self.sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// For each of `limits` (ascending), the peak live bytes of the allocations of at
    /// most that size. A limit out of order still gets its own peak.
    pub fn live_peaks(&self, limits: &[u64]) -> Vec<u64> {
        let mut current = vec![0u64; limits.len()];
        let mut peaks = vec![0u64; limits.len()];
        for event in &self.events {
            match *event {
                TraceEvent::Alloc { size, .. } => {
                    for ((limit, live), peak) in limits.iter().zip(&mut current).zip(&mut peaks) {
                        if size <= *limit {
                            // At most peak_live, which fits 64 bits.
                            *live += size;
                            *peak = (*peak).max(*live);
                        }
                    }
                }
                TraceEvent::Free { id, .. } => {
                    let size = self.sizes[id as usize];
                    for (limit, live) in limits.iter().zip(&mut current) {
                        if size <= *limit {
                            *live -= size;
                        }
                    }
                }
            }
        }
        peaks
    }

    /// By allocation id, the groups (indices into the `groups` that made `member`,
    /// see [`groups_of_sizes`]) its size is in.
    fn groups_by_id<'a>(&self, member: &'a HashMap<u64, Vec<usize>>) -> Vec<&'a [usize]> {
        self.sizes
            .iter()
            .map(|size| member.get(size).map_or(&[][..], Vec::as_slice))
            .collect()
    }

    /// For each group of sizes, the peak live bytes of the allocations of those sizes
    /// and the most of them live at once (each peak taken on its own). A pool that
    /// serves exactly these sizes reserves at least those bytes at its peak, and one
    /// that keeps a storage buffer per allocation makes at least that many: a
    /// planner's lower bounds of a replay, without the replay.
    pub fn group_live_peaks(&self, groups: &[Vec<u64>]) -> Vec<(u64, u64)> {
        let member = groups_of_sizes(groups);
        let of = self.groups_by_id(&member);
        // Per group: (live bytes, live allocations) now, and the peak of each.
        self.live_peaks_of(&of, groups.len())
    }

    /// [`Trace::group_live_peaks`] of groups given as inclusive ranges of sizes
    /// (`(low, high)`; a range with `low > high` holds nothing), in memory that grows
    /// with the ranges, not with the sizes they hold.
    ///
    /// A planner's groups are the sizes a layout routes to one pool: a few runs of a
    /// trace's distinct sizes, which may number tens of thousands. The range ends cut
    /// the sizes into segments, each allocation's segment is found once, and each
    /// event updates the groups of its segment.
    pub fn range_live_peaks(&self, groups: &[Vec<(u64, u64)>]) -> Vec<(u64, u64)> {
        // Segment k holds the sizes from bounds[k - 1] (0 for k = 0) below bounds[k].
        let mut bounds: Vec<u64> = groups
            .iter()
            .flatten()
            .filter(|(low, high)| low <= high)
            .flat_map(|&(low, high)| [Some(low), high.checked_add(1)])
            .flatten()
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        let segment = |size: u64| bounds.partition_point(|&bound| bound <= size);
        let mut in_segment: Vec<Vec<usize>> = vec![Vec::new(); bounds.len() + 1];
        for (index, group) in groups.iter().enumerate() {
            for &(low, high) in group.iter().filter(|(low, high)| low <= high) {
                let last = high.checked_add(1).map_or(bounds.len(), segment);
                for of in &mut in_segment[segment(low)..last] {
                    if of.last() != Some(&index) {
                        of.push(index);
                    }
                }
            }
        }
        let of: Vec<&[usize]> = self
            .sizes
            .iter()
            .map(|&size| in_segment[segment(size)].as_slice())
            .collect();
        self.live_peaks_of(&of, groups.len())
    }

    /// The peak (live bytes, live allocations) of each of `groups` groups, where `of[id]`
    /// lists the groups allocation `id` counts in: the event walk that
    /// [`Trace::group_live_peaks`] and [`Trace::range_live_peaks`] share.
    fn live_peaks_of(&self, of: &[&[usize]], groups: usize) -> Vec<(u64, u64)> {
        let mut live = vec![(0u64, 0u64); groups];
        let mut peaks = vec![(0u64, 0u64); groups];
        for event in &self.events {
            match *event {
                TraceEvent::Alloc { id, size, .. } => {
                    for &group in of[id as usize] {
                        // At most peak_live and the allocation count: both fit 64 bits.
                        let (bytes, count) = &mut live[group];
                        *bytes += size;
                        *count += 1;
                        let peak = &mut peaks[group];
                        *peak = (peak.0.max(*bytes), peak.1.max(*count));
                    }
                }
                TraceEvent::Free { id, .. } => {
                    let size = self.sizes[id as usize];
                    for &group in of[id as usize] {
                        let (bytes, count) = &mut live[group];
                        *bytes -= size;
                        *count -= 1;
                    }
                }
            }
        }
        peaks
    }

    /// For each group of sizes, the most allocations of those sizes live at once, and
    /// how many allocations of those sizes the trace makes. A pool that keeps one
    /// buffer per allocation and reuses freed buffers of the same size (as a direct
    /// pool does) holds exactly the first many buffers at its peak.
    pub fn group_peaks(&self, groups: &[Vec<u64>]) -> Vec<(u64, u64)> {
        let member = groups_of_sizes(groups);
        let of = self.groups_by_id(&member);
        let mut live = vec![0u64; groups.len()];
        let mut figures = vec![(0u64, 0u64); groups.len()];
        for event in &self.events {
            match *event {
                TraceEvent::Alloc { id, .. } => {
                    for &group in of[id as usize] {
                        live[group] += 1;
                        let (peak, count) = &mut figures[group];
                        *peak = (*peak).max(live[group]);
                        *count += 1;
                    }
                }
                TraceEvent::Free { id, .. } => {
                    for &group in of[id as usize] {
                        live[group] -= 1;
                    }
                }
            }
        }
        figures
    }

    /// The index of the event that first reaches `peak_live` (none when no allocation
    /// has bytes).
    pub fn peak_event(&self) -> Option<usize> {
        let (mut live, mut peak, mut peak_at) = (0u64, 0u64, None);
        for (index, event) in self.events.iter().enumerate() {
            match *event {
                TraceEvent::Alloc { size, .. } => {
                    live += size;
                    if live > peak {
                        (peak, peak_at) = (live, Some(index));
                    }
                }
                TraceEvent::Free { id, .. } => live -= self.sizes[id as usize],
            }
        }
        peak_at
    }

    /// The allocations live right after the event that first reaches `peak_live`, as
    /// `(id, size)` pairs by ascending id (none for a trace without allocations).
    pub fn live_at_peak(&self) -> Vec<(u32, u64)> {
        let Some(peak_at) = self.peak_event() else {
            return Vec::new();
        };
        let mut alive = vec![false; self.allocations as usize];
        for event in &self.events[..=peak_at] {
            match *event {
                TraceEvent::Alloc { id, .. } => alive[id as usize] = true,
                TraceEvent::Free { id, .. } => alive[id as usize] = false,
            }
        }
        (0..self.allocations)
            .filter(|&id| alive[id as usize])
            .map(|id| (id, self.sizes[id as usize]))
            .collect()
    }

    /// The events before `cut`, then the step `start..cut` once more on the state it
    /// leaves: its allocations that it also frees are repeated (with new ids, after
    /// every id of the prefix, in their order), shifted in time to start one ns after
    /// the last event; those it keeps stay live. The phases that start before `cut`
    /// are kept and one named `repeated` starts the repetition.
    pub fn with_step_repeated(
        &self,
        start: usize,
        cut: usize,
        repeated: &str,
    ) -> Result<Trace, VariantError> {
        if cut > self.len() {
            return Err(VariantError::IndexOutOfRange {
                what: "the step's end",
                index: cut,
                len: self.len(),
            });
        }
        if start > cut {
            return Err(VariantError::EmptyRange { start, cut });
        }
        let prefix = self.prefix(cut);
        let step = &prefix.events[start..];
        let mut freed = vec![false; prefix.allocations as usize];
        let mut born = vec![false; prefix.allocations as usize];
        for event in step {
            match *event {
                TraceEvent::Alloc { id, .. } => born[id as usize] = true,
                TraceEvent::Free { id, .. } => freed[id as usize] = true,
            }
        }
        // Times that go backwards (the format does not forbid it) shift by one ns; a
        // step that spans every time to u64::MAX repeats at u64::MAX (saturating).
        let shift = match (step.first(), prefix.events.last()) {
            (Some(first), Some(last)) => last.t().saturating_sub(first.t()).saturating_add(1),
            _ => 0,
        };
        let mut header = prefix.header.clone();
        header.phases.push(Phase {
            name: repeated.to_string(),
            first_event: prefix.len(),
            t: 0,
        });
        let mut variant = Variant::new(header);
        for event in &prefix.events {
            variant.push(event, u64::from)?;
        }
        let next = u64::from(prefix.allocations);
        let mut renamed = vec![0u32; prefix.allocations as usize];
        let mut count = 0u32;
        for event in step {
            let id = match *event {
                TraceEvent::Alloc { id, .. } | TraceEvent::Free { id, .. } => id,
            };
            if !(born[id as usize] && freed[id as usize]) {
                continue;
            }
            if let TraceEvent::Alloc { .. } = event {
                renamed[id as usize] = count;
                count += 1;
            }
            let fresh = next + u64::from(renamed[id as usize]);
            let moved = match *event {
                TraceEvent::Alloc { t, size, .. } => TraceEvent::Alloc {
                    t: t.saturating_add(shift),
                    id,
                    size,
                },
                TraceEvent::Free { t, .. } => TraceEvent::Free {
                    t: t.saturating_add(shift),
                    id,
                },
            };
            variant.push(&moved, |_| fresh)?;
        }
        variant.finish(self)
    }

    /// The trace with a twin for each allocation of `twins`: an allocation of the same
    /// size, right after it, freed right after it is (if it is). The events keep their
    /// order, and the header's phases and recorded points move with the events they
    /// start at (a twin never starts a phase).
    pub fn with_twins(&self, twins: &[u32]) -> Result<Trace, VariantError> {
        let mut twin = vec![false; self.allocations as usize];
        for &id in twins {
            *twin
                .get_mut(id as usize)
                .ok_or(VariantError::UnknownAllocation {
                    id,
                    allocations: self.allocations,
                })? = true;
        }
        let offset = u64::from(self.allocations);
        let mut variant = Variant::new(TraceHeader::default());
        // `landed[i]`: where the trace's event `i` lands (`landed[len]`: the new length).
        let mut landed = Vec::with_capacity(self.events.len() + 1);
        for event in &self.events {
            landed.push(variant.builder.len());
            variant.push(event, u64::from)?;
            let id = match *event {
                TraceEvent::Alloc { id, .. } | TraceEvent::Free { id, .. } => id,
            };
            if twin[id as usize] {
                variant.push(event, |id| u64::from(id) + offset)?;
            }
        }
        landed.push(variant.builder.len());
        // Indices past the end cannot be in a trace's header (`TraceHeader::check`).
        let landing = |event: usize| landed.get(event).copied().unwrap_or(event);
        let mut header = self.header.clone();
        for phase in &mut header.phases {
            phase.first_event = landing(phase.first_event);
        }
        for point in header.recorded.iter_mut().flat_map(|r| &mut r.points) {
            point.event = landing(point.event);
        }
        variant.builder.set_header(header);
        variant.finish(self)
    }

    /// The trace with each event from index `start` on moved up to `window` places:
    /// event `start + k` is placed by the key `k + (-window + 2 * window * draws[k])`
    /// (ascending, ties in event order), except that a free placed before its
    /// allocation waits and follows it at once. The times stay where they were, in
    /// order: the `i`-th event from `start` on takes the `i`-th time.
    ///
    /// With `draws` uniform in `[0, 1)` this is `perturb` of `cubepool.plan`, and its
    /// keys are those of `k + random.uniform(-window, window)` to the last bit.
    pub fn reordered(
        &self,
        start: usize,
        window: f64,
        draws: &[f64],
    ) -> Result<Trace, VariantError> {
        if start > self.len() {
            return Err(VariantError::IndexOutOfRange {
                what: "start",
                index: start,
                len: self.len(),
            });
        }
        if !(window.is_finite() && window >= 0.0) {
            return Err(VariantError::BadWindow(window));
        }
        let (head, tail) = self.events.split_at(start);
        if draws.len() != tail.len() {
            return Err(VariantError::DrawCount {
                given: draws.len(),
                needed: tail.len(),
            });
        }
        if let Some((index, &draw)) = draws
            .iter()
            .enumerate()
            .find(|(_, draw)| !(0.0..=1.0).contains(*draw))
        {
            return Err(VariantError::BadDraw { index, draw });
        }
        // As Python computes `k + uniform(-w, w)`: `a + (b - a) * random()`.
        let keys: Vec<f64> = draws
            .iter()
            .enumerate()
            .map(|(k, r)| k as f64 + (-window + (window - -window) * r))
            .collect();
        let mut order: Vec<usize> = (0..tail.len()).collect();
        // Stable: equal keys keep event order. A total order, so that no key can make
        // the sort give up; for draws in [0, 1) no key is -0.0 or NaN, and it orders
        // them as Python does.
        order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
        let mut placed = vec![false; self.allocations as usize];
        for event in head {
            if let TraceEvent::Alloc { id, .. } = *event {
                placed[id as usize] = true;
            }
        }
        let mut waiting: Vec<Option<TraceEvent>> = vec![None; self.allocations as usize];
        let mut moved = Vec::with_capacity(tail.len());
        for k in order {
            let event = tail[k];
            match event {
                TraceEvent::Free { id, .. } if !placed[id as usize] => {
                    waiting[id as usize] = Some(event);
                }
                TraceEvent::Free { .. } => moved.push(event),
                TraceEvent::Alloc { id, .. } => {
                    moved.push(event);
                    placed[id as usize] = true;
                    if let Some(free) = waiting[id as usize].take() {
                        moved.push(free);
                    }
                }
            }
        }
        let mut variant = Variant::new(self.header.clone());
        for event in head {
            variant.push(event, u64::from)?;
        }
        for (event, at) in moved.iter().zip(tail) {
            let timed = match *event {
                TraceEvent::Alloc { id, size, .. } => TraceEvent::Alloc {
                    t: at.t(),
                    id,
                    size,
                },
                TraceEvent::Free { id, .. } => TraceEvent::Free { t: at.t(), id },
            };
            variant.push(&timed, u64::from)?;
        }
        variant.finish(self)
    }
}

/// A variant under construction: its builder, and for each allocation it has so far
/// the allocation of the trace it came from, whose stack it takes (a variant keeps
/// its allocations' stacks).
struct Variant {
    builder: TraceBuilder,
    sources: Vec<u32>,
}

impl Variant {
    fn new(header: TraceHeader) -> Self {
        Self {
            builder: TraceBuilder::new(header),
            sources: Vec::new(),
        }
    }

    /// Adds `event` of the trace under the id `rename` gives its id. Variants pair
    /// their events up by construction; what can fail is a twin pushing the live bytes
    /// or the allocation count past what a trace holds.
    fn push(
        &mut self,
        event: &TraceEvent,
        rename: impl Fn(u32) -> u64,
    ) -> Result<(), VariantError> {
        match *event {
            TraceEvent::Alloc { t, id, size } => {
                self.builder
                    .alloc(t, rename(id), size)
                    .map_err(VariantError::Invalid)?;
                self.sources.push(id);
            }
            TraceEvent::Free { t, id } => self
                .builder
                .free(t, rename(id))
                .map_err(VariantError::Invalid)?,
        }
        Ok(())
    }

    /// The variant of `trace`, with the stacks of its allocations' sources, or
    /// [`VariantError::Invalid`] where its header does not fit its events.
    fn finish(self, trace: &Trace) -> Result<Trace, VariantError> {
        let mut variant = self
            .builder
            .finish()
            .map_err(|error| VariantError::Invalid(error.to_string()))?;
        variant.stacks = trace.stacks.of_allocations(&self.sources);
        Ok(variant)
    }
}

/// For each size in `groups`, the indices of the groups it is in (each group once, even
/// where a group names the size twice).
fn groups_of_sizes(groups: &[Vec<u64>]) -> HashMap<u64, Vec<usize>> {
    let mut member: HashMap<u64, Vec<usize>> = HashMap::new();
    for (index, group) in groups.iter().enumerate() {
        for &size in group {
            let of = member.entry(size).or_default();
            if of.last() != Some(&index) {
                of.push(index);
            }
        }
    }
    member
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceHeader;

    /// alloc 0 (100), alloc 1 (50), free 0, alloc 2 (200), free 1, alloc 3 (10).
    fn small() -> Trace {
        let mut b = TraceBuilder::new(TraceHeader::default());
        b.alloc(1, 10, 100).unwrap();
        b.alloc(2, 11, 50).unwrap();
        b.free(3, 10).unwrap();
        b.alloc(4, 12, 200).unwrap();
        b.free(5, 11).unwrap();
        b.alloc(6, 13, 10).unwrap();
        b.finish().unwrap()
    }

    /// The stack of each allocation of `trace`, by size (the sizes of `framed` are
    /// distinct, and each variant's allocations keep their size).
    fn stacks_by_size(trace: &Trace) -> Vec<(u64, Option<Vec<&str>>)> {
        (0..trace.allocations)
            .map(|id| (trace.sizes[id as usize], trace.stacks().get(id)))
            .collect()
    }

    #[test]
    fn variants_keep_their_allocations_stacks() {
        // The variants were built without stacks: a perturbed or repeated trace lost
        // the frames that say where its blocks were made.
        let mut b = TraceBuilder::new(TraceHeader::default());
        for (t, id, size) in [(1, 10, 100), (2, 11, 50)] {
            let frames = vec![format!("f{size}"), "main".to_string()];
            b.alloc_with_frames(t, id, size, Some(frames)).unwrap();
        }
        b.free(3, 10).unwrap();
        b.alloc(4, 12, 200).unwrap(); // no stack
        b.free(5, 11).unwrap();
        b.free(6, 12).unwrap();
        let framed = b.finish().unwrap();
        let expected = |size: u64| match size {
            200 => None,
            _ => Some(vec![if size == 100 { "f100" } else { "f50" }, "main"]),
        };
        let variants = [
            framed.with_step_repeated(0, framed.len(), "again").unwrap(),
            framed.with_twins(&[0, 2]).unwrap(),
            framed
                .reordered(0, 3.0, &[0.9, 0.1, 0.5, 0.0, 0.7, 0.3])
                .unwrap(),
        ];
        for variant in &variants {
            assert!(variant.allocations >= 3);
            for (size, stack) in stacks_by_size(variant) {
                assert_eq!(stack, expected(size), "size {size}");
            }
        }
        // A variant of a trace without stacks has none.
        assert!(small().with_twins(&[1]).unwrap().stacks().is_empty());
    }

    #[test]
    fn a_step_spanning_every_time_repeats_at_the_last_time() {
        // The step runs from t = 0 to t = u64::MAX: its shift (the span plus one ns)
        // overflowed; the repetition now saturates at u64::MAX, in time order.
        let mut b = TraceBuilder::new(TraceHeader::default());
        b.alloc(0, 1, 64).unwrap();
        b.free(u64::MAX, 1).unwrap();
        let trace = b.finish().unwrap();
        let repeated = trace.with_step_repeated(0, 2, "again").unwrap();
        assert_eq!(repeated.len(), 4);
        assert_eq!(repeated.sizes, vec![64, 64]);
        assert!(repeated.events[2..].iter().all(|e| e.t() == u64::MAX));
    }

    #[test]
    fn live_peaks_count_sizes_under_each_limit() {
        let trace = small();
        assert_eq!(
            trace.live_peaks(&[10, 50, 100, 200]),
            vec![10, 50, 150, 250]
        );
        assert_eq!(trace.live_peaks(&[]), Vec::<u64>::new());
        // Out of order, each limit still gets its own peak.
        assert_eq!(trace.live_peaks(&[200, 50]), vec![250, 50]);
        assert_eq!(trace.distinct_sizes(), vec![10, 50, 100, 200]);
    }

    #[test]
    fn group_live_peaks_add_the_bytes_of_each_group() {
        let trace = small();
        // 100 and 50 live together (150), 200 and 10 too (210); a repeated size counts once.
        let groups = vec![vec![100, 50], vec![200, 10, 10], vec![7], vec![]];
        assert_eq!(
            trace.group_live_peaks(&groups),
            vec![(150, 2), (210, 2), (0, 0), (0, 0)]
        );
        // Each peak on its own: 250 bytes with 200 and 50 live; never more than 2 live.
        let all = trace.distinct_sizes();
        assert_eq!(trace.group_live_peaks(&[all]), vec![(trace.peak_live, 2)]);
    }

    #[test]
    fn group_peaks_count_live_allocations() {
        let trace = small();
        // 100 and 50 live together, and so do 200 and 10 (neither is freed).
        let groups = vec![vec![100, 50], vec![200, 10], vec![7], vec![]];
        assert_eq!(
            trace.group_peaks(&groups),
            vec![(2, 2), (2, 2), (0, 0), (0, 0)]
        );
    }

    #[test]
    fn live_at_peak_is_taken_at_the_first_peak() {
        let trace = small();
        assert_eq!(trace.peak_live, 250);
        assert_eq!(trace.live_at_peak(), vec![(1, 50), (2, 200)]);
        let empty = TraceBuilder::new(TraceHeader::default()).finish().unwrap();
        assert!(empty.live_at_peak().is_empty());
    }

    #[test]
    fn the_peak_event_is_the_first_to_reach_the_peak() {
        assert_eq!(small().peak_event(), Some(3));
        let empty = TraceBuilder::new(TraceHeader::default()).finish().unwrap();
        assert_eq!(empty.peak_event(), None);
    }

    #[test]
    fn a_repeated_step_repeats_what_it_frees() {
        let trace = small();
        // The step is events 2..5: free 0, alloc 2, free 1; nothing born there dies there.
        let same = trace.with_step_repeated(2, 5, "again").unwrap();
        assert_eq!(same.events, trace.prefix(5).events);
        // The step 1..3 (alloc 1, free 0) keeps 1; the step 0..3 repeats 0.
        let again = trace.with_step_repeated(0, 3, "again").unwrap();
        assert_eq!(again.len(), 5);
        assert_eq!(
            again.events[3..],
            [
                TraceEvent::Alloc {
                    t: 4,
                    id: 2,
                    size: 100
                },
                TraceEvent::Free { t: 6, id: 2 }
            ]
        );
        assert_eq!(again.header.phases.last().unwrap().first_event, 3);
        assert!(matches!(
            trace.with_step_repeated(4, 3, "x"),
            Err(VariantError::EmptyRange { .. })
        ));
        assert!(matches!(
            trace.with_step_repeated(0, 7, "x"),
            Err(VariantError::IndexOutOfRange { .. })
        ));
    }

    #[test]
    fn twins_live_alongside_their_allocation() {
        let trace = small();
        let doubled = trace.with_twins(&[0, 3]).unwrap();
        assert_eq!(doubled.len(), trace.len() + 3);
        // 0 and its twin live together (200), then 2 beside 1 (250).
        assert_eq!(doubled.peak_live, 250);
        assert_eq!(doubled.allocations, 6);
        assert!(matches!(
            trace.with_twins(&[4]),
            Err(VariantError::UnknownAllocation { id: 4, .. })
        ));
    }

    #[test]
    fn twins_move_the_phases_with_the_events_they_start_at() {
        let mut trace = small();
        let starts = [0, 2, 4, trace.len()];
        trace.header.phases = starts
            .iter()
            .enumerate()
            .map(|(k, &first_event)| Phase {
                name: format!("p{k}"),
                first_event,
                t: 0,
            })
            .collect();
        let doubled = trace.with_twins(&[0, 3]).unwrap();
        // Twins follow events 0 (alloc of 0), 2 (its free) and 5 (alloc of 3): the
        // trace's events 0, 2, 4 and its end land at 0, 3, 6 and 9.
        let firsts: Vec<usize> = doubled
            .header
            .phases
            .iter()
            .map(|p| p.first_event)
            .collect();
        assert_eq!(firsts, [0, 3, 6, 9]);
        assert_eq!(doubled.len(), 9);
        for (&start, &first) in starts.iter().zip(&firsts).take(3) {
            // The same time, and the trace's event, not its twin, which follows it.
            assert_eq!(doubled.events[first].t(), trace.events[start].t());
            let before = first.checked_sub(1).map(|at| doubled.events[at].t());
            assert!(before.is_none_or(|t| t < trace.events[start].t()));
        }
    }

    #[test]
    fn reordering_keeps_frees_after_allocations_and_times_in_order() {
        let trace = small();
        // Draws that reverse the tail: keys k + (-w + 2w r) with w = 10.
        let draws: Vec<f64> = (0..6).map(|k| 1.0 - k as f64 / 5.0).collect();
        let moved = trace.reordered(0, 10.0, &draws).unwrap();
        assert_eq!(moved.len(), trace.len());
        let times: Vec<u64> = moved.events.iter().map(TraceEvent::t).collect();
        assert_eq!(times, vec![1, 2, 3, 4, 5, 6]);
        // Reversed: 3, 2, 1 (its free follows), 0: 10 + 200 + 100 at most.
        assert_eq!(moved.peak_live, 10 + 200 + 100);
        // Window 0 changes nothing.
        assert_eq!(trace.reordered(2, 0.0, &[0.5; 4]).unwrap(), trace);
        assert!(matches!(
            trace.reordered(2, 1.0, &[0.5; 3]),
            Err(VariantError::DrawCount {
                given: 3,
                needed: 4
            })
        ));
        assert!(matches!(
            trace.reordered(0, f64::NAN, &draws),
            Err(VariantError::BadWindow(_))
        ));
        assert!(matches!(
            trace.reordered(7, 1.0, &[]),
            Err(VariantError::IndexOutOfRange { .. })
        ));
        // A draw outside [0, 1] (NaN included) is refused by its index: it moved its
        // event anywhere, without a word. -0.0 and 1.0 are draws at the window's ends.
        for (index, bad) in [f64::NAN, f64::INFINITY, -1.0, f64::NEG_INFINITY, 2.0]
            .into_iter()
            .enumerate()
        {
            let mut odd = [0.5; 6];
            odd[index] = bad;
            match trace.reordered(0, f64::MAX, &odd) {
                Err(VariantError::BadDraw { index: at, .. }) => assert_eq!(at, index),
                other => panic!("draw {bad} at {index}: {other:?}"),
            }
        }
        let ends = [-0.0, 1.0, 0.0, 1.0, 0.5, 1.0];
        assert_eq!(
            trace.reordered(0, f64::MAX, &ends).unwrap().len(),
            trace.len()
        );
    }
}
