//! cargo-fuzz target `plan_file`: the body is `targets::plan_file` (`fuzz/targets.rs`),
//! which the stable test `tests/fuzz_corpus.rs` also runs.
#![no_main]

// Each binary runs one of the bodies.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::plan_file(data);
});
