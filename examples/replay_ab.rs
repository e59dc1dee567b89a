//! Replay timing of two layouts on one trace, interleaved (A/B/A/B, best of N) so
//! the machine's load affects both alike.
//!
//! `cargo run --release --example replay_ab -- TRACE.jsonl LAYOUT_A LAYOUT_B [N]`
//! prints each layout's best ns/event, its utilization (or, where some reserves
//! failed, how many: such a replay did not hold the trace) and storage calls, and the
//! ratio B/A. With N = 0 it replays layout B once only (for instruction counting
//! under `valgrind --tool=callgrind`).
//!
//! Both layouts are resolved with the default device properties, the largest page
//! raised to hold the trace's largest allocation where 2 GiB does not (as
//! `benches/python/virtual_tradeoff.py`'s `timing_properties`): a layout that fails
//! reserves for want of a page does less work, and its time is no yardstick.

use cubepool::config::MemoryConfiguration;
use cubepool::trace::{replay, ReplayOptions, Trace};
use cubepool::MemoryDeviceProperties;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: replay_ab TRACE LAYOUT_A LAYOUT_B [N]");
        std::process::exit(2);
    }
    let trace = Trace::load(&args[1]).unwrap_or_else(|error| {
        eprintln!("cannot load {}: {error}", args[1]);
        std::process::exit(1);
    });
    let layouts: Vec<MemoryConfiguration> = args[2..4]
        .iter()
        .map(|text| {
            MemoryConfiguration::parse(text).unwrap_or_else(|error| {
                eprintln!("bad layout {text}: {error}");
                std::process::exit(1);
            })
        })
        .collect();
    let repeats: usize = args.get(4).map_or(5, |n| n.parse().unwrap_or(5));
    let options = ReplayOptions {
        limit: None,
        samples: 0,
    };
    let properties = timing_properties(&trace);
    if repeats == 0 {
        let result = replay(&trace, &layouts[1], properties, options).expect("valid layout");
        println!("{:.1} ns/event", result.ns_per_event());
        return;
    }
    let mut best = [f64::INFINITY; 2];
    let mut last = Vec::new();
    for _ in 0..repeats {
        last.clear();
        for (index, layout) in layouts.iter().enumerate() {
            let result = replay(&trace, layout, properties, options).expect("valid layout");
            best[index] = best[index].min(result.ns_per_event());
            last.push(result);
        }
    }
    for (index, result) in last.iter().enumerate() {
        // An incomplete replay has no utilization (it did not hold the trace).
        let utilization = if result.complete() {
            format!("utilization {:.3}", result.utilization)
        } else {
            format!("incomplete ({} reserves failed)", result.failed_reserves)
        };
        println!(
            "{}: {:.1} ns/event, {utilization}, calls {}",
            args[2 + index],
            best[index],
            result.storage_allocations + result.storage_frees
        );
    }
    println!("ratio {:.3}", best[1] / best[0]);
}

/// The default device properties, with the largest page raised to the smallest power
/// of two that holds `trace`'s largest allocation where the default's does not.
fn timing_properties(trace: &Trace) -> MemoryDeviceProperties {
    let default = MemoryDeviceProperties::default();
    let largest = trace.sizes().iter().copied().max().unwrap_or(0);
    MemoryDeviceProperties {
        max_page_size: default
            .max_page_size
            .max(largest.checked_next_power_of_two().unwrap_or(u64::MAX)),
        ..default
    }
}
