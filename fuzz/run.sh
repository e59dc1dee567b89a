#!/usr/bin/env bash
# Builds the libFuzzer targets on stable Rust and fuzzes one of them.
#
#   fuzz/run.sh TARGET [SECONDS] [libFuzzer flags...]
#
# TARGET is a binary of fuzz/Cargo.toml (config_language, plan_file, ...). The run starts from the
# repository's corpus (fuzz/corpus/TARGET) and adds what it finds to a working corpus
# (fuzz/target/corpus/TARGET); a crash is written to fuzz/artifacts/TARGET/ and the run
# stops. It instruments the code the way cargo-fuzz does (SanitizerCoverage through
# -Cpasses=sancov-module), but without AddressSanitizer, which needs nightly:
# cubepool's fuzzed code is safe Rust, so a bug shows as a panic.
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run.sh TARGET [SECONDS] [libFuzzer flags...]}
seconds=${2:-60}
shift $(( $# < 2 ? $# : 2 ))
triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions" \
    cargo build --release --bin "$target" --target "$triple"
mkdir -p "target/corpus/$target" "artifacts/$target"
exec "target/$triple/release/$target" "target/corpus/$target" "corpus/$target" \
    -max_total_time="$seconds" -max_len=65536 -artifact_prefix="artifacts/$target/" "$@"
