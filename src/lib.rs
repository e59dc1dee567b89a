//! cubepool: GPU-style memory pools (CubeCL's vocabulary) with trace replay.
#![deny(unsafe_code)]

pub mod tensor;

#[cfg(feature = "python")]
mod python;
