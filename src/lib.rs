//! cubepool: GPU-style memory pools (CubeCL's vocabulary) with trace replay.
#![deny(unsafe_code)]

#[cfg(feature = "python")]
mod python;
