//! The arena mapping's invariant check (the pool's own, `check_invariants`, is in
//! `memory_pool.rs` with the rest of its `MemoryPool` implementation).

use super::granules::Granules;
use crate::pool::ensure;

impl Granules {
    /// Checks the invariants against the live blocks `(offset, extent)`.
    pub(super) fn check(&self, blocks: &[(u64, u64)]) -> Result<(), String> {
        let mut touches = vec![0u32; self.touches.len()];
        for &(offset, extent) in blocks {
            for g in self.span(offset, extent) {
                touches[g as usize] += 1;
            }
        }
        ensure(touches == self.touches, || {
            "granule touch counts drifted".into()
        })?;
        let mut mapped = vec![false; self.mapped.len()];
        let mut bytes = 0;
        for (&start, run) in &self.runs {
            let mut live = 0;
            for g in start..start + run.len {
                ensure(!mapped[g as usize], || {
                    format!("runs overlap at granule {g}")
                })?;
                mapped[g as usize] = true;
                live += u64::from(touches[g as usize] > 0);
            }
            ensure(live == run.live, || {
                format!("run at granule {start}: live count drifted")
            })?;
            ensure((run.live == 0) == self.idle.contains(&start), || {
                format!("run at granule {start}: idle set drifted")
            })?;
            bytes += run.len * self.granule;
        }
        ensure(mapped == self.mapped, || "mapped granules drifted".into())?;
        ensure(bytes == self.mapped_bytes, || "mapped bytes drifted".into())?;
        ensure(
            touches.iter().zip(&mapped).all(|(&t, &m)| t == 0 || m),
            || "a live block touches an unmapped granule".into(),
        )
    }
}
