//! Reports, usage and statistics of the pools, and the invariant checks.

use super::{MemoryManagement, WholePages};
use crate::pool::{DynamicPool, MemoryPool, PlannedStats, PoolStats};
use crate::report::{MemoryPoolKind, MemoryPoolReport, MemoryRecord, MemoryReport};
use crate::stats::MemoryStats;
use crate::storage::ComputeStorage;
use crate::usage::MemoryUsage;

impl<S: ComputeStorage> MemoryManagement<S> {
    /// The usage of every pool together (after freeing dropped handles).
    pub fn memory_usage(&mut self) -> MemoryUsage {
        self.flush_releases();
        self.current_usage()
    }

    /// The usage of every pool together, without freeing dropped handles first.
    pub fn current_usage(&self) -> MemoryUsage {
        self.held
            .pools
            .iter()
            .fold(self.held.persistent.usage(), |total, pool| {
                total.combine(pool.usage())
            })
    }

    /// The usage and statistics of each dynamic pool, in routing order, then the
    /// persistent pool's.
    pub fn pool_states(&mut self) -> (Vec<(MemoryUsage, PoolStats)>, (MemoryUsage, PoolStats)) {
        self.flush_releases();
        let dynamic = self
            .held
            .pools
            .iter()
            .map(|p| (p.usage(), p.stats()))
            .collect();
        (
            dynamic,
            (self.held.persistent.usage(), self.held.persistent.stats()),
        )
    }

    /// The hits and misses of the planned pools, summed; `None` when there is none.
    pub fn planned_stats(&self) -> Option<PlannedStats> {
        self.held
            .pools
            .iter()
            .filter_map(DynamicPool::planned_stats)
            .reduce(|a, b| PlannedStats {
                hits: a.hits + b.hits,
                misses_unplanned: a.misses_unplanned + b.misses_unplanned,
                misses_held: a.misses_held + b.misses_held,
                steps: a.steps.max(b.steps),
            })
    }

    /// A report of every pool: its shape, usage, and high-water marks since the
    /// peaks were last reset (after freeing dropped handles).
    pub fn memory_report(&mut self) -> MemoryReport {
        self.flush_releases();
        let dynamic = self
            .held
            .pools
            .iter()
            .zip(&self.pool_options)
            .map(|(pool, options)| {
                MemoryPoolReport::new(
                    MemoryPoolKind::of(options),
                    options.dealloc_period,
                    pool.usage(),
                    pool.stats(),
                )
            })
            .collect();
        let persistent = MemoryPoolReport::new(
            MemoryPoolKind::Persistent,
            None,
            self.held.persistent.usage(),
            self.held.persistent.stats(),
        );
        MemoryReport {
            dynamic,
            persistent,
        }
    }

    /// Records a report under `label`, with the next sequence number and the time
    /// since this instance was made; returns it. Records survive
    /// [`MemoryManagement::install_pools`].
    pub fn record_memory(&mut self, label: impl Into<String>) -> MemoryRecord {
        let record = MemoryRecord {
            label: label.into(),
            sequence: self.next_record,
            time: self.created.elapsed(),
            report: self.memory_report(),
        };
        self.next_record += 1;
        self.records.push(record.clone());
        record
    }

    /// The records made so far, oldest first.
    pub fn records(&self) -> &[MemoryRecord] {
        &self.records
    }

    /// Takes the records made so far, oldest first (sequence numbers keep counting).
    pub fn take_records(&mut self) -> Vec<MemoryRecord> {
        std::mem::take(&mut self.records)
    }

    /// PyTorch-style statistics (see [`crate::stats`]), after freeing dropped handles.
    pub fn memory_stats(&mut self) -> MemoryStats {
        self.flush_releases();
        self.held.counters.snapshot(&self.held.storage.counters)
    }

    /// Restarts the peaks of [`MemoryManagement::memory_stats`] from the current
    /// values (`torch.cuda.reset_peak_memory_stats`). The pools' own high-water marks
    /// (reports) restart with [`MemoryManagement::reset_peaks`].
    pub fn reset_peak_memory_stats(&mut self) {
        self.flush_releases();
        self.held
            .counters
            .reset_peaks(&mut self.held.storage.counters);
    }

    /// Restarts the cumulative counts of [`MemoryManagement::memory_stats`]
    /// (`allocated`, `freed`, and the `num_*` counters).
    pub fn reset_accumulated_memory_stats(&mut self) {
        self.flush_releases();
        self.held
            .counters
            .reset_accumulated(&mut self.held.storage.counters);
    }

    /// Restarts the high-water marks of every pool.
    pub fn reset_peaks(&mut self) {
        self.flush_releases();
        self.held.persistent.reset_peaks();
        for pool in &mut self.held.pools {
            pool.reset_peaks();
        }
    }

    /// Checks the invariants of every pool, and that the storage holds exactly the
    /// bytes the pools reserved.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (index, pool) in self.held.pools.iter().enumerate() {
            pool.check_invariants()
                .map_err(|problem| format!("pool {index}: {problem}"))?;
        }
        self.held
            .persistent
            .check_invariants()
            .map_err(|problem| format!("persistent pool: {problem}"))?;
        if self.held.whole_pages != WholePages::of(&self.held.pools) {
            return Err("the whole-page flags do not match the pools".into());
        }
        // Summed wrapping, as the statistics count (`Counters`) and as a storage
        // granting 2^64 bytes or more counts (it cannot count more): pools holding
        // that much together then compare equal. `current_usage` saturates, which
        // reported a drift there, and adding its requested and padding bytes
        // overflowed (a panic in a debug build).
        let (number, requested, padded, reserved) = std::iter::once(self.held.persistent.usage())
            .chain(self.held.pools.iter().map(MemoryPool::usage))
            .fold(
                (0u64, 0u64, 0u64, 0u64),
                |(number, requested, padded, reserved), usage| {
                    (
                        number.wrapping_add(usage.number_allocs),
                        requested.wrapping_add(usage.bytes_in_use),
                        padded
                            .wrapping_add(usage.bytes_in_use)
                            .wrapping_add(usage.bytes_padding),
                        reserved.wrapping_add(usage.bytes_reserved),
                    )
                },
            );
        let allocated = self.held.storage.bytes_allocated();
        if reserved != allocated {
            return Err(format!(
                "pools reserve {reserved} bytes but the storage holds {allocated}"
            ));
        }
        let counted = self.held.counters.live();
        let pooled = (number, requested, padded);
        if counted != pooled {
            return Err(format!(
                "statistics drifted: they count (allocations, requested, padded) = \
                 {counted:?}, the pools hold {pooled:?}"
            ));
        }
        let stats = self.held.counters.snapshot(&self.held.storage.counters);
        if stats.reserved_bytes.current != allocated {
            return Err(format!(
                "statistics count {} reserved bytes but the storage holds {allocated}",
                stats.reserved_bytes.current
            ));
        }
        Ok(())
    }
}
