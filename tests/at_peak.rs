//! Why reserved exceeds live: the view of a replay at its peak, on the bundled traces,
//! for CubeCL's layouts, the virtual pool and both models of PyTorch's allocator.
// These scenarios use sliced pools, which exclusive-memory-only builds refuse.
#![cfg(not(feature = "exclusive-memory-only"))]

use std::collections::HashSet;

use cubepool::trace::{
    at_peak, replay, replay_torch, replay_until, ReplayOptions, Replayed, StopWhen, TorchSettings,
    Trace, TraceEvent,
};
use cubepool::{MemoryConfiguration, MemoryDeviceProperties};

fn example(name: &str) -> Trace {
    let path = format!(
        "{}/python/cubepool/examples/data/{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::load(path).unwrap()
}

/// The allocations live right after event `event`, by id.
fn live_after(trace: &Trace, event: usize) -> HashSet<u32> {
    let mut live = HashSet::new();
    for step in &trace.events()[..=event] {
        match *step {
            TraceEvent::Alloc { id, .. } => live.insert(id),
            TraceEvent::Free { id, .. } => live.remove(&id),
        };
    }
    live
}

#[test]
fn the_view_at_the_peak_adds_up_and_its_pins_are_live() {
    let properties = MemoryDeviceProperties::default();
    // gpt2-generate: ExclusivePages peaks within a reserve (a periodic cleanup).
    for name in ["gpt2-train", "gpt2-generate", "transformer-train"] {
        let trace = example(name);
        let mut replays: Vec<(String, Replayed, u64, usize)> = Vec::new();
        for configuration in [
            MemoryConfiguration::Compact,
            MemoryConfiguration::SubSlices,
            MemoryConfiguration::ExclusivePages,
            MemoryConfiguration::VirtualPages,
        ] {
            let result =
                replay(&trace, &configuration, properties, ReplayOptions::default()).unwrap();
            let label = format!("{configuration:?}");
            let replayed = Replayed::Layout {
                configuration,
                properties,
            };
            replays.push((
                label,
                replayed,
                result.peak_reserved,
                result.peak_reserved_event,
            ));
        }
        for settings in [TorchSettings::default(), TorchSettings::expandable()] {
            let result = replay_torch(&trace, settings, ReplayOptions::default());
            let label = format!("{settings:?}");
            replays.push((
                label,
                Replayed::Torch(settings),
                result.peak_reserved,
                result.peak_reserved_event,
            ));
        }
        for (label, replayed, peak, event) in replays {
            let view = at_peak(&trace, &replayed, None, event).unwrap();
            view.check()
                .unwrap_or_else(|e| panic!("{name} {label}: {e}"));
            assert_eq!(view.reserved, peak, "{name} {label}");
            let live = live_after(&trace, event);
            let mut pinned = HashSet::new();
            for segment in &view.segments {
                assert_eq!(
                    segment.live + segment.free(),
                    segment.size,
                    "{name} {label}"
                );
                for block in &segment.blocks {
                    assert!(
                        live.contains(&block.id),
                        "{name} {label}: block {} is not live",
                        block.id
                    );
                    pinned.insert(block.id);
                }
            }
            // Every live allocation with bytes pins a segment, and what they asked for
            // is the trace's live bytes at that moment.
            let nonzero: HashSet<u32> = live
                .iter()
                .copied()
                .filter(|&id| trace.sizes()[id as usize] > 0)
                .collect();
            assert_eq!(pinned, nonzero, "{name} {label}");
            let requested: u64 = live.iter().map(|&id| trace.sizes()[id as usize]).sum();
            assert_eq!(view.requested, requested, "{name} {label}");
            assert_eq!(
                view.reserved - view.requested,
                view.free_in_pinned + view.rounding + view.idle,
                "{name} {label}"
            );
        }
    }
}

#[test]
fn a_view_of_input_no_replay_makes_is_saturated_or_refused_never_a_panic() {
    use cubepool::trace::{AtPeak, Place};
    let at = |group, start| Place { group, start };
    // Segments `(place, size)` and blocks `(id, place, size, requested)`.
    type Input = (Vec<(Place, u64)>, Vec<(u32, Place, u64, u64)>);
    let cases: Vec<Input> = vec![
        // Two blocks over one segment: more live bytes than the segment holds.
        (
            vec![(at(0, 0), 10)],
            vec![(0, at(0, 0), 10, 10), (1, at(0, 0), 10, 10)],
        ),
        // Segments whose sizes add up past 64 bits.
        (vec![(at(0, 0), u64::MAX), (at(1, 0), u64::MAX)], vec![]),
        // A block that asked for more than it holds, and one past every segment.
        (
            vec![(at(0, 0), 10)],
            vec![(0, at(0, 0), 10, 100), (1, at(5, 5), u64::MAX, u64::MAX)],
        ),
    ];
    for (segments, blocks) in cases {
        let view = AtPeak::build(0, segments, blocks);
        for segment in &view.segments {
            assert!(segment.free() <= segment.size);
        }
        // The view says what it found, or why it does not add up.
        let _ = view.check();
    }
    let overlapping = AtPeak::build(
        0,
        vec![(at(0, 0), 10)],
        vec![(0, at(0, 0), 10, 10), (1, at(0, 0), 10, 10)],
    );
    assert!(
        overlapping.check().is_err(),
        "20 live bytes in 10 are refused"
    );
    let past = AtPeak::build(0, vec![(at(0, 0), u64::MAX), (at(1, 0), u64::MAX)], vec![]);
    assert_eq!(past.reserved, u64::MAX, "saturated");
    assert!(past.check().unwrap_err().contains("pass 64 bits"));
}

/// A reserve that makes a page while its periodic cleanup gives an idle one back held
/// both for a while: the replay's peak counts that moment, and the view at the peak
/// shows it (the idle page among the segments), as the device held them.
#[test]
fn a_peak_within_a_reserve_counts_what_its_periodic_cleanup_gave_back() {
    use cubepool::trace::format::TraceBuilder;
    use cubepool::trace::TraceHeader;
    use cubepool::{MemoryPoolOptions, PoolType};

    let properties = MemoryDeviceProperties::default();
    let unit = properties.alignment.max(512);
    // One large page, freed, then pages of new sizes, each kept: none can reuse the
    // large one, which a periodic check releases within one of their reserves.
    let idle = 64 * unit;
    let mut builder = TraceBuilder::new(TraceHeader::default());
    builder.alloc(0, 0, idle).unwrap();
    builder.free(1, 0).unwrap();
    let kept: Vec<u64> = (1..=12).map(|k| k * unit).collect();
    for (i, &size) in kept.iter().enumerate() {
        builder.alloc(2 + i as u64, 1 + i as u64, size).unwrap();
    }
    let trace = builder.finish().unwrap();
    let configuration = MemoryConfiguration::Custom {
        pool_options: vec![MemoryPoolOptions {
            pool_type: PoolType::ExclusivePages {
                max_alloc_size: 1 << 20,
            },
            dealloc_period: Some(5),
        }],
    };
    let run = |events: usize| {
        replay(
            &trace.prefix(events),
            &configuration,
            properties,
            ReplayOptions::default(),
        )
        .unwrap()
    };
    // The reserve within which the idle page went back: the first prefix that frees.
    let freeing = (1..=trace.len())
        .find(|&events| run(events).storage_frees == 1)
        .expect("the periodic check releases the idle page");
    let made: u64 = kept[..freeing - 2].iter().sum();
    let result = run(trace.len());
    assert!(
        freeing < trace.len(),
        "a later reserve keeps the peak inside"
    );
    assert_eq!(result.peak_reserved, idle + made);
    assert_eq!(result.peak_reserved_event, freeing - 1);
    // After the trace, the idle page is gone: the peak is not a state after an event.
    assert!(result.peak_reserved > kept.iter().sum::<u64>());

    let replayed = Replayed::Layout {
        configuration: configuration.clone(),
        properties,
    };
    let view = at_peak(&trace, &replayed, None, result.peak_reserved_event).unwrap();
    view.check().unwrap();
    assert_eq!(view.reserved, result.peak_reserved);
    assert_eq!(view.idle, idle);

    // A bounded replay stops where the peak passes its bound, within a reserve too.
    let stop = StopWhen {
        reserved_above: Some(result.peak_reserved - 1),
        ..StopWhen::default()
    };
    let (_, stopped) = replay_until(&trace, &configuration, properties, stop).unwrap();
    assert_eq!(stopped, Some(result.peak_reserved_event));
}
