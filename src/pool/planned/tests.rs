//! The unit tests of the planned pool.

use super::*;
use crate::plan_file::{intern_plan, Plan, PlanPhase};
use crate::pool::MemoryPool;
use crate::storage::VirtualMemory;
use crate::VirtualStorage;

const G: u64 = 4096;

fn pool(phases: Vec<Vec<(u64, u64)>>, height: u64) -> PlannedPool {
    let phases = phases
        .into_iter()
        .map(|requests| PlanPhase::new("p", requests));
    let plan = Plan {
        height,
        phases: phases.collect(),
        kept: Vec::new(),
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    PlannedPool::new(intern_plan("test", plan), G, 1 << 30, 256)
}

#[test]
fn requests_follow_the_plan_by_size_and_order_and_steps() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    let mut pool = pool(vec![vec![(1000, 0), (2000, 4096), (1000, 8192)]], 3 * G);
    let a = pool.reserve(&mut storage, 1000).unwrap();
    let b = pool.reserve(&mut storage, 1000).unwrap();
    let c = pool.reserve(&mut storage, 2000).unwrap();
    assert_eq!((a.offset, b.offset, c.offset), (0, 8192, 4096));
    assert_eq!(pool.planned_stats().hits, 3);
    // A fourth request of 1000 bytes is not planned: it goes beside.
    let d = pool.reserve(&mut storage, 1000).unwrap();
    assert_ne!(d.storage.id, a.storage.id);
    assert_eq!(pool.planned_stats().misses_unplanned, 1);
    pool.check_invariants().unwrap();
    // Next step: `a` is still live, so the first request of 1000 bytes misses.
    pool.step();
    pool.release(b.slot).unwrap();
    let e = pool.reserve(&mut storage, 1000).unwrap();
    assert_ne!(e.storage.id, a.storage.id);
    assert_eq!(pool.planned_stats().misses_held, 1);
    let f = pool.reserve(&mut storage, 1000).unwrap();
    assert_eq!((f.storage.id, f.offset), (a.storage.id, 8192));
    pool.check_invariants().unwrap();
    for slot in [a.slot, c.slot, d.slot, e.slot, f.slot] {
        pool.release_with(&mut storage, slot).unwrap();
    }
    pool.cleanup(&mut storage, 0, true);
    pool.check_invariants().unwrap();
    assert_eq!(pool.usage().bytes_reserved, 0);
    assert_eq!(pool.usage().number_allocs, 0);
}

#[test]
fn the_steps_after_the_plan_follow_its_cycle_in_turn() {
    // Each step makes a block again while the last step's copy lives, then frees
    // the old copy: the plan's last two phases place the copies in turns.
    for (cycle, misses) in [(2, 0), (1, 2)] {
        let plan = Plan {
            height: 2 * G,
            phases: vec![
                PlanPhase::new("setup", Vec::new()),
                PlanPhase::new("a", vec![(G, 0)]),
                PlanPhase::new("b", vec![(G, G)]),
            ],
            kept: Vec::new(),
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle,
        };
        let mut pool = PlannedPool::new(intern_plan("cycle", plan), G, 1 << 30, 256);
        let mut storage = VirtualStorage::new().with_granularity(G);
        let mut offsets = Vec::new();
        let mut last = None;
        for _ in 0..6 {
            pool.step();
            let block = pool.reserve(&mut storage, G).unwrap();
            offsets.push(block.offset);
            if let Some(old) = last.replace(block.slot) {
                pool.release_with(&mut storage, old).unwrap();
            }
            pool.check_invariants().unwrap();
        }
        assert_eq!(pool.planned_stats().misses(), misses, "cycle {cycle}");
        if cycle == 2 {
            assert_eq!(offsets, [0, G, 0, G, 0, G]);
            assert_eq!(pool.usage().bytes_reserved, 2 * G);
        }
    }
}

#[test]
fn a_request_its_entry_cannot_serve_takes_a_free_kept_region_of_its_size() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    // Setup keeps a block of 100 bytes at 0 (the plan's kept region); the steady
    // step plans one request of 100 bytes at G.
    let plan = Plan {
        height: 3 * G,
        phases: vec![
            PlanPhase::new("setup", vec![(100, 0)]),
            PlanPhase::new("step", vec![(100, G)]),
        ],
        kept: vec![(100, 0), (100, 2 * G + 1)],
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    let mut pool = PlannedPool::new(intern_plan("kept", plan), G, 1 << 30, 256);
    let kept = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(kept.offset, 0);
    // In setup (not the last phase) a second request misses: kept regions are
    // used from the steady step on.
    let early = pool.reserve(&mut storage, 100).unwrap();
    assert_ne!(early.storage.id, kept.storage.id);
    pool.step();
    let a = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!((a.storage.id, a.offset), (kept.storage.id, G));
    // Unplanned, and the kept region at 0 is held (the one at 2G + 1 is not
    // aligned): it goes beside.
    let b = pool.reserve(&mut storage, 100).unwrap();
    assert_ne!(b.storage.id, kept.storage.id);
    assert_eq!(pool.planned_stats().misses_unplanned, 2);
    // Once the kept block is released, the next unplanned request takes its region.
    pool.release(kept.slot).unwrap();
    let c = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!((c.storage.id, c.offset), (a.storage.id, 0));
    assert_eq!(pool.planned_stats().hits, 3);
    pool.check_invariants().unwrap();
    for slot in [early.slot, a.slot, b.slot, c.slot] {
        pool.release_with(&mut storage, slot).unwrap();
    }
    pool.check_invariants().unwrap();
}

#[test]
fn a_request_whose_entry_is_held_takes_an_entry_whose_planned_lifetime_fits() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    let phase = |name, requests, ends| PlanPhase {
        ends,
        ..PlanPhase::new(name, requests)
    };
    // The step plans three requests of 100 bytes: at 0 (until position 1), at G
    // (from position 1 to 3) and at 2G (from position 2 to 3).
    let plan = Plan {
        height: 3 * G,
        phases: vec![
            phase("p0", vec![(100, 0)], vec![1]),
            phase("p1", vec![(100, 0), (100, G), (100, 2 * G)], vec![1, 3, 3]),
        ],
        kept: Vec::new(),
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    let mut pool = PlannedPool::new(intern_plan("fit", plan), G, 1 << 30, 256);
    let late = pool.reserve(&mut storage, 100).unwrap();
    pool.step();
    // `late` still holds 0: the first request takes G, planned free until position 1.
    let a = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!((a.storage.id, a.offset), (late.storage.id, G));
    // The second finds its entry (G) taken; 0 is held, and 2G is planned for a
    // block whose lifetime meets its own: it misses.
    let b = pool.reserve(&mut storage, 100).unwrap();
    assert_ne!(b.storage.id, late.storage.id);
    assert_eq!(pool.planned_stats().misses_held, 1);
    // The third takes its own entry.
    let c = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!((c.storage.id, c.offset), (late.storage.id, 2 * G));
    assert_eq!(pool.planned_stats().hits, 3);
    pool.check_invariants().unwrap();
    // Without lifetimes in the plan, the first request would have missed.
    let plan = Plan {
        height: 3 * G,
        phases: vec![
            PlanPhase::new("p0", vec![(100, 0)]),
            PlanPhase::new("p1", vec![(100, 0), (100, G), (100, 2 * G)]),
        ],
        kept: Vec::new(),
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    let mut pool = PlannedPool::new(intern_plan("no fit", plan), G, 1 << 30, 256);
    pool.reserve(&mut storage, 100).unwrap();
    pool.step();
    pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(pool.planned_stats().misses_held, 1);
}

#[test]
fn optional_entries_held_by_a_live_block_are_passed_over() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    let plan = Plan {
        height: 3 * G,
        phases: vec![PlanPhase {
            optional: vec![0],
            ..PlanPhase::new("step", vec![(100, 0), (100, G), (100, 2 * G)])
        }],
        kept: Vec::new(),
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    let mut pool = PlannedPool::new(intern_plan("optional", plan), G, 1 << 30, 256);
    let kept = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(kept.offset, 0);
    pool.step();
    // The optional first entry is held by `kept`: the request takes the second.
    let a = pool.reserve(&mut storage, 100).unwrap();
    let b = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!((a.offset, b.offset), (G, 2 * G));
    pool.step();
    pool.release(kept.slot).unwrap();
    pool.release(a.slot).unwrap();
    // Free again, it is taken.
    let c = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(c.offset, 0);
    assert_eq!(pool.planned_stats().misses(), 0);
    pool.check_invariants().unwrap();
}

#[test]
fn requests_match_where_the_orders_agree() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    // Two of 100 bytes far apart in the step, with 40 of 200 bytes between them.
    let mut requests = vec![(100, 0)];
    requests.extend((1..=40).map(|i| (200, i * G)));
    requests.push((100, 41 * G));
    let mut pool = pool(vec![requests], 42 * G);
    // A request of 100 bytes the plan did not foresee, at the step's start: the
    // second entry is planned 41 requests later, so it is left for its own request.
    let first = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(first.offset, 0);
    let extra = pool.reserve(&mut storage, 100).unwrap();
    assert_ne!(extra.storage.id, first.storage.id, "beside");
    assert_eq!(pool.planned_stats().misses_unplanned, 1);
    let mut blocks = vec![first.slot, extra.slot];
    for i in 1..=40 {
        let block = pool.reserve(&mut storage, 200).unwrap();
        assert_eq!(block.offset, i * G, "the extra request shifted nothing");
        blocks.push(block.slot);
    }
    let last = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(last.offset, 41 * G);
    assert_eq!(pool.planned_stats().hits, 42);
    blocks.push(last.slot);
    pool.check_invariants().unwrap();
    // Next step: the run does not make the first request of 100 bytes. When the
    // second comes, the first entry is planned 41 requests before: passed over.
    pool.step();
    for slot in blocks {
        pool.release(slot).unwrap();
    }
    let mut blocks = Vec::new();
    for i in 1..=40 {
        let block = pool.reserve(&mut storage, 200).unwrap();
        assert_eq!(block.offset, i * G);
        blocks.push(block.slot);
    }
    let last = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(
        (last.storage.id, last.offset),
        (first.storage.id, 41 * G),
        "its own entry, not the first"
    );
    assert_eq!(pool.planned_stats().hits, 42 + 41);
    pool.check_invariants().unwrap();
}

#[test]
fn a_plan_past_the_range_is_not_used_and_costs_no_books() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    let far = u64::MAX / 2;
    let mut pool = pool(vec![vec![(100, far), (100, 0)]], far + 100);
    assert!(pool.granules.touches.len() <= (1 << 30) / G as usize);
    let a = pool.reserve(&mut storage, 100).unwrap();
    let b = pool.reserve(&mut storage, 100).unwrap();
    assert_eq!(
        pool.planned_stats().misses_held,
        1,
        "past the range: beside"
    );
    assert_ne!(a.storage.id, b.storage.id);
    assert_eq!(
        (b.offset, pool.planned_stats().hits),
        (0, 1),
        "the rest is followed"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn idle_runs_stay_mapped_for_the_next_step() {
    let mut storage = VirtualStorage::new().with_granularity(G);
    let mut pool = pool(vec![vec![(G, 0), (G, G)]], 2 * G);
    for _ in 0..3 {
        let a = pool.reserve(&mut storage, G).unwrap();
        let b = pool.reserve(&mut storage, G).unwrap();
        pool.release(a.slot).unwrap();
        pool.release(b.slot).unwrap();
        pool.step();
    }
    pool.check_invariants().unwrap();
    assert_eq!(pool.stats().pages_peak, 2, "mapped once, reused");
    assert_eq!(pool.usage().bytes_reserved, 2 * G);
}

#[test]
fn idle_runs_stay_mapped_up_to_the_plans_peak() {
    // `a` at 0 is freed before `b` at G, then `c` at 0 lives beside `b`: the plan
    // touches two granules at once. Knowing that, the pool keeps `a`'s granule mapped
    // for `c` instead of unmapping it when `b` first raises the mapped bytes.
    // After a miss (a request of a size the plan does not make, first) the run has
    // left the plan: the pool goes back to its own high-water mark.
    let peaks = vec![(G, 2 * G), (4 * G, 4 * G)];
    for (peaks, miss, unmaps) in [
        (Vec::new(), false, 1),
        (peaks.clone(), false, 0),
        (peaks, true, 1),
    ] {
        let plan = Plan {
            height: 2 * G,
            phases: vec![PlanPhase::new("p", vec![(G, 0), (G, G), (G, 0)])],
            kept: Vec::new(),
            source: None,
            granule: None,
            peaks,
            cycle: 1,
        };
        let mut pool = PlannedPool::new(intern_plan("peaks", plan), G, 1 << 30, 256);
        let mut storage = VirtualStorage::new().with_granularity(G);
        if miss {
            let beside = pool.reserve(&mut storage, 256).unwrap();
            pool.release(beside.slot).unwrap();
            // The virtual pool beside unmaps what it freed (one unmap).
            pool.cleanup(&mut storage, 1, false);
        }
        let a = pool.reserve(&mut storage, G).unwrap();
        pool.release(a.slot).unwrap();
        let b = pool.reserve(&mut storage, G).unwrap();
        let c = pool.reserve(&mut storage, G).unwrap();
        assert_eq!((b.offset, c.offset), (G, 0));
        pool.check_invariants().unwrap();
        assert_eq!(pool.stats().pages_unmapped - u64::from(miss), unmaps);
        assert_eq!(pool.stats().bytes_reserved_peak, 2 * G);
        assert_eq!(pool.planned_stats().hits, 3);
        assert_eq!(pool.planned_stats().misses(), u64::from(miss));
    }
}

#[test]
fn an_explicit_cleanup_gives_an_empty_arenas_range_back() {
    // Kept, the range leaked at every `install_pools` (its cleanup is explicit), until
    // the process had no address space left.
    let mut storage = VirtualStorage::new().with_granularity(G);
    let mut pool = pool(vec![vec![(1000, 0), (2000, 4096)]], 2 * G);
    let a = pool.reserve(&mut storage, 1000).unwrap();
    let first = a.storage;
    // A live block keeps it.
    pool.cleanup(&mut storage, 1, true);
    assert_eq!(pool.range.map(|range| range.id), Some(first.id));
    pool.release_with(&mut storage, a.slot).unwrap();
    pool.cleanup(&mut storage, 1, true);
    assert!(pool.range.is_none());
    assert!(matches!(
        VirtualMemory::map(&mut storage, first.id, 0, G),
        Err(crate::storage::MappingError::UnknownRange { .. })
    ));
    assert_eq!(storage.ranges_reserved(), 1);
    // The next arena block reserves a range again, and is served from the plan.
    pool.step();
    let b = pool.reserve(&mut storage, 1000).unwrap();
    assert_ne!(b.storage.id, first.id);
    assert_eq!(storage.ranges_reserved(), 2);
    assert_eq!(pool.planned_stats().hits, 2);
    pool.check_invariants().unwrap();
}
