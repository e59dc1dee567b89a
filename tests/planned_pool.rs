//! The planned pool never hands out bytes another live block holds: random plans against
//! random request streams (some following the plan, some perturbed, some ignoring it),
//! checked by an independent checker after every operation and every step.
#![cfg(not(feature = "exclusive-memory-only"))]

use cubepool::plan_file::{intern_plan, Plan, PlanPhase};
use cubepool::pool::{MemoryPool, Placement, PlannedPool};
use cubepool::{MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, VirtualStorage};
use proptest::prelude::*;
mod common;

const GRANULE: u64 = 4096;
const ALIGN: u64 = 256;

/// One operation of a request stream.
#[derive(Debug, Clone)]
enum Op {
    Reserve(u64),
    /// Release the live reservation at this index (modulo the live count).
    Release(usize),
    Step,
    Cleanup,
}

/// A random plan: phases of requests at random offsets (overlapping or not: a plan
/// the pool follows blindly must still never make two live blocks share a byte).
fn plan() -> impl Strategy<Value = Plan> {
    let request = (
        prop_oneof![1u64..=600, Just(256u64), Just(4096u64), 1u64..=20_000],
        0u64..64,
        any::<bool>(),
    )
        .prop_map(|(size, slot, optional)| (size, slot * ALIGN * 3, optional));
    // Phases longer than the pool's window (16 requests), so that requests drift out of
    // it both ways (dropped and unforeseen ones below).
    // Kept regions at random offsets too (overlapping the phases' requests or not), so
    // that the fallback to a free kept region is checked as blindly.
    let kept = prop::collection::vec(
        (prop_oneof![1u64..=600, Just(4096u64)], 0u64..64)
            .prop_map(|(size, slot)| (size, slot * ALIGN * 3)),
        0..8,
    );
    let phases = prop::collection::vec(prop::collection::vec(request, 0..48), 0..4);
    // Cycles of any length, past the number of phases too (the pool clamps them), so
    // that runs alternating the last phases are checked as blindly.
    (phases, kept, 0usize..5).prop_map(|(phases, kept, cycle)| {
        let height = phases
            .iter()
            .flatten()
            .map(|&(size, offset, _)| offset + size)
            .chain(kept.iter().map(|&(size, offset)| offset + size))
            .max()
            .unwrap_or(0);
        Plan {
            height,
            phases: phases
                .into_iter()
                .enumerate()
                .map(|(i, requests)| PlanPhase {
                    name: format!("p{i}"),
                    // Random planned lifetimes (positions), so that requests placed off
                    // their own entries are checked as blindly.
                    ends: requests
                        .iter()
                        .map(|&(size, offset, _)| ((size ^ offset) % 64) as usize)
                        .collect(),
                    optional: (0..requests.len()).filter(|&r| requests[r].2).collect(),
                    requests: requests
                        .iter()
                        .map(|&(size, offset, _)| (size, offset))
                        .collect(),
                })
                .collect(),
            kept,
            source: None,
            granule: None,
            peaks: Vec::new(),
            cycle,
        }
    })
}

/// A request stream made from the plan: its phases' sizes in order, with steps between
/// them, repeated; perturbed by swaps, drops, extra requests and late releases, or
/// (`follow` false) random sizes that ignore the plan.
fn ops(plan: &Plan, follow: bool, noise: &[u64]) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut n = 0usize;
    let mut draw = || {
        n += 1;
        noise[n % noise.len()]
    };
    for round in 0..3 {
        for phase in &plan.phases {
            let mut live = 0usize;
            for &(size, _) in &phase.requests {
                let r = draw();
                let size = if follow { size } else { 1 + r % 9000 };
                match r % 11 {
                    0 => {}                                   // dropped
                    1 => ops.push(Op::Reserve(1 + r % 5000)), // unforeseen
                    2 if follow => {
                        // A burst of unforeseen requests of the plan's own size.
                        for _ in 0..r % 20 {
                            ops.push(Op::Reserve(size));
                        }
                    }
                    _ => {}
                }
                if r % 11 != 0 {
                    ops.push(Op::Reserve(size));
                    live += 1;
                }
                if r % 3 == 0 && live > 0 {
                    ops.push(Op::Release((r / 3) as usize));
                    live -= 1;
                }
            }
            if draw() % 5 == 0 {
                ops.push(Op::Cleanup);
            }
            ops.push(Op::Step);
            let _ = round;
        }
    }
    ops
}

/// The independent checker: the live placements never overlap (by address), and each
/// is where it was placed.
fn check(pool: &PlannedPool, live: &[Placement]) -> Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)?;
    common::check_disjoint(live)?;
    for placement in live {
        prop_assert_eq!(pool.locate(placement.slot), Some(*placement));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn no_two_live_blocks_share_a_byte(
        plan in plan(),
        follow in any::<bool>(),
        noise in prop::collection::vec(any::<u64>(), 1..64),
    ) {
        let ops = ops(&plan, follow, &noise);
        let reserves = ops.iter().filter(|op| matches!(op, Op::Reserve(_))).count() as u64;
        let id = intern_plan("proptest", plan);
        let mut pool = PlannedPool::new(id, GRANULE, 1 << 30, ALIGN);
        let mut storage = VirtualStorage::new().with_granularity(GRANULE);
        let mut live: Vec<Placement> = Vec::new();
        for op in ops {
            match op {
                Op::Reserve(size) => live.push(pool.reserve(&mut storage, size).unwrap()),
                Op::Release(index) if !live.is_empty() => {
                    let placement = live.swap_remove(index % live.len());
                    pool.release_with(&mut storage, placement.slot).unwrap();
                }
                Op::Release(_) => {}
                Op::Step => pool.step(),
                Op::Cleanup => pool.cleanup(&mut storage, 0, true),
            }
            check(&pool, &live)?;
        }
        let stats = pool.planned_stats();
        prop_assert_eq!(stats.hits + stats.misses(), reserves, "every request counted once");
        for placement in live.drain(..) {
            pool.release_with(&mut storage, placement.slot).unwrap();
        }
        pool.cleanup(&mut storage, 0, true);
        check(&pool, &live)?;
        prop_assert_eq!(pool.usage().bytes_reserved, 0, "everything unmapped");
    }
}

/// A plan of `phases` in `height` bytes, written as `plan.json` in a fresh folder named
/// after `name`, and the configuration that follows it with 4 KiB granules (the folder
/// is the caller's to remove).
fn plan_config(
    name: &str,
    height: u64,
    phases: Vec<PlanPhase>,
) -> (std::path::PathBuf, MemoryConfiguration) {
    let dir = std::env::temp_dir().join(format!("cubepool-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("plan.json");
    let plan = Plan {
        height,
        phases,
        kept: Vec::new(),
        source: None,
        granule: None,
        peaks: Vec::new(),
        cycle: 1,
    };
    std::fs::write(&file, plan.to_json()).unwrap();
    let text = format!("planned(file={}, granule=4KiB)", file.display());
    let config = MemoryConfiguration::parse(&text).unwrap();
    assert_eq!(config.to_string(), text, "round-trips");
    (dir, config)
}

/// The device properties of these tests: `ALIGN`-byte alignment.
fn properties() -> MemoryDeviceProperties {
    MemoryDeviceProperties {
        alignment: ALIGN,
        ..MemoryDeviceProperties::default()
    }
}

/// A memory management over virtual storage of `GRANULE`-byte granules with `config`.
fn managed(config: MemoryConfiguration) -> MemoryManagement<VirtualStorage> {
    let storage = VirtualStorage::new().with_granularity(GRANULE);
    MemoryManagement::from_configuration(storage, properties(), config).unwrap()
}

/// A plan that matches its run exactly is followed with no miss, and its arena maps the
/// granules the placement touches, not more.
#[test]
fn an_exact_run_follows_its_plan_without_a_miss() {
    // Setup keeps 8 KiB at 0; each step makes two 4 KiB blocks at 8 KiB and 12 KiB.
    let phases = vec![
        PlanPhase::new("setup", vec![(8192, 0)]),
        PlanPhase::new("step", vec![(4096, 8192), (4096, 12288)]),
    ];
    let (dir, config) = plan_config("planned", 16384, phases);
    let mut memory = managed(config);
    let weights = memory.reserve(8192).unwrap();
    for _ in 0..4 {
        memory.step();
        let a = memory.reserve(4096).unwrap();
        let b = memory.reserve(4096).unwrap();
        memory.release(a);
        memory.release(b);
        memory.check_invariants().unwrap();
    }
    let stats = memory.planned_stats().unwrap();
    assert_eq!((stats.hits, stats.misses(), stats.steps), (9, 0, 4));
    assert_eq!(memory.memory_usage().bytes_reserved, 16384);
    drop(weights);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plan whose offsets reach the top of the address space (a crafted file: every offset
/// plus size within its height of u64::MAX) serves the request beside, with no panic
/// from the aligned extent's overflow.
#[test]
fn a_plan_offset_at_the_top_of_the_address_space_goes_beside() {
    let phases = vec![PlanPhase::new("setup", vec![(1, u64::MAX - 255)])];
    let (dir, config) = plan_config("planned-top", u64::MAX, phases);
    let mut memory = managed(config);
    let handle = memory.reserve(1).unwrap();
    memory.check_invariants().unwrap();
    assert_eq!(memory.planned_stats().unwrap().misses(), 1);
    drop(handle);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plan file that cannot be read is a typed error naming the file and the problem.
#[test]
fn a_bad_plan_file_is_an_error_naming_it() {
    let error = MemoryConfiguration::parse("planned(file=/nonexistent/plan.json)").unwrap_err();
    let message = error.to_string();
    assert!(message.contains("/nonexistent/plan.json"), "{message}");
    assert_eq!(error.error.kind(), "PlanFile");
}

/// In a replay, the trace's phases are the step boundaries: with them, each step follows
/// its phase of the plan (no miss: the steps land on the granules the first step mapped,
/// kept, with no storage call); the same events without phases stay in the first phase,
/// whose entries the later steps' requests do not find: they miss, and the virtual pool
/// beside (eager) maps for each.
#[test]
fn a_replay_takes_step_boundaries_from_the_trace_phases() {
    use cubepool::trace::{replay, ReplayOptions, Trace};
    // Each step: one block of 3 granules at 0, freed, then two of 1 granule at 0 and 4 KiB.
    let step = vec![(3 * GRANULE, 0), (GRANULE, 0), (GRANULE, GRANULE)];
    let phases = vec![
        PlanPhase::new("setup", vec![]),
        PlanPhase::new("step", step),
    ];
    let (dir, config) = plan_config("planned-replay", 3 * GRANULE, phases);
    let mut events = Vec::new();
    let mut phases = vec![r#"{"name":"setup","first_event":0}"#.to_string()];
    let mut id = 0;
    for s in 0..3 {
        phases.push(format!(
            r#"{{"name":"step{s}","first_event":{}}}"#,
            events.len()
        ));
        for size in [3 * GRANULE, GRANULE, GRANULE] {
            events.push(format!(
                r#"{{"t":{},"op":"alloc","id":{id},"size":{size}}}"#,
                events.len()
            ));
            if size > GRANULE {
                events.push(format!(r#"{{"t":{},"op":"free","id":{id}}}"#, events.len()));
            }
            id += 1;
        }
        for done in [id - 2, id - 1] {
            events.push(format!(
                r#"{{"t":{},"op":"free","id":{done}}}"#,
                events.len()
            ));
        }
    }
    let header = |phases: &str| {
        format!(r#"{{"format":"cubepool-trace","version":1,"workload":"w"{phases}}}"#)
    };
    let with = format!(r#","phases":[{}]"#, phases.join(","));
    let mut peaks = Vec::new();
    for head in [header(&with), header("")] {
        let text = format!("{head}\n{}\n", events.join("\n"));
        let trace = Trace::read(text.as_bytes()).unwrap();
        let options = ReplayOptions {
            limit: None,
            samples: 0,
        };
        let result = replay(&trace, &config, properties(), options).unwrap();
        assert_eq!(result.failed_reserves, 0);
        peaks.push((result.peak_reserved, result.storage_allocations));
    }
    assert_eq!(peaks[0].0, 3 * GRANULE, "every request as planned");
    assert!(
        peaks[1].1 > peaks[0].1,
        "without steps, requests miss: {peaks:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
