//! Routing: where a layout places each size ([`routes`]), and the same as runs of
//! sizes routed alike ([`route_runs`]).

use crate::config::{MemoryConfiguration, MemoryDeviceProperties, PoolConfigError};
use crate::handle::PoolRef;
use crate::management::MemoryManagement;
use crate::storage::VirtualStorage;

/// Where a layout places each of `sizes`, as a fresh memory management with its pools
/// routes it: `Some(index)` of the dynamic pool that serves it, or `None` when no
/// dynamic pool does (size 0 is served without one; a size no pool takes fails). The
/// answer holds for every state of pools that no capacity limit makes pass requests on.
pub fn routes(
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    sizes: &[u64],
) -> Result<Vec<Option<usize>>, PoolConfigError> {
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        properties,
        configuration.clone(),
    )?;
    Ok(sizes
        .iter()
        .map(|&size| match memory.reserve_slot_ref(size) {
            Ok(slot_ref) => {
                // Handed straight back: the next size finds the pools as they were.
                let _ = memory.release_slot(slot_ref);
                match slot_ref.pool {
                    PoolRef::Dynamic(pool) => Some(pool as usize),
                    _ => None,
                }
            }
            Err(_) => None,
        })
        .collect())
}

/// A run of consecutive entries of the sizes given to [`route_runs`] that a layout
/// routes alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRun {
    /// Index of the run's first size.
    pub start: usize,
    /// Index one past the run's last size (`start < end`).
    pub end: usize,
    /// Where its sizes go, as [`routes`] says it.
    pub route: Option<usize>,
}

/// What [`routes`] answers for `sizes`, as maximal runs of consecutive entries routed
/// alike, with a number of routing questions that grows with the runs, not the sizes.
///
/// A planner asks where thousands of layouts route a trace's distinct sizes; asking
/// for every size costs a reservation per size and layout (60,000 events with 15,000
/// distinct sizes: 7 s of a 36 s plan). Where a fresh memory routes a size depends on
/// which side of each pool's `AcceptRule` change points it lies (and of the largest
/// page, past which no page is made); so `sizes` is cut at those points, each piece
/// is asked at its two ends, and a piece whose ends route apart is cut in two and
/// asked again, down to single sizes. Sizes that do not ascend are asked one by one.
/// Invariant (tested against [`routes`]): the runs, expanded, are what [`routes`]
/// answers.
pub fn route_runs(
    configuration: &MemoryConfiguration,
    properties: MemoryDeviceProperties,
    sizes: &[u64],
) -> Result<Vec<RouteRun>, PoolConfigError> {
    let mut memory = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        properties,
        configuration.clone(),
    )?;
    // The smallest sizes at which some rule's answer may change (and size 0, served
    // apart, and the largest page's end).
    let mut changes = vec![1, properties.max_page_size.saturating_add(1)];
    for rule in memory.accept_rules() {
        changes.extend(rule.max_size.checked_add(1));
        if let Some(page) = rule.near_page.filter(|&page| page > 0) {
            changes.push(page - (page - 1) / 5);
            changes.extend(page.checked_add(1));
        }
    }
    changes.sort_unstable();
    let mut ask = |size: u64| -> Option<usize> {
        match memory.reserve_slot_ref(size) {
            Ok(slot_ref) => {
                // Handed straight back: the next size finds the pools as they were.
                let _ = memory.release_slot(slot_ref);
                match slot_ref.pool {
                    PoolRef::Dynamic(pool) => Some(pool as usize),
                    _ => None,
                }
            }
            Err(_) => None,
        }
    };
    // Pieces: ascending stretches with no change point inside.
    let mut pieces = Vec::new();
    let mut start = 0;
    for index in 1..=sizes.len() {
        let cut = index == sizes.len() || {
            let (low, high) = (sizes[index - 1], sizes[index]);
            low >= high || changes.iter().any(|&c| low < c && c <= high)
        };
        if cut {
            pieces.push((start, index));
            start = index;
        }
    }
    let mut runs: Vec<RouteRun> = Vec::new();
    let push = |runs: &mut Vec<RouteRun>, start: usize, end: usize, route: Option<usize>| match runs
        .last_mut()
    {
        Some(last) if last.end == start && last.route == route => last.end = end,
        _ => runs.push(RouteRun { start, end, route }),
    };
    for (start, end) in pieces {
        // (start, end, route of the first size, route of the last) still to settle,
        // left to right.
        let first = ask(sizes[start]);
        let last = if end - start > 1 {
            ask(sizes[end - 1])
        } else {
            first
        };
        let mut stack = vec![(start, end, first, last)];
        while let Some((low, high, first, last)) = stack.pop() {
            if first == last || high - low <= 2 {
                if first == last {
                    push(&mut runs, low, high, first);
                } else {
                    push(&mut runs, low, low + 1, first);
                    push(&mut runs, high - 1, high, last);
                }
                continue;
            }
            let mid = low + (high - low) / 2;
            let before = ask(sizes[mid - 1]);
            let after = ask(sizes[mid]);
            // Right half under the left, so the left settles first.
            stack.push((mid, high, after, last));
            stack.push((low, mid, first, before));
        }
    }
    Ok(runs)
}
