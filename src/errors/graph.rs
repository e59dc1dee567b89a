//! The error graph: every failure still carried by some allocation.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::failure::FailureRecord;
use super::{
    check_range, AllocId, AllocRange, Claim, FailureId, GraphError, InvariantViolation,
    LaunchOutcome, Origin, Skipped, Taint,
};

/// How many [`Skipped`] records a failure keeps (the first ones); later ones are counted
/// in [`ErrorGraph::skipped_dropped`]. CubeCL keeps the same number.
pub const MAX_SKIPPED_PER_FAILURE: usize = 16;

/// An allocation whose reservation failed.
#[derive(Debug, Clone)]
struct UnallocatedRecord {
    /// The size that was requested.
    size: u64,
    /// Why the reservation failed.
    reason: String,
    /// The failure minted for this reservation by the first launch that needed it.
    /// Invariant: `Some(f)` only while `f` is in the graph, with
    /// `Origin::Unallocated { alloc }` naming this allocation.
    failure: Option<FailureId>,
}

/// Every failure the device is still holding, and how many allocations carry each one.
///
/// The caller reports what happens to allocations ([`launch`](Self::launch),
/// [`write`](Self::write), [`release`](Self::release),
/// [`mark_unallocated`](Self::mark_unallocated)) and asks what a read would find
/// ([`claim`](Self::claim), [`report`](Self::report)). Allocations are named by
/// [`AllocId`]; the graph holds state only for tainted or unallocated ones, so a clean
/// allocation costs nothing, and [`is_empty`](Self::is_empty) lets the caller skip the
/// graph entirely in O(1) when nothing is tainted.
///
/// A failure leaves the graph the moment no allocation carries it any more (its carriers
/// were released or fully overwritten), together with its skipped records.
#[derive(Debug, Clone, Default)]
pub struct ErrorGraph {
    /// The taint of every allocation with a tainted byte. Invariants: no `Taint` here is
    /// clean; no key is also in `unallocated`.
    taints: HashMap<AllocId, Taint>,
    /// Allocations without memory. Invariant: no key is also in `taints` (they have no
    /// bytes to taint).
    unallocated: HashMap<AllocId, UnallocatedRecord>,
    /// Exactly the failures some `Taint` in `taints` names, in creation order, each with
    /// the exact number of such taints as `carriers`.
    failures: BTreeMap<FailureId, FailureRecord>,
}

impl ErrorGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing is tainted and no allocation is unallocated, so that every read is
    /// clean and the caller may skip the graph. O(1).
    pub fn is_empty(&self) -> bool {
        self.taints.is_empty() && self.unallocated.is_empty()
    }

    /// Records that `alloc`, a handle created first, never received memory because its
    /// reservation of `size` bytes failed for `reason`. Every non-empty read of it finds
    /// a [`Claim::Unallocated`]; a launch that reads or writes it is skipped; a host
    /// [`write`](Self::write) to it is refused. [`release`](Self::release) forgets it.
    ///
    /// Refused with [`GraphError::AlreadyTracked`] if the graph already tracks `alloc`.
    pub fn mark_unallocated(
        &mut self,
        alloc: AllocId,
        size: u64,
        reason: String,
    ) -> Result<(), GraphError> {
        if self.taints.contains_key(&alloc) || self.unallocated.contains_key(&alloc) {
            return Err(GraphError::AlreadyTracked { alloc });
        }
        self.unallocated.insert(
            alloc,
            UnallocatedRecord {
                size,
                reason,
                failure: None,
            },
        );
        Ok(())
    }

    /// The requested size and the reason, if `alloc` is unallocated.
    pub fn unallocated(&self, alloc: AllocId) -> Option<(u64, &str)> {
        self.unallocated
            .get(&alloc)
            .map(|u| (u.size, u.reason.as_str()))
    }

    /// Records a launch of `kernel` that reads and writes the given ranges.
    ///
    /// - If a read range has a [`Claim`] (checked in order, then writes to buffers
    ///   without memory), the launch did not run: it is [`LaunchOutcome::Skipped`], and
    ///   every write range with memory inherits the claim's failure (an unallocated input
    ///   gets a failure describing its failed reservation). This wins over `fail`: a
    ///   launch that never ran cannot fail.
    /// - Else, with `fail: Some(message)`, the launch failed: its write ranges carry a
    ///   new failure, returned in [`LaunchOutcome::Failed`]. If nothing was written (no
    ///   non-empty write range), nothing carries it and the graph does not keep it.
    /// - Else it ran: its write ranges are clean ([`LaunchOutcome::Ran`]).
    ///
    /// Reads are checked before any write is applied, so a launch may read and write the
    /// same bytes. Refused, changing nothing, if any range is reversed.
    pub fn launch(
        &mut self,
        kernel: &str,
        reads: &[(AllocId, Range<u64>)],
        writes: &[(AllocId, Range<u64>)],
        fail: Option<String>,
    ) -> Result<LaunchOutcome, GraphError> {
        for (alloc, range) in reads.iter().chain(writes) {
            check_range(*alloc, range)?;
        }
        if !self.is_empty() {
            if let Some(needed) = self.stopping_claim(reads, writes) {
                return Ok(LaunchOutcome::Skipped(self.skip(kernel, needed, writes)));
            }
        }
        let Some(message) = fail else {
            if !self.is_empty() {
                let mut touched = Vec::new();
                for (alloc, range) in writes {
                    self.clear_range(*alloc, range.clone(), &mut touched);
                }
                self.prune(touched);
            }
            return Ok(LaunchOutcome::Ran);
        };
        let failure = FailureId::mint();
        let origin = Origin::FailedLaunch {
            kernel: kernel.to_owned(),
            writes: writes
                .iter()
                .filter(|(_, r)| r.start < r.end)
                .map(|(a, r)| AllocRange::new(*a, r.clone()))
                .collect(),
        };
        self.insert_failure(failure, message, origin);
        let mut touched = vec![failure];
        for (alloc, range) in writes {
            self.taint_range(*alloc, range.clone(), failure, &mut touched);
        }
        self.prune(touched);
        Ok(LaunchOutcome::Failed(failure))
    }

    /// Records a host write of `range` of `alloc`: the taint there is cleared. Refused
    /// for a reversed range and for an unallocated `alloc` (there is nothing to write).
    pub fn write(&mut self, alloc: AllocId, range: Range<u64>) -> Result<(), GraphError> {
        check_range(alloc, &range)?;
        if self.is_empty() {
            return Ok(());
        }
        if self.unallocated.contains_key(&alloc) {
            return Err(GraphError::Unallocated { alloc });
        }
        let mut touched = Vec::new();
        self.clear_range(alloc, range, &mut touched);
        self.prune(touched);
        Ok(())
    }

    /// Forgets `alloc`, which was freed: its taints are dropped (a failure it was the
    /// last carrier of leaves the graph), or its unallocated mark. Failures it passed on
    /// to other allocations stay. Returns whether the graph tracked it.
    pub fn release(&mut self, alloc: AllocId) -> bool {
        if self.is_empty() {
            return false;
        }
        if let Some(taint) = self.taints.remove(&alloc) {
            let touched: Vec<FailureId> = taint.failures().collect();
            for &failure in &touched {
                self.sub_carrier(failure);
            }
            self.prune(touched);
            return true;
        }
        self.unallocated.remove(&alloc).is_some()
    }

    /// What a read of `range` of `alloc` finds: `None` when every byte is trustworthy
    /// (and always for an empty range). For a tainted range, the first (lowest) tainted
    /// run within it, clipped to the range; every claim in the range is in
    /// [`claims`](Self::claims). For an unallocated `alloc`, the whole range.
    pub fn claim(&self, alloc: AllocId, range: Range<u64>) -> Result<Option<Claim>, GraphError> {
        check_range(alloc, &range)?;
        if self.is_empty() {
            return Ok(None);
        }
        Ok(self.claim_of(alloc, range))
    }

    /// Every claim a read of `range` of `alloc` finds, in ascending order: one per
    /// maximal run of one failure, clipped to the range, or one
    /// [`Claim::Unallocated`] for an unallocated `alloc`.
    pub fn claims(&self, alloc: AllocId, range: Range<u64>) -> Result<Vec<Claim>, GraphError> {
        check_range(alloc, &range)?;
        if range.start == range.end || self.is_empty() {
            return Ok(Vec::new());
        }
        if self.unallocated.contains_key(&alloc) {
            return Ok(vec![Claim::Unallocated {
                memory: AllocRange::new(alloc, range),
            }]);
        }
        Ok(self
            .taints
            .get(&alloc)
            .map(|taint| {
                taint
                    .ranges_in(range)
                    .map(|(r, failure)| Claim::Failed {
                        failure,
                        memory: AllocRange::new(alloc, r),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The taint of `alloc`, if any byte of it is tainted.
    pub fn taint(&self, alloc: AllocId) -> Option<&Taint> {
        self.taints.get(&alloc)
    }

    /// Every failure some allocation carries, oldest first.
    pub fn failures(&self) -> impl ExactSizeIterator<Item = FailureId> + '_ {
        self.failures.keys().copied()
    }

    /// Whether `failure` is in the graph (some allocation carries it).
    pub fn contains(&self, failure: FailureId) -> bool {
        self.failures.contains_key(&failure)
    }

    /// How many allocations carry `failure` (0 once it left the graph). O(log n).
    pub fn carriers(&self, failure: FailureId) -> usize {
        self.failures.get(&failure).map_or(0, |r| r.carriers)
    }

    /// The allocations that carry `failure`, ascending. O(tainted allocations).
    pub fn carrier_allocs(&self, failure: FailureId) -> Vec<AllocId> {
        if !self.contains(failure) {
            return Vec::new();
        }
        let mut allocs: Vec<AllocId> = self
            .taints
            .iter()
            .filter(|(_, taint)| taint.carries(failure))
            .map(|(&alloc, _)| alloc)
            .collect();
        allocs.sort_unstable();
        allocs
    }

    /// What went wrong, in words, while `failure` is in the graph.
    pub fn message(&self, failure: FailureId) -> Option<&str> {
        self.failures.get(&failure).map(|r| r.message.as_str())
    }

    /// Where `failure` came from, while it is in the graph.
    pub fn origin(&self, failure: FailureId) -> Option<&Origin> {
        self.failures.get(&failure).map(|r| &r.origin)
    }

    /// The first [`MAX_SKIPPED_PER_FAILURE`] launches `failure` stopped, oldest first
    /// (empty once it left the graph).
    pub fn skipped(&self, failure: FailureId) -> &[Skipped] {
        self.failures
            .get(&failure)
            .map_or(&[], |r| r.skipped.as_slice())
    }

    /// How many more launches `failure` stopped than [`skipped`](Self::skipped) keeps.
    pub fn skipped_dropped(&self, failure: FailureId) -> u64 {
        self.failures.get(&failure).map_or(0, |r| r.skipped_dropped)
    }

    /// Checks every invariant written on the fields of the graph and of its taints.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let broken = |s: String| Err(InvariantViolation(s));
        let mut counted: BTreeMap<FailureId, usize> = BTreeMap::new();
        for (alloc, taint) in &self.taints {
            taint.check_invariants()?;
            if taint.is_clean() {
                return broken(format!("{alloc} has a clean taint entry"));
            }
            if self.unallocated.contains_key(alloc) {
                return broken(format!("{alloc} is both tainted and unallocated"));
            }
            for failure in taint.failures() {
                *counted.entry(failure).or_insert(0) += 1;
            }
        }
        for (failure, record) in &self.failures {
            let carriers = counted.remove(failure).unwrap_or(0);
            if carriers == 0 {
                return broken(format!("{failure} is in the graph but nothing carries it"));
            }
            if record.carriers != carriers {
                return broken(format!(
                    "{failure} counts {} carriers, but {carriers} allocations carry it",
                    record.carriers
                ));
            }
            if record.skipped.len() > MAX_SKIPPED_PER_FAILURE {
                return broken(format!("{failure} keeps {} skipped", record.skipped.len()));
            }
            if let Some(s) = record.skipped.iter().find(|s| s.failure != *failure) {
                return broken(format!("{failure} keeps a skip of {}", s.failure));
            }
        }
        if let Some(failure) = counted.keys().next() {
            return broken(format!("{failure} is carried but not in the graph"));
        }
        for (alloc, record) in &self.unallocated {
            if let Some(failure) = record.failure {
                match self.failures.get(&failure).map(|r| &r.origin) {
                    Some(Origin::Unallocated { alloc: a, .. }) if a == alloc => {}
                    _ => {
                        return broken(format!(
                            "{alloc} remembers {failure}, which is gone or not its own"
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// The claim that stops a launch: the first read with a claim, else the first
    /// non-empty write to a buffer without memory.
    fn stopping_claim(
        &self,
        reads: &[(AllocId, Range<u64>)],
        writes: &[(AllocId, Range<u64>)],
    ) -> Option<Claim> {
        reads
            .iter()
            .find_map(|(alloc, range)| self.claim_of(*alloc, range.clone()))
            .or_else(|| {
                writes
                    .iter()
                    .find(|(alloc, r)| r.start < r.end && self.unallocated.contains_key(alloc))
                    .map(|(alloc, r)| Claim::Unallocated {
                        memory: AllocRange::new(*alloc, r.clone()),
                    })
            })
    }

    /// [`claim`](Self::claim) without the checks.
    fn claim_of(&self, alloc: AllocId, range: Range<u64>) -> Option<Claim> {
        if range.start >= range.end {
            return None;
        }
        if self.unallocated.contains_key(&alloc) {
            return Some(Claim::Unallocated {
                memory: AllocRange::new(alloc, range),
            });
        }
        let (r, failure) = self.taints.get(&alloc)?.first_in(range)?;
        Some(Claim::Failed {
            failure,
            memory: AllocRange::new(alloc, r),
        })
    }

    /// Records a skipped launch: taints its writes with the failure `needed` names (or
    /// the failure of the unallocated buffer it names) and keeps the record.
    fn skip(&mut self, kernel: &str, needed: Claim, writes: &[(AllocId, Range<u64>)]) -> Skipped {
        let failure = match &needed {
            Claim::Failed { failure, .. } => *failure,
            Claim::Unallocated { memory } => self.unallocated_failure(memory.alloc),
        };
        let mut touched = vec![failure];
        for (alloc, range) in writes {
            self.taint_range(*alloc, range.clone(), failure, &mut touched);
        }
        let skipped = Skipped {
            kernel: kernel.to_owned(),
            needed,
            produced: writes
                .iter()
                .map(|(a, r)| AllocRange::new(*a, r.clone()))
                .collect(),
            failure,
        };
        if let Some(record) = self.failures.get_mut(&failure) {
            if record.skipped.len() < MAX_SKIPPED_PER_FAILURE {
                record.skipped.push(skipped.clone());
            } else {
                record.skipped_dropped = record.skipped_dropped.saturating_add(1);
            }
        }
        self.prune(touched);
        skipped
    }

    /// The failure describing `alloc`'s failed reservation: the one already in the graph,
    /// or a new one (with no carrier yet: the caller taints, then prunes).
    fn unallocated_failure(&mut self, alloc: AllocId) -> FailureId {
        let Some(record) = self.unallocated.get_mut(&alloc) else {
            debug_assert!(false, "{alloc} is not unallocated");
            return FailureId::mint();
        };
        if let Some(failure) = record.failure {
            return failure;
        }
        let failure = FailureId::mint();
        record.failure = Some(failure);
        let message = format!(
            "the reservation of {} bytes for {alloc} failed: {}",
            record.size, record.reason
        );
        let origin = Origin::Unallocated {
            alloc,
            size: record.size,
            reason: record.reason.clone(),
        };
        self.insert_failure(failure, message, origin);
        failure
    }

    /// Adds a failure with no carrier yet.
    fn insert_failure(&mut self, failure: FailureId, message: String, origin: Origin) {
        self.failures.insert(
            failure,
            FailureRecord {
                message,
                origin,
                carriers: 0,
                skipped: Vec::new(),
                skipped_dropped: 0,
            },
        );
    }

    /// Taints `range` of `alloc` with `failure` (which must be in the graph), keeping the
    /// carrier counts; failures that lost a carrier go onto `touched`. Buffers without
    /// memory and empty ranges are left alone.
    fn taint_range(
        &mut self,
        alloc: AllocId,
        range: Range<u64>,
        failure: FailureId,
        touched: &mut Vec<FailureId>,
    ) {
        if range.start >= range.end || self.unallocated.contains_key(&alloc) {
            return;
        }
        let change = self.taints.entry(alloc).or_default().taint(range, failure);
        if change.gained.is_some() {
            if let Some(record) = self.failures.get_mut(&failure) {
                record.carriers += 1;
            } else {
                debug_assert!(false, "tainting with {failure}, which is not in the graph");
            }
        }
        for lost in change.lost {
            self.sub_carrier(lost);
            touched.push(lost);
        }
    }

    /// Clears `range` of `alloc`, keeping the carrier counts; failures that lost a
    /// carrier go onto `touched`.
    fn clear_range(&mut self, alloc: AllocId, range: Range<u64>, touched: &mut Vec<FailureId>) {
        let Some(taint) = self.taints.get_mut(&alloc) else {
            return;
        };
        let change = taint.clear(range);
        if taint.is_clean() {
            self.taints.remove(&alloc);
        }
        for lost in change.lost {
            self.sub_carrier(lost);
            touched.push(lost);
        }
    }

    /// One allocation fewer carries `failure`.
    fn sub_carrier(&mut self, failure: FailureId) {
        if let Some(record) = self.failures.get_mut(&failure) {
            debug_assert!(record.carriers > 0, "{failure} carrier count underflow");
            record.carriers = record.carriers.saturating_sub(1);
        }
    }

    /// Removes the failures among `touched` that nothing carries any more.
    fn prune(&mut self, touched: Vec<FailureId>) {
        for failure in touched {
            if self.failures.get(&failure).is_some_and(|r| r.carriers == 0) {
                if let Some(record) = self.failures.remove(&failure) {
                    if let Origin::Unallocated { alloc, .. } = record.origin {
                        if let Some(u) = self.unallocated.get_mut(&alloc) {
                            if u.failure == Some(failure) {
                                u.failure = None;
                            }
                        }
                    }
                }
            }
        }
    }
}
