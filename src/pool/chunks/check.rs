//! The invariant checks of the chunks against the live blocks.

use super::{Chunks, ARENAS};
use crate::pool::bins::{index_at, Link, SegmentIndex};
use crate::pool::ensure;
use crate::storage::RunMap;

impl Chunks {
    /// Checks the chunks against the live blocks of each arena (`blocks[a]`: offset
    /// and extent of each): every granule a live block touches is mapped, each
    /// granule's live count is the number of live blocks with an edge in it, each
    /// busy chunk's count is the number of its granules they touch, the table and
    /// the chunks agree, the idle spans hold whole chunks and exactly the chunks no
    /// block touches, each idle chunk is found in its span (by its hint or the
    /// index), and the byte counts are exact.
    pub(crate) fn check(&self, blocks: [&[(u64, u64)]; ARENAS]) -> Result<(), String> {
        // Per arena: each granule's count of blocks with an edge in it, and whether
        // it lies inside one.
        let mut inside: [Vec<bool>; ARENAS] = Default::default();
        for (arena, blocks) in blocks.iter().enumerate() {
            let table = &self.table[arena];
            let mut edges = vec![0u32; table.len()];
            inside[arena] = vec![false; table.len()];
            for &(offset, extent) in *blocks {
                let (first, end) = self.span(offset, extent);
                for g in first..end {
                    ensure(self.at(arena, g).is_some(), || {
                        format!("granule {g} of arena {arena} holds live bytes but is unmapped")
                    })?;
                    if g == first || g + 1 == end {
                        edges[g as usize] += 1;
                    } else {
                        inside[arena][g as usize] = true;
                    }
                }
            }
            ensure(table.chunk.len() == table.live.len(), || {
                format!("the table of arena {arena} has links and counts of different lengths")
            })?;
            for (g, (&live, &counted)) in table.live.iter().zip(&edges).enumerate() {
                ensure(live == counted, || {
                    format!(
                        "granule {g} of arena {arena} counts {live} live blocks, {counted} have \
                         an edge in it"
                    )
                })?;
            }
        }
        let members = self.check_spans()?;
        let (mut mapped, mut idle) = (0u64, 0u64);
        for (id, chunk) in self.chunks.iter() {
            let bytes = chunk.granules * self.granule;
            mapped += bytes;
            ensure(chunk.granules > 0, || "empty chunk".into())?;
            let mut busy = 0u64;
            let table = &self.table[chunk.arena];
            for g in chunk.start..chunk.start + chunk.granules {
                ensure(
                    self.at(chunk.arena, g).get().map(|index| index.get()) == Some(id.index),
                    || format!("granule {g} of a chunk is not mapped to it"),
                )?;
                let inside = inside[chunk.arena].get(g as usize) == Some(&true);
                busy +=
                    u64::from(inside || table.live.get(g as usize).is_some_and(|&live| live > 0));
            }
            let member = members.get(&id.index).copied();
            let unlisted = self.unlisted == Link::to(index_at(id.index));
            ensure(!(unlisted && member.is_some()), || {
                format!("the unlisted chunk at granule {} is listed", chunk.start)
            })?;
            if member.is_some() || unlisted {
                idle += bytes;
            }
            let expected = if member.is_some() || unlisted {
                chunk.granules
            } else {
                busy
            };
            ensure(
                (busy == 0) == (member.is_some() || unlisted) && chunk.busy == expected,
                || {
                    format!(
                        "chunk at granule {} counts {} busy granules, live blocks touch {busy}, \
                         idle: {}",
                        chunk.start,
                        chunk.busy,
                        member.is_some()
                    )
                },
            )?;
            ensure(self.span_of(index_at(id.index)) == member, || {
                format!(
                    "chunk at granule {} is not found in its idle span",
                    chunk.start
                )
            })?;
        }
        for (arena, table) in self.table.iter().enumerate() {
            for (g, &link) in table.chunk.iter().enumerate() {
                if link.is_some() {
                    let chunk = self
                        .chunks
                        .linked(link)
                        .ok_or_else(|| format!("granule {g} names a dead chunk"))?;
                    ensure(
                        chunk.arena == arena
                            && chunk.start <= g as u64
                            && (g as u64) < chunk.start + chunk.granules,
                        || format!("granule {g} of arena {arena} names a chunk not over it"),
                    )?;
                }
            }
        }
        let unlisted = self
            .chunks
            .linked(self.unlisted)
            .map_or(0, |chunk| chunk.granules * self.granule);
        ensure(self.unlisted.is_none() || unlisted > 0, || {
            "the unlisted chunk is dead".into()
        })?;
        let listed: u64 = members
            .keys()
            .filter_map(|&index| self.chunks.at(index))
            .map(|chunk| chunk.granules * self.granule)
            .sum::<u64>()
            + unlisted;
        ensure(listed == idle && idle == self.idle_bytes, || {
            format!(
                "idle bytes drifted: {} counted, {idle} idle, {listed} listed",
                self.idle_bytes
            )
        })?;
        ensure(mapped == self.mapped_bytes, || {
            format!(
                "mapped bytes drifted: {} counted, chunks hold {mapped}",
                self.mapped_bytes
            )
        })
    }

    /// Checks the idle list (each span listed once, holding whole chunks from its
    /// start to its end), that spans do not overlap, and that exactly the indexed
    /// ones are found by start; returns the span holding each idle chunk, by the
    /// chunk's index.
    fn check_spans(&self) -> Result<std::collections::HashMap<u32, SegmentIndex>, String> {
        let mut members = std::collections::HashMap::new();
        let mut bounds: [Vec<(u64, u64)>; ARENAS] = Default::default();
        let (mut cursor, mut before, mut indexed) = (self.idle_head, Link::NONE, 0usize);
        while let Some(index) = cursor.get() {
            let span = self
                .chunks
                .linked(cursor)
                .ok_or("the idle list names a dead chunk")?;
            ensure(
                span.prev == before && span.start < span.span_end && span.arena < ARENAS,
                || "broken idle list".into(),
            )?;
            let found = self.span_starts[span.arena].get(span.start) == Some(index);
            ensure(found == span.indexed, || {
                format!(
                    "the idle span at granule {} is indexed: {}, found by start: {found}",
                    span.start, span.indexed
                )
            })?;
            indexed += usize::from(span.indexed);
            let mut largest = 0;
            let mut g = span.start;
            while g < span.span_end {
                let link = self.at(span.arena, g);
                let chunk = self
                    .chunks
                    .linked(link)
                    .ok_or_else(|| format!("idle span over unmapped granule {g}"))?;
                ensure(chunk.start == g, || {
                    format!("idle span splits the chunk at granule {}", chunk.start)
                })?;
                ensure(g == span.start || chunk.span_end == 0, || {
                    format!("the chunk at granule {g} heads a span inside another")
                })?;
                ensure(
                    members.insert(link.followed().get(), index).is_none(),
                    || "the idle list loops or spans overlap".into(),
                )?;
                largest = largest.max(chunk.granules);
                g += chunk.granules;
            }
            ensure(g == span.span_end, || {
                format!("idle span ends inside a chunk at granule {}", span.span_end)
            })?;
            ensure(
                largest <= span.span_largest && span.span_largest <= span.span_end - span.start,
                || {
                    format!(
                        "the idle span at granule {} bounds its largest chunk ({largest} \
                         granules) by {}",
                        span.start, span.span_largest
                    )
                },
            )?;
            bounds[span.arena].push((span.start, span.span_end));
            (before, cursor) = (cursor, span.next);
        }
        ensure(before == self.idle_tail, || {
            "the idle list's tail is wrong".into()
        })?;
        let listed: usize = bounds.iter().map(Vec::len).sum();
        ensure(
            listed
                == self
                    .chunks
                    .iter()
                    .filter(|(_, chunk)| chunk.span_end > 0)
                    .count()
                && indexed == self.span_starts.iter().map(RunMap::len).sum::<usize>(),
            || "idle spans drifted from the list".into(),
        )?;
        for bounds in &mut bounds {
            bounds.sort_unstable();
            ensure(bounds.windows(2).all(|pair| pair[0].1 <= pair[1].0), || {
                "idle spans overlap".into()
            })?;
        }
        Ok(members)
    }
}
