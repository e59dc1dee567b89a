//! Failed reservations: [`Failures`], counted by cause, and the cause of one.

use crate::error::PoolError;

/// Why the reservations of a replay failed, counted by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Failures {
    /// Requests larger than every pool of the layout accepts (no limit would help).
    pub too_big: u64,
    /// Requests whose accepting pools were all capped and full.
    pub pools_full: u64,
    /// Requests that needed storage past the memory limit.
    pub over_limit: u64,
}

impl Failures {
    /// All failed reservations, or None where they add up past `u64::MAX` (never for a
    /// replay's, each of which counts at most one per event; a `Failures` written by
    /// hand may).
    pub fn checked_total(&self) -> Option<u64> {
        self.too_big
            .checked_add(self.pools_full)?
            .checked_add(self.over_limit)
    }

    /// All failed reservations (at most `u64::MAX`, see [`Failures::checked_total`]).
    pub fn total(&self) -> u64 {
        self.checked_total().unwrap_or(u64::MAX)
    }

    pub(super) fn count(&mut self, failure: Failure) {
        match failure {
            Failure::TooBig => self.too_big += 1,
            Failure::PoolsFull => self.pools_full += 1,
            Failure::OverLimit => self.over_limit += 1,
        }
    }
}

/// Why one reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    TooBig,
    PoolsFull,
    OverLimit,
}

impl From<PoolError> for Failure {
    fn from(error: PoolError) -> Self {
        match error {
            PoolError::BufferTooBig { .. } => Failure::TooBig,
            PoolError::PoolCapacityExceeded { .. } => Failure::PoolsFull,
            // A reservation allocates storage and nothing else; a missing handle cannot
            // come from a reservation, and a storage that refuses a call (virtual storage
            // serves every pool kind) counts with the storage failures, as would an
            // argument a pool refuses (memory management hands pools none: it serves
            // 0-byte reservations itself and checks the layout's parameters).
            PoolError::OutOfMemory { .. }
            | PoolError::NotFound { .. }
            | PoolError::Storage { .. }
            | PoolError::InvalidArgument { .. } => Failure::OverLimit,
        }
    }
}
