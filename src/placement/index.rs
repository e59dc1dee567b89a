//! Which buffers live at the same time as a given one, without a list of all pairs.
//!
//! A buffer overlapping `[lower, upper)` either is live at `lower` (found by a stabbing
//! query on a segment tree over the distinct times) or starts inside `(lower, upper)`
//! (a range of the buffers sorted by lower). Each is reported once; the cost of a query
//! is its answer plus a logarithm.

use super::problem::Buffer;

/// A time index of a fixed set of buffers.
///
/// Invariants: `times` is sorted and distinct and holds every lower and upper;
/// `node_start` has `2 * times.len() + 1` entries, non-decreasing, and the ids of node
/// `k` are `node_ids[node_start[k]..node_start[k + 1]]`, each a buffer whose span of
/// time indices covers the node's whole range; `by_lower` lists every buffer sorted by
/// lower, and `lowers[i]` is the lower of `by_lower[i]`.
pub(crate) struct TimeIndex {
    times: Vec<u64>,
    node_start: Vec<u32>,
    node_ids: Vec<u32>,
    by_lower: Vec<u32>,
    lowers: Vec<u64>,
}

impl TimeIndex {
    /// Builds the index of `buffers` (each with `lower < upper`).
    pub(crate) fn new(buffers: &[Buffer]) -> Self {
        let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.lower, b.upper]).collect();
        times.sort_unstable();
        times.dedup();
        let m = times.len();
        let slot = |t: u64| times.partition_point(|&x| x < t);
        let spans: Vec<(usize, usize)> = buffers
            .iter()
            .map(|b| (slot(b.lower), slot(b.upper)))
            .collect();
        // Two passes over the canonical nodes of each span: count, then fill.
        let mut counts = vec![0u32; 2 * m + 1];
        let each_node = |(lo, hi): (usize, usize), visit: &mut dyn FnMut(usize)| {
            let (mut l, mut r) = (lo + m, hi + m);
            while l < r {
                if l & 1 == 1 {
                    visit(l);
                    l += 1;
                }
                if r & 1 == 1 {
                    r -= 1;
                    visit(r);
                }
                l >>= 1;
                r >>= 1;
            }
        };
        for &span in &spans {
            each_node(span, &mut |node| counts[node] += 1);
        }
        let mut node_start = vec![0u32; 2 * m + 1];
        let mut sum = 0u32;
        for (node, count) in counts.iter().enumerate() {
            node_start[node] = sum;
            sum += count;
        }
        node_start[2 * m] = sum;
        let mut fill = node_start.clone();
        let mut node_ids = vec![0u32; sum as usize];
        for (id, &span) in spans.iter().enumerate() {
            each_node(span, &mut |node| {
                node_ids[fill[node] as usize] = id as u32;
                fill[node] += 1;
            });
        }
        let mut by_lower: Vec<u32> = (0..buffers.len() as u32).collect();
        by_lower.sort_unstable_by_key(|&i| buffers[i as usize].lower);
        let lowers = by_lower
            .iter()
            .map(|&i| buffers[i as usize].lower)
            .collect();
        Self {
            times,
            node_start,
            node_ids,
            by_lower,
            lowers,
        }
    }

    /// Calls `visit` once with each buffer other than `id` whose lifetime intersects
    /// that of `buffer` (buffer number `id` of the indexed set).
    pub(crate) fn each_overlap(&self, id: u32, buffer: &Buffer, mut visit: impl FnMut(u32)) {
        let m = self.times.len();
        // Live at `lower`: the nodes from the leaf of `lower` up to the root.
        let mut node = self.times.partition_point(|&x| x < buffer.lower) + m;
        while node >= 1 {
            let ids =
                &self.node_ids[self.node_start[node] as usize..self.node_start[node + 1] as usize];
            for &other in ids {
                if other != id {
                    visit(other);
                }
            }
            node >>= 1;
        }
        // Starting strictly inside the lifetime.
        let first = self.lowers.partition_point(|&x| x <= buffer.lower);
        let last = self.lowers.partition_point(|&x| x < buffer.upper);
        for &other in &self.by_lower[first..last.max(first)] {
            visit(other);
        }
    }
}

/// The number of pairs of buffers whose lifetimes intersect, by a sweep.
pub(crate) fn overlapping_pairs(buffers: &[Buffer]) -> u64 {
    let mut events: Vec<(u64, bool)> = Vec::with_capacity(buffers.len() * 2);
    for buffer in buffers {
        events.push((buffer.lower, true));
        events.push((buffer.upper, false));
    }
    events.sort_unstable();
    let (mut live, mut pairs) = (0u64, 0u64);
    for (_, starts) in events {
        if starts {
            pairs += live;
            live += 1;
        } else {
            live -= 1;
        }
    }
    pairs
}
