//! A replay looked at again: [`at_peak`], the address space after one event of what
//! a replay ran through ([`Replayed`]).

use super::memory::Replayable;
use super::replayer::Replayer;
use crate::config::{MemoryConfiguration, MemoryDeviceProperties, PoolConfigError};
use crate::management::MemoryManagement;
use crate::storage::VirtualStorage;
use crate::trace::at_peak::AtPeak;
use crate::trace::torch_model::{TorchAllocator, TorchSettings};
use crate::trace::Trace;

/// What a replay ran through, so that its peak can be looked at again ([`at_peak`]).
#[derive(Debug, Clone)]
pub enum Replayed {
    /// A pool layout on a device.
    Layout {
        /// The layout.
        configuration: MemoryConfiguration,
        /// The device.
        properties: MemoryDeviceProperties,
    },
    /// The model of PyTorch's caching allocator.
    Torch(TorchSettings),
}

/// The address space of the replay of `trace` through `replayed` (under `limit`) right
/// after event `event` (the last event when past the end; nothing for an empty trace),
/// before any pages a periodic cleanup gives back within that event's reserve (they
/// were held until it ran, and count for the peak): at a result's
/// `peak_reserved_event`, why its peak reserves more than is live.
pub fn at_peak(
    trace: &Trace,
    replayed: &Replayed,
    limit: Option<u64>,
    event: usize,
) -> Result<AtPeak, PoolConfigError> {
    let storage = || match limit {
        Some(limit) => VirtualStorage::with_limit(limit),
        None => VirtualStorage::new(),
    };
    Ok(match replayed {
        Replayed::Layout {
            configuration,
            properties,
        } => {
            let memory = MemoryManagement::from_configuration(
                storage(),
                *properties,
                configuration.clone(),
            )?;
            view_after(trace, memory, event)
        }
        Replayed::Torch(settings) => {
            view_after(trace, TorchAllocator::new(*settings, limit), event)
        }
    })
}

/// Replays `trace` through `memory` up to and with event `event`, and views it as
/// that event left it at its most: a reserve's periodic cleanup does not run (what it
/// gives back was held until then, and a replay's peak counts it).
fn view_after<A: Replayable>(trace: &Trace, memory: A, event: usize) -> AtPeak {
    let mut replayer = Replayer::new(trace, memory, 0);
    replayer.open_run();
    let last = event.min(trace.events.len());
    for (index, step) in trace.events.iter().enumerate().take(last.saturating_add(1)) {
        if index == last {
            replayer.memory.hold_within_reserve();
        }
        replayer.step(index, step);
    }
    let blocks = replayer
        .slots
        .iter()
        .enumerate()
        .filter_map(|(id, slot)| {
            let (place, size) = replayer.memory.place_of((*slot)?)?;
            Some((id as u32, place, size, trace.sizes[id]))
        })
        .collect();
    AtPeak::build(event, replayer.memory.segments(), blocks)
}
