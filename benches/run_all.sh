#!/usr/bin/env bash
# Regenerates every benchmark figure and BENCHMARKS.md, every section of it (about 17
# minutes on 2 cores).
#
#   benches/run_all.sh           full run: criterion benches `pools` and `peers`, the
#                                targets' loops interleaved (examples/peer_loops.rs) and
#                                their cache events (benches/cache_profile.py) and
#                                their time without the default's books
#                                (benches/books_split.py), the
#                                Python benchmarks (reserve, the virtual pool's
#                                trade-off and the layouts' memory, other placement
#                                rules (benches/python/fit_policies.py), plan scaling), then
#                                BENCHMARKS.md
#   benches/run_all.sh --smoke   CI smoke run: builds both benches and runs every
#                                benchmark once, plus seconds-long Python runs; writes
#                                no BENCHMARKS.md
#
# The Python part needs an environment with numpy and maturin: `.venv` at the
# repository root is used if no virtual environment is active. The shared traces that
# are not bundled (vit-train, mixtral-train) are read from $CUBEPOOL_TRACES (default
# /work/shared/traces); where it does not hold them, the tables cover the bundled three.
set -euo pipefail

cd "$(dirname "$0")/.."
mode=full
case "${1:-}" in
    "") ;;
    --smoke) mode=smoke ;;
    *) echo "usage: $0 [--smoke]" >&2; exit 2 ;;
esac

# CubeCL reads CUBECL_* variables (and cubecl.toml files; the peers bench checks those).
while IFS= read -r name; do unset "$name"; done < <(compgen -e | grep '^CUBECL_' || true)

if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi
python=${PYTHON:-python3}
traces=${CUBEPOOL_TRACES:-/work/shared/traces}
target=${CARGO_TARGET_DIR:-target}

if [[ $mode == smoke ]]; then
    # Debug build shared with `cargo test`; criterion runs each benchmark once.
    cargo test --bench pools --bench peers
    # The interleaved loops, one round of a few steps (debug build).
    smoke_json=$(mktemp)
    cargo run --quiet --example peer_loops -- --json "$smoke_json" fifo all 1000 1
    "$python" -c 'import json, sys; assert json.load(open(sys.argv[1]))["best_ns"]["virtual"] > 0' \
        "$smoke_json"
    cargo run --quiet --example peer_loops -- --no-bytes steady all 200 1
    rm -f "$smoke_json"
    # The loops' cache events, a few steps each under cachegrind (skipped, saying so,
    # without valgrind).
    "$python" benches/cache_profile.py --quick --loops "$target/debug/examples/peer_loops"
    # The throwaway builds without the default's books: only that their edits apply.
    "$python" benches/books_split.py --check
    "$python" benches/python/bench_reserve.py --quick
    "$python" benches/python/virtual_tradeoff.py --quick --table --select --timing 1 --memory --beside --fewer-calls --scaled-up --variants 2 --scaled-variants 2 --scaled-timing 1 --wider 2
    "$python" benches/python/fit_policies.py --only gpt2-generate --variants 1
    "$python" benches/python/kv_decode.py --quick
    "$python" benches/python/kv_decode.py --quick --gpu-scale
    "$python" benches/python/bench_disco.py --quick
    "$python" benches/python/bench_disco_command.py --count 50 --rounds 1
    "$python" benches/python/bench_plan.py --lengths 2000 --sized 2000:10 --dynamic 2000 \
        --report 2000 --no-real
    "$python" benches/python/bench_place.py --time-limit 1 --buffers 2000
    "$python" benches/python/late_start.py gpt2-generate --cut 0.3
    "$python" benches/python/bench_unpickle.py --quick
    exit 0
fi

results="$target/bench-results"
mkdir -p "$results"
# Drop earlier results of these benches, so the report reads only this run's.
rm -rf "$target"/criterion/{fifo_window_1mib,steady_state_log_uniform,replay,peers_fifo_1mib,peers_steady_state,peers_replay}

# Build first, so that the peak resident set measured below is the bench's own.
cargo bench --bench pools --bench peers --no-run
# Bounded criterion runs: 1 s warm-up and 3 s of measurement per benchmark.
cargo bench --bench pools -- --warm-up-time 1 --measurement-time 3
measure=()
rm -f "$results/peers-maxrss-kb"
if [[ -x /usr/bin/time ]]; then
    measure=(/usr/bin/time -f %M -o "$results/peers-maxrss-kb")
fi
CUBEPOOL_PEERS_JSON="$results/peers-memory.json" CUBEPOOL_TRACES="$traces" \
    "${measure[@]}" cargo bench --bench peers -- --warm-up-time 1 --measurement-time 3
# The targets' FIFO (W=4000) and steady-state loops again, the peers interleaved (20
# rounds each, peers in turn, the best round of each kept): the machine's speed drifts
# over the minutes between two criterion benchmarks, and rounds taken in turn see the
# same machine. The steady state also on storage without bytes (no kernel calls).
cargo build --release --example peer_loops
loops="$target/release/examples/peer_loops"
"$loops" --json "$results/interleaved-fifo.json" fifo all 1000000 20
"$loops" --json "$results/interleaved-steady.json" steady all 100000 20
"$loops" --no-bytes --json "$results/interleaved-steady-no-bytes.json" steady all 100000 20
# The same loops' instructions, data accesses and simulated cache misses per step, and
# where the misses are (cachegrind, on the release build with line tables; without
# valgrind the report says they were not measured).
rm -f "$results/cache.json"
cargo build --profile lines --example peer_loops
"$python" benches/cache_profile.py --loops "$target/lines/examples/peer_loops" \
    --json "$results/cache.json"
# What the default's books cost in ns: the loops built without each part of them (the
# statistics, the pool's books, the granule books), every build timed in turn.
"$python" benches/books_split.py --json "$results/books.json"

maturin develop --release --quiet
"$python" benches/python/bench_reserve.py --json "$results/python.json"
# The virtual pool's release knob, how the default's setting was chosen, its replay speed
# against the default before it (also on every trace scaled up), and every layout's memory
# on the shared traces.
"$python" benches/python/virtual_tradeoff.py --table --select --timing 15 --memory --beside --fewer-calls --scaled-up --variants 20 --scaled-variants 20 --scaled-timing 15 --wider 20 \
    --traces "$traces" --json "$results/virtual.json"
# Other online placement rules beside the default's under eager unmapping (half a minute).
"$python" benches/python/fit_policies.py --variants 20 --traces "$traces" --json "$results/fit.json"
# Plan time and peak memory against trace length and distinct sizes (minutes: the
# 1M-event traces), `cubepool report` on a long trace, and the plan's figures on the
# real traces (the static placement with 10 s each).
"$python" benches/python/bench_plan.py --real "$traces" --json "$results/plan.json"
# MiniMalloc's instances A-K and 100,000 synthetic buffers (10 s each).
"$python" benches/python/bench_place.py --time-limit 10 --json "$results/place.json"

"$python" benches/report.py \
    --criterion "$target/criterion" \
    --peers-memory "$results/peers-memory.json" \
    --python "$results/python.json" \
    --virtual "$results/virtual.json" \
    --plan "$results/plan.json" \
    --place "$results/place.json" \
    --peers-maxrss "$results/peers-maxrss-kb" \
    --interleaved "$results"/interleaved-{fifo,steady,steady-no-bytes}.json \
    --cache "$results/cache.json" \
    --books "$results/books.json" \
    --fit "$results/fit.json" \
    --out BENCHMARKS.md
