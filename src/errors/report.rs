//! Human-readable explanations of why an allocation cannot be trusted.

use std::fmt::Write;

use super::{AllocId, AllocRange, Claim, ErrorGraph, Origin, MAX_SKIPPED_PER_FAILURE};

impl ErrorGraph {
    /// Explains in words why `alloc` cannot be trusted, or `None` if every byte of it is.
    ///
    /// The report names the first claim on the allocation (the lowest tainted run, and
    /// how much else is tainted), then walks the chain back: the skipped launch that
    /// should have written those bytes, the input whose claim stopped it, the launch that
    /// should have written that input, and so on, down to the original failure and its
    /// message. Each step takes the most recent recorded launch that produced bytes
    /// overlapping the current ones, among those older than the previous step. Launches
    /// beyond the [`MAX_SKIPPED_PER_FAILURE`] kept per failure are not recorded; the
    /// report says so where the chain breaks.
    ///
    /// ```text
    /// alloc#3 cannot be trusted: alloc#3 bytes 0..64 carry failure#1.
    ///   alloc#3 bytes 0..64 were not written: launch `relu` was skipped because alloc#2 bytes 0..64 carry failure#1
    ///   alloc#2 bytes 0..64 were not written: launch `matmul` failed
    ///   failure#1, the original failure: CUDA_ERROR_ILLEGAL_ADDRESS
    /// ```
    pub fn report(&self, alloc: AllocId) -> Option<String> {
        if let Some((size, reason)) = self.unallocated(alloc) {
            return Some(format!(
                "{alloc} cannot be trusted: it has no memory, because its reservation of \
                 {size} bytes failed: {reason}\n"
            ));
        }
        let taint = self.taint(alloc)?;
        let (range, failure) = taint.ranges().next()?;
        let mut current = AllocRange::new(alloc, range);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(out, "{alloc} cannot be trusted: {current} carry {failure}.");
        let runs = taint.ranges().count();
        if runs > 1 {
            let failures: Vec<String> = taint.failures().map(|f| f.to_string()).collect();
            let _ = writeln!(
                out,
                "  ({} bytes are tainted in all, in {runs} ranges, carrying {})",
                taint.tainted_bytes(),
                failures.join(", ")
            );
        }

        let skipped = self.skipped(failure);
        let mut limit = skipped.len();
        let mut rooted = false;
        while let Some(i) = skipped[..limit]
            .iter()
            .rposition(|s| s.produced.iter().any(|p| p.overlaps(&current)))
        {
            let step = &skipped[i];
            let _ = writeln!(
                out,
                "  {current} were not written: launch `{}` was skipped because {}",
                step.kernel, step.needed
            );
            match &step.needed {
                Claim::Failed { memory, .. } => current = memory.clone(),
                Claim::Unallocated { .. } => {
                    rooted = true;
                    break;
                }
            }
            limit = i;
        }
        if !rooted {
            match self.origin(failure) {
                Some(Origin::FailedLaunch { kernel, writes })
                    if writes.iter().any(|w| w.overlaps(&current)) =>
                {
                    let _ = writeln!(
                        out,
                        "  {current} were not written: launch `{kernel}` failed"
                    );
                }
                _ if self.skipped_dropped(failure) > 0 => {
                    let _ = writeln!(
                        out,
                        "  {current} were not written because of launches {failure} stopped \
                         that were not recorded (only the first {MAX_SKIPPED_PER_FAILURE} are kept)"
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "  how {current} came to carry {failure} was not recorded"
                    );
                }
            }
        }
        let message = self.message(failure).unwrap_or("(no message)");
        let _ = writeln!(out, "  {failure}, the original failure: {message}");
        Some(out)
    }
}
