//! The independent checker every placement passes before it is returned.
//!
//! It shares no code with the placers: it sweeps time and keeps the live buffers in a
//! map ordered by offset, so an overlap shows as a neighbour in that map.

use std::collections::BTreeMap;

use super::problem::Buffer;

/// What is wrong with a placement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// The offsets are not one per buffer.
    #[error("{offsets} offsets for {buffers} buffers")]
    Count {
        /// Offsets given.
        offsets: usize,
        /// Buffers placed.
        buffers: usize,
    },
    /// A buffer's end passes 2^64.
    #[error("buffer {index}: offset {offset} plus size {size} passes 2^64")]
    Overflow {
        /// The buffer.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its size.
        size: u64,
    },
    /// A buffer ends past the capacity.
    #[error("buffer {index} ends at {end}, past the capacity {capacity}")]
    PastCapacity {
        /// The buffer.
        index: usize,
        /// Its offset plus size.
        end: u64,
        /// The capacity.
        capacity: u64,
    },
    /// Two buffers live at the same time share bytes.
    #[error("buffers {first} and {second} are live at the same time and overlap in memory")]
    Overlap {
        /// One buffer.
        first: usize,
        /// The other.
        second: usize,
    },
}

/// Checks that `offsets` place `buffers` with no two buffers live at the same time
/// sharing a byte, and every buffer within `capacity` if one is given. Returns the
/// height: the largest offset plus size (0 with no buffers).
pub fn check_placement(
    buffers: &[Buffer],
    offsets: &[u64],
    capacity: Option<u64>,
) -> Result<u64, Violation> {
    if buffers.len() != offsets.len() {
        return Err(Violation::Count {
            offsets: offsets.len(),
            buffers: buffers.len(),
        });
    }
    let mut height = 0u64;
    for (index, (buffer, &offset)) in buffers.iter().zip(offsets).enumerate() {
        let end = offset.checked_add(buffer.size).ok_or(Violation::Overflow {
            index,
            offset,
            size: buffer.size,
        })?;
        if let Some(capacity) = capacity {
            if end > capacity {
                return Err(Violation::PastCapacity {
                    index,
                    end,
                    capacity,
                });
            }
        }
        height = height.max(end);
    }
    // Times at which buffers start or end; at one time every end comes first, since a
    // buffer ending at t and one starting at t are never live together.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(buffers.len() * 2);
    for (index, buffer) in buffers.iter().enumerate() {
        // A buffer of no bytes shares no byte with any other.
        if buffer.size > 0 && buffer.lower < buffer.upper {
            events.push((buffer.lower, true, index));
            events.push((buffer.upper, false, index));
        }
    }
    events.sort_unstable();
    // Live buffers by offset: offset -> (end, index).
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (_, starts, index) in events {
        let offset = offsets[index];
        if !starts {
            live.remove(&offset);
            continue;
        }
        let end = offset + buffers[index].size;
        if let Some((_, &(below_end, below))) = live.range(..=offset).next_back() {
            if below_end > offset {
                return Err(Violation::Overlap {
                    first: below.min(index),
                    second: below.max(index),
                });
            }
        }
        if let Some((_, &(_, above))) = live.range(offset..end).next() {
            return Err(Violation::Overlap {
                first: above.min(index),
                second: above.max(index),
            });
        }
        live.insert(offset, (end, index));
    }
    Ok(height)
}
