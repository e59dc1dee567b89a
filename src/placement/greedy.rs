//! Fast placers for inputs of any size: greedy placement in a chosen order with
//! best-fit offsets, an allocator-like sweep in time order, and a local search that
//! reorders the buffers that set the height.

use std::collections::BTreeSet;
use std::time::Instant;

use super::index::TimeIndex;
use super::problem::{Buffer, Problem};
use super::Deadline;

/// A placement a heuristic made: an offset per buffer and the height.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) offsets: Vec<u64>,
    pub(crate) height: u64,
}

/// The order in which a greedy placer takes the buffers (largest first for each key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// By size, then by lifetime (TFLite's greedy by size).
    Size,
    /// By size times lifetime.
    Area,
    /// By lifetime, then by size.
    Lifetime,
    /// By the bytes live at the busiest time of the buffer's lifetime, then by size:
    /// the buffers in the most contested places first.
    Conflict,
}

/// The orders tried, best first on the inputs measured.
pub(crate) const ORDERS: [Order; 4] = [Order::Size, Order::Conflict, Order::Area, Order::Lifetime];

/// The buffers' indices in `order`.
pub(crate) fn ordered(problem: &Problem, order: Order) -> Vec<u32> {
    let buffers = problem.buffers();
    let mut ids: Vec<u32> = (0..buffers.len() as u32).collect();
    let width = |b: &Buffer| b.upper - b.lower;
    match order {
        Order::Size => ids.sort_by_key(|&i| {
            let b = &buffers[i as usize];
            (std::cmp::Reverse(b.size), std::cmp::Reverse(width(b)), i)
        }),
        Order::Area => ids.sort_by_key(|&i| {
            let b = &buffers[i as usize];
            (
                std::cmp::Reverse(b.size as u128 * width(b) as u128),
                std::cmp::Reverse(b.size),
                i,
            )
        }),
        Order::Lifetime => ids.sort_by_key(|&i| {
            let b = &buffers[i as usize];
            (std::cmp::Reverse(width(b)), std::cmp::Reverse(b.size), i)
        }),
        Order::Conflict => {
            let contest = busiest_live(buffers);
            ids.sort_by_key(|&i| {
                let b = &buffers[i as usize];
                (
                    std::cmp::Reverse(contest[i as usize]),
                    std::cmp::Reverse(b.size),
                    i,
                )
            })
        }
    }
    ids
}

/// For each buffer, the most bytes live at one time within its lifetime.
fn busiest_live(buffers: &[Buffer]) -> Vec<u64> {
    let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.lower, b.upper]).collect();
    times.sort_unstable();
    times.dedup();
    let slot = |t: u64| times.partition_point(|&x| x < t);
    // Live bytes per section [times[k], times[k + 1]) by a difference array.
    let mut delta = vec![0i128; times.len() + 1];
    for b in buffers {
        delta[slot(b.lower)] += b.size as i128;
        delta[slot(b.upper)] -= b.size as i128;
    }
    let mut live = Vec::with_capacity(times.len());
    let mut sum = 0i128;
    for d in &delta[..times.len()] {
        sum += d;
        live.push(sum as u64);
    }
    // The maximum over a buffer's sections, by a sparse table.
    let mut table = vec![live];
    let mut width = 1;
    while 2 * width <= times.len() {
        let last = &table[table.len() - 1];
        let next: Vec<u64> = (0..last.len() - width)
            .map(|k| last[k].max(last[k + width]))
            .collect();
        table.push(next);
        width *= 2;
    }
    buffers
        .iter()
        .map(|b| {
            let (lo, hi) = (slot(b.lower), slot(b.upper));
            let level = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
            table[level][lo].max(table[level][hi - (1 << level)])
        })
        .collect()
}

/// Places the buffers in `order`, each at the smallest gap between the buffers already
/// placed and live at the same time that holds it (best fit), or above them all.
/// `None` when `deadline` passes first (checked every [`DEADLINE_STRIDE`] buffers).
pub(crate) fn place_in_order(
    problem: &Problem,
    index: &TimeIndex,
    order: &[u32],
    deadline: Option<Deadline<'_>>,
) -> Option<Layout> {
    let buffers = problem.buffers();
    let mut offsets: Vec<Option<u64>> = vec![None; buffers.len()];
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut height = 0u64;
    for (k, &id) in order.iter().enumerate() {
        if k % DEADLINE_STRIDE == DEADLINE_STRIDE - 1 && deadline.is_some_and(Deadline::passed) {
            return None;
        }
        let buffer = &buffers[id as usize];
        taken.clear();
        index.each_overlap(id, buffer, |other| {
            if let Some(offset) = offsets[other as usize] {
                let size = buffers[other as usize].size;
                if size > 0 {
                    taken.push((offset, offset + size));
                }
            }
        });
        let offset = if buffer.size == 0 {
            0
        } else {
            best_fit(&mut taken, buffer.size)
        };
        offsets[id as usize] = Some(offset);
        height = height.max(offset + buffer.size);
    }
    Some(Layout {
        offsets: offsets.into_iter().map(|o| o.unwrap_or(0)).collect(),
        height,
    })
}

/// How many buffers [`place_in_order`] places between two looks at the clock: on a
/// dense input a buffer may overlap thousands (4,000 buffers each overlapping 6,000
/// took some 40 us a buffer, so 1,024 of them ran 40 ms past a deadline); a look costs
/// some 25 ns.
const DEADLINE_STRIDE: usize = 64;

/// The offset of the smallest gap among `taken` ranges that holds `size` bytes, or the
/// top of them all.
fn best_fit(taken: &mut [(u64, u64)], size: u64) -> u64 {
    taken.sort_unstable();
    let mut cursor = 0u64;
    let mut best: Option<(u64, u64)> = None;
    for &(start, end) in taken.iter() {
        if start > cursor {
            let gap = start - cursor;
            if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, cursor));
            }
        }
        cursor = cursor.max(end);
    }
    best.map_or(cursor, |(_, offset)| offset)
}

/// Places the buffers in time order as a best-fit allocator would, with free gaps
/// kept by address and by size: `O(n log n)` whatever the overlap.
pub(crate) fn sweep(problem: &Problem) -> Layout {
    let buffers = problem.buffers();
    let mut events: Vec<(u64, bool, std::cmp::Reverse<u64>, u32)> =
        Vec::with_capacity(buffers.len() * 2);
    for (i, b) in buffers.iter().enumerate() {
        // Ends first at one time; among starts, the larger first.
        events.push((b.lower, true, std::cmp::Reverse(b.size), i as u32));
        events.push((b.upper, false, std::cmp::Reverse(b.size), i as u32));
    }
    events.sort_unstable();
    let mut gaps = FreeGaps::default();
    let mut offsets = vec![0u64; buffers.len()];
    let mut height = 0u64;
    for (_, starts, _, id) in events {
        let size = buffers[id as usize].size;
        if size == 0 {
            continue;
        }
        if starts {
            let offset = gaps.take(size);
            offsets[id as usize] = offset;
            height = height.max(offset + size);
        } else {
            gaps.give_back(offsets[id as usize], size);
        }
    }
    Layout { offsets, height }
}

/// Free address ranges below `top`, joined when adjacent; above `top` all is free.
///
/// Invariants: `by_start` and `by_size` hold the same gaps; no two gaps touch; every
/// gap ends below `top`.
#[derive(Default)]
struct FreeGaps {
    by_start: BTreeSet<(u64, u64)>,
    by_size: BTreeSet<(u64, u64)>,
    top: u64,
}

impl FreeGaps {
    fn take(&mut self, size: u64) -> u64 {
        if let Some(&(len, start)) = self.by_size.range((size, 0)..).next() {
            self.by_size.remove(&(len, start));
            self.by_start.remove(&(start, len));
            if len > size {
                self.insert(start + size, len - size);
            }
            return start;
        }
        let start = self.top;
        self.top += size;
        start
    }

    fn give_back(&mut self, mut start: u64, mut len: u64) {
        if let Some(&(s, l)) = self.by_start.range(..(start, 0)).next_back() {
            if s + l == start {
                self.remove(s, l);
                start = s;
                len += l;
            }
        }
        if let Some(&(s, l)) = self.by_start.range((start + len, 0)..).next() {
            if s == start + len {
                self.remove(s, l);
                len += l;
            }
        }
        if start + len == self.top {
            self.top = start;
        } else {
            self.insert(start, len);
        }
    }

    fn insert(&mut self, start: u64, len: u64) {
        self.by_start.insert((start, len));
        self.by_size.insert((len, start));
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&(start, len));
        self.by_size.remove(&(len, start));
    }
}

/// A small deterministic random source (xorshift64*), so runs repeat.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// Improves `order` (whose placement is `layout`) until `deadline` or `stop_at`
/// height: moves a buffer that reaches the height to a random earlier place in the
/// order and keeps the new order if its height is no higher. An iteration starts only
/// if the last one's time still fits before the deadline.
pub(crate) fn improve(
    problem: &Problem,
    index: &TimeIndex,
    mut order: Vec<u32>,
    mut layout: Layout,
    stop_at: u64,
    deadline: Deadline<'_>,
    max_iterations: usize,
) -> Layout {
    let buffers = problem.buffers();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut best = layout.clone();
    let mut position = vec![0usize; order.len()];
    let mut last = std::time::Duration::ZERO;
    for _ in 0..max_iterations {
        let now = Instant::now();
        if best.height <= stop_at || now + last >= deadline.instant() || deadline.stopped() {
            break;
        }
        for (p, &id) in order.iter().enumerate() {
            position[id as usize] = p;
        }
        let critical: Vec<u32> = order
            .iter()
            .copied()
            .filter(|&id| {
                let b = &buffers[id as usize];
                b.size > 0 && layout.offsets[id as usize] + b.size == layout.height
            })
            .collect();
        let Some(&moved) = critical.get(rng.below(critical.len())) else {
            break;
        };
        // Move the buffer earlier; one already first moves another buffer instead.
        let from = match position[moved as usize] {
            0 if order.len() > 1 => 1 + rng.below(order.len() - 1),
            0 => break,
            from => from,
        };
        let to = rng.below(from);
        order[to..=from].rotate_right(1);
        let Some(candidate) = place_in_order(problem, index, &order, Some(deadline)) else {
            break;
        };
        if candidate.height <= layout.height {
            layout = candidate;
            if layout.height < best.height {
                best = layout.clone();
            }
        } else {
            order[to..=from].rotate_left(1);
        }
        last = now.elapsed();
    }
    best
}
