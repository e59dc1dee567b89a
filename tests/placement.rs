//! Offline placement: every placement checked by a naive pairwise check written here,
//! the checker's own verdicts, optimality against brute force on small inputs, the
//! typed errors, and the CSV reader's strictness.

use std::time::Duration;

use cubepool::placement::csv::{read_csv, write_csv, CsvError};
use cubepool::placement::{
    check_placement, place, Buffer, InfeasibleBecause, PlaceOptions, PlacementError, Problem,
    Violation,
};
use proptest::prelude::*;

fn buffer(lower: u64, upper: u64, size: u64) -> Buffer {
    Buffer { lower, upper, size }
}

/// The pairwise definition of a valid placement, independent of the crate's checker.
fn naive_valid(buffers: &[Buffer], offsets: &[u64], capacity: Option<u64>) -> bool {
    buffers.len() == offsets.len()
        && buffers.iter().zip(offsets).all(|(b, &o)| {
            capacity.is_none_or(|c| o.checked_add(b.size).is_some_and(|end| end <= c))
        })
        && (0..buffers.len()).all(|i| {
            (i + 1..buffers.len()).all(|j| {
                let (a, b) = (&buffers[i], &buffers[j]);
                let in_time = a.lower < b.upper && b.lower < a.upper;
                let in_space = offsets[i] < offsets[j] + b.size && offsets[j] < offsets[i] + a.size;
                !(in_time && in_space && a.size > 0 && b.size > 0)
            })
        })
}

fn options(capacity: Option<u64>, seconds: f64) -> PlaceOptions {
    PlaceOptions {
        capacity,
        time_limit: Duration::from_secs_f64(seconds),
    }
}

/// The lowest height of any placement, by trying every integer offset (sizes small).
fn brute_force_height(buffers: &[Buffer]) -> u64 {
    fn go(buffers: &[Buffer], offsets: &mut Vec<u64>, height: u64, best: &mut u64) {
        let k = offsets.len();
        if k == buffers.len() {
            *best = (*best).min(height);
            return;
        }
        let b = buffers[k];
        for offset in 0..*best {
            let top = offset + b.size;
            if top.max(height) >= *best {
                break;
            }
            let clash = (0..k).any(|i| {
                let o = &buffers[i];
                o.lower < b.upper
                    && b.lower < o.upper
                    && offsets[i] < top
                    && offset < offsets[i] + o.size
                    && o.size > 0
                    && b.size > 0
            });
            if !clash {
                offsets.push(offset);
                go(buffers, offsets, height.max(top), best);
                offsets.pop();
            }
        }
    }
    let mut best = buffers.iter().map(|b| b.size).sum::<u64>() + 1;
    go(buffers, &mut Vec::new(), 0, &mut best);
    best.min(buffers.iter().map(|b| b.size).sum())
}

fn small_buffers(max: usize, max_size: u64) -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((0u64..8, 1u64..5, 0..=max_size), 1..=max).prop_map(|rows| {
        rows.into_iter()
            .map(|(lower, width, size)| buffer(lower, lower + width, size))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// On random inputs (with zero sizes and shared endpoints), placements pass the
    /// pairwise check and never go below peak live bytes.
    #[test]
    fn placements_are_valid(buffers in small_buffers(40, 1000)) {
        let problem = Problem::new(buffers.clone()).unwrap();
        let placed = place(&problem, &options(None, 0.2)).unwrap();
        prop_assert!(naive_valid(&buffers, &placed.offsets, None));
        prop_assert!(placed.height >= placed.lower_bound);
        prop_assert_eq!(placed.lower_bound, problem.lower_bound());
    }

    /// On inputs small enough for brute force, the search's height is the optimum,
    /// and it says so.
    #[test]
    fn exact_search_is_optimal(buffers in small_buffers(6, 4)) {
        let problem = Problem::new(buffers.clone()).unwrap();
        let placed = place(&problem, &options(None, 5.0)).unwrap();
        prop_assert!(naive_valid(&buffers, &placed.offsets, None));
        prop_assert_eq!(placed.height, brute_force_height(&buffers));
        prop_assert!(placed.optimal);
    }

    /// With the optimum as the capacity a placement is found; one byte less is
    /// proven infeasible.
    #[test]
    fn capacity_at_the_optimum(buffers in small_buffers(6, 4)) {
        let problem = Problem::new(buffers.clone()).unwrap();
        let optimum = brute_force_height(&buffers);
        let placed = place(&problem, &options(Some(optimum), 5.0)).unwrap();
        prop_assert!(naive_valid(&buffers, &placed.offsets, Some(optimum)));
        if optimum > 0 {
            let error = place(&problem, &options(Some(optimum - 1), 5.0)).unwrap_err();
            let is_infeasible = matches!(error, PlacementError::Infeasible { .. });
            prop_assert!(is_infeasible, "{}", error);
        }
    }

    /// The crate's checker agrees with the pairwise check on arbitrary offsets.
    #[test]
    fn checker_agrees_with_pairwise(
        buffers in small_buffers(12, 6),
        offsets in prop::collection::vec(0u64..12, 12),
        capacity in prop::option::of(0u64..20),
    ) {
        let offsets = &offsets[..buffers.len()];
        let verdict = check_placement(&buffers, offsets, capacity);
        prop_assert_eq!(verdict.is_ok(), naive_valid(&buffers, offsets, capacity), "{:?}", verdict);
    }
}

/// Structured inputs: a staircase of nested lifetimes and a chain where each buffer
/// meets the next; both have placements at their peak live bytes.
#[test]
fn structured_inputs_reach_the_lower_bound() {
    let nested: Vec<Buffer> = (0..50).map(|k| buffer(k, 100 - k, 1 + k % 7)).collect();
    let chain: Vec<Buffer> = (0..200).map(|k| buffer(k, k + 2, 64 << (k % 5))).collect();
    for buffers in [nested, chain] {
        let problem = Problem::new(buffers.clone()).unwrap();
        let placed = place(&problem, &options(None, 2.0)).unwrap();
        assert!(naive_valid(&buffers, &placed.offsets, None));
        assert_eq!(placed.height, problem.lower_bound());
        assert!(placed.optimal);
    }
}

/// Draws below a bound from a xorshift generator seeded with `seed` (non-zero): the
/// same inputs on every run.
fn draws(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |bound| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    }
}

/// A larger random trace-like input (many short lifetimes, a few long ones).
#[test]
fn a_few_thousand_buffers_are_placed_validly() {
    let mut next = draws(0x1234_5678);
    let buffers: Vec<Buffer> = (0..5_000)
        .map(|k| {
            let width = if next(20) == 0 {
                1 + next(2_000)
            } else {
                1 + next(30)
            };
            buffer(k, k + width, 256 * (1 + next(64)))
        })
        .collect();
    let problem = Problem::new(buffers.clone()).unwrap();
    let placed = place(&problem, &options(None, 1.0)).unwrap();
    assert_eq!(
        check_placement(&buffers, &placed.offsets, None),
        Ok(placed.height)
    );
    assert!(placed.height >= problem.lower_bound());
}

/// A deadline that has passed before the heuristics start still yields a checked
/// placement: the time-ordered sweep's (the greedy orders and the local search stop
/// at the deadline, also part-way through an order).
#[test]
fn a_passed_deadline_returns_the_sweep_checked() {
    let buffers: Vec<Buffer> = (0..6_000u64)
        .map(|k| buffer(k, k + 1 + (k * 7919) % 500, 256 * (1 + (k * 104_729) % 64)))
        .collect();
    let problem = Problem::new(buffers.clone()).unwrap();
    let placed = place(&problem, &options(None, 0.0)).unwrap();
    assert_eq!(
        check_placement(&buffers, &placed.offsets, None),
        Ok(placed.height)
    );
    assert!(placed.height >= problem.lower_bound());
    // With time, the greedy orders and the local search do no worse than the sweep.
    let longer = place(&problem, &options(None, 2.0)).unwrap();
    assert!(longer.height <= placed.height);
}

#[test]
fn checker_names_the_overlapping_pair() {
    let buffers = [buffer(0, 4, 10), buffer(2, 6, 10), buffer(4, 8, 10)];
    assert_eq!(check_placement(&buffers, &[0, 10, 0], None), Ok(20));
    assert_eq!(
        check_placement(&buffers, &[0, 5, 0], None),
        Err(Violation::Overlap {
            first: 0,
            second: 1
        })
    );
    assert_eq!(
        check_placement(&buffers, &[0, 10, 0], Some(19)),
        Err(Violation::PastCapacity {
            index: 1,
            end: 20,
            capacity: 19
        })
    );
    assert!(matches!(
        check_placement(&buffers, &[0, u64::MAX, 0], None),
        Err(Violation::Overflow { index: 1, .. })
    ));
    assert!(matches!(
        check_placement(&buffers, &[0], None),
        Err(Violation::Count { .. })
    ));
}

#[test]
fn capacity_below_peak_live_states_the_best_height() {
    let problem = Problem::new(vec![buffer(0, 2, 100), buffer(1, 3, 50)]).unwrap();
    let error = place(&problem, &options(Some(120), 1.0)).unwrap_err();
    assert_eq!(
        error,
        PlacementError::Infeasible {
            capacity: 120,
            best_height: 150,
            lower_bound: 150,
            why: InfeasibleBecause::PeakLive,
        }
    );
    let message = error.to_string();
    assert!(message.contains("capacity 120"), "{message}");
    assert!(message.contains("best height found is 150"), "{message}");
    // Large heights read as the success line writes them: in groups of three.
    let large = PlacementError::Infeasible {
        capacity: 1_048_576,
        best_height: 3_795_506,
        lower_bound: 1_039_360,
        why: InfeasibleBecause::PeakLive,
    }
    .to_string();
    assert!(large.contains("capacity 1,048,576"), "{large}");
    assert!(large.contains("best height found is 3,795,506"), "{large}");
    assert!(large.contains("is 1,039,360)"), "{large}");
}

#[test]
fn bad_buffers_are_typed_errors() {
    assert_eq!(
        Problem::new(vec![buffer(0, 1, 1), buffer(5, 5, 1)]),
        Err(PlacementError::EmptyLifetime {
            index: 1,
            lower: 5,
            upper: 5
        })
    );
    assert_eq!(
        Problem::new(vec![buffer(0, 1, u64::MAX), buffer(0, 1, 1)]),
        Err(PlacementError::SizesOverflow)
    );
    let empty = Problem::new(Vec::new()).unwrap();
    let placed = place(&empty, &PlaceOptions::default()).unwrap();
    assert_eq!((placed.height, placed.optimal), (0, true));
}

#[test]
fn csv_round_trips_and_errors_name_the_line() {
    let text = b"id,lower,upper,size\r\na,0,3,16\nb,1,2,8\n";
    let read = read_csv(text).unwrap();
    assert_eq!(read.ids, ["a", "b"]);
    assert_eq!(read.buffers, [buffer(0, 3, 16), buffer(1, 2, 8)]);
    let mut out = Vec::new();
    write_csv(&mut out, &read.ids, &read.buffers, &[0, 16]).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "id,lower,upper,size,offset\na,0,3,16,0\nb,1,2,8,16\n"
    );
    let cases: [(&[u8], usize, &str); 9] = [
        (b"", 1, "empty"),
        (b"id,start,finish,size\n", 1, "\"finish\""),
        (b"id,lower,upper,size\na,0,1\n", 2, "4 fields"),
        (b"id,lower,upper,size\na,0,1,2\n\nb,0,1,2\n", 3, "4 fields"),
        (b"id,lower,upper,size\na,0,1,-2\n", 2, "size"),
        (b"id,lower,upper,size\na,0,1,+2\n", 2, "size"),
        (b"id,lower,upper,size\na,3,1,2\n", 2, "below upper"),
        (
            b"id,lower,upper,size\na,0,1,2\na,0,1,2\n",
            3,
            "already used on line 2",
        ),
        (b"id,lower,upper,size\n\"a\",0,1,2\n", 2, "quotes"),
    ];
    for (text, line, says) in cases {
        let error: CsvError = read_csv(text).unwrap_err();
        assert_eq!(error.line(), line, "{error}");
        assert!(error.to_string().contains(says), "{error}");
        assert!(
            error.to_string().starts_with(&format!("line {line}:")),
            "{error}"
        );
    }
    // Blank lines at the end are no lines (MiniMalloc's reader stops at the first
    // blank line, so its files may end in one): they were refused.
    let ended = read_csv(b"id,lower,upper,size\na,0,1,2\n\n\r\n").unwrap();
    assert_eq!(ended.buffers, [buffer(0, 1, 2)]);
    assert!(read_csv(b"id,lower,upper,size\na,0,1,99999999999999999999\n").is_err());
    assert!(read_csv(b"id,lower,upper,size\na,0,1,\xff\n").is_err());
}

/// A training-like trace of three steps (generated once by a seeded script, written out
/// so the test does not hang on a generator): four parameters live throughout;
/// optimizer state from the end of the first step on; each step's activations
/// allocated on the way forward and freed in reverse; each step's 32-byte output
/// living into the next step past that one's output (so consecutive outputs overlap
/// and must alternate between two places); short temporaries at each peak. Every
/// greedy order with best-fit offsets stops above the floor on it (checked, so the
/// test keeps the structure that matters); without a capacity the exact search
/// reaches the floor, so the height is optimal.
#[test]
fn training_steps_reach_the_floor_where_greedy_orders_do_not() {
    let rows: [(u64, u64, u64); 54] = [
        (0, 122, 7),
        (0, 122, 15),
        (0, 122, 5),
        (0, 122, 11),
        (1, 24, 11),
        (2, 23, 8),
        (3, 22, 5),
        (4, 21, 5),
        (5, 20, 2),
        (6, 20, 1),
        (7, 18, 6),
        (8, 17, 2),
        (9, 17, 9),
        (10, 16, 1),
        (11, 15, 1),
        (12, 14, 9),
        (12, 55, 32),
        (13, 14, 32),
        (26, 122, 10),
        (27, 122, 5),
        (28, 122, 4),
        (29, 122, 4),
        (41, 65, 4),
        (42, 64, 1),
        (43, 62, 9),
        (44, 62, 8),
        (45, 60, 6),
        (46, 59, 3),
        (47, 58, 5),
        (48, 57, 6),
        (49, 56, 8),
        (50, 56, 8),
        (51, 54, 9),
        (52, 53, 7),
        (51, 95, 32),
        (54, 57, 16),
        (54, 56, 8),
        (56, 58, 8),
        (81, 105, 9),
        (82, 104, 9),
        (83, 103, 4),
        (84, 101, 11),
        (85, 101, 11),
        (86, 100, 11),
        (87, 98, 5),
        (88, 97, 7),
        (89, 97, 6),
        (90, 96, 5),
        (91, 94, 11),
        (92, 94, 7),
        (93, 122, 32),
        (96, 99, 32),
        (96, 97, 8),
        (94, 97, 16),
    ];
    let buffers: Vec<Buffer> = rows.iter().map(|&(l, u, s)| buffer(l, u, s)).collect();
    let problem = Problem::new(buffers.clone()).unwrap();
    // A limit already passed: the sweep alone, no greedy order nor search.
    let greedy = place(&problem, &options(None, 1e-9)).unwrap();
    assert!(naive_valid(&buffers, &greedy.offsets, None));
    assert!(
        greedy.height > problem.lower_bound(),
        "the structure no longer matters"
    );
    // A generous limit: the search takes milliseconds here; the limit only bounds a bug.
    let placed = place(&problem, &options(None, 60.0)).unwrap();
    assert!(naive_valid(&buffers, &placed.offsets, None));
    assert_eq!(placed.height, problem.lower_bound());
    assert!(placed.optimal);
}

#[test]
fn a_time_limit_past_what_an_instant_holds_is_no_limit() {
    // `Duration::MAX` overflowed the deadline (`Instant + Duration` panics).
    let problem = Problem::new(vec![buffer(0, 2, 64), buffer(1, 3, 32)]).unwrap();
    for capacity in [None, Some(96)] {
        let options = PlaceOptions {
            capacity,
            time_limit: Duration::MAX,
        };
        let placement = place(&problem, &options).unwrap();
        assert_eq!(placement.height, 96);
        assert!(placement.optimal);
    }
}

/// The exact search recurses a level per buffer placed: on a thread with a small stack
/// (a Python thread pool's, 512 KiB) a search of 1,000 random buffers overflowed it
/// (SIGSEGV). It runs on a stack of its own past a few hundred buffers.
#[test]
fn the_search_runs_on_a_thread_with_a_small_stack() {
    let mut next = draws(0x2545_f491_4f6c_dd1d);
    let buffers: Vec<Buffer> = (0..1_000)
        .map(|_| {
            let lower = next(800);
            buffer(lower, lower + 1 + next(400), 1 + next(50_000))
        })
        .collect();
    let problem = Problem::new(buffers.clone()).unwrap();
    let placed = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || place(&problem, &options(None, 1.0)))
        .unwrap()
        .join()
        .expect("the search did not overflow the thread's stack")
        .unwrap();
    assert_eq!(
        check_placement(&buffers, &placed.offsets, None),
        Ok(placed.height)
    );
}
