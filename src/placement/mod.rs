//! Offline placement: the dynamic storage allocation problem.
//!
//! Given buffers with lifetimes `[lower, upper)` and sizes, give each an offset so that
//! no two buffers live at the same time share a byte, in as little height (largest
//! offset plus size) as possible. This is what a compiler's static memory planner
//! does (TVM, XLA's heap simulator, TFLite's greedy by size, MiniMalloc), and what a
//! runtime that knows a whole run in advance could reserve.
//!
//! - [`problem`]: the buffers, checked, and their lower bound (peak live bytes).
//! - `index`: which buffers live at the same time as one, by a segment tree.
//! - `greedy`: greedy placers in several orders with best-fit offsets, a sweep in
//!   time order, and a local search that reorders the buffers at the top.
//! - `search`: exact branch and bound over canonical placements (MiniMalloc's ideas).
//! - [`check`]: the independent checker every placement passes before [`place`]
//!   returns it.
//! - [`csv`]: MiniMalloc's CSV format (`id,lower,upper,size[,offset]`, and every
//!   header form MiniMalloc's reader takes, but unknown columns, which it passes over).

pub mod check;
pub mod csv;
mod greedy;
mod index;
pub mod problem;
mod search;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use check::{check_placement, Violation};
pub use problem::{Buffer, InfeasibleBecause, PlacementError, Problem};

use greedy::{Layout, Order, ORDERS};
use search::Decision;

/// The time limit when none is given.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(10);

/// Inputs with at most this many buffers get the exact search after the heuristics
/// (its per-node work grows with the buffers and sections; MiniMalloc's hard
/// instances have 150-215).
pub const SEARCH_MAX_BUFFERS: usize = 4_000;

/// Greedy placers in a chosen order query each buffer's overlaps; past this many
/// overlapping pairs only the first order runs, after the `O(n log n)` sweep.
const GREEDY_PAIR_BUDGET: u64 = 200_000_000;

/// The longest time limit [`place`] follows as given: a longer one (up to
/// `Duration::MAX`) searches as long as this, a century, which is no limit in practice
/// (and past which the deadline would overflow an `Instant`).
pub const LONGEST_TIME_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// What [`place`] is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaceOptions {
    /// The most bytes the placement may take; `None` asks for the lowest height.
    pub capacity: Option<u64>,
    /// How long to search; the best placement found is returned when it passes.
    pub time_limit: Duration,
}

impl Default for PlaceOptions {
    fn default() -> Self {
        Self {
            capacity: None,
            time_limit: DEFAULT_TIME_LIMIT,
        }
    }
}

/// When a search must end: an instant, and optionally a flag another thread sets to
/// stop it sooner ([`place_until`]). Every look at the clock reads the flag too, so a
/// set flag ends the search as promptly as a passed instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline<'a> {
    at: Instant,
    stop: Option<&'a AtomicBool>,
}

impl<'a> Deadline<'a> {
    /// Ends at `at`, or once `stop` reads true.
    pub(crate) fn new(at: Instant, stop: Option<&'a AtomicBool>) -> Self {
        Self { at, stop }
    }

    /// The same stop flag with another instant.
    pub(crate) fn at(self, at: Instant) -> Self {
        Self { at, ..self }
    }

    /// The instant.
    pub(crate) fn instant(self) -> Instant {
        self.at
    }

    /// Whether the stop flag is set.
    pub(crate) fn stopped(self) -> bool {
        self.stop.is_some_and(|stop| stop.load(Ordering::Relaxed))
    }

    /// Whether the search must end: the stop flag is set or the instant has passed.
    pub(crate) fn passed(self) -> bool {
        self.stopped() || Instant::now() >= self.at
    }
}

/// Which placer made a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A greedy placer or the local search after it.
    Heuristic,
    /// The exact search.
    Search,
}

impl Method {
    /// The method's name: `"heuristic"` or `"search"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Heuristic => "heuristic",
            Method::Search => "search",
        }
    }
}

/// A checked placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The offset of each buffer, in input order.
    pub offsets: Vec<u64>,
    /// The largest offset plus size.
    pub height: u64,
    /// Peak live bytes: no placement is lower.
    pub lower_bound: u64,
    /// Whether no placement is lower: the height is the lower bound, or the exact
    /// search showed that one byte less does not fit.
    pub optimal: bool,
    /// Which placer made it.
    pub method: Method,
    /// Time taken.
    pub elapsed: Duration,
}

/// Places `problem`'s buffers: within `options.capacity` if given (returning the first
/// placement that fits), else as low as the time limit allows. The heuristics run
/// first; inputs of at most [`SEARCH_MAX_BUFFERS`] buffers then get the exact search
/// (for a capacity, when no heuristic fits; without one, first one byte below the
/// heuristics' best, then from the lower bound up).
///
/// The time limit bounds the heuristics (part-way through a greedy order too), the
/// local search and the exact search (the building of its lists too), on inputs of
/// every size. On a sparse input the greedy orders take milliseconds, far inside the
/// heuristics' share of any usual limit; on a dense one (4,000 buffers each overlapping
/// 6,000: some 0.1 s an order, and as long to build the search's lists) a short limit
/// stops them, and the sweep's placement (or the best order's before) stands: placed in
/// 0.011 s under a limit of 0.01 s, where every order ran whatever the limit (0.6 s).
///
/// Every placement passes [`check_placement`] before it is returned. A capacity below
/// the peak live bytes, or one the search proves too small, is
/// [`PlacementError::Infeasible`]; a time limit passed first is
/// [`PlacementError::TimeLimit`]; both state the best height found.
pub fn place(problem: &Problem, options: &PlaceOptions) -> Result<Placement, PlacementError> {
    place_with(problem, options, None)
}

/// [`place`], stopped early once `stop` reads true (set by another thread: a caller
/// waiting for Ctrl-C, a cancelled job). Every part of the search that looks at the
/// clock reads the flag as well, so a set flag ends it as promptly as a passed time
/// limit would. A stopped placement returns [`PlacementError::Stopped`], not the best
/// placement found so far; one never stopped returns exactly what [`place`] would.
pub fn place_until(
    problem: &Problem,
    options: &PlaceOptions,
    stop: &AtomicBool,
) -> Result<Placement, PlacementError> {
    place_with(problem, options, Some(stop))
}

/// [`place`] and [`place_until`].
fn place_with(
    problem: &Problem,
    options: &PlaceOptions,
    stop: Option<&AtomicBool>,
) -> Result<Placement, PlacementError> {
    let start = Instant::now();
    // A longer limit is none in practice, and would overflow an `Instant`.
    let time_limit = options.time_limit.min(LONGEST_TIME_LIMIT);
    let deadline = Deadline::new(start + time_limit, stop);
    let lower_bound = problem.lower_bound();
    let target = options.capacity.unwrap_or(lower_bound).max(lower_bound);
    let searchable = problem.len() <= SEARCH_MAX_BUFFERS;
    // With the search to come, the heuristics get part of the time: a tenth with no
    // capacity (their best is where the search's first decision starts), a fortieth
    // with one, where the local search rarely reaches a tight capacity and the search
    // decides it directly (MiniMalloc's 11 instances at 1,048,576 with 10 s: 15.2 s
    // in all against 28.7 s with a tenth, run alternately on this loaded machine).
    let heuristic_deadline = match (searchable, options.capacity) {
        (false, _) => deadline,
        (true, None) => deadline.at(start + time_limit / 10),
        (true, Some(_)) => deadline.at(start + time_limit / 40),
    };
    let mut best = heuristics(problem, target, heuristic_deadline);
    if deadline.stopped() {
        return Err(PlacementError::Stopped);
    }
    let mut method = Method::Heuristic;
    let mut optimal = best.height == lower_bound;
    match options.capacity {
        Some(capacity) if best.height > capacity => {
            if lower_bound > capacity {
                return Err(PlacementError::Infeasible {
                    capacity,
                    best_height: best.height,
                    lower_bound,
                    why: InfeasibleBecause::PeakLive,
                });
            }
            let decision = if searchable {
                search::decide(problem, capacity, deadline)
            } else {
                Decision::TimedOut
            };
            match decision {
                Decision::TimedOut if deadline.stopped() => return Err(PlacementError::Stopped),
                Decision::Fits(offsets) => {
                    best = layout_of(problem, offsets);
                    method = Method::Search;
                    optimal = best.height == lower_bound;
                }
                Decision::DoesNotFit => {
                    return Err(PlacementError::Infeasible {
                        capacity,
                        best_height: best.height,
                        lower_bound,
                        why: InfeasibleBecause::Exhausted,
                    })
                }
                Decision::TimedOut => {
                    return Err(PlacementError::TimeLimit {
                        capacity,
                        best_height: best.height,
                        lower_bound,
                        time_limit: options.time_limit,
                    })
                }
            }
        }
        Some(_) => {}
        None if !optimal && searchable => {
            // First decide one byte below the heuristics' best, with half the time
            // left: with that slack the search's first dive (buffers bottom-up at their
            // lowest offsets, a skyline order unlike the greedy placers' best fit)
            // rarely backtracks and often lands far below the height asked (on
            // gpt2-train at the floor plus 8 KiB, where the greedy orders stop 2.35 %
            // over). Then decide the lower bound with half the time left: it is the
            // decision that proves a placement optimal, and on MiniMalloc's instances
            // it takes the search seconds where the first takes milliseconds (with a
            // third, 10 s placed 4 of the 11 at their peak live bytes on this loaded
            // machine; with half, 9, and D and J lower than with two thirds). Then
            // halve the gap, each decision with a third of the time left. One that runs
            // out counts as "does not fit" without proving it.
            let (mut lo, mut hi) = (lower_bound, best.height - 1);
            let mut proven = true;
            let mut decision = 0;
            while lo <= hi {
                if deadline.stopped() {
                    return Err(PlacementError::Stopped);
                }
                let now = Instant::now();
                if now >= deadline.instant() {
                    proven = false;
                    break;
                }
                // The decision's height and its share of the time left, as a fraction.
                let (height, share, of) = match decision {
                    0 => (hi, 1, 2),
                    1 => (lo, 1, 2),
                    _ => (lo + (hi - lo) / 2, 1, 3),
                };
                decision += 1;
                let until = deadline.at(now + (deadline.instant() - now) * share / of);
                match search::decide(problem, height, until) {
                    Decision::Fits(offsets) => {
                        best = layout_of(problem, offsets);
                        method = Method::Search;
                        hi = best.height.saturating_sub(1);
                    }
                    Decision::DoesNotFit => lo = height + 1,
                    // The top decision running out says nothing of the heights below.
                    Decision::TimedOut if decision == 1 => proven = false,
                    Decision::TimedOut => {
                        proven = false;
                        lo = height + 1;
                    }
                }
            }
            if deadline.stopped() {
                return Err(PlacementError::Stopped);
            }
            optimal = best.height == lower_bound || (proven && lo > hi);
        }
        None => {}
    }
    let height = check_placement(problem.buffers(), &best.offsets, options.capacity)?;
    debug_assert_eq!(height, best.height);
    Ok(Placement {
        offsets: best.offsets,
        height,
        lower_bound,
        optimal,
        method,
        elapsed: start.elapsed(),
    })
}

/// The height of `offsets` as a layout.
fn layout_of(problem: &Problem, offsets: Vec<u64>) -> Layout {
    let height = problem
        .buffers()
        .iter()
        .zip(&offsets)
        .map(|(b, &o)| o + b.size)
        .max()
        .unwrap_or(0);
    Layout { offsets, height }
}

/// The sweep, then the greedy orders, then the local search from the best order,
/// stopping once a height of `target` or less is reached.
fn heuristics(problem: &Problem, target: u64, deadline: Deadline<'_>) -> Layout {
    let best = greedy::sweep(problem);
    if best.height <= target || problem.is_empty() {
        return best;
    }
    let index = index::TimeIndex::new(problem.buffers());
    let budget = index::overlapping_pairs(problem.buffers()) <= GREEDY_PAIR_BUDGET;
    let orders: &[Order] = if budget { &ORDERS } else { &ORDERS[..1] };
    // The best greedy order and its placement, where the local search starts. The
    // deadline stops them at every size, part-way through an order too: a count of
    // buffers says little of their cost (4,000 buffers each overlapping 6,000 others
    // took 0.6 s for the four orders, past a limit of 0.01 s, when inputs of at most
    // SEARCH_MAX_BUFFERS ran every order whatever the deadline). On sparse inputs
    // (MiniMalloc's, most traces) they take milliseconds, well inside the heuristics'
    // share of the time.
    let mut start: Option<(Vec<u32>, Layout)> = None;
    for &order in orders {
        if deadline.passed() {
            break;
        }
        let ids = greedy::ordered(problem, order);
        // An order the deadline cuts short places nothing: the sweep's (or the best
        // order's before it) stands.
        let Some(layout) = greedy::place_in_order(problem, &index, &ids, Some(deadline)) else {
            break;
        };
        if start.as_ref().is_none_or(|(_, s)| layout.height < s.height) {
            start = Some((ids, layout));
        }
    }
    let Some((ids, layout)) = start else {
        return best;
    };
    let layout = if budget && layout.height > target {
        let iterations = 50 * problem.len();
        greedy::improve(problem, &index, ids, layout, target, deadline, iterations)
    } else {
        layout
    };
    if layout.height < best.height {
        layout
    } else {
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers `[k, k + width)` with a width below `widest` and sizes multiple of 32,
    /// from a fixed seed.
    fn staggered(count: u64, widest: u64) -> Problem {
        let mut state = 0x2545_f491_u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let buffers: Vec<Buffer> = (0..count)
            .map(|k| {
                let width = 1 + next(widest);
                Buffer {
                    lower: k,
                    upper: k + width,
                    size: 32 * (1 + next(100)),
                }
            })
            .collect();
        Problem::new(buffers).unwrap()
    }

    /// With the deadline passed, no greedy order runs, whatever the input's size: the
    /// heuristics' result is the sweep's. Inputs of at most SEARCH_MAX_BUFFERS buffers
    /// ran every order whatever the deadline.
    #[test]
    fn the_deadline_stops_the_greedy_orders_on_small_inputs_too() {
        let problem = staggered(600, 40);
        let sweep = greedy::sweep(&problem).height;
        let index = index::TimeIndex::new(problem.buffers());
        let best_order = ORDERS
            .iter()
            .map(|&order| {
                let ids = greedy::ordered(&problem, order);
                let layout = greedy::place_in_order(&problem, &index, &ids, None).unwrap();
                layout.height
            })
            .min()
            .unwrap();
        assert!(
            best_order < sweep,
            "the test needs an order better than the sweep"
        );
        let passed = Deadline::new(Instant::now(), None);
        assert_eq!(
            heuristics(&problem, problem.lower_bound(), passed).height,
            sweep
        );
        // With time, every order runs (asked no lower than the best of them, the local
        // search does not).
        let later = Deadline::new(Instant::now() + Duration::from_secs(3600), None);
        assert_eq!(heuristics(&problem, best_order, later).height, best_order);
    }

    /// A search whose stop flag is set ends with `Stopped`, however long its time
    /// limit, for an input that takes the exact search (which would run for the
    /// hour) and one that takes only the heuristics; never set, the flag changes
    /// nothing.
    #[test]
    fn a_set_stop_flag_stops_the_search() {
        let options = PlaceOptions {
            capacity: None,
            time_limit: Duration::from_secs(3600),
        };
        let stop = AtomicBool::new(true);
        for problem in [
            staggered(600, 40),
            staggered(SEARCH_MAX_BUFFERS as u64 + 1, 40),
        ] {
            assert_eq!(
                place_until(&problem, &options, &stop),
                Err(PlacementError::Stopped)
            );
            let capacity = PlaceOptions {
                capacity: Some(problem.lower_bound()),
                ..options.clone()
            };
            assert_eq!(
                place_until(&problem, &capacity, &stop),
                Err(PlacementError::Stopped)
            );
        }
        let problem = staggered(60, 10);
        let short = PlaceOptions {
            capacity: None,
            time_limit: Duration::from_secs(5),
        };
        let unset = AtomicBool::new(false);
        let mut placed = place_until(&problem, &short, &unset).unwrap();
        let mut plain = place(&problem, &short).unwrap();
        // Optimal: neither run was cut short by its clock, so both are the same.
        assert!(plain.optimal);
        placed.elapsed = Duration::ZERO;
        plain.elapsed = Duration::ZERO;
        assert_eq!(placed, plain);
    }
}
