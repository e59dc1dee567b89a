//! Why reserved exceeds live: the address space of a replay at its peak.
//!
//! At the event that first reaches a replay's peak of reserved bytes, every reserved
//! segment (a storage buffer, a mapped run of a virtual range, a segment of the model of
//! PyTorch's allocator) with the live blocks inside it, each block's bytes and the bytes
//! its request asked for. The gap between reserved and requested bytes is made of three
//! parts, which add up exactly ([`AtPeak::check`]):
//!
//! - **free inside pinned segments**: bytes of segments that hold a live block but are
//!   not handed out; the live blocks pin these segments, so they cannot be given back;
//! - **rounding**: bytes of live blocks beyond what their requests asked for (alignment,
//!   size classes, whole pages or granules for one request);
//! - **idle segments**: segments with no live block, kept for reuse.

/// Where a segment or a block is: a storage buffer or range (`group`) and the offset
/// in it, or for the model of PyTorch's allocator (one address space, `group` 0) the
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    /// The storage buffer or range (0 for the model's single address space).
    pub group: u64,
    /// The offset in it (the address, for the model).
    pub start: u64,
}

/// A live block at the peak, or the part of one inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedBlock {
    /// The allocation's dense id in the trace.
    pub id: u32,
    /// Where the block starts.
    pub place: Place,
    /// The block's bytes inside the segment (with rounding).
    pub size: u64,
    /// The bytes its request asked for (the trace's size; the part inside the segment
    /// when a block spans several).
    pub requested: u64,
}

/// One reserved segment at the peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedSegment {
    /// Where it starts.
    pub place: Place,
    /// Its bytes reserved from the device.
    pub size: u64,
    /// The bytes of its live blocks. Invariant: `live <= size`.
    pub live: u64,
    /// The bytes those blocks' requests asked for. Invariant: `requested <= live`.
    pub requested: u64,
    /// The live blocks inside it, by place.
    pub blocks: Vec<PinnedBlock>,
}

impl ReservedSegment {
    /// Bytes of the segment no live block holds (`size - live`; 0 where the blocks
    /// given to [`AtPeak::build`] overlap past its size).
    pub fn free(&self) -> u64 {
        self.size.saturating_sub(self.live)
    }
}

/// The address space of a replay at its peak of reserved bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AtPeak {
    /// The event that first reached the peak (its index in the trace).
    pub event: usize,
    /// Bytes reserved: the sum of the segments' sizes.
    pub reserved: u64,
    /// The segments, by place.
    pub segments: Vec<ReservedSegment>,
    /// Free bytes inside segments that hold a live block.
    pub free_in_pinned: u64,
    /// Bytes of live blocks beyond their requests.
    pub rounding: u64,
    /// Bytes of segments without a live block.
    pub idle: u64,
    /// Bytes the live requests asked for.
    pub requested: u64,
}

impl AtPeak {
    /// The view of `segments` holding `blocks` (`(id, place, size, requested)`) at
    /// `event`. A block is counted in every segment of its group that it overlaps, for
    /// the bytes of the overlap (a block of a virtual pool may span mapped runs).
    /// Input no replay makes (blocks that overlap each other, sizes that add up past
    /// 64 bits) gives saturated figures, never a panic.
    pub fn build(
        event: usize,
        mut segments: Vec<(Place, u64)>,
        mut blocks: Vec<(u32, Place, u64, u64)>,
    ) -> AtPeak {
        segments.sort_unstable();
        blocks.sort_unstable_by_key(|&(_, place, _, _)| place);
        let mut out: Vec<ReservedSegment> = segments
            .iter()
            .map(|&(place, size)| ReservedSegment {
                place,
                size,
                live: 0,
                requested: 0,
                blocks: Vec::new(),
            })
            .collect();
        for (id, place, size, requested) in blocks {
            let end = place.start.saturating_add(size);
            // The first segment of the group that ends after the block starts.
            let first = out.partition_point(|s| {
                (s.place.group, s.place.start.saturating_add(s.size)) <= (place.group, place.start)
            });
            let mut requested_left = requested;
            for segment in out[first..].iter_mut() {
                if segment.place.group != place.group || segment.place.start >= end {
                    break;
                }
                let from = segment.place.start.max(place.start);
                let to = end.min(segment.place.start.saturating_add(segment.size));
                let inside = to.saturating_sub(from);
                let asked = requested_left.min(inside);
                requested_left -= asked;
                segment.live = segment.live.saturating_add(inside);
                segment.requested = segment.requested.saturating_add(asked);
                segment.blocks.push(PinnedBlock {
                    id,
                    place: Place {
                        group: place.group,
                        start: from,
                    },
                    size: inside,
                    requested: asked,
                });
            }
        }
        let mut view = AtPeak {
            event,
            ..AtPeak::default()
        };
        for segment in &out {
            view.reserved = view.reserved.saturating_add(segment.size);
            view.requested = view.requested.saturating_add(segment.requested);
            if segment.blocks.is_empty() {
                view.idle = view.idle.saturating_add(segment.size);
            } else {
                view.free_in_pinned = view.free_in_pinned.saturating_add(segment.free());
                view.rounding = view
                    .rounding
                    .saturating_add(segment.live.saturating_sub(segment.requested));
            }
        }
        view.segments = out;
        view
    }

    /// Checks that the numbers add up: per segment, live + free = size, the blocks'
    /// bytes are its live bytes and requests never exceed blocks; in all, the segments'
    /// sizes are `reserved`, and reserved - requested = free in pinned segments +
    /// rounding + idle segments.
    pub fn check(&self) -> Result<(), String> {
        // Checked sums: a view built of inconsistent input (see `build`) is refused,
        // not overflowed.
        let past = |what: &str| format!("{what} pass 64 bits");
        let mut reserved = 0u64;
        for (index, segment) in self.segments.iter().enumerate() {
            let sum = |bytes: fn(&PinnedBlock) -> u64| {
                segment
                    .blocks
                    .iter()
                    .try_fold(0u64, |sum, block| sum.checked_add(bytes(block)))
                    .ok_or_else(|| past(&format!("segment {index}: its blocks' bytes")))
            };
            let (live, requested) = (sum(|b| b.size)?, sum(|b| b.requested)?);
            if live != segment.live || requested != segment.requested {
                return Err(format!(
                    "segment {index}: its blocks do not add up to its live bytes"
                ));
            }
            if segment.live > segment.size || segment.requested > segment.live {
                return Err(format!(
                    "segment {index}: {} live bytes of {} requested in {} bytes",
                    segment.live, segment.requested, segment.size
                ));
            }
            reserved = reserved
                .checked_add(segment.size)
                .ok_or_else(|| past("the segments' bytes"))?;
        }
        if reserved != self.reserved {
            return Err(format!(
                "the segments hold {reserved} bytes, the view says {}",
                self.reserved
            ));
        }
        let gap = self.reserved.checked_sub(self.requested);
        let parts = self
            .free_in_pinned
            .checked_add(self.rounding)
            .and_then(|sum| sum.checked_add(self.idle));
        if gap.is_none() || gap != parts {
            return Err("reserved - requested is not free + rounding + idle".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(group: u64, start: u64) -> Place {
        Place { group, start }
    }

    #[test]
    fn blocks_pin_their_segments_and_the_gap_adds_up() {
        // Two buffers of 100 bytes: the first holds blocks of 30 (asked 25) and 20 (asked
        // 20); the second is idle. A range with runs of 50 at 0 and 50 at 50 holds a block
        // of 80 (asked 70) across both runs.
        let view = AtPeak::build(
            7,
            vec![
                (at(1, 0), 100),
                (at(2, 0), 100),
                (at(3, 50), 50),
                (at(3, 0), 50),
            ],
            vec![
                (4, at(3, 10), 80, 70),
                (0, at(1, 0), 30, 25),
                (1, at(1, 40), 20, 20),
            ],
        );
        view.check().unwrap();
        assert_eq!(view.reserved, 300);
        assert_eq!(view.requested, 115);
        assert_eq!(view.idle, 100);
        assert_eq!(view.rounding, 5 + 10);
        assert_eq!(view.free_in_pinned, 50 + 20);
        let lives: Vec<(u64, u64)> = view.segments.iter().map(|s| (s.live, s.free())).collect();
        assert_eq!(lives, [(50, 50), (0, 100), (40, 10), (40, 10)]);
        assert_eq!(view.segments[2].blocks[0].requested, 40);
        assert_eq!(view.segments[3].blocks[0].requested, 30);
    }
}
