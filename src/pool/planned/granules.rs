//! The arena's mapping in granules: which a live block touches, the mapped runs, the idle
//! ones, and the storage calls that map and unmap them.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::{MappingError, StorageHandle, VirtualMemory};

/// One mapped run of the arena's granules.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    /// Its granules.
    pub(super) len: u64,
    /// How many of them a live block touches.
    pub(super) live: u64,
}

/// The arena's mapping, in granules: which a live block touches and which are mapped.
/// Invariants (checked by `check`): `touches[g]` counts the live blocks touching
/// granule `g`; every touched granule is mapped; the runs do not overlap and `mapped[g]`
/// says whether a run holds `g`; a run's `live` counts its touched granules; `idle`
/// holds exactly the runs with `live == 0`.
#[derive(Debug, Clone, Default)]
pub(super) struct Granules {
    pub(super) granule: u64,
    pub(super) touches: Vec<u32>,
    pub(super) mapped: Vec<bool>,
    /// Runs by first granule.
    pub(super) runs: BTreeMap<u64, Run>,
    pub(super) idle: BTreeSet<u64>,
    pub(super) mapped_bytes: u64,
}

/// Storage calls made by one change of the mapping.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Calls {
    pub(super) maps: u64,
    pub(super) unmaps: u64,
}

impl Granules {
    pub(super) fn new(granule: u64, count: u64) -> Self {
        Self {
            granule,
            touches: vec![0; count as usize],
            mapped: vec![false; count as usize],
            ..Self::default()
        }
    }

    /// The granules `offset..offset + extent` touches.
    pub(super) fn span(&self, offset: u64, extent: u64) -> std::ops::Range<u64> {
        offset / self.granule..(offset + extent).div_ceil(self.granule)
    }

    /// The first granule of the run holding mapped granule `g`.
    fn run_start(&self, g: u64) -> u64 {
        *self
            .runs
            .range(..=g)
            .next_back()
            .expect("a mapped granule is in a run")
            .0
    }

    /// Touches the granules of a block; returns the unmapped granules it needs, as
    /// runs `(first, len)`.
    pub(super) fn touch(&mut self, offset: u64, extent: u64) -> Vec<(u64, u64)> {
        let mut missing: Vec<(u64, u64)> = Vec::new();
        for g in self.span(offset, extent) {
            let i = g as usize;
            self.touches[i] += 1;
            if self.touches[i] > 1 {
                continue;
            }
            if self.mapped[i] {
                let start = self.run_start(g);
                let run = self.runs.get_mut(&start).expect("found");
                if run.live == 0 {
                    self.idle.remove(&start);
                }
                run.live += 1;
            } else {
                match missing.last_mut() {
                    Some((first, len)) if *first + *len == g => *len += 1,
                    _ => missing.push((g, 1)),
                }
            }
        }
        missing
    }

    /// Undoes [`Granules::touch`] for a block that was not placed after all (the
    /// missing runs were not mapped).
    pub(super) fn untouch(&mut self, offset: u64, extent: u64) {
        for g in self.span(offset, extent) {
            let i = g as usize;
            self.touches[i] -= 1;
            if self.touches[i] == 0 && self.mapped[i] {
                let start = self.run_start(g);
                let run = self.runs.get_mut(&start).expect("found");
                run.live -= 1;
                if run.live == 0 {
                    self.idle.insert(start);
                }
            }
        }
    }

    /// Unmaps idle runs, largest first, until the mapped bytes are at most `goal` or
    /// none is left.
    pub(super) fn unmap_idle(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageHandle,
        goal: u64,
    ) -> Calls {
        let mut calls = Calls::default();
        let mut idle: Vec<(u64, u64)> = self.idle.iter().map(|&s| (self.runs[&s].len, s)).collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        for (len, start) in idle {
            if self.mapped_bytes <= goal {
                break;
            }
            // An unmap of a run that one map made is never refused by a sound storage;
            // if it is, the run stays mapped and booked.
            if memory
                .unmap(range.id, start * self.granule, len * self.granule)
                .is_err()
            {
                continue;
            }
            self.idle.remove(&start);
            self.runs.remove(&start);
            for g in start..start + len {
                self.mapped[g as usize] = false;
            }
            self.mapped_bytes -= len * self.granule;
            calls.unmaps += 1;
        }
        calls
    }

    /// Maps the `missing` runs a touched block needs, unmapping idle runs first where
    /// the mapped bytes would pass `limit`; on a lack of memory, unmaps every idle run
    /// and tries once more. The storage calls made, failed or not, are added to `calls`.
    pub(super) fn map(
        &mut self,
        memory: &mut dyn VirtualMemory,
        range: StorageHandle,
        missing: &[(u64, u64)],
        limit: u64,
        calls: &mut Calls,
    ) -> Result<(), MappingError> {
        let wanted: u64 = missing.iter().map(|run| run.1).sum::<u64>() * self.granule;
        if self.mapped_bytes + wanted > limit {
            let goal = limit.saturating_sub(wanted);
            calls.unmaps += self.unmap_idle(memory, range, goal).unmaps;
        }
        for (index, &(first, len)) in missing.iter().enumerate() {
            let mut result = memory.map(range.id, first * self.granule, len * self.granule);
            if matches!(result, Err(MappingError::OutOfMemory { .. })) && !self.idle.is_empty() {
                calls.unmaps += self.unmap_idle(memory, range, 0).unmaps;
                result = memory.map(range.id, first * self.granule, len * self.granule);
            }
            if let Err(error) = result {
                // Give back what this block mapped so far: its runs hold no other block.
                for &(done, done_len) in &missing[..index] {
                    let _ = memory.unmap(range.id, done * self.granule, done_len * self.granule);
                    self.runs.remove(&done);
                    for g in done..done + done_len {
                        self.mapped[g as usize] = false;
                    }
                    self.mapped_bytes -= done_len * self.granule;
                    calls.unmaps += 1;
                }
                return Err(error);
            }
            self.runs.insert(first, Run { len, live: len });
            for g in first..first + len {
                self.mapped[g as usize] = true;
            }
            self.mapped_bytes += len * self.granule;
            calls.maps += 1;
        }
        Ok(())
    }
}
