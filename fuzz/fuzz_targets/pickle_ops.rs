//! cargo-fuzz target `pickle_ops`: the body is `targets::pickle_ops` (`fuzz/targets.rs`),
//! which the stable test `tests/fuzz_corpus.rs` also runs.
#![no_main]

// Each binary runs one of the bodies.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::pickle_ops(data);
});
