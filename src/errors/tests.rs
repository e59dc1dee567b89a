//! Behaviour tests of the error graph, and a model-based test against per-byte shadows.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Range;

use proptest::prelude::*;

use super::*;

const A: AllocId = AllocId(1);
const B: AllocId = AllocId(2);
const C: AllocId = AllocId(3);
const D: AllocId = AllocId(4);

fn failed(graph: &mut ErrorGraph, kernel: &str, writes: &[(AllocId, Range<u64>)]) -> FailureId {
    match graph
        .launch(kernel, &[], writes, Some(format!("{kernel} exploded")))
        .unwrap()
    {
        LaunchOutcome::Failed(f) => f,
        other => panic!("expected a failed launch, got {other:?}"),
    }
}

fn skipped(outcome: Result<LaunchOutcome, GraphError>) -> Skipped {
    match outcome.unwrap() {
        LaunchOutcome::Skipped(s) => s,
        other => panic!("expected a skipped launch, got {other:?}"),
    }
}

fn claim_failed(failure: FailureId, alloc: AllocId, range: Range<u64>) -> Claim {
    Claim::Failed {
        failure,
        memory: AllocRange::new(alloc, range),
    }
}

#[test]
fn the_graph_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ErrorGraph>();
    send_sync::<LaunchOutcome>();
}

#[test]
fn failed_launch_taints_its_outputs() {
    let mut g = ErrorGraph::new();
    assert!(g.is_empty());
    let f = failed(&mut g, "matmul", &[(A, 0..64), (B, 16..32)]);
    g.check_invariants().unwrap();
    assert!(!g.is_empty());
    assert_eq!(g.failures().collect::<Vec<_>>(), vec![f]);
    assert_eq!(g.carriers(f), 2);
    assert_eq!(g.carrier_allocs(f), vec![A, B]);
    assert_eq!(g.message(f), Some("matmul exploded"));
    assert_eq!(g.claim(A, 0..128).unwrap(), Some(claim_failed(f, A, 0..64)));
    assert_eq!(g.claim(B, 0..64).unwrap(), Some(claim_failed(f, B, 16..32)));
    assert_eq!(g.claim(B, 0..16).unwrap(), None);
    assert_eq!(g.claim(C, 0..16).unwrap(), None);
    assert!(matches!(
        g.origin(f),
        Some(Origin::FailedLaunch { kernel, .. }) if kernel == "matmul"
    ));
}

#[test]
fn reading_a_tainted_input_skips_and_passes_the_failure_on() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    let s = skipped(g.launch("relu", &[(C, 0..8), (A, 32..96)], &[(B, 0..64)], None));
    g.check_invariants().unwrap();
    assert_eq!(s.kernel, "relu");
    assert_eq!(s.failure, f);
    assert_eq!(s.needed, claim_failed(f, A, 32..64));
    assert_eq!(s.produced, vec![AllocRange::new(B, 0..64)]);
    assert_eq!(g.claim(B, 0..64).unwrap(), Some(claim_failed(f, B, 0..64)));
    assert_eq!(g.carriers(f), 2);
    assert_eq!(g.skipped(f), &[s]);
    assert_eq!(g.skipped_dropped(f), 0);
    // No new failure: the skipped launch's outputs carry the original one.
    assert_eq!(g.failures().count(), 1);
}

#[test]
fn skipped_wins_over_a_requested_failure() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    let s = skipped(g.launch("relu", &[(A, 0..64)], &[(B, 0..64)], Some("boom".into())));
    assert_eq!(s.failure, f);
    assert_eq!(g.failures().collect::<Vec<_>>(), vec![f]);
    g.check_invariants().unwrap();
}

#[test]
fn writing_the_whole_range_clears_the_claim() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64), (B, 0..64)]);
    g.write(A, 0..64).unwrap();
    assert_eq!(g.claim(A, 0..64).unwrap(), None);
    assert!(g.taint(A).is_none());
    assert_eq!(g.carriers(f), 1);
    // A launch that runs clears its writes too.
    assert_eq!(
        g.launch("fill", &[(C, 0..8)], &[(B, 0..64)], None).unwrap(),
        LaunchOutcome::Ran
    );
    assert_eq!(g.claim(B, 0..64).unwrap(), None);
    assert!(
        !g.contains(f),
        "fully overwritten: the failure left the graph"
    );
    assert!(g.is_empty());
    g.check_invariants().unwrap();
}

#[test]
fn releasing_the_last_carrier_removes_the_failure() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    skipped(g.launch("relu", &[(A, 0..64)], &[(B, 0..64)], None));
    assert!(g.release(A));
    assert!(!g.release(A), "already forgotten");
    assert_eq!(g.carriers(f), 1);
    assert_eq!(g.skipped(f).len(), 1);
    assert!(g.release(B));
    assert!(!g.contains(f));
    assert_eq!(g.failures().count(), 0);
    assert_eq!(g.message(f), None);
    assert!(g.skipped(f).is_empty());
    assert!(g.is_empty());
    assert!(!g.release(C));
    g.check_invariants().unwrap();
}

#[test]
fn a_partial_write_leaves_a_partial_claim() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    g.write(A, 16..32).unwrap();
    assert_eq!(g.claim(A, 0..64).unwrap(), Some(claim_failed(f, A, 0..16)));
    assert_eq!(
        g.claim(A, 16..64).unwrap(),
        Some(claim_failed(f, A, 32..64))
    );
    assert_eq!(g.claim(A, 16..32).unwrap(), None);
    assert_eq!(
        g.claims(A, 8..40).unwrap(),
        vec![claim_failed(f, A, 8..16), claim_failed(f, A, 32..40)]
    );
    assert_eq!(g.taint(A).unwrap().tainted_bytes(), 48);
    assert_eq!(g.carriers(f), 1);
    // A launch reading only clean bytes runs.
    assert_eq!(
        g.launch("copy", &[(A, 16..32)], &[(B, 0..16)], None)
            .unwrap(),
        LaunchOutcome::Ran
    );
    g.check_invariants().unwrap();
}

#[test]
fn an_unallocated_claim_propagates_with_a_new_failure() {
    let mut g = ErrorGraph::new();
    g.mark_unallocated(A, 1024, "out of memory".into()).unwrap();
    assert!(!g.is_empty());
    assert_eq!(
        g.failures().count(),
        0,
        "an unallocated buffer is not a failure yet"
    );
    assert_eq!(
        g.claim(A, 0..1024).unwrap(),
        Some(Claim::Unallocated {
            memory: AllocRange::new(A, 0..1024)
        })
    );
    let s = skipped(g.launch("relu", &[(A, 0..1024)], &[(B, 0..1024)], None));
    let f = s.failure;
    assert_eq!(
        s.needed,
        Claim::Unallocated {
            memory: AllocRange::new(A, 0..1024)
        }
    );
    assert_eq!(g.claim(B, 0..8).unwrap(), Some(claim_failed(f, B, 0..8)));
    let message = g.message(f).unwrap();
    assert!(message.contains("1024 bytes") && message.contains("out of memory"));
    assert_eq!(
        g.origin(f),
        Some(&Origin::Unallocated {
            alloc: A,
            size: 1024,
            reason: "out of memory".into()
        })
    );
    // A second launch needing the same reservation reuses its failure...
    let s2 = skipped(g.launch("gelu", &[(A, 0..8)], &[(C, 0..8)], None));
    assert_eq!(s2.failure, f);
    // ...and downstream launches inherit it like any other failure.
    let s3 = skipped(g.launch("add", &[(C, 0..8)], &[(D, 0..8)], None));
    assert_eq!(s3.failure, f);
    assert_eq!(g.carriers(f), 3);
    assert_eq!(g.skipped(f).len(), 3);
    g.check_invariants().unwrap();
    // Once nothing carries it, the next need mints a new one.
    g.write(B, 0..1024).unwrap();
    g.write(C, 0..8).unwrap();
    g.release(D);
    assert!(!g.contains(f));
    let s4 = skipped(g.launch("relu", &[(A, 0..8)], &[(B, 0..8)], None));
    assert_ne!(s4.failure, f);
    assert!(s4.failure > f);
    g.check_invariants().unwrap();
    // Releasing the handle forgets it; what it passed on stays.
    assert!(g.release(A));
    assert_eq!(g.claim(A, 0..8).unwrap(), None);
    assert!(g.contains(s4.failure));
    g.check_invariants().unwrap();
}

#[test]
fn unallocated_buffers_cannot_be_written() {
    let mut g = ErrorGraph::new();
    g.mark_unallocated(A, 64, "pool capacity exceeded".into())
        .unwrap();
    assert_eq!(g.write(A, 0..8), Err(GraphError::Unallocated { alloc: A }));
    assert_eq!(
        g.mark_unallocated(A, 64, "again".into()),
        Err(GraphError::AlreadyTracked { alloc: A })
    );
    // A launch writing it cannot bind it: skipped, and its other outputs inherit.
    let s = skipped(g.launch("fill", &[], &[(B, 0..8), (A, 0..8)], None));
    assert_eq!(
        s.needed,
        Claim::Unallocated {
            memory: AllocRange::new(A, 0..8)
        }
    );
    assert_eq!(
        g.claim(B, 0..8).unwrap().unwrap().failure(),
        Some(s.failure)
    );
    assert_eq!(g.carriers(s.failure), 1);
    // A tainted allocation cannot be marked unallocated either.
    assert_eq!(
        g.mark_unallocated(B, 8, "oom".into()),
        Err(GraphError::AlreadyTracked { alloc: B })
    );
    // A skip that produces nothing keeps no failure.
    let lonely = skipped(g.launch("read", &[(A, 0..8)], &[], None));
    assert_eq!(lonely.failure, s.failure, "the live failure is reused");
    g.release(B);
    let lonely = skipped(g.launch("read", &[(A, 0..8)], &[], None));
    assert!(!g.contains(lonely.failure));
    assert_eq!(g.failures().count(), 0);
    g.check_invariants().unwrap();
}

#[test]
fn a_failure_that_wrote_nothing_is_not_kept() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "noop", &[(A, 8..8)]);
    assert!(!g.contains(f));
    assert!(g.is_empty());
    g.check_invariants().unwrap();
}

#[test]
fn a_newer_failure_overwriting_an_older_one_removes_it() {
    let mut g = ErrorGraph::new();
    let f1 = failed(&mut g, "k1", &[(A, 0..32)]);
    let f2 = failed(&mut g, "k2", &[(A, 0..16)]);
    assert!(f2 > f1);
    assert_eq!(g.carriers(f1), 1);
    assert_eq!(g.carriers(f2), 1);
    let f3 = failed(&mut g, "k3", &[(A, 0..64)]);
    assert!(!g.contains(f1) && !g.contains(f2));
    assert_eq!(g.failures().collect::<Vec<_>>(), vec![f3]);
    assert_eq!(
        g.taint(A).unwrap().ranges().collect::<Vec<_>>(),
        vec![(0..64, f3)]
    );
    g.check_invariants().unwrap();
}

#[test]
fn skipped_records_are_capped_and_the_rest_counted() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..8)]);
    for i in 0..20 {
        skipped(g.launch(&format!("k{i}"), &[(A, 0..8)], &[(B, 0..8)], None));
    }
    assert_eq!(g.skipped(f).len(), MAX_SKIPPED_PER_FAILURE);
    assert_eq!(g.skipped(f)[0].kernel, "k0");
    assert_eq!(g.skipped(f)[15].kernel, "k15");
    assert_eq!(g.skipped_dropped(f), 4);
    assert_eq!(g.carriers(f), 2);
    g.check_invariants().unwrap();
}

#[test]
fn failure_ids_are_never_reused() {
    let mut g = ErrorGraph::new();
    let mut seen = HashSet::new();
    for _ in 0..100 {
        let f = failed(&mut g, "k", &[(A, 0..8)]);
        assert!(seen.insert(f));
        g.release(A);
    }
    // Across graphs too: ids are process-wide.
    let mut other = ErrorGraph::new();
    assert!(!seen.contains(&failed(&mut other, "k", &[(A, 0..8)])));
}

#[test]
#[allow(clippy::reversed_empty_ranges)] // reversed on purpose
fn reversed_ranges_are_refused_and_change_nothing() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    let reversed = 10..5;
    let refused = Err(GraphError::ReversedRange {
        alloc: B,
        start: 10,
        end: 5,
    });
    assert_eq!(
        g.launch("k", &[(A, 0..8)], &[(B, reversed.clone())], None),
        refused
    );
    assert_eq!(g.write(B, reversed.clone()), refused.clone().map(|_| ()));
    assert_eq!(g.claim(B, reversed.clone()), refused.clone().map(|_| None));
    assert_eq!(g.claims(B, reversed), refused.map(|_| Vec::new()));
    assert!(g.skipped(f).is_empty(), "the refused launch left no record");
    assert_eq!(g.carriers(f), 1);
    // The error names what a caller needs.
    let err = g.write(A, 9..3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "range 9..3 of alloc#1 is reversed (start > end)"
    );
    g.check_invariants().unwrap();
}

#[test]
fn empty_reads_find_nothing() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    g.mark_unallocated(B, 64, "oom".into()).unwrap();
    assert_eq!(g.claim(A, 8..8).unwrap(), None);
    assert_eq!(g.claim(B, 0..0).unwrap(), None);
    assert_eq!(
        g.launch("k", &[(A, 8..8), (B, 4..4)], &[(C, 0..8)], None)
            .unwrap(),
        LaunchOutcome::Ran
    );
    assert_eq!(g.carriers(f), 1);
}

#[test]
fn report_walks_back_to_a_failed_launch() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..64)]);
    skipped(g.launch("relu", &[(A, 0..64)], &[(B, 0..64)], None));
    skipped(g.launch("unrelated", &[(A, 0..8)], &[(D, 0..8)], None));
    skipped(g.launch("softmax", &[(B, 0..64)], &[(C, 0..32)], None));
    let report = g.report(C).unwrap();
    let expected = format!(
        "alloc#3 cannot be trusted: alloc#3 bytes 0..32 carry {f}.\n  \
         alloc#3 bytes 0..32 were not written: launch `softmax` was skipped because alloc#2 bytes 0..64 carry {f}\n  \
         alloc#2 bytes 0..64 were not written: launch `relu` was skipped because alloc#1 bytes 0..64 carry {f}\n  \
         alloc#1 bytes 0..64 were not written: launch `matmul` failed\n  \
         {f}, the original failure: matmul exploded\n"
    );
    assert_eq!(report, expected);
    assert!(g.report(A).unwrap().contains("launch `matmul` failed"));
    g.write(C, 0..32).unwrap();
    assert_eq!(g.report(C), None);
    assert_eq!(g.report(AllocId(99)), None);
}

#[test]
fn report_walks_back_to_a_failed_reservation() {
    let mut g = ErrorGraph::new();
    g.mark_unallocated(A, 4096, "out of memory".into()).unwrap();
    let unallocated = g.report(A).unwrap();
    assert!(unallocated.contains("no memory") && unallocated.contains("out of memory"));
    let s = skipped(g.launch("embed", &[(A, 0..4096)], &[(B, 0..128)], None));
    skipped(g.launch("norm", &[(B, 0..128)], &[(C, 0..128)], None));
    // A second tainted run on C: the report mentions it.
    let f2 = failed(&mut g, "late", &[(C, 256..260)]);
    let report = g.report(C).unwrap();
    let f = s.failure;
    assert!(report.starts_with(&format!(
        "alloc#3 cannot be trusted: alloc#3 bytes 0..128 carry {f}.\n  \
         (132 bytes are tainted in all, in 2 ranges, carrying {f}, {f2})\n"
    )));
    assert!(report.contains("launch `norm` was skipped because alloc#2 bytes 0..128"));
    assert!(
        report.contains("launch `embed` was skipped because alloc#1 bytes 0..4096 have no memory")
    );
    assert!(report.ends_with(&format!(
        "{f}, the original failure: the reservation of 4096 bytes for alloc#1 failed: out of memory\n"
    )));
}

#[test]
fn report_says_where_the_record_runs_out() {
    let mut g = ErrorGraph::new();
    let f = failed(&mut g, "matmul", &[(A, 0..8)]);
    for i in 0..MAX_SKIPPED_PER_FAILURE {
        skipped(g.launch(&format!("k{i}"), &[(A, 0..8)], &[(B, 0..8)], None));
    }
    skipped(g.launch("late", &[(A, 0..8)], &[(C, 0..8)], None));
    let report = g.report(C).unwrap();
    assert!(report.contains("not recorded (only the first 16 are kept)"));
    assert!(report.ends_with(&format!("{f}, the original failure: matmul exploded\n")));
}

// ---------------------------------------------------------------------------------------
// Model-based test: random launches, writes, releases and reads against a per-byte model.

/// Slots the test works on; releasing one replaces it with a fresh allocation.
const SLOTS: usize = 5;
/// Bytes per allocation.
const SIZE: u64 = 16;

/// One slot of the model.
#[derive(Debug, Clone)]
enum Shadow {
    /// The failure each byte carries.
    Bytes(Vec<Option<FailureId>>),
    /// No memory; the failure minted for it while some byte carries it.
    Unallocated(Option<FailureId>),
}

#[derive(Debug, Clone)]
enum Op {
    Launch {
        reads: Vec<(usize, Range<u64>)>,
        writes: Vec<(usize, Range<u64>)>,
        fail: bool,
    },
    Write(usize, Range<u64>),
    Release {
        slot: usize,
        unallocated: bool,
    },
    Read(usize, Range<u64>),
}

fn slot_range() -> impl Strategy<Value = (usize, Range<u64>)> {
    (0..SLOTS, 0..=SIZE, 0..=SIZE).prop_map(|(s, a, b)| (s, a.min(b)..a.max(b)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (
            prop::collection::vec(slot_range(), 0..3),
            prop::collection::vec(slot_range(), 0..3),
            prop::bool::weighted(0.3)
        )
            .prop_map(|(reads, writes, fail)| Op::Launch { reads, writes, fail }),
        2 => slot_range().prop_map(|(s, r)| Op::Write(s, r)),
        1 => (0..SLOTS, prop::bool::weighted(0.3))
            .prop_map(|(slot, unallocated)| Op::Release { slot, unallocated }),
        1 => slot_range().prop_map(|(s, r)| Op::Read(s, r)),
    ]
}

struct Model {
    ids: Vec<AllocId>,
    shadows: Vec<Shadow>,
    next_id: u64,
    /// Skips recorded per live failure.
    skips: BTreeMap<FailureId, u64>,
    /// Every failure id ever returned, to check fresh ones are fresh.
    seen: HashSet<FailureId>,
}

impl Model {
    fn new() -> Self {
        Self {
            ids: (0..SLOTS as u64).map(AllocId).collect(),
            shadows: vec![Shadow::Bytes(vec![None; SIZE as usize]); SLOTS],
            next_id: SLOTS as u64,
            skips: BTreeMap::new(),
            seen: HashSet::new(),
        }
    }

    /// What a read of `range` of `slot` finds.
    fn claim(&self, slot: usize, range: Range<u64>) -> Option<Claim> {
        if range.is_empty() {
            return None;
        }
        let alloc = self.ids[slot];
        match &self.shadows[slot] {
            Shadow::Unallocated(_) => Some(Claim::Unallocated {
                memory: AllocRange::new(alloc, range),
            }),
            Shadow::Bytes(bytes) => {
                let first = range.clone().find(|&i| bytes[i as usize].is_some())?;
                let failure = bytes[first as usize]?;
                let end = (first..range.end)
                    .find(|&i| bytes[i as usize] != Some(failure))
                    .unwrap_or(range.end);
                Some(Claim::Failed {
                    failure,
                    memory: AllocRange::new(alloc, first..end),
                })
            }
        }
    }

    fn set(&mut self, slot: usize, range: Range<u64>, value: Option<FailureId>) {
        if let Shadow::Bytes(bytes) = &mut self.shadows[slot] {
            for i in range {
                bytes[i as usize] = value;
            }
        }
    }

    fn carriers(&self) -> BTreeMap<FailureId, BTreeSet<AllocId>> {
        let mut out: BTreeMap<FailureId, BTreeSet<AllocId>> = BTreeMap::new();
        for (slot, shadow) in self.shadows.iter().enumerate() {
            if let Shadow::Bytes(bytes) = shadow {
                for f in bytes.iter().flatten() {
                    out.entry(*f).or_default().insert(self.ids[slot]);
                }
            }
        }
        out
    }

    /// Forgets what belongs to failures nothing carries any more.
    fn settle(&mut self) {
        let live = self.carriers();
        self.skips.retain(|f, _| live.contains_key(f));
        for shadow in &mut self.shadows {
            if let Shadow::Unallocated(memo) = shadow {
                if memo.is_some_and(|f| !live.contains_key(&f)) {
                    *memo = None;
                }
            }
        }
    }

    fn fresh(&mut self, failure: FailureId) -> Result<(), TestCaseError> {
        prop_assert!(self.seen.insert(failure), "{failure} was reused");
        Ok(())
    }
}

fn apply(g: &mut ErrorGraph, m: &mut Model, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Launch {
            reads,
            writes,
            fail,
        } => {
            let to_ids = |v: &[(usize, Range<u64>)]| -> Vec<(AllocId, Range<u64>)> {
                v.iter().map(|(s, r)| (m.ids[*s], r.clone())).collect()
            };
            let outcome = g
                .launch(
                    "k",
                    &to_ids(&reads),
                    &to_ids(&writes),
                    fail.then(|| "boom".to_owned()),
                )
                .unwrap();
            let stop = reads
                .iter()
                .find_map(|(s, r)| m.claim(*s, r.clone()))
                .or_else(|| {
                    writes
                        .iter()
                        .find(|(s, r)| {
                            !r.is_empty() && matches!(m.shadows[*s], Shadow::Unallocated(_))
                        })
                        .map(|(s, r)| Claim::Unallocated {
                            memory: AllocRange::new(m.ids[*s], r.clone()),
                        })
                });
            let failure = match (stop, outcome) {
                (Some(needed), LaunchOutcome::Skipped(s)) => {
                    prop_assert_eq!(&s.needed, &needed);
                    prop_assert_eq!(
                        s.produced,
                        to_ids(&writes)
                            .into_iter()
                            .map(|(a, r)| AllocRange::new(a, r))
                            .collect::<Vec<_>>()
                    );
                    match needed {
                        Claim::Failed { failure, .. } => prop_assert_eq!(s.failure, failure),
                        Claim::Unallocated { memory } => {
                            let slot = m.ids.iter().position(|&a| a == memory.alloc).unwrap();
                            let Shadow::Unallocated(memo) = &mut m.shadows[slot] else {
                                unreachable!()
                            };
                            match *memo {
                                Some(f) => prop_assert_eq!(s.failure, f),
                                None => {
                                    *memo = Some(s.failure);
                                    m.fresh(s.failure)?;
                                }
                            }
                        }
                    }
                    *m.skips.entry(s.failure).or_insert(0) += 1;
                    Some(s.failure)
                }
                (None, LaunchOutcome::Failed(f)) if fail => {
                    m.fresh(f)?;
                    Some(f)
                }
                (None, LaunchOutcome::Ran) if !fail => None,
                (stop, outcome) => {
                    return Err(TestCaseError::fail(format!(
                        "model expected stop {stop:?} fail {fail}, graph did {outcome:?}"
                    )))
                }
            };
            for (s, r) in writes {
                m.set(s, r, failure);
            }
        }
        Op::Write(slot, range) => {
            let result = g.write(m.ids[slot], range.clone());
            if matches!(m.shadows[slot], Shadow::Unallocated(_)) {
                prop_assert_eq!(result, Err(GraphError::Unallocated { alloc: m.ids[slot] }));
            } else {
                prop_assert_eq!(result, Ok(()));
                m.set(slot, range, None);
            }
        }
        Op::Release { slot, unallocated } => {
            let tracked = match &m.shadows[slot] {
                Shadow::Unallocated(_) => true,
                Shadow::Bytes(bytes) => bytes.iter().any(Option::is_some),
            };
            prop_assert_eq!(g.release(m.ids[slot]), tracked);
            let id = AllocId(m.next_id);
            m.next_id += 1;
            m.ids[slot] = id;
            if unallocated {
                g.mark_unallocated(id, SIZE, "out of memory".into())
                    .unwrap();
                m.shadows[slot] = Shadow::Unallocated(None);
            } else {
                m.shadows[slot] = Shadow::Bytes(vec![None; SIZE as usize]);
            }
        }
        Op::Read(slot, range) => {
            prop_assert_eq!(
                g.claim(m.ids[slot], range.clone()).unwrap(),
                m.claim(slot, range.clone())
            );
            // `claims` is the sequence of first claims, read run by run.
            let mut expected = Vec::new();
            let mut rest = range.clone();
            while let Some(c) = m.claim(slot, rest.clone()) {
                let end = c.memory().range.end;
                expected.push(c);
                if matches!(m.shadows[slot], Shadow::Unallocated(_)) {
                    break;
                }
                rest = end..range.end;
            }
            prop_assert_eq!(g.claims(m.ids[slot], range).unwrap(), expected);
        }
    }
    m.settle();
    Ok(())
}

fn compare(g: &ErrorGraph, m: &Model) -> Result<(), TestCaseError> {
    g.check_invariants()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let carriers = m.carriers();
    prop_assert_eq!(
        g.failures().collect::<Vec<_>>(),
        carriers.keys().copied().collect::<Vec<_>>(),
        "no failure outlives its last carrier, and every carried one is in the graph"
    );
    for (f, allocs) in &carriers {
        prop_assert_eq!(g.carriers(*f), allocs.len());
        prop_assert_eq!(
            g.carrier_allocs(*f),
            allocs.iter().copied().collect::<Vec<_>>()
        );
        prop_assert!(g.message(*f).is_some());
        let skips = m.skips.get(f).copied().unwrap_or(0);
        prop_assert_eq!(
            g.skipped(*f).len() as u64,
            skips.min(MAX_SKIPPED_PER_FAILURE as u64)
        );
        prop_assert_eq!(
            g.skipped_dropped(*f),
            skips.saturating_sub(MAX_SKIPPED_PER_FAILURE as u64)
        );
    }
    let mut anything = false;
    for (slot, shadow) in m.shadows.iter().enumerate() {
        let alloc = m.ids[slot];
        let expected: Vec<(Range<u64>, FailureId)> = match shadow {
            Shadow::Unallocated(_) => {
                anything = true;
                prop_assert!(g.unallocated(alloc).is_some());
                prop_assert!(g.report(alloc).is_some());
                continue;
            }
            Shadow::Bytes(bytes) => {
                let mut runs: Vec<(Range<u64>, FailureId)> = Vec::new();
                for (i, b) in bytes.iter().enumerate() {
                    let i = i as u64;
                    if let Some(f) = b {
                        match runs.last_mut() {
                            Some((r, g)) if r.end == i && g == f => r.end += 1,
                            _ => runs.push((i..i + 1, *f)),
                        }
                    }
                }
                runs
            }
        };
        anything |= !expected.is_empty();
        let actual: Vec<_> = g
            .taint(alloc)
            .map(|t| t.ranges().collect())
            .unwrap_or_default();
        prop_assert_eq!(&actual, &expected);
        prop_assert_eq!(g.report(alloc).is_some(), !expected.is_empty());
    }
    prop_assert_eq!(g.is_empty(), !anything);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn model_random_launches_writes_releases(ops in prop::collection::vec(op(), 1..80)) {
        let mut g = ErrorGraph::new();
        let mut m = Model::new();
        for op in ops {
            apply(&mut g, &mut m, op)?;
            compare(&g, &m)?;
        }
        // Free everything: the graph is empty.
        for id in m.ids.clone() {
            g.release(id);
        }
        prop_assert!(g.is_empty());
        prop_assert_eq!(g.failures().count(), 0);
        g.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}
