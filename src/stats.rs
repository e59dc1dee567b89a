//! Statistics like PyTorch's `torch.cuda.memory_stats()`, kept by memory management.
//!
//! The keys follow PyTorch where the meaning carries over, so a dashboard built for
//! PyTorch reads them unchanged ([`MemoryStats::to_flat`]):
//!
//! | key                    | cubepool meaning                                              |
//! |------------------------|---------------------------------------------------------------|
//! | `allocation`           | live reservations (zero-byte ones hold no memory: not counted) |
//! | `allocated_bytes`      | their bytes, padded to the alignment                           |
//! | `requested_bytes`      | their bytes as asked for                                       |
//! | `active`, `active_bytes` | as `allocation`, `allocated_bytes`: a reservation is in use until its last handle and binding are gone |
//! | `segment`              | storage buffers (pages) the pools hold                         |
//! | `reserved_bytes`       | their bytes                                                    |
//! | `inactive_split_bytes` | bytes the pools hold that no reservation covers (free slices, free pages, the slack of a reused exclusive page) |
//! | `inactive_split`       | pages that may hold such bytes: every page of a sliced pool, and the free pages of the other pools |
//!
//! Each has `current`, `peak` (since the peaks were last reset), `allocated` and
//! `freed` (cumulative increases and decreases since the accumulated counts were last
//! reset), under `all`. PyTorch's `small_pool`/`large_pool` split has no counterpart:
//! cubepool's pools are not split at 1 MiB and pages are shared by every size, and
//! counting each class would cost the hot path a second set of counters. Counters: `num_ooms` (reserves that failed for memory: out of memory, or
//! every accepting pool full), `num_alloc_retries` (storage allocations that failed
//! and were retried after freeing cached pages), `num_device_alloc` and
//! `num_device_free` (storage allocations and releases, `cudaMalloc`/`cudaFree` on a
//! GPU).
//!
//! The counters are plain integers updated on every reserve and release: a few
//! additions and comparisons, no lookups, no division.

use std::fmt::Write as _;

use crate::error::PoolError;
use crate::storage::{ComputeStorage, MappingError, StorageHandle, StorageId, VirtualMemory};

/// One statistic: its current value, its peak, and its cumulative increases and
/// decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The largest value since the peaks were last reset.
    pub peak: u64,
    /// The sum of every increase since the accumulated counts were last reset.
    pub allocated: u64,
    /// The sum of every decrease since the accumulated counts were last reset.
    pub freed: u64,
}

/// A snapshot of memory management's statistics (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MemoryStats {
    /// Live reservations.
    pub allocation: Stat,
    /// Bytes of live reservations, padded to the alignment.
    pub allocated_bytes: Stat,
    /// Bytes of live reservations as asked for.
    pub requested_bytes: Stat,
    /// Reservations in use (the same as `allocation` in cubepool).
    pub active: Stat,
    /// Bytes of reservations in use (the same as `allocated_bytes` in cubepool).
    pub active_bytes: Stat,
    /// Storage buffers (pages) held.
    pub segment: Stat,
    /// Bytes of the storage buffers held.
    pub reserved_bytes: Stat,
    /// Pages that may hold bytes no reservation covers.
    pub inactive_split: Stat,
    /// Bytes held that no reservation covers.
    pub inactive_split_bytes: Stat,
    /// Reserves that failed for memory (out of memory, or every accepting pool full).
    pub num_ooms: u64,
    /// Storage allocations that failed and were retried after freeing cached pages.
    pub num_alloc_retries: u64,
    /// Storage allocations made.
    pub num_device_alloc: u64,
    /// Storage releases made.
    pub num_device_free: u64,
}

impl MemoryStats {
    /// The statistics as `torch.cuda.memory_stats()` lays them out: keys such as
    /// `allocated_bytes.all.current`, sorted.
    pub fn to_flat(&self) -> Vec<(String, u64)> {
        let mut flat = Vec::with_capacity(128);
        let mut stat = |name: &str, pool: &str, stat: &Stat| {
            for (field, value) in [
                ("current", stat.current),
                ("peak", stat.peak),
                ("allocated", stat.allocated),
                ("freed", stat.freed),
            ] {
                flat.push((format!("{name}.{pool}.{field}"), value));
            }
        };
        for (name, value) in [
            ("allocation", &self.allocation),
            ("allocated_bytes", &self.allocated_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("segment", &self.segment),
            ("reserved_bytes", &self.reserved_bytes),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
        ] {
            stat(name, "all", value);
        }
        for (name, value) in [
            ("num_ooms", self.num_ooms),
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ] {
            flat.push((name.to_string(), value));
        }
        flat.sort();
        flat
    }

    /// The table `torch.cuda.memory_summary()` prints, for these statistics.
    ///
    /// PyTorch's "Non-releasable memory" row (`inactive_split_bytes`) counts free bytes
    /// that `empty_cache()` cannot give back. cubepool's `inactive_split_bytes` also
    /// counts free pages that `cleanup()` does give back, so its row reads "Free cached
    /// memory" (reserved bytes no reservation covers) and the count's "Segs with free
    /// space" (see the [module documentation](self)).
    pub fn summary(&self, title: &str) -> String {
        const WIDTH: usize = 75;
        let rule = |c: char| format!("|{}|\n", c.to_string().repeat(WIDTH));
        let mut out = String::new();
        out.push_str(&rule('='));
        let title: String = title.chars().take(WIDTH).collect();
        let _ = writeln!(out, "|{title:^WIDTH$}|");
        out.push_str(&rule('-'));
        let half = WIDTH / 2;
        let left = format!("OOMs: {:<6}", self.num_ooms);
        let right = format!("alloc retries: {:<6}", self.num_alloc_retries);
        let _ = writeln!(
            out,
            "|{left:^half$}|{right:^width$}|",
            width = WIDTH - half - 1
        );
        out.push_str(&rule('='));
        let _ = writeln!(
            out,
            "| {:<21} | {:>10} | {:>10} | {:>10} | {:>10} |",
            "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
        );
        let row = |out: &mut String, name: &str, stat: &Stat, bytes: bool| {
            let cells = [stat.current, stat.peak, stat.allocated, stat.freed];
            let cells = cells.map(|value| {
                if bytes {
                    format_bytes(value, stat.peak)
                } else {
                    format_count(value, stat.peak)
                }
            });
            let _ = writeln!(
                out,
                "| {name:<21} | {:>10} | {:>10} | {:>10} | {:>10} |",
                cells[0], cells[1], cells[2], cells[3]
            );
        };
        let sections: [&[(&str, &Stat, bool)]; 2] = [
            &[
                ("Allocated memory", &self.allocated_bytes, true),
                ("Active memory", &self.active_bytes, true),
                ("Requested memory", &self.requested_bytes, true),
                ("Reserved memory", &self.reserved_bytes, true),
                ("Free cached memory", &self.inactive_split_bytes, true),
            ],
            &[
                ("Allocations", &self.allocation, false),
                ("Active allocs", &self.active, false),
                ("Reserved segments", &self.segment, false),
                ("Segs with free space", &self.inactive_split, false),
            ],
        ];
        for rows in sections {
            out.push_str(&rule('-'));
            for (name, stat, bytes) in rows {
                row(&mut out, name, stat, *bytes);
            }
        }
        out.push_str(&rule('='));
        out
    }
}

/// `value` in the unit that keeps `peak` (the row's largest value) readable, as
/// PyTorch's summary writes sizes (whole units, `KiB` from 768 KiB up).
fn format_bytes(value: u64, peak: u64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (mut value, mut peak, mut unit) = (value, peak, 0);
    while unit + 1 < UNITS.len() && peak >= 768 * 1024 {
        value /= 1024;
        peak /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

/// `value` as PyTorch's summary writes counts (`K`, `M` from 750 K up).
fn format_count(value: u64, peak: u64) -> String {
    const UNITS: [&str; 4] = [" ", "K", "M", "G"];
    let (mut value, mut peak, mut unit) = (value, peak, 0);
    while unit + 1 < UNITS.len() && peak >= 750 * 1000 {
        value /= 1000;
        peak /= 1000;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

/// One statistic as the hot path keeps it: `freed` is derived (`allocated + base -
/// current`), so a decrease is one subtraction.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Level {
    current: u64,
    peak: u64,
    allocated: u64,
    /// `current` when the accumulated counts were last reset.
    base: u64,
}

impl Level {
    // Wrapping arithmetic: the books never go below zero or past 2^64 bytes (checked by
    // `MemoryManagement::check_invariants`), and it keeps overflow checks off the hot
    // path.
    #[inline]
    pub(crate) fn up(&mut self, amount: u64) {
        self.current = self.current.wrapping_add(amount);
        self.allocated = self.allocated.wrapping_add(amount);
        // A branch, not `max`: the peak rarely moves, and a store it does not need
        // is one more instruction on every reserve.
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    /// [`Level::up`] without the peak, for a count whose peak nobody reads.
    #[inline]
    fn up_quiet(&mut self, amount: u64) {
        self.current = self.current.wrapping_add(amount);
        self.allocated = self.allocated.wrapping_add(amount);
    }

    #[inline]
    pub(crate) fn down(&mut self, amount: u64) {
        self.current = self.current.wrapping_sub(amount);
    }

    fn stat(&self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak.max(self.current),
            allocated: self.allocated,
            freed: self
                .allocated
                .saturating_add(self.base)
                .saturating_sub(self.current),
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.base = self.current;
    }
}

/// The counters memory management updates on every reserve and release.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    allocation: Level,
    requested_bytes: Level,
    allocated_bytes: Level,
    /// Live reservations in pools whose pages hold one reservation each (every pool
    /// but the sliced ones): the used pages among their pages.
    whole_page: Level,
    pub(crate) num_ooms: u64,
    pub(crate) num_alloc_retries: u64,
}

impl Counters {
    /// Records a reservation of `size` bytes padded to `extent`, in a pool whose pages
    /// hold one reservation each when `whole_page`.
    #[inline]
    pub(crate) fn reserved(
        &mut self,
        size: u64,
        extent: u64,
        whole_page: bool,
        storage: &mut StorageCounters,
    ) {
        self.allocation.up(1);
        self.requested_bytes.up(size);
        self.allocated_bytes.up(extent);
        // Only pools of whole pages count (one branch where most reserves add 0).
        if whole_page {
            self.whole_page.up_quiet(1);
        }
        // Free bytes grow on a reserve only when it maps a page, which opens a new
        // epoch of the inactive peaks: its first reserve is below the epoch's low
        // (`u64::MAX`). Any other reserve's bytes are above it (the low is the lowest
        // value at a release since the epoch opened, and a reserve only adds).
        if self.allocated_bytes.current < storage.inactive.allocated_low {
            storage
                .inactive
                .track(self.allocated_bytes.current, self.whole_page.current);
        }
    }

    /// Records the release of a reservation recorded by [`Counters::reserved`].
    #[inline]
    pub(crate) fn released(
        &mut self,
        size: u64,
        extent: u64,
        whole_page: bool,
        storage: &mut StorageCounters,
    ) {
        self.allocation.down(1);
        self.requested_bytes.down(size);
        self.allocated_bytes.down(extent);
        storage.inactive.allocated_at(self.allocated_bytes.current);
        if whole_page {
            self.whole_page.down(1);
            storage.inactive.whole_pages_at(self.whole_page.current);
        }
    }

    /// The live reservations, their requested bytes and their padded bytes.
    pub(crate) fn live(&self) -> (u64, u64, u64) {
        (
            self.allocation.current,
            self.requested_bytes.current,
            self.allocated_bytes.current,
        )
    }

    /// The statistics, with the storage's.
    pub(crate) fn snapshot(&self, storage: &StorageCounters) -> MemoryStats {
        let (reserved, segment) = (storage.reserved.stat(), storage.segment.stat());
        let allocated = self.allocated_bytes.stat();
        let whole_page = self.whole_page.stat();
        let inactive_bytes = reserved.current.saturating_sub(allocated.current);
        let inactive_pages = segment.current.saturating_sub(whole_page.current);
        let (peak_bytes, peak_pages) = storage.inactive.peaks(storage);
        let allocation = self.allocation.stat();
        let allocated_bytes = allocated;
        MemoryStats {
            allocation,
            allocated_bytes,
            requested_bytes: self.requested_bytes.stat(),
            active: allocation,
            active_bytes: allocated_bytes,
            segment,
            reserved_bytes: reserved,
            inactive_split: Stat {
                current: inactive_pages,
                peak: peak_pages.max(inactive_pages),
                allocated: segment.allocated.saturating_add(whole_page.freed),
                freed: segment.freed.saturating_add(whole_page.allocated),
            },
            inactive_split_bytes: Stat {
                current: inactive_bytes,
                peak: peak_bytes.max(inactive_bytes),
                allocated: reserved.allocated.saturating_add(allocated.freed),
                freed: reserved.freed.saturating_add(allocated.allocated),
            },
            num_ooms: self.num_ooms,
            num_alloc_retries: self.num_alloc_retries,
            num_device_alloc: segment.allocated,
            num_device_free: segment.freed,
        }
    }

    /// Restarts every peak from the current values.
    pub(crate) fn reset_peaks(&mut self, storage: &mut StorageCounters) {
        for level in [
            &mut self.allocation,
            &mut self.requested_bytes,
            &mut self.allocated_bytes,
            &mut self.whole_page,
        ] {
            level.reset_peak();
        }
        storage.segment.reset_peak();
        storage.reserved.reset_peak();
        storage.inactive = InactivePeaks::default();
        storage
            .inactive
            .track(self.allocated_bytes.current, self.whole_page.current);
    }

    /// Restarts the cumulative counts (`allocated`, `freed` and the `num_*` counters).
    pub(crate) fn reset_accumulated(&mut self, storage: &mut StorageCounters) {
        for level in [
            &mut self.allocation,
            &mut self.requested_bytes,
            &mut self.allocated_bytes,
            &mut self.whole_page,
        ] {
            level.reset_accumulated();
        }
        storage.segment.reset_accumulated();
        storage.reserved.reset_accumulated();
        self.num_ooms = 0;
        self.num_alloc_retries = 0;
    }
}

/// The storage's buffers and bytes, counted as the pools allocate and release them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StorageCounters {
    segment: Level,
    reserved: Level,
    inactive: InactivePeaks,
}

impl StorageCounters {
    /// Closes the epoch of the inactive peaks: called before every change of the
    /// storage's pages or bytes.
    #[inline]
    fn changing(&mut self) {
        let (bytes, pages) = self.inactive.peaks(self);
        self.inactive = InactivePeaks {
            bytes_peak: bytes,
            pages_peak: pages,
            ..InactivePeaks::default()
        };
    }
}

/// The peaks of the bytes and pages the storage holds that no reservation covers
/// (`inactive_split_bytes`, `inactive_split`), kept in epochs: between two changes of
/// the storage (a map, an unmap, an allocation or a release of a buffer) its bytes `R`
/// and pages `S` are constant, so the peak of `R - allocated bytes` over the epoch's
/// measuring points is `R - ` their lowest allocated bytes (and the same for pages and
/// whole-page reservations). The hot path then records a low-water mark (one compare
/// on a release) instead of computing both differences and their maxima; the storage
/// folds the epoch into the peaks before it changes (`StorageCounters::changing`).
///
/// Measuring points: after every release, and after the first reserve of an epoch
/// (which may have mapped a page; the others lower the inactive bytes). Invariant: `allocated_low` and
/// `whole_pages_low` are the lowest values at this epoch's measuring points (`u64::MAX`
/// while it has none), and the peaks cover every earlier epoch.
#[derive(Debug, Clone, Copy)]
struct InactivePeaks {
    bytes_peak: u64,
    pages_peak: u64,
    allocated_low: u64,
    whole_pages_low: u64,
}

impl Default for InactivePeaks {
    fn default() -> Self {
        Self {
            bytes_peak: 0,
            pages_peak: 0,
            allocated_low: u64::MAX,
            whole_pages_low: u64::MAX,
        }
    }
}

impl InactivePeaks {
    /// A measuring point with `allocated` padded bytes live (a branch, not `min`: the
    /// low rarely moves, and a store it does not need costs an instruction).
    #[inline]
    fn allocated_at(&mut self, allocated: u64) {
        if allocated < self.allocated_low {
            self.allocated_low = allocated;
        }
    }

    /// A measuring point with `whole_pages` whole-page reservations live.
    #[inline]
    fn whole_pages_at(&mut self, whole_pages: u64) {
        if whole_pages < self.whole_pages_low {
            self.whole_pages_low = whole_pages;
        }
    }

    /// A measuring point of both.
    fn track(&mut self, allocated: u64, whole_pages: u64) {
        self.allocated_at(allocated);
        self.whole_pages_at(whole_pages);
    }

    /// The peaks of inactive bytes and pages so far, with the storage's current bytes
    /// and pages (those of this epoch). Saturating: an epoch without a measuring point
    /// has lows of `u64::MAX` and adds nothing.
    fn peaks(&self, storage: &StorageCounters) -> (u64, u64) {
        (
            self.bytes_peak
                .max(storage.reserved.current.saturating_sub(self.allocated_low)),
            self.pages_peak
                .max(storage.segment.current.saturating_sub(self.whole_pages_low)),
        )
    }
}

/// A storage that counts the buffers and bytes that pass through it.
#[derive(Debug)]
pub(crate) struct CountingStorage<S> {
    pub(crate) inner: S,
    pub(crate) counters: StorageCounters,
}

impl<S> CountingStorage<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            counters: StorageCounters::default(),
        }
    }
}

impl<S: ComputeStorage> ComputeStorage for CountingStorage<S> {
    fn alloc(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, PoolError> {
        let handle = self.inner.alloc(size, alignment)?;
        self.counters.changing();
        self.counters.segment.up(1);
        self.counters.reserved.up(handle.size);
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        let (bytes, releases) = (self.inner.bytes_allocated(), self.inner.deallocations());
        self.inner.dealloc(id);
        if self.inner.deallocations() != releases {
            self.counters.changing();
            self.counters.segment.down(1);
            // Wrapping, as the counters: a storage holding 2^64 bytes or more counts
            // them modulo 2^64, and its count may go up on a release (saturating
            // counted nothing freed there, a drift `check_invariants` reported).
            let freed = bytes.wrapping_sub(self.inner.bytes_allocated());
            self.counters.reserved.down(freed);
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.inner.bytes_allocated()
    }

    fn allocations(&self) -> u64 {
        self.inner.allocations()
    }

    fn deallocations(&self) -> u64 {
        self.inner.deallocations()
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        if self.inner.virtual_memory().is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn virtual_memory_ref(&self) -> Option<&dyn VirtualMemory> {
        if self.inner.virtual_memory_ref().is_some() {
            Some(self)
        } else {
            None
        }
    }
}

/// The virtual memory of the inner storage, with each map counted as a segment (and
/// its bytes as reserved) and each unmap as a segment freed: on a GPU they are the
/// calls that take memory and give it back. Without inner virtual memory every call
/// fails (`CountingStorage::virtual_memory` then hands none out).
impl<S: ComputeStorage> VirtualMemory for CountingStorage<S> {
    fn granularity(&self) -> u64 {
        self.inner
            .virtual_memory_ref()
            .map_or(1, VirtualMemory::granularity)
    }

    fn reserve_range(&mut self, size: u64, alignment: u64) -> Result<StorageHandle, MappingError> {
        match self.inner.virtual_memory() {
            Some(memory) => memory.reserve_range(size, alignment),
            None => Err(MappingError::OutOfMemory { size }),
        }
    }

    fn free_range(&mut self, id: StorageId) {
        let (bytes, releases) = (self.inner.bytes_allocated(), self.inner.deallocations());
        if let Some(memory) = self.inner.virtual_memory() {
            memory.free_range(id);
        }
        self.counters.changing();
        self.counters
            .segment
            .down(self.inner.deallocations().saturating_sub(releases));
        let freed = bytes.saturating_sub(self.inner.bytes_allocated());
        self.counters.reserved.down(freed);
    }

    fn map(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        match self.inner.virtual_memory() {
            Some(memory) => memory.map(id, offset, size)?,
            None => return Err(MappingError::UnknownRange { id: id.0 }),
        }
        self.counters.changing();
        self.counters.segment.up(1);
        self.counters.reserved.up(size);
        Ok(())
    }

    fn unmap(&mut self, id: StorageId, offset: u64, size: u64) -> Result<(), MappingError> {
        match self.inner.virtual_memory() {
            Some(memory) => memory.unmap(id, offset, size)?,
            None => return Err(MappingError::UnknownRange { id: id.0 }),
        }
        self.counters.changing();
        self.counters.segment.down(1);
        self.counters.reserved.down(size);
        Ok(())
    }

    fn bytes_mapped(&self) -> u64 {
        self.inner
            .virtual_memory_ref()
            .map_or(0, VirtualMemory::bytes_mapped)
    }

    fn ranges_reserved(&self) -> u64 {
        self.inner
            .virtual_memory_ref()
            .map_or(0, VirtualMemory::ranges_reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_keeps_its_peak_and_totals() {
        let mut level = Level::default();
        level.up(10);
        level.up(5);
        level.down(12);
        let stat = Stat {
            current: 3,
            peak: 15,
            allocated: 15,
            freed: 12,
        };
        assert_eq!(level.stat(), stat);
        level.reset_peak();
        assert_eq!(level.stat().peak, 3);
        level.reset_accumulated();
        level.up(4);
        level.down(5);
        assert_eq!(
            level.stat(),
            Stat {
                current: 2,
                peak: 7,
                allocated: 4,
                freed: 5
            }
        );
    }

    #[test]
    fn flat_keys_follow_torch() {
        let flat = MemoryStats::default().to_flat();
        let keys: Vec<&str> = flat.iter().map(|(k, _)| k.as_str()).collect();
        for key in [
            "allocation.all.current",
            "allocated_bytes.all.peak",
            "requested_bytes.all.freed",
            "active_bytes.all.allocated",
            "segment.all.peak",
            "reserved_bytes.all.current",
            "inactive_split.all.current",
            "inactive_split_bytes.all.peak",
            "num_ooms",
            "num_alloc_retries",
            "num_device_alloc",
            "num_device_free",
        ] {
            assert!(keys.contains(&key), "{key}");
        }
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn the_summary_is_a_torch_like_table() {
        let mut stats = MemoryStats::default();
        stats.allocated_bytes.current = 3 << 20;
        stats.allocated_bytes.peak = 3 << 20;
        let summary = stats.summary("cubepool memory summary");
        // PyTorch switches to KiB from 768 KiB and to MiB from 768 MiB.
        assert!(
            summary.contains("| Allocated memory      |   3072 KiB |"),
            "{summary}"
        );
        assert!(
            summary.lines().all(|line| line.chars().count() == 77),
            "{summary}"
        );
    }
}
