//! cubepool: GPU-style memory pools (CubeCL's vocabulary) with trace replay.
#![deny(unsafe_code)]

pub mod errors;

#[cfg(feature = "python")]
mod python;
