//! Exact search for small, hard inputs: branch and bound over canonical placements,
//! after the ideas of MiniMalloc (Moffitt, ASPLOS '23); our own code.
//!
//! The search answers one question: do the buffers fit in `capacity`? Its ideas:
//!
//! 1. **Canonical placements only.** Some optimal placement has every buffer on the
//!    floor or on top of a buffer live at the same time ("gravity"). Taken in order
//!    of (offset, preorder rank), such a placement puts each buffer at the top of the
//!    buffers already placed under it, its *minimum offset*. So a node branches on
//!    which unplaced buffer goes next, at its minimum offset, and only buffers at or
//!    after the last (offset, rank) placed are tried.
//! 2. **Sections.** Time is cut into sections at every lower and upper. A section's
//!    *floor* is where its next buffer can go at the lowest; its *total* is the bytes
//!    of its unplaced buffers. A node whose floor (raised to the offset just used,
//!    the *monotonic floor*) plus total passes the capacity in any section is cut.
//!    A section's floor also rises to the lowest minimum offset of its unplaced
//!    buffers.
//! 3. **Dominance.** A buffer is not placed at or above the top that another unplaced
//!    buffer would reach at its minimum offset: that one would fit below, so the
//!    placement with it first is as good and is tried on another branch.
//! 4. **Hatless pruning.** A buffer with no unplaced buffer live beside it constrains
//!    no one; if the branch placing it fails, no sibling branch can succeed.
//! 5. **Decomposition.** Once no unplaced buffer spans a section boundary, the two
//!    sides are independent problems, solved one after the other.
//! 6. **Restarts.** The search runs under a node limit with each of three static
//!    orders in turn, doubling the limit each round, so one unlucky order cannot
//!    stall it; only a search that ends within its limit proves that nothing fits.

use super::index::TimeIndex;
use super::problem::{Buffer, Problem};
use super::Deadline;

/// The answer of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Offsets for every buffer of the problem, all within the capacity.
    Fits(Vec<u64>),
    /// No placement fits: every canonical placement was explored.
    DoesNotFit,
    /// The deadline passed first.
    TimedOut,
}

/// How a (sub)search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Found,
    NotFound,
    NodeLimit,
    TimedOut,
}

/// Static orders tried in turn: letters name keys compared largest first.
/// `W` lifetime, `A` size times lifetime, `T` the most unplaced bytes in one of the
/// buffer's sections (MiniMalloc's default three).
const PREORDERS: [&[u8]; 3] = [b"WAT", b"TAW", b"TWA"];

/// Whether `problem` fits within `capacity`, by exact search until `deadline`.
pub(crate) fn decide(problem: &Problem, capacity: u64, deadline: Deadline<'_>) -> Decision {
    if problem.lower_bound() > capacity {
        return Decision::DoesNotFit;
    }
    let all = problem.buffers();
    // Buffers of no bytes sit at offset 0 and take no part.
    let active: Vec<u32> = (0..all.len() as u32)
        .filter(|&i| all[i as usize].size > 0)
        .collect();
    if active.is_empty() {
        return Decision::Fits(vec![0; all.len()]);
    }
    let buffers: Vec<Buffer> = active.iter().map(|&i| all[i as usize]).collect();
    let Some(mut search) = Search::new(&buffers, capacity, deadline) else {
        return Decision::TimedOut;
    };
    let found = on_deep_stack(buffers.len(), || search.run());
    match found {
        Outcome::Found => {
            let mut offsets = vec![0u64; all.len()];
            for (k, &i) in active.iter().enumerate() {
                offsets[i as usize] = search.solution[k];
            }
            Decision::Fits(offsets)
        }
        Outcome::NotFound => Decision::DoesNotFit,
        Outcome::TimedOut | Outcome::NodeLimit => Decision::TimedOut,
    }
}

/// The most buffers a search runs on its caller's stack: the search recurses a level
/// per buffer placed (`search`, `decompose`), some hundreds of bytes a level, and a
/// caller's thread may have a small stack (a 1 MiB thread stack overflowed at 2,000
/// buffers: SIGSEGV).
const CALLER_STACK_BUFFERS: usize = 128;

/// The stack a larger search runs on: 64 MiB, sixteen times what the deepest search
/// [`super::SEARCH_MAX_BUFFERS`] allows takes; only the pages it touches are used.
const SEARCH_STACK_BYTES: usize = 64 << 20;

/// `run()` on a thread of its own with a stack of [`SEARCH_STACK_BYTES`] where the
/// search has more than [`CALLER_STACK_BUFFERS`] buffers, else on the caller's (and
/// on the caller's where no thread can be made: out of threads, a search still runs).
fn on_deep_stack(buffers: usize, run: impl FnOnce() -> Outcome + Send) -> Outcome {
    if buffers <= CALLER_STACK_BUFFERS {
        return run();
    }
    let mut run = Some(run);
    let outcome = std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("cubepool-place".into())
            .stack_size(SEARCH_STACK_BYTES)
            .spawn_scoped(scope, || run.take().map(|run| run()));
        // A panic of the search's (never seen) goes on in the caller, as it would have
        // on its own stack.
        spawned.ok().map(|thread| {
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    });
    match (outcome.flatten(), run) {
        (Some(outcome), _) => outcome,
        // No thread was made (the closure is still here): run it here.
        (None, Some(run)) => run(),
        // A thread that took the closure returned what it ran to: not met.
        (None, None) => Outcome::TimedOut,
    }
}

/// Buffers in one range of sections, solved as a problem of its own.
struct Partition {
    buffers: Vec<u32>,
    /// First section.
    lo: u32,
    /// One past the last section.
    hi: u32,
}

/// The search's state.
///
/// Invariants (between calls of `search`): `offset[b]` is `Some` exactly for placed
/// buffers; `min_offset[b]` of an unplaced buffer is the highest top of the placed
/// buffers live beside it (or 0); `total[s]` is the sum of the sizes of the unplaced
/// buffers in section `s`; `cuts[s]` is the number of unplaced buffers in both
/// sections `s` and `s + 1`; `floor[s]` is at most the minimum offset of every
/// unplaced buffer of section `s`.
struct Search<'a> {
    size: Vec<u64>,
    width: Vec<u64>,
    /// Each buffer's sections, `[first, last)`.
    span: Vec<(u32, u32)>,
    overlaps: Vec<Vec<u32>>,
    section_buffers: Vec<Vec<u32>>,
    capacity: u64,
    deadline: Deadline<'a>,
    offset: Vec<Option<u64>>,
    min_offset: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    solution: Vec<u64>,
    nodes_left: u64,
    nodes: u64,
    preorder: &'static [u8],
    /// Per section, the last `stamp` that listed it as affected: a section is listed
    /// once per placement without sorting the list (a sort of every affected
    /// section, repeated per overlapping buffer, was most of a node's time).
    mark: Vec<u64>,
    stamp: u64,
    /// The sections affected by one placement, reused: it is not needed once the
    /// floors are raised, so no level of the recursion holds one.
    affected: Vec<u32>,
    /// Undo stacks shared by every level: each level pushes its changes, then pops
    /// back to where it started (one growing buffer instead of two per node).
    offset_undo: Vec<(u32, u64)>,
    floor_undo: Vec<(u32, u64)>,
    /// A node's unplaced buffers keyed for sorting, reused by every node.
    keyed: Vec<(u64, u32)>,
}

impl<'a> Search<'a> {
    /// The search's state, or `None` when `deadline` passes while it is built (its
    /// lists hold every overlapping pair and every buffer's sections: some 0.1 s and
    /// 200 MB for 4,000 buffers each overlapping 6,000).
    fn new(buffers: &[Buffer], capacity: u64, deadline: Deadline<'a>) -> Option<Self> {
        // Looks at the clock every this many buffers.
        const STRIDE: usize = 64;
        let passed = |i: usize| i % STRIDE == STRIDE - 1 && deadline.passed();
        let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.lower, b.upper]).collect();
        times.sort_unstable();
        times.dedup();
        let sections = times.len() - 1;
        let slot = |t: u64| times.partition_point(|&x| x < t) as u32;
        let span: Vec<(u32, u32)> = buffers
            .iter()
            .map(|b| (slot(b.lower), slot(b.upper)))
            .collect();
        let index = TimeIndex::new(buffers);
        let mut overlaps = Vec::with_capacity(buffers.len());
        for (i, b) in buffers.iter().enumerate() {
            if passed(i) {
                return None;
            }
            let mut list = Vec::new();
            index.each_overlap(i as u32, b, |o| list.push(o));
            overlaps.push(list);
        }
        let mut section_buffers = vec![Vec::new(); sections];
        let mut total = vec![0u64; sections];
        let mut cuts = vec![0u32; sections];
        for (i, &(lo, hi)) in span.iter().enumerate() {
            if passed(i) {
                return None;
            }
            for s in lo..hi {
                section_buffers[s as usize].push(i as u32);
                total[s as usize] += buffers[i].size;
            }
            for s in lo..hi - 1 {
                cuts[s as usize] += 1;
            }
        }
        Some(Self {
            size: buffers.iter().map(|b| b.size).collect(),
            width: buffers.iter().map(|b| b.upper - b.lower).collect(),
            span,
            overlaps,
            section_buffers,
            capacity,
            deadline,
            offset: vec![None; buffers.len()],
            min_offset: vec![0; buffers.len()],
            floor: vec![0; sections],
            total,
            cuts,
            solution: vec![0; buffers.len()],
            nodes_left: 0,
            nodes: 0,
            preorder: PREORDERS[0],
            mark: vec![0; sections],
            stamp: 0,
            affected: Vec::new(),
            offset_undo: Vec::new(),
            floor_undo: Vec::new(),
            keyed: Vec::new(),
        })
    }

    /// Round-robin restarts over the preorders with a doubling node limit.
    fn run(&mut self) -> Outcome {
        let sections = self.floor.len() as u32;
        // The first partitions: split where no buffer spans a boundary.
        let mut partitions = Vec::new();
        let mut lo = 0u32;
        for s in 0..sections {
            if s + 1 == sections || self.cuts[s as usize] == 0 {
                let buffers = (0..self.size.len() as u32)
                    .filter(|&b| self.span[b as usize].0 >= lo && self.span[b as usize].0 <= s)
                    .collect::<Vec<_>>();
                if !buffers.is_empty() {
                    partitions.push(Partition {
                        buffers,
                        lo,
                        hi: s + 1,
                    });
                }
                lo = s + 1;
            }
        }
        let mut limit = self.size.len() as u64;
        loop {
            limit = limit.saturating_mul(2);
            for preorder in PREORDERS {
                self.preorder = preorder;
                self.nodes_left = limit;
                let mut outcome = Outcome::Found;
                for partition in &partitions {
                    outcome = self.solve(partition);
                    if outcome != Outcome::Found {
                        break;
                    }
                }
                match outcome {
                    Outcome::NodeLimit => continue,
                    other => return other,
                }
            }
        }
    }

    /// Solves one partition from its current state, in the current preorder.
    fn solve(&mut self, partition: &Partition) -> Outcome {
        let mut keys: Vec<([u128; 3], u32)> = partition
            .buffers
            .iter()
            .map(|&b| {
                let (lo, hi) = self.span[b as usize];
                let total = (lo..hi).map(|s| self.total[s as usize]).max().unwrap_or(0);
                let width = self.width[b as usize] as u128;
                let mut key = [0u128; 3];
                for (k, letter) in self.preorder.iter().enumerate() {
                    key[k] = match letter {
                        b'W' => width,
                        b'A' => width * self.size[b as usize] as u128,
                        _ => total as u128,
                    };
                }
                (key, b)
            })
            .collect();
        keys.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let preorder: Vec<u32> = keys.into_iter().map(|(_, b)| b).collect();
        let ordering: Vec<u32> = (0..preorder.len() as u32).collect();
        self.search(partition, &preorder, &ordering, (0, 0))
    }

    /// One node: tries each unplaced buffer, at its minimum offset, in order of that
    /// offset, that canonical order and dominance allow after `last` (offset, rank).
    fn search(
        &mut self,
        partition: &Partition,
        preorder: &[u32],
        previous: &[u32],
        last: (u64, u32),
    ) -> Outcome {
        if self.nodes_left == 0 {
            return Outcome::NodeLimit;
        }
        self.nodes_left -= 1;
        self.nodes += 1;
        // Every node: a node of a large input scans many sections, so a clock read is
        // small beside it, and a coarser check let a 1 s limit run for 12 s.
        if self.deadline.passed() {
            return Outcome::TimedOut;
        }
        // The unplaced buffers by (minimum offset, rank), sorted in a reused buffer;
        // the level keeps only the ranks (its children re-read the offsets), so the
        // recursion holds 4 bytes per unplaced buffer and level, not 16.
        let mut keyed = std::mem::take(&mut self.keyed);
        keyed.clear();
        keyed.extend(
            previous
                .iter()
                .filter(|&&p| self.offset[preorder[p as usize] as usize].is_none())
                .map(|&p| (self.min_offset[preorder[p as usize] as usize], p)),
        );
        if keyed.is_empty() {
            self.keyed = keyed;
            return Outcome::Found;
        }
        keyed.sort_unstable();
        let min_top = keyed
            .iter()
            .map(|&(offset, p)| offset + self.size[preorder[p as usize] as usize])
            .min()
            .unwrap_or(u64::MAX);
        let ordering: Vec<u32> = keyed.iter().map(|&(_, p)| p).collect();
        self.keyed = keyed;
        for &p in &ordering {
            // Unplaced buffers' minimum offsets are as sorted: each branch below
            // restores what it changed before the next one.
            let offset = self.min_offset[preorder[p as usize] as usize];
            if (offset, p) < last || offset >= min_top {
                continue;
            }
            // Every candidate, not only every node: a node of thousands of buffers
            // tries hundreds, each raising its neighbours' offsets over their sections,
            // and a 1 s limit ran 4.5 s between two nodes' checks. Nothing of this
            // candidate is changed yet.
            if self.deadline.passed() {
                return Outcome::TimedOut;
            }
            let b = preorder[p as usize] as usize;
            let top = offset + self.size[b];
            self.offset[b] = Some(offset);
            // Raise the minimum offsets of the unplaced buffers beside b.
            let mut hatless = true;
            let offset_mark = self.offset_undo.len();
            let floor_mark = self.floor_undo.len();
            let mut affected = std::mem::take(&mut self.affected);
            affected.clear();
            self.stamp += 1;
            for k in 0..self.overlaps[b].len() {
                let o = self.overlaps[b][k] as usize;
                if self.offset[o].is_some() {
                    continue;
                }
                hatless = false;
                if self.min_offset[o] >= top {
                    continue;
                }
                self.offset_undo.push((o as u32, self.min_offset[o]));
                self.min_offset[o] = top;
                let (lo, hi) = self.span[o];
                for s in lo..hi {
                    if self.mark[s as usize] != self.stamp {
                        self.mark[s as usize] = self.stamp;
                        affected.push(s);
                    }
                }
            }
            // b's sections: their floor is b's top, their total loses b.
            let (lo, hi) = self.span[b];
            for s in lo..hi {
                self.floor_undo.push((s, self.floor[s as usize]));
                self.floor[s as usize] = top;
                self.total[s as usize] -= self.size[b];
            }
            for &s in &affected {
                let lowest = self.section_buffers[s as usize]
                    .iter()
                    .filter(|&&o| self.offset[o as usize].is_none())
                    .map(|&o| self.min_offset[o as usize])
                    .min();
                if let Some(lowest) = lowest {
                    if self.floor[s as usize] < lowest {
                        self.floor_undo.push((s, self.floor[s as usize]));
                        self.floor[s as usize] = lowest;
                    }
                }
            }
            self.affected = affected;
            let outcome = if self.room_left(partition, offset) {
                self.solution[b] = offset;
                self.decompose(partition, preorder, &ordering, (offset, p), b)
            } else {
                Outcome::NotFound
            };
            while self.floor_undo.len() > floor_mark {
                let (s, floor) = self.floor_undo.pop().unwrap_or_default();
                self.floor[s as usize] = floor;
            }
            for s in lo..hi {
                self.total[s as usize] += self.size[b];
            }
            while self.offset_undo.len() > offset_mark {
                let (o, min_offset) = self.offset_undo.pop().unwrap_or_default();
                self.min_offset[o as usize] = min_offset;
            }
            self.offset[b] = None;
            if outcome != Outcome::NotFound {
                return outcome;
            }
            if hatless {
                break;
            }
        }
        Outcome::NotFound
    }

    /// Whether every section of the partition can still take its unplaced bytes above
    /// its floor, raised to `offset` (nothing goes below it from here on).
    fn room_left(&self, partition: &Partition, offset: u64) -> bool {
        (partition.lo..partition.hi).all(|s| {
            let s = s as usize;
            self.floor[s].max(offset) + self.total[s] <= self.capacity
        })
    }

    /// Goes on after placing `b`: in the same partition, or, where `b` was the last
    /// buffer across some section boundaries, in each independent part in turn.
    fn decompose(
        &mut self,
        partition: &Partition,
        preorder: &[u32],
        ordering: &[u32],
        last: (u64, u32),
        b: usize,
    ) -> Outcome {
        let (lo, hi) = self.span[b];
        let mut cutpoints = vec![partition.lo];
        for s in lo..hi - 1 {
            self.cuts[s as usize] -= 1;
            if self.cuts[s as usize] == 0 {
                cutpoints.push(s + 1);
            }
        }
        let outcome = if cutpoints.len() == 1 {
            self.search(partition, preorder, ordering, last)
        } else {
            cutpoints.push(partition.hi);
            let mut outcome = Outcome::Found;
            for range in cutpoints.windows(2) {
                let (part_lo, part_hi) = (range[0], range[1]);
                let buffers: Vec<u32> = partition
                    .buffers
                    .iter()
                    .copied()
                    .filter(|&o| {
                        let (o_lo, o_hi) = self.span[o as usize];
                        self.offset[o as usize].is_none() && o_lo < part_hi && part_lo < o_hi
                    })
                    .collect();
                if buffers.is_empty() {
                    continue;
                }
                let sub = Partition {
                    buffers,
                    lo: part_lo,
                    hi: part_hi,
                };
                outcome = self.solve(&sub);
                if outcome != Outcome::Found {
                    break;
                }
            }
            outcome
        };
        for s in lo..hi - 1 {
            self.cuts[s as usize] += 1;
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The setup (every overlapping pair: some 0.1 s and 200 MB for a dense input of
    /// 4,000 buffers each overlapping 5,998 others) stops at a passed deadline, before
    /// it lists them all; with time it is built. (How long a limit is kept is measured,
    /// not tested: timing thresholds stay out of tests.)
    #[test]
    fn a_passed_deadline_stops_the_setup() {
        let buffers: Vec<Buffer> = (0..4_000u64)
            .map(|k| Buffer {
                lower: k,
                upper: k + 3_000,
                size: 1 + k % 4_096,
            })
            .collect();
        assert!(Search::new(&buffers, u64::MAX, Deadline::new(Instant::now(), None)).is_none());
        let later = Deadline::new(Instant::now() + std::time::Duration::from_secs(3_600), None);
        assert!(Search::new(&buffers[..200], u64::MAX, later).is_some());
    }
}
