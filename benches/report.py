"""Assembles BENCHMARKS.md from the results that ``benches/run_all.sh`` leaves behind.

Inputs: criterion's ``<group>/<bench>/new/{benchmark,estimates}.json`` files (the
``pools`` and ``peers`` benches), the peak-memory and storage-call tables the ``peers``
bench writes (``CUBEPOOL_PEERS_JSON``), and the JSON of ``benches/python/bench_reserve.py``,
``benches/python/virtual_tradeoff.py`` and ``benches/python/bench_plan.py``. Every time
quoted from criterion is its median estimate for one iteration. Every section of the
file is made here from those results; none is edited by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from statistics import mean, median
from typing import Any

FIFO_WINDOWS = (40, 400, 4000)
TRACES = ("gpt2-train", "gpt2-generate", "transformer-train")
MIB = 1024 * 1024

REGENERATE = "benches/run_all.sh"
SMOKE = "benches/run_all.sh --smoke"
SMOKE_PARTS = (
    "cargo test --bench pools --bench peers",
    "python benches/python/bench_reserve.py --quick",
    "python benches/python/virtual_tradeoff.py --quick --table --select --timing 1 --memory"
    " --beside --fewer-calls --scaled-up --variants 2 --scaled-variants 2 --scaled-timing 1"
    " --wider 2",
)
# Issue 17's bars for the default layout: utilization per shared trace, storage calls
# per 100 allocations, replay time against the previous default, plan time.
UTILIZATION_BARS = {
    "gpt2-train": 0.95,
    "transformer-train": 0.95,
    "mixtral-train": 0.95,
    "vit-train": 0.93,
    "gpt2-generate": 0.93,
}
MAX_CALLS_PER_100 = 5.0
MAX_REPLAY_RATIO = 1.25
# Issue 28's goals for the default on every trace: at least this utilization, and never
# more than this below `torch_expandable (model)`.
UTILIZATION_GOAL = 0.95
MARGIN_GOAL = 0.005
# Issue 31's bar for the default layout's reserve + drop against offset-allocator's.
MAX_OFFSET_RATIO = 1.25

# Where the scaled-up replays' time goes, counted once (not by run_all.sh).
REPLAY_CALL_COST = (
    "counted with callgrind (the `replay` function's instructions, inclusive, of "
    "`examples/replay_ab.rs TRACE compact virtual_pages 0` and the same with the layouts "
    "swapped, on the traces of `virtual_tradeoff.py`'s `scaled_by` saved with "
    "`Trace.write`, with glibc's `rep stos` and `rep movs` turned off, as callgrind counts "
    "each of their bytes an instruction: `GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold="
    "0x7fffffffffffffff:glibc.cpu.x86_rep_movsb_threshold=0x7fffffffffffffff`), the "
    "default runs 0.50 to 1.62 million instructions more than `compact`, 950 to 1,310 a "
    "storage call it makes (the calls `examples/placements.rs` counts): conv-dynamic x128 "
    "3.18 M against 1.56 M with 1,427 calls (1,135 a call), mixtral-train x16 4.42 M "
    "against 3.11 M with 1,001 (1,308), gpt2-train x16 3.79 M against 3.10 M with 723 "
    "(949), lstm-train x16 1.28 M against 0.78 M with 497 (1,002) (stop 64, after the "
    "granule table's links went apart from its counts: 3.27, 4.43, 3.78 and 1.31 M "
    "before; 0.54 to 1.73 million in stop 63, and before it, when the granule "
    "table grew by the entries each block needed, 0.59 to 2.0 million, 1,170 to 1,480 a "
    "call). They are spread over many small steps: on conv-dynamic x128 (counted before "
    "stop 63, the replay alone, `--toggle-collect`) no "
    "function of the chunks' claim, map and release, their idle spans or the storage's "
    "run map takes more than 5 % of the replay's instructions, the largest share being "
    "memory moves (7.4 %: the run map's sorted leaves, and vectors growing). Fewer calls "
    "at that scale cost utilization (coarser granules, above); cheaper calls would need "
    "other books for the granules and the storage's runs, not attempted. On a GPU a map "
    "or unmap is a driver call of microseconds, beside which these books are small."
)
# Where the default's reserve + release spends its instructions, beside
# offset-allocator's: counted with callgrind (deterministic, so the shares are not
# noise), not by this run. Reproduce: `cargo build --release --example peer_loops`, then
# `valgrind --tool=callgrind ./target/release/examples/peer_loops fifo PEER N` for N =
# 20,000 and 120,000 and PEER = offset, virtual, virtual-release, virtual-slots (and
# `steady`); a step's count is the difference of the totals over 100,000.
# `callgrind_annotate` splits the dropped-handle runs by function.
DEFAULT_COSTS = (
    "per step of FIFO W=4000 / the steady state, offset-allocator runs 375 / "
    "515 instructions; the default with handles dropped 438 / 1,010 (435 / 1,009 before "
    "stop 66's fix of stale ids, which gives an arena segment taken again in place a new "
    "generation, counted this stop on the builds of aee0e68 and 9f02ea7; stops 67 to 70 "
    "moved none of these counts; 435 / 1,008 after, 434 / 1,006 before "
    "a pool refused a reserve of 0 bytes, the build before it counted in the same session, "
    "stop 65, below; 433 / 1,021 before "
    "the granule table kept its links apart from its counts and each idle span a bound "
    "on its largest chunk, stop 64, below; 436 / 1,024 before "
    "the last two of six splits of modules into files, 436 / 1,022 before the first "
    "four, below; 436 / 1,024 before an unmapped run "
    "of host memory kept its protection, below; 438 / 1,024 before "
    "the granule books' table grew fallibly, below; 438 / 1,030 before "
    "issue 31's tenth round, below; 438 / 1,027 before "
    "issue 28's fourth rule of placement, below; 441 / 1,045 "
    "before the ninth round, below; 433 / "
    "1,016 before the eighth; 434 / "
    "1,086 before the seventh; 436 / 1,088 before the sixth; 436 / "
    "1,117 before a trim's search was bounded; 496 / "
    "1,184 before issue 31's fifth round, counted on the code it started from: "
    "the granule books' idle spans, merged after the fourth round's 494 / "
    "1,132, moved them; 522 / 1,156 before the fourth, 729 / 1,328 before the "
    "third), with `mm.release` 409 / 981 (405 / 979 before the fix of stale ids; 405 / "
    "978 after, 404 / 976 before the refusal, 402 / 991 before "
    "stop 64's two changes, "
    "400 / 988 before the last two splits, 400 / 987 "
    "before the first four, 400 / 989 before the "
    "protection's change, "
    "403 / 990 before the table's change, 403 / 996 "
    "before the tenth, 403 / 993 before "
    "the rule, 408 / 1,012 "
    "before the ninth, 400 / 983 "
    "before the eighth, 401 / "
    "1,053 before the seventh, 405 / "
    "1,056 before the sixth, 405 / "
    "1,086 before the bound, 464 / "
    "1,151 before the fifth, 492 "
    "/ 1,126 before the fourth, 632 / 1,230 before the third), without handles "
    "376 / 946 (369 / 941 before the fix of stale ids; 369 / 940 after, 372 / 941 "
    "before the refusal, 371 / 956 before stop 64's two changes, "
    "371 / 955 before the last two splits, 371 / 953 before the first four, "
    "371 / 955 before the protection's change, "
    "375 / 958 before the table's "
    "change, 375 / 963 before the tenth, "
    "375 / 960 before the rule, 380 / 979 before "
    "the ninth, 373 / 954 "
    "before the eighth, 374 / 1,024 "
    "before the seventh, "
    "the same before the sixth; "
    "374 / 1,054; 419 / 1,104; 487 / 1,112; 595 / "
    "1,194). The "
    "third round: a "
    "dropped handle's descriptor is freed straight off its ring (no list in "
    "between), the drop finds its ring through a thread-local copy of the "
    "thread's first ring (no destructor-state check, no borrow, no stack "
    "frame), the pools, storage, statistics and error graph sit in one field "
    "beside the descriptor table (one pointer to free with), the virtual "
    "pool's reserve and release are inlined whole into memory management's two "
    "paths (two frames a step instead of six), the route cache's hit is "
    "inline, the whole-page flags are a byte per pool and a statistic's peak "
    "moves by a branch. The fourth round: the peaks of the statistics' free "
    "bytes and pages are kept per epoch of the storage (between two maps or "
    "unmaps its bytes and pages are constant, so a release records a low-water "
    "mark of the allocated bytes, one compare, instead of two differences and "
    "two maxima), a reserve measures them only when it is the first of an "
    "epoch, a pool's largest allocation and bytes-in-use peak move by a "
    "branch, the virtual pool's reserve is called apart from the other kinds "
    "(its placement stays in registers instead of a stack slot the out-of-line "
    "kinds also write) and `reserve_slot` takes that same path. The fifth "
    "round (dropped 496 -> 436): a size's extent is the mask's, with one "
    "compare against the largest size the range holds, and the granule books' "
    "one-granule test compares the granules of a block's first and last bytes "
    "(both 496 -> 471); release calls the virtual pool apart from the other "
    "kinds, with its whole-page flag a constant and an error it cannot return "
    "dropped out of line (471 -> 451); the route cache's hit looks at neither "
    "the mode nor the persistent pool (opening a window or freeing a "
    "persistent buffer empties it), the vacant descriptors' top sits in a "
    "field of its own (451 -> 445), the drain's closure owns the freeing "
    "closure and a ring's producer compares its count with the count at which "
    "the ring is full (445 -> 441), and each range keeps its arena's bits of a "
    "slot index (441 -> 436). Where the FIFO dropped-handle step's 436 went, "
    "each part removed in a throwaway build with the rest unchanged: memory "
    "management's PyTorch-style statistics 39 (47 at 494; the split moves with "
    "what the compiler inlines); the pool's own books (usage, high-water "
    "marks) 21 (18 at 494); the granule books (`pool/chunks`: which granules "
    "live blocks touch, so unused ones can be unmapped) 55 (63 at 522); "
    "handles 62 (dropped over slots; 81 at 494); the bench loop and its call "
    "60 (offset-allocator's 53), measured at 522. The rest is the placement "
    "(the arena's best fit with deferred coalescing), the routing and the glue "
    "of reserve and release, beside offset-allocator's 322 for its allocate "
    "and free. So the default's own placement is as lean as "
    "offset-allocator's; what it runs over it are the books offset-allocator "
    "does not keep (statistics, granules, handles): without handles the step "
    "now runs 376 against offset-allocator's 375 (1.00x; 369, 0.98x, before stop 66's "
    "fix of stale ids; 372, 0.99x, before stop 65's "
    "refusal below; 375, 1.00x, before the "
    "table's change below; 380, 1.01x, before the "
    "ninth round; 373, 0.99x, before the eighth), `mm.release` 1.09x and handles "
    "dropped 1.17x. The "
    "steady state adds (split measured before the "
    "third round) the arena's coalescing (115), the granule books (197) and "
    "the storage calls they make with the storage's books (B-trees, a hash "
    "map, map/unmap: about 120). Since then a trim looks for a chunk that "
    "frees its bytes alone in the 64 idle spans idle longest only (unbounded "
    "it walked 127 spans a call, a cache miss each): 1,117 -> 1,088, the same "
    "storage calls. The sixth round, for a block alone in its granule (the "
    "Python loop below): freed and placed again where it was, it takes its "
    "granule's chunk back without the chunk being listed idle in between "
    "(`pool/chunks`), and the free rest after it, first on its class already, is "
    "not taken off and put back (`arena.rs`); FIFO 436 -> 434, the steady "
    "state 1,088 -> 1,086, the same placements and storage calls on every "
    "trace. The seventh round, the storages' books of mapped runs "
    "(`storage/run_map.rs`, `storage/host.rs`): past 256 runs a range's runs "
    "sit in sorted leaves of at most 64, found by a binary search of the "
    "leaves' first offsets (one search of each level and a short move a call), "
    "instead of a B-tree (three descents for a checked map), and the host "
    "storage checks and records a run with one search, finds its range by a "
    "scan of its few ranges instead of a SipHash map and asks the host's page "
    "size once: a checked map 680 -> 265 instructions in the simulated "
    "storage, the host's map 800 -> 405 and unmap 705 -> 363 (whole calls); "
    "the steady state 1,086 -> 1,013 (without bytes 1,042 -> 1,004), FIFO 434 "
    "-> 433, the same placements and storage calls on every trace. In the same "
    "round the arena remembers that its last place took the deferred segment "
    "back beside its free next neighbour, with a count of the changes to its "
    "class lists; while neither the neighbour, the size nor the count has "
    "changed the answer is the same (it is read off those alone), so a block "
    "freed and placed again before the free rest of the range (the Python loop "
    "below) asks once: 103 instructions fewer there, the steady state 1,013 -> "
    "1,016 (the count's upkeep), FIFO unchanged, replays up to 0.8 % more, the same "
    "placements on every trace. The eighth round is a rule of placement, not of "
    "speed (issue 28): a request negligible against the free segments it must "
    "split (under 1/256 of each) takes the one freed longest ago, so the arena "
    "keeps the last segment of each size class's list beside the first. It cost "
    "FIFO 433 -> 441 (no request there takes that path: the compiler lays out "
    "the reserve differently; with the rule's test made constant false, the "
    "step without handles ran 373 again) and "
    "the steady state 1,016 -> 1,045 (the lists' tails and the placements the "
    "rule changes), handles dropped. The ninth round is one of layout: a used "
    "segment, on no list, keeps the bytes asked for in its list links, so the "
    "arena's `Segment` is 40 bytes instead of 48. Where blocks come and go in order "
    "each step brings one cold segment into the cache (cachegrind, below): the FIFO "
    "step without handles missed the first level 1.00 times and now 0.88, and the "
    "steady state's, handles dropped, on storage without bytes, missed the second "
    "level 3.14 times and now 2.73; FIFO 441 -> 438 and the steady state 1,045 -> "
    "1,027 instructions, handles dropped, the same placements on every trace "
    "(`examples/placements.rs`: 41 traces under three layouts). Issue 28's fourth "
    "rule of placement, not of speed: a request that must split a larger class takes, "
    "of its first four members, one no larger than what splitting the first would "
    "leave (`bins.rs`); such a search takes a member alone in its class without "
    "reading it, else reads the first member and its class's smallest size, and "
    "walks on only where a rest can be that small. FIFO 438 unchanged, the steady "
    "state 1,027 -> 1,030, handles dropped; the shared traces' replays 0.5-0.9 % "
    "fewer instructions (1.1-1.6 % more before the member alone was spared the read). "
    "Issue 31's tenth round, of code layout: the granule books' split of a block into "
    "its interior and the chunks over its edges (`Chunks::interior`) is inlined always. "
    "Called, its result came back through memory and was read with 16-byte loads right "
    "after the 8-byte stores that wrote it, a store-forwarding stall at 13 % of "
    "`claim_each`'s samples in bert-dynamic x128's replay (`perf annotate`). FIFO 438 "
    "unchanged, the steady state 1,030 -> 1,024, handles dropped; the replays of six "
    "traces x128 1-7 % faster (`examples/replay_ab.rs`, best of 60, the builds in turn), "
    "the shared traces' unchanged. The change to the granule books' table is one of "
    "safety, not speed: it grows with a fallible reservation, so that a block of more "
    "granules than the host can book is out of memory instead of an abort, and the claim "
    "says so with a value no count of bytes to map can be, which the reserve tests only "
    "out of line, where that count is not 0 (an `Option` tested on every reservation "
    "cost the FIFO step 3 instructions); FIFO 438 -> 436 and the steady state 1,024 "
    "unchanged, handles dropped (the code's layout), the same placements. An unmapped run "
    "of host memory keeps its protection (stop 63, `storage/os_mapping.rs`): an unmap is "
    "a `madvise` alone, where an `mprotect` to no access split the range's host mapping, "
    "merged back by the next map's; the steady state's step on host memory took "
    "297-306 ns before and 177-185 after (`peer_loops steady virtual`, best of 3, the "
    "builds in turn; the kernel's share of its samples 35 % and 9 %). A map of a run that "
    "is writable still makes no call (`storage/writable_runs.rs`): 183.5-195.6 ns "
    "before, 169.1-178.4 after (best of 3, six rounds in turn). The step's instructions, "
    "the process's own: 1,024 before both, 1,021 after the first (fewer calls into the C "
    "library), 1,022 after the second (the check of the writable runs). Splitting the "
    "granule books, the memory management, the PyTorch model and the trace bindings into "
    "files of one job (stop 63, code moved only) moved the compiler's code units: a "
    "chained iterator's fold and `check_run` went out of line, 1,022 -> 1,026; the fold "
    "written as two sums took it to 1,024 (`check_run` inlined by force cost more), the "
    "same placements. The planned pool's and the replay's splits after them (with "
    "`ExclusivePool::release` marked `#[inline]`, which the replay's split had left out "
    "of line) moved the units again: FIFO 436 -> 433, the steady state 1,024 -> 1,021. "
    "Stop 64 made two changes to the granule books (`pool/chunks`). The granule table "
    "keeps its chunk links and its live counts in two arrays, so that a block's run of "
    "granules is named with one fill and scanned sixteen links at a time (replays at GPU "
    "scale, below); the fast paths read a count and then, maybe, a link in another "
    "array, a second bounds check: on storage without bytes FIFO 430 -> 432, the steady "
    "state 1,012 unchanged. And each "
    "idle span keeps a bound on its largest chunk, which a trim's search reads instead of "
    "visiting the span's chunks, tightened to the largest when it visited them in vain: "
    "the steady state's searches visited 84 thousand chunks in a million steps instead "
    "of 1.29 million, 1,012 -> 999 on storage without bytes (1,021 -> 1,007 and FIFO "
    "433 -> 434 on host memory, both changes together), the same chunks unmapped (the "
    "same placements and calls on every trace, as captured, x16 and x128). Stop 65 made "
    "the pools refuse a reserve of 0 bytes handed to them directly (memory management "
    "serves those itself) with a typed error: the virtual pool tests `size - 1 < bound` "
    "where it tested `size <= bound`, which sends a size of 0 to its cold path and "
    "places every other size as before, one or two instructions more a step with "
    "handles (FIFO 434 -> 435 and the steady state 1,006 -> 1,008 on host memory, "
    "432 -> 433 and 998 -> 1,000 without bytes; 372 -> 369 and 941 -> 940 without "
    "handles, the code's layout; the builds before and after counted in one session)."
)
# Instructions per 4 KiB reserve + drop from Python, counted with callgrind (not by
# this run): `python benches/python/bench_reserve.py --loop WHICH N` for N = 10,000
# and 110,000 under `valgrind --tool=callgrind` with OPENBLAS_NUM_THREADS=1; a step's
# count is the difference of the totals over 100,000.
PYTHON_COSTS = (
    "numpy.empty 2,171-2,271 (its count varies from run to run; 2,176 in the "
    "last count); the default 1,480-1,497 after issue 31's eleventh round (five "
    "counts; 1,734 before it, counted the same way on the same machine; SubSlices, "
    "which takes the same call, 1,628-1,647 against 1,900): "
    "`MemoryManagement.reserve` is entered as a "
    "`METH_O` method (`src/python/method_o.rs`), so CPython hands it its one "
    "argument as it is, where PyO3's entry ran its trampoline, its attach guard's "
    "thread-local count (`__tls_get_addr`) and its parser of positional and keyword "
    "arguments, about 190 instructions of the 1,734; an exact int is read through "
    "the C API (about 70 in PyO3's extraction before), and any other size, every "
    "failure's exception and a panic go through PyO3's attach as before, so that "
    "no Python object is dropped while PyO3 counts the thread as detached (this "
    "build leaks such a drop: a first form of the round leaked every error's "
    "objects, found in review; `tests/python/test_management.py` checks it). The "
    "bare loop of 10 million steps, the builds in turn five rounds each, took "
    "121-124 ns a step in four rounds and 142 in one, against 143-150 before, the "
    "interpreter's start included; the size is now "
    "positional only, as in `list.append`), "
    "1,734 after the tenth round (1,745 before it; its gain is in time, not "
    "instructions: the binding moved the reserve's result out of the lock with "
    "16-byte loads right after the 8-byte stores that wrote it, store-forwarding "
    "stalls that `perf annotate` put at about 7 % of the step's samples; it now "
    "hands the fields out one by one from the inlined reserve, and the bare loop of "
    "10 million steps, the builds run in turn eight times, took 144-152 ns a step "
    "against 151-155 before, the interpreter's start included; a like stall remains "
    "in PyO3's copy of the new handle object's value, about half of "
    "`create_class_object`'s samples, 3 % of the step), "
    "1,750 after issue 31's ninth round (its one block's segment stays in the cache "
    "in this loop, so the smaller segment changes nothing here), "
    "1,747 after the seventh (1,850 before it: the arena asks once "
    "whether a block freed and placed again beside the free rest of the range "
    "takes its segment back, see above), 1,850 after the sixth (2,013 before "
    "it, counted the same way "
    "on the same machine: its fast path for a block alone in its granule is "
    "this loop's, whose one live block is alone in its granule; 2,017-2,029 "
    "before, 2,020 after the fifth round, whose changes are below the "
    "binding; 2,042-2,050 before the fourth round, 2,166 before its "
    "third, counted the same way on the same machine; 2,255 before its second); "
    "SubSlices 1,900 before the eleventh round (1,915 before the fourth). The default's, by "
    "function (split measured before the third round, whose 120 instructions "
    "came off the core's): the interpreter (its loop, the handle object's memory) "
    "about 570; PyO3's call and object glue about 390; the binding's own code (the "
    "size, the lock, the handle, its give-back) about 240; the core's reserve and "
    "release about 950 before, so about 830 after it (950 less the 120), "
    "about 670 after the sixth (830 less its 163) and about 580 after the "
    "seventh (670 less its 103); the eleventh took about 190 off PyO3's glue."
)
PLAN_EVENTS = 1_000_000
MAX_PLAN_SECONDS = 20.0
# The heading of the section ``--beside-only`` writes alone.
BESIDE_HEADING = "## The default beside PyTorch's allocator on every trace"
# The section it goes before when BENCHMARKS.md lacks it.
BESIDE_BEFORE = "## The virtual pool's release knob"


def load_criterion(root: Path) -> dict[str, dict[str, float]]:
    """Every benchmark under ``root``, by full id: its median (ns per iteration), the
    median's 95 % confidence interval (``lo``, ``hi``), and its mean."""
    results: dict[str, dict[str, float]] = {}
    for meta_path in root.glob("**/new/benchmark.json"):
        meta = json.loads(meta_path.read_text())
        estimates = json.loads((meta_path.parent / "estimates.json").read_text())
        median = estimates["median"]
        results[meta["full_id"]] = {
            "median": median["point_estimate"],
            "lo": median["confidence_interval"]["lower_bound"],
            "hi": median["confidence_interval"]["upper_bound"],
            "mean": estimates["mean"]["point_estimate"],
        }
    return results


def duration(ns: float) -> str:
    """A time in the unit that reads best."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def difference(ns: float) -> str:
    """A time difference; negative when the later way was the faster."""
    return f"-{duration(-ns)}" if ns < 0 else duration(ns)


def ratio(value: float) -> str:
    """A ratio such as 3.2x or 0.45x."""
    return f"{value:.1f}x" if value >= 10 else f"{value:.2f}x"


def beside_bar(value: float, bar: float, decimals: int, *, at_most: bool) -> str:
    """``value`` with ``decimals`` decimals, or more where that many would show it on
    the other side of ``bar`` than it is (1.2549 against a bar of at most 1.25 reads
    1.255, not 1.25, beside its miss): the figure a verdict prints agrees with the
    verdict."""
    met = value <= bar if at_most else value >= bar
    for places in range(decimals, decimals + 8):
        text = f"{value:.{places}f}"
        shown = float(text)
        if (shown <= bar if at_most else shown >= bar) == met:
            return text
    return repr(value)


def ratio_beside(value: float, bar: float) -> str:
    """A ratio as :func:`ratio` writes it, with the decimals :func:`beside_bar` adds
    where it sits by an at-most ``bar``."""
    return ratio(value) if value >= 10 else f"{beside_bar(value, bar, 2, at_most=True)}x"


def mib(n: int) -> str:
    """Bytes in MiB."""
    return f"{n / MIB:.1f}"


def status(met: bool) -> str:
    """A target's verdict."""
    return "met" if met else "**missed**"


def figures(cell: list[float]) -> str:
    """A replay's ``[utilization, storage calls per 100 allocations]`` as
    ``utilization / calls``."""
    return f"{cell[0]:.3f} / {cell[1]:.1f}"


def replay_ratio(row: dict[str, Any]) -> float:
    """A timed replay row's ns/event of the default over the previous default's."""
    return float(row["default"]) / float(row["previous"])


def table(header: Iterable[str], align: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# The peers of `benches/cache_profile.py` the reading compares: offset-allocator, the
# default without handles, with `mm.release` and with handles dropped.
PROFILED = ("offset", "virtual-slots", "virtual-release", "virtual")
PROFILED_NAMES = {
    "offset": "offset-allocator",
    "virtual": "default, handles dropped",
    "virtual-release": "default, `mm.release`",
    "virtual-slots": "default, slots",
}


def spread(variants: list[dict[str, Any]], workload: str) -> float:
    """How far offset-allocator's best step in ``workload`` ranged over the builds of
    ``benches/books_split.py`` (its code is the same in each: the noise)."""
    offsets = [variant["best_ns"][workload]["offset"] for variant in variants]
    return max(offsets) - min(offsets)


def noise(variants: list[dict[str, Any]], reps: int) -> str:
    """How far the timings of ``benches/books_split.py`` ranged: the step as built
    (handles dropped) between its runs, where the result records it, and
    offset-allocator's best between the builds (its code is the same in each)."""
    built = variants[0].get("range_ns")
    runs = (
        f"the step as built (handles dropped) ranged over {difference(built['fifo']['virtual'])} "
        f"(FIFO) and {difference(built['steady']['virtual'])} (steady state) between its "
        f"{reps} runs' bests, "
        if built
        else ""
    )
    return (
        f"{runs}offset-allocator's step, the same code in every build, over "
        f"{difference(spread(variants, 'fifo'))} and {difference(spread(variants, 'steady'))} "
        "between the builds"
    )


def misses(step: dict[str, float]) -> float:
    """First-level data cache misses (reads and writes) in one step's counts."""
    return step["D1mr"] + step["D1mw"]


def second_misses(step: dict[str, float]) -> float:
    """Data accesses that miss the second-level cache too, in one step's counts."""
    return step["DLmr"] + step["DLmw"]


def per_step_count(value: float) -> str:
    """One event's count per step, two decimals. A count is the difference of two runs'
    totals over the difference of their steps, so an event the extra steps never cause
    can come out a hair below zero (the two runs' setups differ by a few events): that
    reads 0.00, not -0.00."""
    return f"{max(value, 0.0):.2f}"


# The places of a row's misses the report lists, most first.
PLACES_SHOWN = 4


def places_table(rows: list[dict[str, Any]], workloads: dict[str, str]) -> str:
    """Where each profiled loop's first-level misses are: its places (function and
    source file) with the most misses a step, or "" when no row names any."""
    body = [
        [
            workloads.get(row["workload"], row["workload"]),
            PROFILED_NAMES.get(row["peer"], row["peer"]),
            f"`{place['function']}`",
            f"`{place['file']}`",
            per_step_count(place["misses"]),
        ]
        for row in rows
        for place in row.get("places", [])[:PLACES_SHOWN]
    ]
    if not body:
        return ""
    header = ["workload", "peer", "function", "source file", "first-level misses"]
    return table(header, ["---", "---", "---", "---", "---:"], body)


def accesses(step: dict[str, float]) -> float:
    """Data reads and writes in one step's counts."""
    return step["Dr"] + step["Dw"]


def command(*args: str) -> str:
    """The first line a command prints, or a note that it failed."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"({' '.join(args)} unavailable)"
    return out.strip().splitlines()[0]


def machine(measured: float) -> list[str]:
    """What the figures were measured on; ``measured`` is a POSIX time of the run."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    libc, libc_version = platform.libc_ver()
    load = ", ".join(f"{average:.2f}" for average in os.getloadavg())
    return [
        f"- CPU: {model}; `nproc` = {command('nproc')}",
        f"- Memory: {memory_total()}",
        f"- OS: {platform.system()} {platform.release()}, {libc} {libc_version}",
        f"- Rust: {command('rustc', '--version')}",
        "- Date: "
        + datetime.datetime.fromtimestamp(measured, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        f"- Load average (1, 5, 15 minutes) when this file was written: {load}",
    ]


def peak_rss_kib(path: Path | None) -> int | None:
    """The number in a GNU time ``%M`` output file (KiB), if there is one."""
    if path is None or not path.is_file():
        return None
    try:
        return int(path.read_text().split()[-1])
    except (ValueError, IndexError):
        return None


def memory_total() -> str:
    """Total RAM from /proc/meminfo."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


# The cubepool variants each target is reported for: (what they are, bench name).
VARIANTS = (
    ("with handles", "cubepool"),
    ("handles given back with `mm.release`", "cubepool-release"),
    ("slots (freed by the caller, like offset-allocator's)", "cubepool-slots"),
)


# Issue 27's bars for the planner and the placement.
PLAN_BARS = (
    ("dynamic shapes", 120_000, 10.0, 300.0),
    ("synthetic, 10 sizes", 1_000_000, 20.0, None),
)
"""(kind, events, most seconds, most peak MiB or None) of each plan the issue bounds."""
REPORT_BAR = (240_000, 5.0)
"""(events, most seconds) of ``cubepool report`` on a dynamic-shape trace."""
PLACE_BAR = (100_000, 10.0)
"""(buffers, most seconds) of an offline placement."""
STATIC_WITHIN = 0.02
"""The goal: the static placement within 2 % of the floor on every trace."""
NEXT_RUN_AT_LEAST = 0.98
"""Issue 27's bar for the plan for the next run on every training trace with steps."""
TRAINING_SUFFIXES = ("-train", "-finetune")
"""Workload names of training runs (each capture is named by what it runs)."""
TRAINING_ALSO = ("unet-diffusion",)
"""Training runs named otherwise: the training steps of a diffusion UNet (its sampling
is ``diffusion-sample``)."""


def training_with_steps(row: dict[str, Any]) -> bool:
    """Whether a real trace's row is of a training run whose header names its steps
    (``bench_plan.py``'s ``steps``: phases other than the setup; a row without the
    figure, from before it was measured, counts by its name alone)."""
    name = str(row.get("name", ""))
    training = name.endswith(TRAINING_SUFFIXES) or name in TRAINING_ALSO
    return training and row.get("steps", 1) > 0


MINIMALLOC_CAPACITY = 1_048_576


def _kind(row: dict[str, Any]) -> str:
    return str(row.get("kind", "synthetic"))


def plan_scale_table(rows: list[dict[str, Any]]) -> str:
    """``bench_plan.py``'s plans of long traces: cost against length and distinct sizes."""
    return table(
        (
            "trace",
            "events",
            "distinct sizes",
            "candidates",
            "plan (s)",
            "of it static placement (s)",
            "plan CPU (s)",
            "replays",
            "peak RSS (MiB)",
            "planned utilization",
        ),
        ("---", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:"),
        [
            [
                _kind(r),
                f"{r['events']:,}",
                f"{r.get('distinct_sizes', 0):,}",
                str(r.get("candidates", "candidates full")).removeprefix("candidates "),
                f"{r['plan_s']:.1f}",
                f"{(r.get('static') or {}).get('seconds', 0.0):.1f}",
                f"{r.get('plan_cpu_s', float('nan')):.1f}",
                f"{r['replays']:,}",
                f"{r['peak_rss_mib']:.0f}",
                f"{r['utilization']:.3f}",
            ]
            for r in rows
        ],
    )


def report_scale_table(rows: list[dict[str, Any]]) -> str:
    """``bench_plan.py``'s runs of ``cubepool report`` on long traces."""
    return table(
        ("`cubepool report` on", "events", "candidates", "seconds", "CPU (s)", "peak RSS (MiB)"),
        ("---", "---:", "---", "---:", "---:", "---:"),
        [
            [
                _kind(r),
                f"{r['events']:,}",
                str(r["candidates"]).removeprefix("candidates "),
                f"{r['report_s']:.1f}",
                f"{r['report_cpu_s']:.1f}",
                f"{r['peak_rss_mib']:.0f}",
            ]
            for r in rows
        ],
    )


def plan_figures_table(rows: list[dict[str, Any]]) -> str:
    """Per real trace: utilization of the default layout, the plan for the next run, the
    static placement of the whole trace, and the floor (1.0, peak live)."""
    out = []
    for r in rows:
        static = r.get("static")
        cell = "-"
        if static is not None:
            cell = f"{static['utilization']:.3f}" + (" (optimal)" if static["optimal"] else "")
        out.append(
            [
                r["name"],
                f"{r['events']:,}",
                f"{r.get('peak_live', 0) / MIB:.1f}",
                f"{r.get('default_utilization', float('nan')):.3f}",
                f"{r['utilization']:.3f}",
                cell,
                "1.000",
                f"{r['plan_s']:.1f}",
                r["layout"],
            ]
        )
    return table(
        (
            "trace",
            "events",
            "peak live (MiB)",
            "default",
            "plan for the next run",
            "static placement of the whole trace",
            "floor",
            "plan + placement (s)",
            "planned layout",
        ),
        ("---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"),
        out,
    )


def plan_goals(plan: dict[str, Any]) -> str:
    """Issue 27's bars for the planner, met or missed, from ``bench_plan.py``'s JSON."""
    goals = []
    rows = plan.get("synthetic", []) + plan.get("scale", [])
    for kind, events, seconds, mib_most in PLAN_BARS:
        found = [r for r in rows if _kind(r) == kind and r["events"] == events]
        if not found:
            continue
        r = found[0]
        bound = f"at most {seconds:g} s" + ("" if mib_most is None else f" and {mib_most:g} MiB")
        met = r["plan_s"] <= seconds and (mib_most is None or r["peak_rss_mib"] <= mib_most)
        goals.append(
            (
                f"plan of {events:,} events ({kind}, {r.get('distinct_sizes', 0):,} distinct "
                f"sizes): {bound}",
                f"{r['plan_s']:.1f} s (CPU {r['plan_cpu_s']:.1f} s), {r['peak_rss_mib']:.0f} MiB",
                status(met),
            )
        )
    events, seconds = REPORT_BAR
    for r in plan.get("report", []):
        if r["events"] == events:
            goals.append(
                (
                    f"`cubepool report` on {events:,} events ({_kind(r)}): under {seconds:g} s",
                    f"{r['report_s']:.1f} s (CPU {r['report_cpu_s']:.1f} s)",
                    status(r["report_s"] < seconds),
                )
            )
    real = plan.get("real", [])
    placed = [r for r in real if r.get("static")]
    if placed:
        far = [
            f"{r['name']} {r['static']['over_floor'] / r['static']['lower_bound']:.1%}"
            for r in placed
            if r["static"]["lower_bound"]
            and r["static"]["over_floor"] > STATIC_WITHIN * r["static"]["lower_bound"]
        ]
        goals.append(
            (
                f"static placement within {STATIC_WITHIN:.0%} of the floor on every trace",
                "over it: " + ", ".join(far) if far else f"all {len(placed)} within",
                status(not far),
            )
        )
    training = [r for r in real if training_with_steps(r)]
    if training:
        short = [
            f"{r['name']} {r['utilization']:.3f}"
            for r in training
            if r["utilization"] < NEXT_RUN_AT_LEAST
        ]
        goals.append(
            (
                f"the plan for the next run at least {NEXT_RUN_AT_LEAST} on every training "
                "trace with steps",
                "below: " + ", ".join(short) if short else f"at or above on all {len(training)}",
                status(not short),
            )
        )
    judged = [r for r in real if "default_utilization" in r]
    if judged:
        below = [r["name"] for r in judged if r["utilization"] < r["default_utilization"] - 1e-9]
        goals.append(
            (
                "the plan for the next run never below the default",
                "below: " + ", ".join(below) if below else f"at or above on all {len(judged)}",
                status(not below),
            )
        )
    return table(("goal (issue 27)", "measured", "status"), ("---", "---", "---"), goals)


def placement_table(place: dict[str, Any]) -> str:
    """``bench_place.py``'s JSON: MiniMalloc's instances at their capacity and with none,
    then the synthetic input."""
    rows = []
    for r in place.get("instances", []):
        fit = "yes" if r["fits"] else f"no ({r.get('fit_reason')})"
        secs = r.get("fit_seconds")
        cpu = r.get("fit_cpu_seconds")
        rows.append(
            [
                r["instance"],
                f"{r['buffers']:,}",
                f"{r['lower_bound']:,}",
                fit,
                "-" if secs is None else f"{secs:.2f} s",
                "-" if cpu is None else f"{cpu:.2f} s",
                f"{r['height']:,}",
                f"{r['utilization']:.3f}",
                "yes" if r["optimal"] else "no",
            ]
        )
    text = table(
        (
            "instance",
            "buffers",
            "peak live",
            f"fits {MINIMALLOC_CAPACITY:,}",
            "time",
            "CPU time",
            "best height, no capacity",
            "utilization",
            "proven optimal",
        ),
        ("---", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---"),
        rows,
    )
    synthetic = place.get("synthetic")
    if synthetic:
        buffers, seconds = PLACE_BAR
        verdict = (
            status(synthetic["seconds"] <= seconds)
            if synthetic["buffers"] >= buffers
            else "not measured in this run"
        )
        text += (
            f"\n\n{synthetic['buffers']:,} synthetic trace-like buffers, no capacity: height "
            f"{synthetic['height']:,} against a lower bound of {synthetic['lower_bound']:,} "
            f"(utilization {synthetic['utilization']:.3f}) in {synthetic['seconds']:.2f} s "
            + (f"(CPU {synthetic['cpu_seconds']:.2f} s) " if "cpu_seconds" in synthetic else "")
            + f"(goal: {buffers:,} buffers in at most {seconds:g} s: {verdict})."
        )
    return text


PLANNER_SECTIONS = (
    "## Offline placement: MiniMalloc's instances A-K",
    "## Plans: the default, the plan for the next run, the static placement, the floor",
    "## Planning time and memory against trace length and distinct sizes",
)
"""The headings of the sections :func:`planner_sections` makes."""


def planner_sections(plan: dict[str, Any] | None, place: dict[str, Any] | None) -> str:
    """The planner's and the placement's sections of BENCHMARKS.md (issue 27), from the
    JSON of ``bench_plan.py`` and ``bench_place.py`` (a section whose results are missing
    says so)."""
    missing = "(Not measured in this run: `benches/python/{}`.)"
    placement = missing.format("bench_place.py") if place is None else placement_table(place)
    limit = "" if place is None else f" {place.get('time_limit_s', 10):g}"
    figures = missing.format("bench_plan.py")
    scale = figures
    if plan is not None:
        real = plan.get("real")
        figures = plan_figures_table(real) if real else "(No real traces in this run.)"
        figures += "\n\n" + plan_goals(plan)
        scale = plan_scale_table(plan.get("synthetic", []) + plan.get("scale", []))
        if plan.get("report"):
            scale += "\n\n" + report_scale_table(plan["report"])
    static_limit = "10" if plan is None else f"{plan.get('static_time_limit', 10):g}"
    load = ""
    if plan is not None and plan.get("load_average"):
        averages = ", ".join(f"{x:.1f}" for x in plan["load_average"])
        ended = f" (at {plan['ended']})" if plan.get("ended") else ""
        load = (
            f" When `bench_plan.py` ended{ended}, the load average (1, 5, 15 minutes) was"
            f" {averages} on {plan.get('cpus', '?')} CPUs."
        )
    return f"""{PLANNER_SECTIONS[0]}

MiniMalloc's eleven challenging instances (google/minimalloc, Apache-2.0; A-E in
`../shared/placement/`, F-K bundled in `benches/placement/`):
whether `cubepool place --capacity {MINIMALLOC_CAPACITY}` finds a placement and in how
long (wall clock and CPU time: the machine is shared, so a time limit buys less CPU
than it says), and the best height with no capacity, each with a time limit of{limit} s
(`python benches/python/bench_place.py --json`). On eight of the eleven the peak live
bytes equal the capacity, so only a perfect packing fits.

{placement}

{PLANNER_SECTIONS[1]}

Utilization (peak live over peak reserved; the floor is 1.0) on every shared trace and
on the traces captured by `scripts/capture_traces.py` (`benches/traces`): the default
layout; the plan for the next run (derived from the early part of the trace, replayed on
the whole of it); the static placement of the whole trace (`cubepool.place` of its
allocations with {static_limit} s: what a runtime that knows this exact run in advance
would reserve, not a plan); each planned in a fresh process
(`python benches/python/bench_plan.py`; the time is the plan's and the placement's).

{figures}

{PLANNER_SECTIONS[2]}

`cubepool.plan` of long traces with no phases (the plan is derived on the whole trace),
each loaded and planned in a fresh process: synthetic traces of the default vocabulary
and of 10 distinct sizes, and dynamic-shape traces (`dynamic_trace.py`: lognormal sizes,
nearly every size once). The plan includes the static placement of the whole trace
(1 s). Traces of more than 50,000 events are planned with the reduced candidate set,
and `cubepool report` plans them with the few set (the summary says so). Times are
wall-clock on the machine below, shared with other jobs (CPU time beside them).{load}

{scale}
"""


def splice_sections(
    document: str, sections: str, headings: tuple[str, ...], before: str = "## Method"
) -> str:
    """``document`` with each section of ``sections`` (headed by one of ``headings``)
    in place of the section of that heading (up to the next ``## ``), or before the
    heading ``before`` (else at the end) where ``document`` has none."""
    parts: dict[str, str] = {}
    for heading in headings:
        start = sections.index(heading)
        ends = [sections.find(h, start + 1) for h in headings if sections.find(h, start + 1) > 0]
        parts[heading] = sections[start : min(ends, default=len(sections))].rstrip() + "\n\n"
    for heading, text in parts.items():
        if heading in document:
            start = document.index(heading)
            end = document.find("\n## ", start + 1)
            end = len(document) if end < 0 else end + 1
            document = document[:start] + text + document[end:]
        elif before in document:
            at = document.index(before)
            document = document[:at] + text + document[at:]
        else:
            document = document.rstrip() + "\n\n" + text
    return document


def offset_target(workload: str, ours: float, offset: float) -> tuple[str, str, str]:
    """Issue 31's row for one workload: the default (handles dropped, ``ours`` ns)
    within ``MAX_OFFSET_RATIO`` of offset-allocator's ``offset`` ns."""
    r = ours / offset
    return (
        f"{workload}: virtual pool (handles dropped) within "
        f"{MAX_OFFSET_RATIO}x of offset-allocator",
        f"{duration(ours)} vs {duration(offset)} ({ratio_beside(r, MAX_OFFSET_RATIO)} its time)",
        status(r <= MAX_OFFSET_RATIO),
    )


# One replay of a variant: its trace, and ``layout``'s and the model's (utilization,
# calls) on it.
Judged = tuple[str, list[float], list[float]]


def judged(
    rows: list[dict[str, Any]], layout: str, expandable: str
) -> tuple[list[Judged], dict[str, int], set[str]]:
    """``layout``'s replays of the variants of every trace in ``rows`` beside
    ``expandable``'s, judged against issue 28's goals: the replays, the number below the
    utilization goal per trace (in the rows' order) and the traces with one more than
    the goal's margin behind the model."""
    cells = [
        (row["trace"], ours, theirs)
        for row in rows
        for ours, theirs in zip(row["cells"][layout], row["cells"][expandable], strict=True)
    ]
    below: dict[str, int] = {}
    for trace, ours, _ in cells:
        if ours[0] < UTILIZATION_GOAL:
            below[trace] = below.get(trace, 0) + 1
    late = {trace for trace, ours, theirs in cells if ours[0] - theirs[0] < -MARGIN_GOAL}
    return cells, below, late


def scaled_variants_row(
    rows: list[dict[str, Any]], layout: str, expandable: str, sizes: str
) -> list[str]:
    """One line of a variants' table: ``layout``'s replays of the variants of every
    trace in ``rows`` (of one scale, named ``sizes`` in the first column), judged against
    issue 28's goals."""
    cells, below, late = judged(rows, layout, expandable)
    utilizations = [ours[0] for _, ours, _ in cells]
    calls = max((ours[1], trace) for trace, ours, _ in cells)
    # The model is the yardstick: its own row names no traces, margin or laggards.
    named, closest, behind = "", "-", "-"
    if layout != expandable:
        named = f" ({', '.join(f'{trace} {n}' for trace, n in below.items()) or 'none'})"
        margin, where = min((ours[0] - theirs[0], trace) for trace, ours, theirs in cells)
        closest = f"{margin:+.3f} ({where})"
        behind = ", ".join(sorted(late)) or "none"
    return [
        sizes,
        f"`{layout}`",
        str(len(cells)),
        f"{mean(utilizations):.3f} / {min(utilizations):.3f}",
        f"{mean(ours[1] for _, ours, _ in cells):.1f} / {calls[0]:.1f} ({calls[1]})",
        f"{sum(below.values())}{named}",
        closest,
        behind,
    ]


def splits_reading(varied: dict[str, Any]) -> str:
    """Per layout of the scaled variants but the model: at which scales some variant is
    more than the goal's margin behind ``torch_expandable`` (and on which traces), and
    how many variants are below the utilization goal at each scale."""
    expandable = varied["layouts"][1]
    parts = []
    for layout in varied["layouts"]:
        if layout == expandable:
            continue
        behind, below = [], []
        for factor in varied["factors"]:
            at = [row for row in varied["rows"] if row["factor"] == factor]
            if not at:
                continue
            _, low, late = judged(at, layout, expandable)
            if late:
                behind.append(f"x{factor} ({', '.join(sorted(late))})")
            below.append(f"{sum(low.values())} at x{factor}")
        where = f"behind at {', '.join(behind)}" if behind else "never behind"
        parts.append(f"`{layout}` {where}; below {UTILIZATION_GOAL:g}: {', '.join(below)}")
    return "; ".join(parts)


class Report:
    """The figures, and the sections of BENCHMARKS.md built from them."""

    def __init__(
        self,
        times: dict[str, dict[str, float]],
        memory: list[dict[str, Any]],
        python: dict[str, Any],
        peers_rss_kib: int | None = None,
        measured: float | None = None,
        *,
        calls: list[dict[str, Any]] | None = None,
        virtual: dict[str, Any] | None = None,
        plan: dict[str, Any] | None = None,
        place: dict[str, Any] | None = None,
        interleaved: list[dict[str, Any]] | None = None,
        cache: dict[str, Any] | None = None,
        books: dict[str, Any] | None = None,
        fit: dict[str, Any] | None = None,
    ) -> None:
        """Keeps the result sets: ``calls`` are the peers bench's storage calls per 100
        reserves, ``virtual`` the JSON of ``virtual_tradeoff.py``, ``plan`` that of
        ``bench_plan.py``, ``interleaved`` the JSONs of ``examples/peer_loops.rs --json``,
        ``cache`` that of ``benches/cache_profile.py``, ``books`` that of
        ``benches/books_split.py``, ``fit`` that of ``benches/python/fit_policies.py`` (a
        section whose results are missing says so)."""
        self.times = times
        self.memory = memory
        self.python = python
        self.peers_rss_kib = peers_rss_kib
        self.measured = time.time() if measured is None else measured
        self.calls = {(row["group"], row["input"]): row for row in calls or []}
        self.virtual = virtual or {}
        self.plan = plan
        self.place = place
        self.interleaved = interleaved or []
        self.cache = cache
        self.books = books
        self.fit = fit

    def calls_cell(self, group: str, input_: str) -> str:
        """Storage calls per 100 reserves of one workload: cubepool / virtual pool /
        CubeCL 0.10 / CubeCL 0.11 (a dash for one not counted)."""
        row = self.calls.get((group, input_))
        if row is None:
            return "-"
        return " / ".join(
            "-" if row.get(peer) is None else f"{row[peer]:.2f}"
            for peer in ("cubepool", "virtual-pool", "cubecl", "cubecl11")
        )

    def traces(self) -> list[str]:
        """The traces of the peers bench's memory table: the bundled ones, then the
        shared ones it found."""
        return [row["trace"] for row in self.memory]

    def ratio_cell(self, peer_id: str, ours_id: str) -> str:
        """The peer's median over ours, or a dash where either was not measured."""
        if not (self.has(peer_id) and self.has(ours_id)):
            return "-"
        return ratio(self.t(peer_id) / self.t(ours_id))

    def has(self, full_id: str) -> bool:
        """Whether this run measured benchmark ``full_id``."""
        return full_id in self.times

    def time_cell(self, full_id: str) -> str:
        """One benchmark's median, or a dash where this run did not measure it."""
        return duration(self.t(full_id)) if self.has(full_id) else "-"

    def t(self, full_id: str) -> float:
        """Median ns per iteration of one benchmark."""
        return self.times[full_id]["median"]

    def fifo(self, peer: str, window: int) -> float:
        """ns per free + reserve in the FIFO window."""
        return self.t(f"peers_fifo_1mib/{peer}/{window}")

    def steady(self, peer: str) -> float:
        """ns per free + reserve in the steady state."""
        return self.t(f"peers_steady_state/{peer}")

    def replay(self, peer: str, trace: str) -> float:
        """ns per replay of a whole trace."""
        return self.t(f"peers_replay/{peer}/{trace}")

    def versus(self, peer_id: str, ours_id: str) -> tuple[float, float, float]:
        """The peer's median over ours, and the widest interval the two medians' 95 %
        confidence intervals allow."""
        peer, ours = self.times[peer_id], self.times[ours_id]
        return peer["median"] / ours["median"], peer["lo"] / ours["hi"], peer["hi"] / ours["lo"]

    def cubecl_ratios(self) -> list[tuple[str, tuple[float, float, float]]]:
        """(workload, CubeCL time / cubepool time with its interval), for every workload
        both run."""
        rows = [
            (
                f"FIFO W={w}",
                self.versus(f"peers_fifo_1mib/cubecl/{w}", f"peers_fifo_1mib/cubepool/{w}"),
            )
            for w in FIFO_WINDOWS
        ]
        rows.append(
            (
                "steady state",
                self.versus("peers_steady_state/cubecl", "peers_steady_state/cubepool"),
            )
        )
        for trace in self.traces():
            for pages, suffix in (("host", ""), ("no bytes", "-virtual")):
                if not (
                    self.has(f"peers_replay/cubecl{suffix}/{trace}")
                    and self.has(f"peers_replay/cubepool{suffix}/{trace}")
                ):
                    continue
                rows.append(
                    (
                        f"replay {trace} ({pages} pages)",
                        self.versus(
                            f"peers_replay/cubecl{suffix}/{trace}",
                            f"peers_replay/cubepool{suffix}/{trace}",
                        ),
                    )
                )
        return rows

    def scanning(self, ours: str) -> list[tuple[str, float]]:
        """CubeCL's time over cubepool variant `ours`'s on the workloads where CubeCL
        scans many pages."""
        rows = [
            (f"FIFO W={w}", self.fifo("cubecl", w) / self.fifo(ours, w))
            for w in FIFO_WINDOWS
            if w >= 400
        ]
        rows.append(("steady state", self.steady("cubecl") / self.steady(ours)))
        return rows

    def targets(self) -> str:
        """The issue's targets, met or missed."""
        ratios = self.cubecl_ratios()
        slower = [(name, r) for name, r in ratios if r[0] < 1]
        if slower:
            never_slower = "; ".join(
                f"{name}: {ratio(r)} (interval {ratio(lo)}-{ratio(hi)}"
                + (", within noise)" if hi >= 1 else ")")
                for name, (r, lo, hi) in slower
            )
        else:
            name, (r, _, _) = min(ratios, key=lambda row: row[1][0])
            never_slower = f"slowest: {name} at {ratio(r)}"
        memory = [
            (row["trace"], row["cubepool_peak_reserved"], row["cubecl_peak_bytes_reserved"])
            for row in self.memory
        ]
        at_4k = next(row for row in self.python["reserve"] if row["n"] == 4096)
        rows = [
            (
                ">= 10x faster than CubeCL where it scans pages (FIFO W=400, W=4000, steady "
                f"state), {variant}",
                ", ".join(f"{name}: {ratio(r)}" for name, r in self.scanning(ours)),
                status(all(r >= 10 for _, r in self.scanning(ours))),
            )
            for variant, ours in VARIANTS
        ]
        rows.append(
            (
                "never slower than CubeCL (all workloads above and the replays)",
                never_slower,
                status(not slower),
            )
        )
        offset = self.steady("offset")
        rows += [
            (
                f"within 2x of offset-allocator on the steady state, {variant}",
                f"cubepool {duration(self.steady(ours))} vs offset-allocator "
                f"{duration(offset)} ({ratio_beside(self.steady(ours) / offset, 2)} its time)",
                status(self.steady(ours) <= 2 * offset),
            )
            for variant, ours in VARIANTS
        ]
        rows += [
            (
                "no more reserved memory than CubeCL on any shared trace",
                ", ".join(
                    f"{name}: {mib(ours)} vs {mib(theirs)} MiB" for name, ours, theirs in memory
                ),
                status(all(ours <= theirs for _, ours, theirs in memory)),
            ),
            (
                "Python reserve + drop no slower than numpy.empty + drop at 4 KiB",
                f"{at_4k['cubepool_ns']:.0f} ns vs {at_4k['numpy_ns']:.0f} ns",
                status(at_4k["cubepool_ns"] <= at_4k["numpy_ns"]),
            ),
        ]
        return table(("target (issue 7)", "measured", "status"), ("---", "---", "---"), rows)

    def latest_targets(self) -> str:
        """Issue 31's targets for the default layout (the virtual pool), each against the
        peer named in its row, measured in the same run."""
        rows = []
        for workload, ours, offset in [
            *(
                (
                    f"FIFO W={w}",
                    f"peers_fifo_1mib/virtual-pool/{w}",
                    f"peers_fifo_1mib/offset/{w}",
                )
                for w in FIFO_WINDOWS
            ),
            ("steady state", "peers_steady_state/virtual-pool", "peers_steady_state/offset"),
        ]:
            if self.has(ours) and self.has(offset):
                rows.append(offset_target(workload, self.t(ours), self.t(offset)))
        rows.extend(self.interleaved_targets())
        for peer, label in (("cubecl11", "CubeCL 0.11"), ("cubecl", "CubeCL 0.10")):
            pairs = [
                (
                    trace,
                    f"peers_replay/{peer}-virtual/{trace}",
                    f"peers_replay/virtual-pool-virtual/{trace}",
                )
                for trace in self.traces()
            ]
            measured = [
                (trace, self.t(theirs) / self.t(ours))
                for trace, theirs, ours in pairs
                if self.has(theirs) and self.has(ours)
            ]
            if measured:
                rows.append(
                    (
                        f"replays (no bytes): the virtual pool never slower than {label}",
                        ", ".join(f"{trace}: {label} {ratio(r)} its time" for trace, r in measured),
                        status(all(r >= 1 for _, r in measured)),
                    )
                )
        for key, label in (
            ("cubecl11_peak_storage", "CubeCL 0.11 (Adaptive, relocation on)"),
            ("cubecl_peak_storage", "CubeCL 0.10 (SubSlices)"),
        ):
            memory = [
                (row["trace"], row["virtual_pool_peak_reserved"], row[key])
                for row in self.memory
                if key in row and "virtual_pool_peak_reserved" in row
            ]
            if memory:
                rows.append(
                    (
                        f"the virtual pool reserves no more than {label} on any trace",
                        ", ".join(
                            f"{name}: {mib(ours)} vs {mib(theirs)} MiB"
                            for name, ours, theirs in memory
                        ),
                        status(all(ours <= theirs for _, ours, theirs in memory)),
                    )
                )
        at_4k = next(row for row in self.python["reserve"] if row["n"] == 4096)
        # The default layout's figure; files written before it was measured have only
        # the SubSlices preset's.
        ours = at_4k.get("default_ns", at_4k["cubepool_ns"])
        rows.append(
            (
                "Python reserve + drop with the default layout at most numpy.empty + drop "
                "at 4 KiB (one process, interleaved)",
                f"{ours:.0f} ns vs {at_4k['numpy_ns']:.0f} ns",
                status(ours <= at_4k["numpy_ns"]),
            )
        )
        return table(
            ("target for the default (issue 31)", "measured against, in this run", "status"),
            ("---", "---", "---"),
            rows,
        )

    def interleaved_targets(self) -> list[tuple[str, str, str]]:
        """The FIFO and steady-state targets again from ``examples/peer_loops.rs``'s
        interleaved rounds (the best round of each peer, the peers in turn), one row per
        result: the loops of the rows above, timed so that a drift of the machine's speed
        between two criterion benchmarks does not move the ratio."""
        rows = []
        for result in self.interleaved:
            best = result["best_ns"]
            if "virtual" not in best or "offset" not in best:
                continue
            workload = {"fifo": "FIFO W=4000", "steady": "steady state"}.get(
                result["workload"], result["workload"]
            )
            storage = "" if result.get("bytes", True) else " on storage without bytes"
            label = (
                f"{workload}{storage}, interleaved (best of {result['rounds']} rounds of "
                f"{result['steps']:,} steps, the peers in turn)"
            )
            rows.append(offset_target(label, best["virtual"], best["offset"]))
        return rows

    def cubecl11_steady_peak(self) -> str:
        """The most bytes CubeCL 0.11's storage held in the steady state, if counted."""
        row = self.calls.get(("peers_steady_state", ""), {})
        peak = row.get("cubecl11_peak_storage")
        return "more than the machine's RAM" if peak is None else f"{peak / 1e9:.1f} GB"

    def reading(self) -> str:
        """Where each peer wins, read off this run's figures: the fastest allocator per
        workload and the one that reserves least per trace."""
        names = {
            "virtual-pool": "the virtual pool",
            "cubepool": "cubepool's sliced pools",
            "cubecl": "CubeCL 0.10",
            "cubecl11": "CubeCL 0.11",
            "offset": "offset-allocator",
            "system": "malloc",
        }
        fastest = []
        for workload, ids in [
            *(
                (f"FIFO W={w}", {p: f"peers_fifo_1mib/{p}/{w}" for p in names})
                for w in FIFO_WINDOWS
            ),
            (
                "the steady state",
                {
                    **{p: f"peers_steady_state/{p}" for p in names},
                    "cubecl11": "peers_steady_state/cubecl11-virtual",
                },
            ),
            *(
                (
                    f"the {trace} replay (no bytes)",
                    {
                        "virtual-pool": f"peers_replay/virtual-pool-virtual/{trace}",
                        "cubepool": f"peers_replay/cubepool-virtual/{trace}",
                        "cubecl": f"peers_replay/cubecl-virtual/{trace}",
                        "cubecl11": f"peers_replay/cubecl11-virtual/{trace}",
                        "offset": f"peers_replay/offset/{trace}",
                    },
                )
                for trace in self.traces()
            ),
        ]:
            timed = {p: self.t(i) for p, i in ids.items() if self.has(i)}
            if timed:
                best = min(timed, key=lambda p: timed[p])
                fastest.append(f"{workload}: {names[best]}")
        memory_keys = {
            "virtual_pool_peak_reserved": "the virtual pool",
            "cubepool_peak_reserved": "cubepool's sliced pools",
            "cubecl_peak_storage": "CubeCL 0.10",
            "cubecl11_peak_storage": "CubeCL 0.11",
            "offset_allocator_peak_span": "offset-allocator (its span)",
        }
        least = []
        for row in self.memory:
            held = {name: row[key] for key, name in memory_keys.items() if key in row}
            best = min(held, key=lambda name: held[name])
            least.append(f"{row['trace']}: {best}")
        if not fastest:
            return "(Not measured in this run: `cargo bench --bench peers`.)"
        relocations = [
            row["cubecl11_relocations"] for row in self.memory if "cubecl11_relocations" in row
        ]
        steady = self.calls.get(("peers_steady_state", ""), {}).get("cubecl11_relocations")
        moved = (
            f" CubeCL 0.11 ran {sum(relocations)} relocations over the traces' replays"
            + ("" if steady is None else f" and {steady} in the steady state")
            + "."
            if relocations
            else ""
        )
        return (
            "Fastest per workload (criterion medians of this run; ratios within about 15 %"
            f" can swap between runs, see Noise): {'; '.join(fastest)}. Least reserved per "
            f"trace: {'; '.join(least)}.{moved} offset-allocator and malloc keep no pages, "
            "handles or statistics and map nothing, so they are the floor for speed; the "
            "peak-memory figures are deterministic and do not depend on the machine."
        )

    def fifo_table(self) -> str:
        """FIFO windows: ratios, then times."""
        rows = []
        for w in FIFO_WINDOWS:
            ours = self.fifo("cubepool", w)
            release = self.fifo("cubepool-release", w)
            slots = self.fifo("cubepool-slots", w)
            peers = [self.fifo(p, w) for p in ("cubecl", "offset", "system")]
            latest = f"peers_fifo_1mib/cubecl11/{w}"
            pool = f"peers_fifo_1mib/virtual-pool/{w}"
            rows.append(
                [
                    str(w),
                    *(ratio(p / ours) for p in peers),
                    self.ratio_cell(latest, pool),
                    self.ratio_cell(f"peers_fifo_1mib/offset/{w}", pool),
                    duration(ours),
                    duration(release),
                    duration(slots),
                    self.time_cell(pool),
                    *(duration(p) for p in peers),
                    self.time_cell(latest),
                    self.calls_cell("peers_fifo_1mib", str(w)),
                ]
            )
        return table(
            (
                "W",
                "CubeCL / cubepool",
                "offset / cubepool",
                "system / cubepool",
                "CubeCL 0.11 / virtual pool",
                "offset / virtual pool",
                "cubepool",
                "cubepool (release)",
                "cubepool (slots)",
                "virtual pool",
                "CubeCL",
                "offset-allocator",
                "malloc/free",
                "CubeCL 0.11",
                "storage calls per 100 steps: cubepool / virtual pool / CubeCL / CubeCL 0.11",
            ),
            ("---:",) * 15,
            rows,
        )

    def steady_table(self) -> str:
        """Steady state: ratios, then times."""
        ours = self.steady("cubepool")
        release = self.steady("cubepool-release")
        slots = self.steady("cubepool-slots")
        peers = [self.steady(p) for p in ("cubecl", "offset", "system")]
        return table(
            (
                "CubeCL / cubepool",
                "offset / cubepool",
                "offset / cubepool (release)",
                "offset / cubepool (slots)",
                "system / cubepool",
                "CubeCL 0.11 (no bytes) / virtual pool",
                "offset / virtual pool",
                "cubepool",
                "cubepool (release)",
                "cubepool (slots)",
                "virtual pool",
                "CubeCL",
                "offset-allocator",
                "malloc/free",
                "CubeCL 0.11 (no bytes)",
                "storage calls per 100 steps: cubepool / virtual pool / CubeCL / CubeCL 0.11",
            ),
            ("---:",) * 16,
            [
                [
                    ratio(peers[0] / ours),
                    ratio(peers[1] / ours),
                    ratio(peers[1] / release),
                    ratio(peers[1] / slots),
                    ratio(peers[2] / ours),
                    self.ratio_cell(
                        "peers_steady_state/cubecl11-virtual", "peers_steady_state/virtual-pool"
                    ),
                    self.ratio_cell("peers_steady_state/offset", "peers_steady_state/virtual-pool"),
                    duration(ours),
                    duration(release),
                    duration(slots),
                    self.time_cell("peers_steady_state/virtual-pool"),
                    *(duration(p) for p in peers),
                    self.time_cell("peers_steady_state/cubecl11-virtual"),
                    self.calls_cell("peers_steady_state", ""),
                ]
            ],
        )

    def cost_table(self, layout: str = "cubepool") -> str:
        """A layout's time per step (``cubepool``: the sliced pools; ``virtual-pool``: the
        default) split by what each way of freeing adds, beside offset-allocator's."""
        rows = []
        windows: list[int | None] = [*FIFO_WINDOWS, None]
        for window in windows:
            group = "peers_steady_state/{}" if window is None else f"peers_fifo_1mib/{{}}/{window}"
            ids = [
                group.format(peer)
                for peer in (f"{layout}-slots", f"{layout}-release", layout, "offset")
            ]
            if not all(self.has(i) for i in ids):
                continue
            slots, release, dropped, offset = (self.t(i) for i in ids)
            rows.append(
                [
                    "steady state" if window is None else f"FIFO W={window}",
                    duration(slots),
                    difference(release - slots),
                    difference(dropped - release),
                    duration(dropped),
                    f"{duration(offset)} ({ratio(dropped / offset)})",
                ]
            )
        if not rows:
            return "(Not measured in this run: `cargo bench --bench peers`.)"
        return table(
            (
                "workload",
                "pools, routing, statistics (slots)",
                "+ handle (release - slots)",
                "+ dropping it (dropped - release)",
                "= dropped handle",
                "offset-allocator (dropped handle / it)",
            ),
            ("---", "---:", "---:", "---:", "---:", "---:"),
            rows,
        )

    def steady_split(self) -> str:
        """The default's steady state on host memory beside the same pool on storage
        without bytes (the peers bench's ``virtual-pool-virtual``, this run): what its
        map and unmap calls cost, and what is left against offset-allocator."""
        ids = (
            "peers_steady_state/virtual-pool",
            "peers_steady_state/virtual-pool-virtual",
            "peers_steady_state/offset",
        )
        calls = self.calls.get(("peers_steady_state", ""), {}).get("virtual-pool")
        if not all(self.has(i) for i in ids) or not calls:
            return "(The steady state's split: not measured in this run.)"
        host, bare, offset = (self.t(i) for i in ids)
        per_call = (host - bare) / (calls / 100)
        return (
            f"The steady state's step on host memory, handles dropped, takes {duration(host)}; "
            f"the same pool on storage without bytes ({duration(bare)}, the same steps in this "
            f"run) places the same blocks and makes the same map and unmap calls ({calls:.2f} "
            "per 100 steps, counted above), which there only update tables. The difference, "
            f"{duration(host - bare)} a step, is the host's share: each unmap is a `madvise` "
            "of host memory and each map of a run not mapped before an `mprotect` (a run "
            "lying wholly in runs mapped before is writable still and costs no call), about "
            f"{duration(per_call)} a storage call on average (until stop 63 an unmap made "
            "the run inaccessible too and every map made it writable again, two more calls "
            "that split the host's mapping of the range and merged it back: about 130 ns a "
            "step more). "
            "offset-allocator maps nothing: on storage without "
            f"bytes the default's step is {bare / offset:.1f}x offset-allocator's "
            f"{duration(offset)} (the granule books, the arena's coalescing and the storage's "
            "books above), and on host memory the calls add the rest. The calls come from "
            "mapping only the granules live blocks touch (issue 28: the peak of mapped bytes "
            "is eager unmapping's); with them, and with the books the default keeps beside "
            "its placement, the 1.25x target is out of reach for this workload."
        )

    def cache_section(self) -> str:
        """Per-step instructions, data accesses and simulated cache misses of the
        targets' loops (``benches/cache_profile.py``), and what they say about the
        default's gap in time to offset-allocator."""
        if not self.cache or not self.cache.get("rows"):
            return (
                "(Per-step cache events: not measured in this run; "
                "`benches/cache_profile.py` needs valgrind.)"
            )
        cache = self.cache
        first_kib = cache["first_level_bytes"] // 1024
        second_kib = cache["second_level_bytes"] // 1024
        window, live = cache["fifo_window"], cache["steady_live"]
        rows = {(row["workload"], row["peer"]): row["per_step"] for row in cache["rows"]}
        workloads = {"fifo": f"FIFO W={window:,}", "steady": "steady state, storage without bytes"}
        body = [
            [
                workloads.get(workload, workload),
                PROFILED_NAMES.get(peer, peer),
                f"{step['Ir']:,.0f}",
                f"{step['Dr']:,.0f}",
                f"{step['Dw']:,.0f}",
                per_step_count(step["D1mr"]),
                per_step_count(step["D1mw"]),
                per_step_count(second_misses(step)),
            ]
            for (workload, peer), step in rows.items()
        ]
        header = ["workload", "peer", "instructions", "data reads", "data writes"]
        header += ["first-level read misses", "first-level write misses"]
        header += ["second-level misses"]
        text = table(header, ["---", "---", *["---:"] * 6], body)
        reading = []
        places = places_table(cache["rows"], workloads)
        where = (
            "\n\nWhere the misses are: the places of each loop's step with the most "
            "first-level misses (reads and writes), the function a load ran in and its "
            "source file (inlined code counts to its own file: the loops' build has line "
            f"tables).\n\n{places}"
            if places
            else ""
        )
        offset, slots, released, dropped = (rows.get(("fifo", p)) for p in PROFILED)
        if offset and slots and released and dropped:
            reading.append(
                f"Per FIFO step the default with handles dropped runs {dropped['Ir']:,.0f} "
                f"instructions against offset-allocator's {offset['Ir']:,.0f} "
                f"({dropped['Ir'] / offset['Ir']:.2f}x), but makes {accesses(dropped):,.0f} "
                f"data accesses against {accesses(offset):,.0f} and misses the first-level "
                f"data cache {misses(dropped):.2f} times (reads and writes) against "
                f"{misses(offset):.2f}. Without handles (slots) it runs {slots['Ir']:,.0f} "
                f"instructions ({slots['Ir'] / offset['Ir']:.2f}x) with "
                f"{accesses(slots):,.0f} data accesses and {misses(slots):.2f} misses. The "
                f"handle's descriptor (`mm.release` over slots; the loop keeps {window:,} "
                "live handles, each with its descriptor) adds "
                f"{misses(released) - misses(slots):.2f} misses a step and dropping the "
                f"handle (over `mm.release`) {misses(dropped) - misses(released):.2f}."
            )
        offset, _, _, dropped = (rows.get(("steady", p)) for p in PROFILED)
        if offset and dropped:
            reading.append(
                f"Per steady-state step ({live:,} live blocks) the default runs "
                f"{dropped['Ir']:,.0f} instructions against {offset['Ir']:,.0f}, "
                f"{accesses(dropped):,.0f} data accesses against {accesses(offset):,.0f} and "
                f"{misses(dropped):.1f} first-level misses against {misses(offset):.1f}, of "
                f"which {second_misses(dropped):.2f} against {second_misses(offset):.2f} miss "
                "the second level too: the books offset-allocator does not keep (the "
                "arena's segments, the granule table and chunks, the storage's runs). On "
                "host memory, counted above, the step runs a few instructions more (the host "
                "storage's own books)."
            )
        # The place with the most misses of each loop, where its row names places.
        tops = {
            (row["workload"], row["peer"]): row["places"][0]
            for row in cache["rows"]
            if row.get("places")
        }
        slots_top, offset_top = tops.get(("fifo", "virtual-slots")), tops.get(("fifo", "offset"))
        if slots_top and offset_top:
            reading.append(
                "Where (the table below): the FIFO step without handles misses most at "
                f"`{slots_top['file']}` ({slots_top['misses']:.2f} a step), offset-allocator's "
                f"at `{offset_top['file']}` ({offset_top['misses']:.2f}). Each step brings one "
                "cold entry of per-block books into the cache, that of the block the loop "
                "frees next, read as the next neighbour of the block just freed (the "
                "arena's segment, offset-allocator's node): the arena's `Segment` is 40 bytes "
                "(48 before the ninth round above, 0.75 of a line), 0.63 of a 64-byte line, "
                "and offset-allocator's node 28 bytes, 0.44 (six "
                "4-byte fields and a flag, offset-allocator 0.2.0), and the loop's queue "
                "holds 12-byte `Location`s against 8-byte `Allocation`s (0.19 and 0.13 of a "
                "line a step). Those sizes, not extra work, are the FIFO's gap in misses "
                "without handles; `arena.rs`' tests check them."
            )
        dropped_top = tops.get(("fifo", "virtual"))
        if dropped_top:
            reading.append(
                "With handles dropped the place with the most misses is "
                f"`{dropped_top['function']}` in `{dropped_top['file']}` "
                f"({dropped_top['misses']:.2f} a step): dropping a handle counts its user "
                "off the handle's descriptor, which is a 64-byte line of its own (aligned "
                "so that threads dropping handles never share a line; `handle.rs`' tests "
                f"check its size), cold in a loop that holds {window:,} of them."
            )
        reading.append(
            "A first-level miss that hits the second level costs about a dozen cycles, one "
            "that misses it too several times that, unless the processor runs on past it; "
            "how much of the gap in time these misses make is not measured: cachegrind "
            "counts what a step touches, it does not time it."
        )
        return (
            "Where the rest of the time goes: counts per step from cachegrind "
            f"({cache['tool']}; simulated {first_kib} KiB first-level and "
            f"{second_kib:,} KiB second-level caches, 8-way, 64-byte lines), the difference "
            "of two runs of `examples/peer_loops.rs` over the difference of their steps "
            f"(`python benches/cache_profile.py`).\n\n{text}\n\n" + " ".join(reading) + where
        )

    def books_section(self) -> str:
        """The default's loops timed with its books removed (``benches/books_split.py``):
        what each part of the books costs a step, in ns, beside offset-allocator's step
        timed in the same process."""
        if not self.books or not self.books.get("variants"):
            return (
                "(The books' cost in ns: not measured in this run; "
                "`benches/books_split.py` builds and times the loops without them.)"
            )
        books = self.books
        variants = books["variants"]
        # books_split.py's builds in its order: as built first, without all three last.
        built, bare = variants[0]["best_ns"], variants[-1]["best_ns"]
        workloads = {"fifo": "FIFO W=4,000", "steady": "steady state"}
        body = []
        for workload, label in workloads.items():
            for variant in variants:
                ns = variant["best_ns"][workload]
                saved = built[workload]["virtual"] - ns["virtual"]
                body.append(
                    [
                        label,
                        variant["name"],
                        duration(ns["offset"]),
                        duration(ns["virtual"]),
                        duration(ns["virtual-release"]),
                        duration(ns["virtual-slots"]),
                        f"{ns['virtual'] / ns['offset']:.2f}x",
                        "-" if variant is variants[0] else difference(saved),
                    ]
                )
        header = ["workload", "build", "offset-allocator", "handles dropped", "`mm.release`"]
        header += ["slots", "handles dropped / offset-allocator", "handles dropped: saved"]
        text = table(header, ["---", "---", *["---:"] * 6], body)
        parts = "; ".join(f"**{name}**: {what}" for name, what in books["parts"].items())
        by_name = {variant["name"]: variant["best_ns"] for variant in variants}
        reading = []
        if len(variants) > 1:
            fifo, steady = built["fifo"], built["steady"]
            fifo_bare, steady_bare = bare["fifo"], bare["steady"]
            singles = [
                f"{variant['name'].removeprefix('without ')} "
                f"{difference(fifo['virtual'] - variant['best_ns']['fifo']['virtual'])}"
                for variant in variants[1:-1]
            ]
            reading.append(
                f"Without the three, the FIFO step with handles dropped takes "
                f"{duration(fifo_bare['virtual'])} against offset-allocator's "
                f"{duration(fifo_bare['offset'])} "
                f"({fifo_bare['virtual'] / fifo_bare['offset']:.2f}x; as built "
                f"{fifo['virtual'] / fifo['offset']:.2f}x), and without handles "
                f"{duration(fifo_bare['virtual-slots'])} "
                f"({fifo_bare['virtual-slots'] / fifo_bare['offset']:.2f}x): the placement, "
                "routing and handles alone are "
                + (
                    "within the 1.25x target, and the books are the FIFO's gap. "
                    if fifo_bare["virtual"] <= 1.25 * fifo_bare["offset"]
                    else "still over the 1.25x target. "
                )
                + f"Together they cost {difference(fifo['virtual'] - fifo_bare['virtual'])} "
                f"a step, one at a time {', '.join(singles)}. The noise in each "
                "difference: " + noise(variants, books["reps"]) + "."
            )
            granules = by_name["without granule books"]["steady"]
            reading.append(
                f"In the steady state the granule books and their map and unmap calls cost "
                f"{difference(steady['virtual'] - granules['virtual'])} "
                f"of {duration(steady['virtual'])}; without all three the step takes "
                f"{duration(steady_bare['virtual'])} against "
                f"{duration(steady_bare['offset'])} "
                f"({steady_bare['virtual'] / steady_bare['offset']:.2f}x; without handles "
                f"{steady_bare['virtual-slots'] / steady_bare['offset']:.2f}x): the rest is "
                "the placement (the arena's best fit and its coalescing) and the handles "
                f"({difference(steady_bare['virtual'] - steady_bare['virtual-slots'])} of "
                "the step, dropped over slots, their descriptors cold among 10,000 live)."
            )
        return (
            "What the books cost in time: `examples/peer_loops.rs` built as it is and "
            "without each part of the books the default keeps beside its placement "
            f"({parts}), each build's loops on storage without bytes with the peers "
            f"interleaved, every build in turn, {books['reps']} times, the best of "
            f"{books['rounds']} rounds each (`python benches/books_split.py`). Throwaway "
            "builds, not configurations: without the granule books nothing is mapped.\n\n"
            f"{text}\n\n" + " ".join(reading)
        )

    def fit_section(self) -> str:
        """Other online placements beside the default's under eager unmapping
        (``benches/python/fit_policies.py``): the traces as captured, the summary over
        every replay, and a reading generated from them."""
        heading = "## Other placements under eager unmapping\n\n"
        if not self.fit or not self.fit.get("rows"):
            return heading + (
                "(Not measured in this run; `benches/python/fit_policies.py` replays the "
                "traces through other placement rules.)\n"
            )
        fit = self.fit
        policies = fit["policies"]
        captured = [row for row in fit["rows"] if row["variant"] == 0]
        per_trace = table(
            ["trace", *(f"`{policy}`" for policy in policies)],
            ["---", *["---:"] * len(policies)],
            ([row["trace"], *(f"{row[policy]:.3f}" for policy in policies)] for row in captured),
        )
        summary = table(
            ["rule", "mean", "lowest", "below 0.95", "above the default", "below the default"],
            ["---", *["---:"] * 5],
            (
                [
                    f"`{s['policy']}`",
                    f"{s['mean']:.4f}",
                    f"{s['lowest']:.3f}",
                    str(s["below_095"]),
                    str(s["above_default"]),
                    str(s["below_default"]),
                ]
                for s in fit["summary"]
            ),
        )
        by_policy = {s["policy"]: s for s in fit["summary"]}
        default = by_policy["default"]
        others = [s for s in fit["summary"] if s["policy"] != "default"]
        better = [s["policy"] for s in others if s["mean"] > default["mean"] + 5e-4]
        raises_low = [s["policy"] for s in others if s["lowest"] > default["lowest"] + 5e-4]
        replays = len(fit["rows"])
        if better or raises_low:
            verdict = (
                f"Better than the default here: {', '.join(f'`{p}`' for p in better) or 'none'} "
                f"on the mean, {', '.join(f'`{p}`' for p in raises_low) or 'none'} on the "
                "lowest."
            )
        else:
            verdict = (
                "No rule here beats the default on the mean or raises its lowest: each wins "
                "on some replays and loses on others. So which of these rules places the "
                "blocks does not decide what keeps a trace below 0.95; what they all lack is "
                "when each block and its neighbours will be freed, which the plan for the "
                "next run takes from a recorded step (the Plans section below)."
            )
        worst = min(captured, key=lambda row: row["default"])
        return (
            heading + "The default's utilization is its eager-unmap limit's, so what is left "
            "below 1.0 is where its placement put the blocks. Each trace and "
            f"{fit['variants']} variants of it (every distinct size times its own factor in "
            "[0.85, 1.15]) replayed through a model of the virtual pool (two ranges split at "
            "16 MiB, 64-byte extents, 2 MiB granules mapped while a live block touches them, "
            "each block at the start of the free run its rule picks) under other rules "
            "that know no more of the future than the default: `best` (the smallest free "
            "run that fits; the default's arena approximates it with size classes), "
            "`first` (the lowest free run that fits) and `fewest-granules` (the free run "
            "where the block maps the fewest new granules, then best fit); `default` is "
            "`cubepool.replay` of the eager-unmap limit (`python "
            "benches/python/fit_policies.py`).\n\n"
            f"{per_trace}\n\nOver {replays} replays:\n\n{summary}\n\n"
            f"{verdict} The lowest as captured: {worst['trace']}, "
            + ", ".join(f"`{policy}` {worst[policy]:.3f}" for policy in policies)
            + ".\n"
        )

    def per_replay(self, peer: str, trace: str, events: int) -> str:
        """The time of one replay, and per event; a dash where it was not measured."""
        if not self.has(f"peers_replay/{peer}/{trace}"):
            return "-"
        ns = self.replay(peer, trace)
        return f"{duration(ns)} ({ns / events:.0f} ns/event)"

    def replay_table(self) -> str:
        """Replays: ratios, then times per replay and per event."""
        rows = []
        for trace in self.traces():
            events = next(row["events"] for row in self.memory if row["trace"] == trace)
            if not self.has(f"peers_replay/cubepool/{trace}"):
                continue
            ours = self.replay("cubepool", trace)
            ours_virtual = self.replay("cubepool-virtual", trace)
            rows.append(
                [
                    trace,
                    f"{events:,}",
                    ratio(self.replay("cubecl", trace) / ours),
                    ratio(self.replay("cubecl-virtual", trace) / ours_virtual),
                    ratio(self.replay("offset", trace) / ours),
                    ratio(self.replay("system", trace) / ours),
                    self.ratio_cell(
                        f"peers_replay/cubecl11-virtual/{trace}",
                        f"peers_replay/virtual-pool-virtual/{trace}",
                    ),
                    *(
                        self.per_replay(p, trace, events)
                        for p in (
                            "cubepool",
                            "virtual-pool",
                            "cubecl",
                            "cubecl11",
                            "cubepool-virtual",
                            "virtual-pool-virtual",
                            "cubecl-virtual",
                            "cubecl11-virtual",
                            "offset",
                            "system",
                        )
                    ),
                    self.calls_cell("peers_replay", trace),
                ]
            )
        return table(
            (
                "trace",
                "events",
                "CubeCL / cubepool",
                "CubeCL / cubepool (no bytes)",
                "offset / cubepool",
                "system / cubepool",
                "CubeCL 0.11 / virtual pool (no bytes)",
                "cubepool",
                "virtual pool",
                "CubeCL",
                "CubeCL 0.11",
                "cubepool (no bytes)",
                "virtual pool (no bytes)",
                "CubeCL (no bytes)",
                "CubeCL 0.11 (no bytes)",
                "offset-allocator",
                "malloc/free",
                "storage calls per 100 allocations: cubepool / virtual pool / CubeCL / CubeCL 0.11",
            ),
            ("---", "---:") + ("---:",) * 16,
            rows,
        )

    def memory_table(self) -> str:
        """Peak bytes reserved per trace."""
        rows = []
        for row in self.memory:
            live = row["peak_live"]
            ours = row["cubepool_peak_reserved"]
            theirs = row["cubecl_peak_bytes_reserved"]
            rows.append(
                [
                    row["trace"],
                    ratio(ours / theirs),
                    f"{live / ours:.1%}",
                    f"{live / theirs:.1%}",
                    mib(live),
                    mib(ours),
                    mib(theirs),
                    mib(row["cubecl_peak_storage"]),
                    mib(row["offset_allocator_peak_span"]),
                    *(
                        f"{mib(row[key])} ({live / row[key]:.1%})" if key in row else "-"
                        for key in (
                            "virtual_pool_peak_reserved",
                            "cubecl11_peak_storage",
                            "torch_peak_reserved",
                            "torch_expandable_peak_reserved",
                        )
                    ),
                    str(row.get("cubecl11_relocations", "-")),
                ]
            )
        return table(
            (
                "trace",
                "cubepool / CubeCL reserved",
                "cubepool utilization",
                "CubeCL utilization",
                "peak live (MiB)",
                "cubepool peak reserved",
                "CubeCL peak bytes_reserved",
                "CubeCL peak storage",
                "offset-allocator span",
                "virtual pool (the default) peak reserved (utilization)",
                "CubeCL 0.11 (Adaptive) peak storage (utilization)",
                "torch (model) peak reserved (utilization)",
                "torch_expandable (model) peak reserved (utilization)",
                "CubeCL 0.11 relocations",
            ),
            ("---",) + ("---:",) * 13,
            rows,
        )

    def missing(self, part: str, command: str) -> str | None:
        """A note in place of a section of ``virtual_tradeoff.py`` whose results this run
        lacks, else None."""
        if part not in self.virtual:
            return f"(Not measured in this run: `{command}`.)"
        return None

    def traces_note(self) -> str:
        """Which shared traces the virtual pool's sections cover."""
        if not self.virtual:
            return ""
        traces = ", ".join(self.virtual.get("traces", []))
        missing = self.virtual.get("missing", [])
        note = f"Traces: {traces}"
        if missing:
            note += f" ({', '.join(missing)} not found: they are read from `--traces`)"
        return note + "."

    def default_targets(self) -> str:
        """Issue 17's bars for the default layout, met or missed."""
        rows = []
        if "memory" in self.virtual:
            default = self.virtual["default"]
            cells = {row["trace"]: row["cells"][default] for row in self.virtual["memory"]["rows"]}
            for bar in sorted(set(UTILIZATION_BARS.values()), reverse=True):
                names = [name for name, at in UTILIZATION_BARS.items() if at == bar]
                measured = [(name, cells[name][0]) for name in names if name in cells]
                absent = [name for name in names if name not in cells]
                rows.append(
                    (
                        f"utilization >= {bar} on {', '.join(names)}",
                        ", ".join(
                            f"{name}: {beside_bar(u, bar, 3, at_most=False)}"
                            for name, u in measured
                        )
                        + (f"; not measured: {', '.join(absent)}" if absent else ""),
                        # One named trace below the bar misses it; met needs them all.
                        status(False)
                        if any(u < bar for _, u in measured)
                        else "-"
                        if absent
                        else status(True),
                    )
                )
            rows.append(
                (
                    f"at most {MAX_CALLS_PER_100:g} map + unmap calls per 100 allocations "
                    "on each shared trace",
                    ", ".join(
                        f"{name}: {beside_bar(cell[1], MAX_CALLS_PER_100, 1, at_most=True)}"
                        for name, cell in cells.items()
                    ),
                    status(all(cell[1] <= MAX_CALLS_PER_100 for cell in cells.values())),
                )
            )
        if "timing" in self.virtual:
            timing = self.virtual["timing"]
            ratios = [(row["trace"], replay_ratio(row)) for row in timing["rows"]]
            rows.append(
                (
                    f"replay ns/event within {MAX_REPLAY_RATIO}x of "
                    f"{self.virtual['previous']}'s (best of {timing['repeats']})",
                    ", ".join(
                        f"{name}: {beside_bar(r, MAX_REPLAY_RATIO, 2, at_most=True)}x"
                        for name, r in ratios
                    ),
                    status(all(r <= MAX_REPLAY_RATIO for _, r in ratios)),
                )
            )
        if "scaled_timing" in self.virtual and any(
            row["factor"] > 1 for row in self.virtual["scaled_timing"]["rows"]
        ):
            scaled = self.virtual["scaled_timing"]
            over = [row for row in scaled["rows"] if row["factor"] > 1]
            worst = sorted(over, key=replay_ratio)[-3:]
            within = sum(replay_ratio(row) <= MAX_REPLAY_RATIO for row in over)
            factors = ", ".join(f"x{factor}" for factor in scaled["factors"] if factor > 1)
            rows.append(
                (
                    f"the same with every trace's sizes scaled up ({factors}; best of "
                    f"{scaled['repeats']})",
                    f"{within} of {len(over)} within; highest "
                    + ", ".join(
                        f"{row['trace']} x{row['factor']}: "
                        f"{beside_bar(replay_ratio(row), MAX_REPLAY_RATIO, 2, at_most=True)}x"
                        for row in reversed(worst)
                    ),
                    status(within == len(over)),
                )
            )
        if self.plan is not None:
            long = [row for row in self.plan["synthetic"] if row["events"] == PLAN_EVENTS]
            if not long:
                rows.append(
                    (
                        f"`cubepool.plan` of a synthetic trace of {PLAN_EVENTS:,} events "
                        f"under {MAX_PLAN_SECONDS:g} s",
                        "not measured in this run",
                        "-",
                    )
                )
            else:
                seconds = long[0]["plan_s"]
                rows.append(
                    (
                        f"`cubepool.plan` of a synthetic trace of {PLAN_EVENTS:,} events "
                        f"under {MAX_PLAN_SECONDS:g} s",
                        f"{seconds:.1f} s (CPU {long[0]['plan_cpu_s']:.1f} s, load average "
                        f"{long[0]['load_average']:.1f}; trace load {long[0]['load_s']:.1f} s, "
                        f"peak RSS {long[0]['peak_rss_mib']:.0f} MiB)",
                        status(seconds < MAX_PLAN_SECONDS),
                    )
                )
        if not rows:
            return "(Not measured in this run: `benches/python/virtual_tradeoff.py`.)"
        return table(("target (issue 17)", "measured", "status"), ("---", "---", "---"), rows)

    def layouts_table(self) -> str:
        """Each shared trace's utilization and storage calls per 100 allocations under
        every preset, the models of PyTorch's allocator and a plan."""
        note = self.missing("memory", "virtual_tradeoff.py --memory")
        if note:
            return note
        memory = self.virtual["memory"]
        default, previous = self.virtual["default"], self.virtual["previous"]

        def label(layout: str) -> str:
            if layout == default:
                return f"{layout} (the default)"
            if layout == previous:
                return f"{layout} (the default before)"
            if layout.startswith("torch"):
                return f"{layout} (model)"
            return layout

        rows = [
            [row["trace"], *(figures(row["cells"][layout]) for layout in memory["layouts"])]
            for row in memory["rows"]
        ]
        plans = "\n".join(f"- {row['trace']}: {row['planned_layout']}" for row in memory["rows"])
        return "\n\n".join(
            [
                table(
                    ("trace", *(label(layout) for layout in memory["layouts"])),
                    ("---",) + ("---:",) * len(memory["layouts"]),
                    rows,
                ),
                "`planned` is `cubepool.plan(trace)`'s layout:\n\n" + plans,
            ]
        )

    def beside_table(self) -> str:
        """The default beside the models of PyTorch's allocator and its eager-unmap limit
        on every trace, chosen-on or held-out (issue 28)."""
        note = self.missing("beside", "virtual_tradeoff.py --beside")
        if note:
            return note
        beside = self.virtual["beside"]
        layouts = beside["layouts"]
        rows = [
            [row["trace"], row["role"], *(figures(row["cells"][layout]) for layout in layouts)]
            for row in beside["rows"]
        ]
        return table(
            ("trace", "role", *(f"`{layout}`" for layout in layouts)),
            ("---", "---") + ("---:",) * len(layouts),
            rows,
        )

    def fewer_calls_part(self) -> str:
        """What a lower figure of storage calls would cost on the traces where the
        default makes more than the bar's calls per 100 allocations (the bar is on the
        shared traces): the default beside settings with fewer calls (issue 28)."""
        note = self.missing("fewer_calls", "virtual_tradeoff.py --fewer-calls")
        if note:
            return note
        fewer = self.virtual["fewer_calls"]
        default, *others = fewer["layouts"]
        over = []
        for row in fewer["rows"]:
            utilization, calls = row["cells"][default]
            if calls <= MAX_CALLS_PER_100:
                continue
            costs = "; ".join(
                f"`{layout}` {row['cells'][layout][1]:.1f} at {row['cells'][layout][0]:.3f} "
                f"({row['cells'][layout][0] - utilization:+.3f})"
                for layout in others
            )
            over.append(f"- {row['trace']}: {calls:.1f} calls at {utilization:.3f}; {costs}.")
        listed = "\n".join(over) if over else "- none"
        # A setting that beats the default everywhere: no less utilization and no more
        # calls on every trace.
        winners = [
            layout
            for layout in others
            if all(
                row["cells"][layout][0] >= row["cells"][default][0]
                and row["cells"][layout][1] <= row["cells"][default][1]
                for row in fewer["rows"]
            )
        ]
        verdict = (
            "No setting here has the default's utilization and no more calls on every "
            "trace, so the default's policy is unchanged."
            if not winners
            else "At or above the default's utilization with no more calls on every trace: "
            + ", ".join(f"`{layout}`" for layout in winners)
            + " (not adopted without the check on the perturbed copies)."
        )
        grid = table(
            ("trace", *(f"`{layout}`" for layout in fewer["layouts"])),
            ("---",) + ("---:",) * len(fewer["layouts"]),
            [
                [row["trace"], *(figures(row["cells"][layout]) for layout in fewer["layouts"])]
                for row in fewer["rows"]
            ],
        )
        return f"""What fewer storage calls would cost (`virtual_tradeoff.py --fewer-calls`). The
default keeps an idle chunk only while the mapped bytes stay under the eager limit's
peak, so a lower figure needs coarser granules (fewer, larger chunks, more bytes lost
to rounding) or a peak above eager unmapping's. On each trace where the default makes
more than {MAX_CALLS_PER_100:g} calls per 100 allocations (the bar is on the shared traces),
the calls and utilization of each other setting (change in utilization):

{listed}

{verdict}

{grid}"""

    def beside_section(self) -> str:
        """The section of :meth:`beside_table`, from its heading on."""
        return f"""{BESIDE_HEADING}

The default beside the models of PyTorch's caching allocator (`torch`,
`torch_expandable`) and its eager-unmap limit (`keep=0` with the default's size split),
on the shared traces and on the ones captured by `scripts/capture_traces.py`
(`benches/traces`); utilization / map + unmap calls per 100 allocations. `chosen-on`:
the traces the default's setting was chosen on; `held-out`: the rest
(`virtual_tradeoff.py --beside`). The default's two later rules (issue 28) were
judged on every trace here but those marked `held-out (all)` (captured after every
choice, nothing chosen on them): an idle chunk is taken
back only when it holds nothing but granules the block touches (so the default's
peak of mapped bytes is the eager limit's on every trace, by construction, not by
choice), and requests over 16 MiB get a range of their own (`small=16MiB`, the one
constant, chosen for storage calls: the utilization of every trace it was judged on is
the same with `small=0`; on the `held-out (all)` ones it is not always, see
`benches/traces/README.md`). A third rule was chosen on variants of calibrate-layers
and checked on the variants of every other trace (the last table below): a request
negligible against the free segments it must split (under 1/256 of each) takes the one
freed longest ago, sparing the hole freed last for the tensor of its size that comes
back; as recorded, it changes no trace's utilization nor the default's storage calls.
A fourth was found on ssm-train (marked `held-out`; sizes varied and multiplied 4 to 128
times, it fell up to 0.089 below `torch_expandable`) and checked on every other trace: a
request that must split a larger class takes, of its first four members, one no larger
than what splitting the first would leave (the smallest such) instead of the first,
sparing the hole freed whole; as captured it moved one utilization of the traces held
before (the wider seq2seq-train's, 0.982 to 0.978) and none of the shared traces' storage
calls (`benches/traces/README.md`).

{self.beside_table()}

{self.fewer_calls_part()}

{self.scaled_up_part()}

{self.variants_part()}

{self.scaled_variants_part()}

{self.wider_part()}
"""

    def scaled_up_part(self) -> str:
        """The default beside the models of PyTorch's allocator on every trace with its
        sizes multiplied (``virtual_tradeoff.py --scaled-up``): the captured runs at the
        scale of GPU runs, with how far the default is from each bar of issue 28."""
        note = self.missing("scaled_up", "virtual_tradeoff.py --scaled-up")
        if note:
            return note
        scaled = self.virtual["scaled_up"]
        default, expandable, *_ = scaled["layouts"]
        rows = [
            [
                row["trace"],
                f"x{row['factor']}",
                *(figures(row["cells"][layout]) for layout in scaled["layouts"]),
            ]
            for row in scaled["rows"]
        ]
        lowest = min(scaled["rows"], key=lambda row: row["cells"][default][0])
        margin = min(
            scaled["rows"],
            key=lambda row: row["cells"][default][0] - row["cells"][expandable][0],
        )
        ours, theirs = margin["cells"][default][0], margin["cells"][expandable][0]
        busiest = max(scaled["rows"], key=lambda row: row["cells"][default][1])
        most_expandable = max(row["cells"][expandable][1] for row in scaled["rows"])
        factors = ", ".join(f"x{factor}" for factor in scaled["factors"])
        heads = ("trace", "sizes", *(f"`{layout}`" for layout in scaled["layouts"]))
        return f"""The same traces with every size multiplied ({factors}; `virtual_tradeoff.py
--scaled-up`): the captured CPU runs at the scale of GPU runs, where most tensors span
many granules. Nothing was chosen on these. Lowest utilization of the default:
{lowest["cells"][default][0]:.3f} ({lowest["trace"]} x{lowest["factor"]}). Its smallest margin over
`{expandable}`: {ours - theirs:+.4f} ({margin["trace"]} x{margin["factor"]}, {ours:.4f} against
{theirs:.4f}). Storage calls grow with the scale: up to {busiest["cells"][default][1]:.1f} per
100 allocations ({busiest["trace"]} x{busiest["factor"]}) against at most
{most_expandable:.1f} for `{expandable}`: the default keeps idle granules mapped only under
the eager limit's peak, so where tensors change size or place from step to step most new
granules are mapped as others are unmapped. Coarser granules, what fewer calls would cost
at that scale: {self.scaled_costs()}.

{table(heads, ("---", "---:") + ("---:",) * len(scaled["layouts"]), rows)}"""

    def variants_part(self) -> str:
        """The default beside ``torch_expandable`` (model) and one range for all sizes on
        variants of every trace (``virtual_tradeoff.py --variants K``): issue 28's goals
        on the same programs with other tensor shapes, not on one draw of their sizes."""
        note = self.missing("variants", "virtual_tradeoff.py --variants K")
        if note:
            return note
        varied = self.virtual["variants"]
        default, expandable, *_ = varied["layouts"]
        count, spread = varied["count"], varied["spread"]

        def utilizations(row: dict[str, Any], layout: str) -> list[float]:
            return [cell[0] for cell in row["cells"][layout]]

        def margins(row: dict[str, Any]) -> list[float]:
            pairs = zip(utilizations(row, default), utilizations(row, expandable), strict=True)
            return [ours - theirs for ours, theirs in pairs]

        rows = []
        for row in varied["rows"]:
            cells = [
                f"{mean(utilizations(row, layout)):.3f} / {min(utilizations(row, layout)):.3f}"
                for layout in varied["layouts"]
            ]
            below = sum(u < UTILIZATION_GOAL for u in utilizations(row, default))
            rows.append([row["trace"], *cells, f"{min(margins(row)):+.3f}", str(below)])
        closest = min(varied["rows"], key=lambda row: min(margins(row)))
        lowest = min(varied["rows"], key=lambda row: mean(utilizations(row, default)))
        below_goal = [
            row["trace"]
            for row in varied["rows"]
            if mean(utilizations(row, default)) < UTILIZATION_GOAL
        ]
        behind = [row["trace"] for row in varied["rows"] if min(margins(row)) < -MARGIN_GOAL]
        varied_count = sum(
            any(u < UTILIZATION_GOAL for u in utilizations(row, default)) for row in varied["rows"]
        )
        every = mean(mean(utilizations(row, default)) for row in varied["rows"])
        below_text = ", ".join(below_goal) or "none"
        heads = (
            "trace",
            *(f"`{layout}` mean / lowest" for layout in varied["layouts"]),
            f"smallest margin over `{expandable}`",
            f"variants below {UTILIZATION_GOAL:g}",
        )
        return f"""{count} variants of each trace (`virtual_tradeoff.py --variants {count}`): every
distinct size times its own factor in [{1 - spread:g}, {1 + spread:g}], the same programs with
other tensor shapes. On traces of a few hundred MiB one 2 MiB granule moves utilization
by up to 0.02, so where blocks fall against granule boundaries, which a variant
changes, decides a single trace's figure; issue 28's goals are checked here on every
variant. The default's mean over all traces' variants: {every:.4f}. Lowest mean:
{mean(utilizations(lowest, default)):.3f} ({lowest["trace"]}); mean below {UTILIZATION_GOAL:g} on
{len(below_goal)} of {len(varied["rows"])} traces ({below_text}), and some variant
below it on {varied_count}. Smallest margin over `{expandable}` on any variant:
{min(margins(closest)):+.3f} ({closest["trace"]}); more than {MARGIN_GOAL:g} below it on
{", ".join(behind) or "no trace"}.

{table(heads, ("---",) + ("---:",) * (len(varied["layouts"]) + 2), rows)}"""

    def scaled_variants_part(self) -> str:
        """Issue 28's goals on variants of every trace, as captured and scaled up first
        (``virtual_tradeoff.py --scaled-variants K``): per factor and layout, the mean
        and lowest utilization, the storage calls, the variants below the goal (and on
        which traces), the smallest margin over ``torch_expandable`` and the traces more
        than the goal's 0.005 behind it."""
        note = self.missing("scaled_variants", "virtual_tradeoff.py --scaled-variants K")
        if note:
            return note
        varied = self.virtual["scaled_variants"]
        expandable = varied["layouts"][1]
        count, spread = varied["count"], varied["spread"]
        rows = []
        for factor in varied["factors"]:
            at = [row for row in varied["rows"] if row["factor"] == factor]
            for layout in varied["layouts"] if at else []:
                rows.append(scaled_variants_row(at, layout, expandable, f"x{factor}"))
        if not rows:
            return "(No scaled-up variant in this run.)"
        heads = (
            "sizes",
            "layout",
            "variants",
            "mean / lowest",
            "calls per 100 allocations, mean / highest",
            f"variants below {UTILIZATION_GOAL:g} (per trace)",
            f"smallest margin over `{expandable}`",
            f"more than {MARGIN_GOAL:g} below it",
        )
        return f"""Both goals again, from the traces' scale as captured to a scale between it and
that of GPU runs (`virtual_tradeoff.py --scaled-variants {count}`): {count} variants of each
trace with every size multiplied by the factor first, then every distinct size by its own
factor in [{1 - spread:g}, {1 + spread:g}] (at x1 the draws of the table above). No setting
of the default was chosen at the larger scales. Beside the default, the default with
PyTorch's own size split (blocks up to 1 MiB apart from the rest, as PyTorch's small pool
keeps them): both place by best fit, so where PyTorch keeps sizes apart it keeps them
apart too, and maps only the granules blocks touch where `{expandable}` maps its segment
up to its top; it pays in storage calls (the shared traces' bar is {MAX_CALLS_PER_100:g} per 100
allocations) and on some traces as captured. The other splits between the two ask whether
a fixed boundary elsewhere meets both goals at every scale. More than {MARGIN_GOAL:g} below
`{expandable}` on some variant, and the variants below {UTILIZATION_GOAL:g}, per layout and
scale: {splits_reading(varied)}.

{table(heads, ("---", "---") + ("---:",) * (len(heads) - 2), rows)}"""

    def wider_part(self) -> str:
        """Issue 28's goals on real captures of larger models (``virtual_tradeoff.py
        --wider K``): the summary rows of the variants' table over every wider capture
        (each as captured and its variants), then per trace each layout's utilization and
        calls as captured, the default's mean and lowest over the variants and its
        smallest margin over ``torch_expandable``."""
        note = self.missing("wider", "virtual_tradeoff.py --wider K")
        if note:
            return note
        wide = self.virtual["wider"]
        if not wide["rows"]:
            return "(No wider capture in this run.)"
        layouts = wide["layouts"]
        default, expandable = layouts[0], layouts[1]
        count, spread = wide["count"], wide["spread"]
        heads = (
            "sizes",
            "layout",
            "replays",
            "mean / lowest",
            "calls per 100 allocations, mean / highest",
            f"replays below {UTILIZATION_GOAL:g} (per trace)",
            f"smallest margin over `{expandable}`",
            f"more than {MARGIN_GOAL:g} below it",
        )
        summary = [
            scaled_variants_row(wide["rows"], layout, expandable, "widths x2") for layout in layouts
        ]
        per_trace = []
        for row in wide["rows"]:
            cells = row["cells"]
            ours = [u for u, _ in cells[default]]
            margin = min(u - theirs[0] for u, theirs in zip(ours, cells[expandable], strict=True))
            per_trace.append(
                [
                    row["trace"],
                    f"{row['peak_live'] / 2**20:,.0f}",
                    *(
                        f"{cells[layout][0][0]:.3f} / {cells[layout][0][1]:.1f}"
                        for layout in layouts
                    ),
                    f"{mean(ours):.3f} / {min(ours):.3f}",
                    f"{margin:+.3f}",
                ]
            )
        trace_heads = (
            "trace (widths x2)",
            "peak live (MiB)",
            *(f"`{layout}` as captured" for layout in layouts),
            f"`{default}` over all {count + 1}: mean / lowest",
            f"smallest margin over `{expandable}`",
        )
        interval = f"[{1 - spread:g}, {1 + spread:g}]"
        return f"""Both goals on real captures of larger models: `scripts/capture_traces.py --wider`
captures {len(wide["rows"])} of the families again with every model width doubled
(dimensions, hidden sizes, channels; weights grow four times and activations twice, as
a real larger model's do, where the scaled variants above multiply every size alike),
into `benches/traces/wider`. They were captured after every choice of the default and
nothing was chosen on them (`virtual_tradeoff.py --wider {count}`: each trace as captured
and {count} variants, every distinct size times its own factor in {interval}).

{table(heads, ("---", "---") + ("---:",) * (len(heads) - 2), summary)}

Per trace (utilization / storage calls per 100 allocations as captured):

{table(trace_heads, ("---",) + ("---:",) * (len(trace_heads) - 1), per_trace)}"""

    def scaled_costs(self) -> str:
        """Per factor, each layout's mean storage calls per 100 allocations and lowest
        utilization over the scaled-up traces."""
        scaled = self.virtual["scaled_up"]
        parts = []
        for factor in scaled["factors"]:
            rows = [row for row in scaled["rows"] if row["factor"] == factor]
            cells = []
            for layout in scaled["layouts"]:
                if layout.startswith("torch"):
                    continue
                calls = sum(row["cells"][layout][1] for row in rows) / len(rows)
                lowest = min(row["cells"][layout][0] for row in rows)
                cells.append(f"`{layout}` {calls:.1f} calls at {lowest:.3f} or more")
            parts.append(f"x{factor}: " + ", ".join(cells))
        return "; ".join(parts)

    def tradeoff_table(self) -> str:
        """Utilization against storage calls as the release knob ``keep`` moves."""
        note = self.missing("tradeoff", "virtual_tradeoff.py --table")
        if note:
            return note
        tradeoff = self.virtual["tradeoff"]
        names = self.virtual["traces"]
        rows = [
            [f"`{row['keep']}`", *(figures(row["cells"][name]) for name in names)]
            for row in tradeoff["rows"]
        ]
        return table(("keep", *names), ("---",) + ("---:",) * len(names), rows)

    def selection_section(self) -> str:
        """The grid the default's setting was chosen from, and its check on held-back
        and perturbed traces."""
        note = self.missing("selection", "virtual_tradeoff.py --select")
        if note:
            return note
        selection = self.virtual["selection"]
        names = selection["traces"]
        grid = table(
            ("setting", *names, f"within {selection['max_calls']:g} calls on each"),
            ("---",) + ("---:",) * len(names) + ("---",),
            [
                [
                    f"`{row['config']}`",
                    *(figures(row["cells"][name]) for name in names),
                    "yes" if row["ok"] else "no",
                ]
                for row in selection["rows"]
            ],
        )
        chosen = selection["chosen"]
        default = f"the default layout (`{self.virtual['default']}`)"
        if chosen is None:
            verdict = f"Chosen: none within the call budget; {default} is"
        elif selection.get("chosen_text") == self.virtual["default_text"]:
            verdict = f"Chosen: `{chosen}`, which is {default}:"
        else:
            verdict = f"Chosen: `{chosen}`, which is **not** {default}, that is"
        parts = [grid, f"{verdict} `{self.virtual['default_text']}`."]
        if "check" in self.virtual:
            parts.append(
                table(
                    (
                        "trace",
                        "utilization",
                        "calls / 100 allocations",
                        f"{self.virtual['previous']} utilization",
                    ),
                    ("---", "---:", "---:", "---:"),
                    [
                        [
                            row["trace"],
                            f"{row['utilization']:.3f}",
                            f"{row['calls']:.1f}",
                            f"{row['previous']:.3f}",
                        ]
                        for row in self.virtual["check"]
                    ],
                )
            )
        return "\n\n".join(parts)

    def timing_table(self) -> str:
        """Replay ns/event of the default against the previous default."""
        note = self.missing("timing", "virtual_tradeoff.py --timing N")
        if note:
            return note
        timing = self.virtual["timing"]
        default, previous = self.virtual["default"], self.virtual["previous"]
        return table(
            ("trace", f"{previous} ns/event", f"{default} ns/event", "ratio"),
            ("---", "---:", "---:", "---:"),
            [
                [
                    row["trace"],
                    f"{row['previous']:.1f}",
                    f"{row['default']:.1f}",
                    f"{replay_ratio(row):.2f}x",
                ]
                for row in timing["rows"]
            ],
        )

    def scaled_timing_part(self) -> str:
        """Replay ns/event of the default against the previous default on every trace as
        captured and scaled up (``virtual_tradeoff.py --scaled-timing N``), with the
        default's storage calls per 100 allocations beside each ratio."""
        note = self.missing("scaled_timing", "virtual_tradeoff.py --scaled-timing N")
        if note:
            return note
        scaled = self.virtual["scaled_timing"]
        default, previous = self.virtual["default"], self.virtual["previous"]
        factors = scaled["factors"]
        cells: dict[str, dict[int, dict[str, Any]]] = {}
        for row in scaled["rows"]:
            cells.setdefault(row["trace"], {})[row["factor"]] = row
        rows = [
            [
                trace,
                *(
                    f"{replay_ratio(by[f]):.2f}x / {by[f]['calls']:.1f}" if f in by else "-"
                    for f in factors
                ),
            ]
            for trace, by in cells.items()
        ]
        counts = []
        for factor in factors:
            ratios = [replay_ratio(row) for row in scaled["rows"] if row["factor"] == factor]
            if not ratios:
                continue
            within = sum(r <= MAX_REPLAY_RATIO for r in ratios)
            counts.append(
                f"x{factor}: {within} of {len(ratios)} within {MAX_REPLAY_RATIO}x "
                f"(median {median(ratios):.2f}x, highest {max(ratios):.2f}x)"
            )
        heads = ("trace", *(f"x{factor}: ratio / calls" for factor in factors))
        return f"""The same ratio on every trace, shared and captured, as captured and with
every size multiplied (`virtual_tradeoff.py --scaled-timing N`, best of {scaled["repeats"]}
each), beside `{default}`'s map + unmap calls per 100 allocations there: {"; ".join(counts)}.
Where a trace holds a block over 2 GiB (most at x128), both layouts are resolved with a
largest page that holds it (`timing_properties`): `{previous}` puts a larger block
nowhere, and a replay whose reserves fail does less work, so its time would flatter it.
{self.timing_noise()}
At the scale of GPU runs most blocks span many granules and the default maps and unmaps
more often, and in a replay each call is a table update in the replay's storage with the
granule books around it, which `{previous}` (a few large pages) hardly ever pays:
{REPLAY_CALL_COST}

{table(heads, ("---",) + ("---:",) * len(factors), rows)}"""

    def timing_noise(self) -> str:
        """How far apart the two timed rounds of the same replays (part 3's table and the
        x1 column below) came out, where both ran: the noise a ratio near the bar has."""
        timing = self.virtual.get("timing", {}).get("rows", [])
        scaled = self.virtual.get("scaled_timing", {}).get("rows", [])
        first = {row["trace"]: replay_ratio(row) for row in timing}
        again = {row["trace"]: replay_ratio(row) for row in scaled if row["factor"] == 1}
        both = sorted(set(first) & set(again))
        if not both:
            return ""
        apart = max(both, key=lambda trace: abs(first[trace] - again[trace]))
        return (
            f"The x1 column times what the table above does, in rounds of its own: on the "
            f"traces in both the two ratios differ by up to "
            f"{abs(first[apart] - again[apart]):.2f} ({apart}, {first[apart]:.2f}x and "
            f"{again[apart]:.2f}x), the machine's noise, so a ratio that close to "
            f"{MAX_REPLAY_RATIO}x is met or missed by chance."
        )

    def plan_tables(self) -> str:
        """Plan time and memory against trace length, and plans of the shared traces."""
        if self.plan is None:
            return "(Not measured in this run: `benches/python/bench_plan.py`.)"
        synthetic = table(
            (
                "events",
                "load (s)",
                "plan (s)",
                "plan CPU (s)",
                "replays",
                "RSS after load (MiB)",
                "peak RSS (MiB)",
                "planned utilization",
            ),
            ("---:",) * 8,
            [
                [
                    f"{row['events']:,}",
                    f"{row['load_s']:.2f}",
                    f"{row['plan_s']:.1f}",
                    f"{row['plan_cpu_s']:.1f}",
                    f"{row['replays']:,}",
                    f"{row['rss_after_load_mib']:.0f}",
                    f"{row['peak_rss_mib']:.0f}",
                    f"{row['utilization']:.3f}",
                ]
                for row in self.plan["synthetic"]
            ],
        )
        parts = [synthetic]
        if self.plan["real"]:
            parts.append(
                table(
                    ("trace", "events", "plan (s)", "replays", "planned utilization", "layout"),
                    ("---", "---:", "---:", "---:", "---:", "---"),
                    [
                        [
                            row["name"],
                            f"{row['events']:,}",
                            f"{row['plan_s']:.1f}",
                            f"{row['replays']:,}",
                            f"{row['utilization']:.3f}",
                            row["layout"],
                        ]
                        for row in self.plan["real"]
                    ],
                )
            )
        return "\n\n".join(parts)

    def python_tables(self) -> str:
        """Reserve + drop from Python, and replay overhead."""
        reserve_rows = []
        for row in self.python["reserve"]:
            n = row["n"]
            label = f"{n // MIB} MiB" if n >= MIB else f"{n // 1024} KiB" if n >= 1024 else f"{n} B"
            # Files written before the default's column have no `default_ns`.
            default = row.get("default_ns")
            reserve_rows.append(
                [
                    label,
                    "-" if default is None else ratio(row["numpy_ns"] / default),
                    ratio(row["numpy_ns"] / row["cubepool_ns"]),
                    ratio(row["bytearray_ns"] / row["cubepool_ns"]),
                    "-" if default is None else f"{default:.0f} ns",
                    f"{row['cubepool_ns']:.0f} ns",
                    f"{row['numpy_ns']:.0f} ns",
                    f"{row['bytearray_ns']:.0f} ns",
                ]
            )
        replay_rows = []
        for row in self.python["replay"]:
            bench = self.times.get(f"replay/virtual/{row['trace']}")
            replay_rows.append(
                [
                    row["trace"],
                    ratio(row["python_s"] / row["rust_loop_s"]),
                    f"{row['python_s'] * 1e3:.3f} ms",
                    f"{row['rust_loop_s'] * 1e3:.3f} ms",
                    f"{row['overhead_us']:.0f} us",
                    duration(bench["median"]) if bench else "n/a",
                ]
            )
        return "\n\n".join(
            [
                table(
                    (
                        "n",
                        "numpy.empty / default",
                        "numpy.empty / cubepool",
                        "bytearray / cubepool",
                        "mm.reserve(n) + drop, default layout",
                        "mm.reserve(n) + drop, cubepool (SubSlices)",
                        "numpy.empty(n, uint8) + drop",
                        "bytearray(n) + drop",
                    ),
                    ("---:",) * 8,
                    reserve_rows,
                ),
                table(
                    (
                        "trace",
                        "Python / Rust loop",
                        "cubepool.replay from Python",
                        "Rust loop (ReplayResult.seconds)",
                        "overhead per call",
                        "Rust `replay()` (criterion, pools bench, with setup)",
                    ),
                    ("---", "---:", "---:", "---:", "---:", "---:"),
                    replay_rows,
                ),
            ]
        )

    def core_table(self) -> str:
        """The pools bench (cubepool alone, as the core engineer runs it): the
        ``SubSlices`` preset (sliced pools), the default layout (the virtual pool), and
        for replays the default before it (``compact``); a dash where a layout was not
        measured."""

        def row(what: str, group: str, suffix: str = "") -> list[str]:
            return [what] + [
                self.time_cell(f"{group}/{layout}{suffix}")
                for layout in ("cubepool", "virtual", "compact")
            ]

        rows = [row(f"FIFO W={w} (host memory)", "fifo_window_1mib", f"/{w}") for w in FIFO_WINDOWS]
        rows.append(
            row("steady state (virtual storage, reserve then drop)", "steady_state_log_uniform")
        )
        rows += [
            row(f"`replay()` {trace} (virtual storage, with setup)", "replay", f"/{trace}")
            for trace in TRACES
        ]
        return table(
            (
                "benchmark (benches/pools.rs)",
                "SubSlices (sliced pools)",
                "virtual_pages (the default)",
                "compact (the default before)",
            ),
            ("---", "---:", "---:", "---:"),
            rows,
        )


def render(report: Report) -> str:
    """BENCHMARKS.md."""
    python = report.python
    rss = (
        "the peers bench's peak resident set was not measured (no /usr/bin/time)"
        if report.peers_rss_kib is None
        else f"the peers bench's peak resident set was {report.peers_rss_kib / 1024**2:.2f} GiB"
    )
    return f"""# Benchmarks

This file is generated; nothing in it is edited by hand. Regenerate everything (it takes
minutes: run it on an otherwise idle machine):

    {REGENERATE}

It runs the criterion benches `pools` and `peers`, times the FIFO and steady-state
loops of the default's targets again with the peers interleaved
(`examples/peer_loops.rs`), counts their cache events under cachegrind
(`benches/cache_profile.py`) and times them built without the default's books
(`benches/books_split.py`), rebuilds the Python package
(`maturin develop --release`, in `.venv` if there is one), runs
`benches/python/bench_reserve.py`, `benches/python/virtual_tradeoff.py` and
`benches/python/fit_policies.py` (on the shared traces of `$CUBEPOOL_TRACES`, by
default `/work/shared/traces`, where the bundled ones are missing),
`benches/python/bench_place.py` (MiniMalloc's instances A-K and 100,000 synthetic
buffers, 10 s each) and `benches/python/bench_plan.py`, and writes this file with
`benches/report.py`. Smoke run for CI (builds both benches and runs every benchmark
once, plus seconds-long Python runs; writes nothing here):

    {SMOKE}

which is `{SMOKE_PARTS[0]}`, then `{SMOKE_PARTS[1]}`,
`{SMOKE_PARTS[2]}` and short runs of the other Python benchmarks.

Measured on:

{chr(10).join(machine(report.measured))}
- Python {python["python"]}, numpy {python["numpy"]}, cubepool {python["cubepool"]}

Times are criterion's median per iteration. A ratio is the peer's time divided by
cubepool's: above 1, cubepool is faster; below 1, the peer is. "cubepool" is its
`SubSlices` preset (sliced pools, CubeCL's default, the layout the peers are compared
on); "virtual pool" is cubepool's default layout, the `virtual_pages` preset
(`{report.virtual.get("default_text", "virtual(granule=2MiB, ...)")}`: one address
range, memory mapped in 2 MiB granules where live blocks are). Storage calls are page
allocations and releases (sliced pools, CubeCL) or maps and unmaps (virtual pool): on a
GPU each is a driver call of tens of microseconds.

## Targets

The default layout (the virtual pool), each target against the peer its row names,
measured in the same run:

{report.latest_targets()}

Where each peer wins: {report.reading()}

`SubSlices` (cubepool's sliced pools) against CubeCL 0.10, offset-allocator and numpy:

{report.targets()}

{report.default_targets()}

## FIFO window of 1 MiB reserves (free the oldest, reserve one; W live)

{report.fifo_table()}

## Steady state: log-uniform sizes 8 B to 32 MiB, 10,000 live

Each step frees a random live block and reserves a new size in its place.

{report.steady_table()}

## Where cubepool's time goes

The three ways of freeing, side by side: slots have no handle; `mm.release` adds the
handle's descriptor (issued at the reserve, recycled at once); dropping the handle
adds the lock-free hand-back (the last user pushes the descriptor on its thread's
release ring with plain stores; the next operation drains the ring with plain loads
and frees the reservation). A difference below zero means dropping was the faster
in this run.

{report.cost_table()}

## Where the default's time goes

The same split for the default layout (the virtual pool), in the same run. Inside the
pools' part, instruction counts (deterministic, unlike times on a shared machine) name
the rest: {DEFAULT_COSTS}

{report.cost_table("virtual-pool")}

{report.steady_split()}

{report.cache_section()}

{report.books_section()}

## Replay of the shared traces (each allocator's own reserve and free, per whole replay)

The bundled traces, then the shared ones the bench found in `$CUBEPOOL_TRACES`.

{report.replay_table()}

## Peak memory on the shared traces (MiB)

{report.memory_table()}

## Utilization by layout (utilization / storage calls per 100 allocations)

Each shared trace under every preset, the models of PyTorch's caching allocator and a
plan: peak live over peak reserved, and storage calls per 100 allocations, replayed on
virtual storage (`python benches/python/virtual_tradeoff.py --memory`). {report.traces_note()}

{report.layouts_table()}

{report.beside_section()}
{report.fit_section()}
## The virtual pool's release knob: utilization against storage calls

The default's `keep` (idle mapped bytes kept for reuse: `0` unmaps as soon as no live
byte is in a granule, `none` keeps them up to the high-water mark of mapped bytes) moved
from eager to lazy, other settings as the default's (`small=16MiB`); utilization / map +
unmap calls per 100 allocations, and the previous default for reference
(`virtual_tradeoff.py --table`).

{report.tradeoff_table()}

## How the default's setting was chosen

Settings of the virtual pool (2 MiB granules; `small`: requests up to it get a range of
their own; `keep`) scored on three selection traces only: the best worst utilization
among those within the call budget on each (among equals to 0.001, the fewest calls).
The winner is then checked on the traces held back and on perturbed copies of all
(events reordered within a window and the peak grown 3 % with twins, by
`cubepool.plan.perturb`; every distinct size scaled by its own random factor in
[0.6, 1.7]) (`virtual_tradeoff.py --select`).

{report.selection_section()}

## Replay speed: the default against the default before it

`cubepool.replay` ns/event, interleaved replays, the best of each kept, so machine load
affects both alike (`virtual_tradeoff.py --timing N`).

{report.timing_table()}

{report.scaled_timing_part()}

## Python (one process)

`mm.reserve(n)` on a `MemoryManagement` with the default layout (`virtual_pages`) and
with the `sub_slices` preset, in rounds taken in turn with `numpy.empty` and `bytearray`
(best round of each); `cubepool.replay` with the default layout, beside the pools
bench's replay of the same layout from Rust (`python benches/python/bench_reserve.py`).
Instructions per 4 KiB reserve + drop (callgrind, a bare loop): {PYTHON_COSTS}

{report.python_tables()}

## Planning time against trace length

`cubepool.plan` of synthetic traces with no phases (the plan is derived on the whole
trace), each loaded and planned in a fresh process, and of each shared trace
(`python benches/python/bench_plan.py`; one run per length).

{report.plan_tables()}

{planner_sections(report.plan, report.place)}
## cubepool alone (benches/pools.rs)

{report.core_table()}

## Method

- **Same work for everyone.** The steady state's 10,000 initial sizes and 65,536
  (victim, size) steps are drawn once from a fixed-seed xorshift64* generator and
  cycled through by every allocator; the FIFO window frees the oldest 1 MiB block
  and reserves a new one (CubeCL's own `benches/dynamic.rs` shape); the replays map
  trace ids to each allocator's handles and start from an empty allocator each time
  (building it, and dropping it with the never-freed allocations, is not timed).
- **cubepool**: `MemoryManagement` with `SubSlices`, 2 GiB max page, alignment 32, on
  `HostStorage` (zero-filled pages: `alloc_zeroed` from the global allocator, or a
  private `mmap` of its own, whose pages read as zeros until touched, for a page of a
  huge page (2 MiB) or more); handles are dropped to
  free (the lock-free path: the dropped handle's descriptor goes on the dropping
  thread's release ring, freed at the next operation; no atomic read-modify-write
  per pair on one thread). "cubepool
  (release)" gives each handle back with `mm.release(handle)` instead (freed at once,
  no atomic operation); "cubepool (slots)" uses `reserve_slot`/`release_slot` without
  handles. The "(no bytes)" replay columns use `VirtualStorage` (address ranges, no
  bytes).
- **virtual pool**: `MemoryManagement` with the `virtual_pages` preset (the default
  layout), same device properties, on `HostStorage`: one range of address space
  reserved with `mmap(PROT_NONE)`, granules committed with `mprotect` and released with
  `madvise(MADV_DONTNEED)` (no byte is written, so none becomes resident); handles
  dropped to free. In the replays' "(no bytes)" column it runs on `VirtualStorage`.
- **Storage calls** come from untimed runs of the same workloads after the timings, on
  storages without bytes (cubepool's `VirtualStorage`, CubeCL's address ranges; the pools
  make the same calls as on host memory): cubepool's `memory_stats()`
  (`num_device_alloc + num_device_free`), CubeCL's through a storage wrapper that counts
  `alloc` and `dealloc`. FIFO and steady state: calls per
  100 steps over 4,096 steps after 4,096 steps of warm-up (the state the timings
  measure); replays: calls per 100 allocations of one replay from an empty allocator.
  Its sliced pools defer coalescing: the block freed last is merged only at the next
  operation, and a reserve of its very extent, when it has no free neighbour, takes it
  back in place. Every FIFO step does that (no merge, no search, no split); in the
  steady state the new size rarely has the freed block's extent. Placements are the
  ones eager coalescing makes (a proptest runs both side by side), so the memory
  figures are unchanged by it.
- **CubeCL 0.10.0** (`cubecl-runtime`): `MemoryManagement::from_configuration(BytesStorage,
  MemoryDeviceProperties {{ max_page_size: 2 GiB, alignment: 32 }}, SubSlices,
  ServerLogger::default(), MemoryManagementOptions::new("bench"))`; the bench refuses to run
  if a `cubecl.toml`/`burn.toml` or a `CUBECL_*` variable could configure it.
  `BytesStorage` zeroes every page with `calloc`; glibc skips that for fresh pages but
  memsets recycled heap memory, so its cost depends on what the process allocated before.
  The replays therefore also run on a CubeCL storage of address ranges without bytes
  ("CubeCL (no bytes)"), against cubepool's `VirtualStorage`: that pair times the pools alone.
  The replays run first and the steady state last, because the steady state's 22 GB
  of freed blocks leave glibc's heap in a state where later `calloc`s zero whole pages.
- **CubeCL 0.11** (`cubecl-server` 0.11.3 over `cubecl-runtime` 0.11.4, CubeCL's
  newest stable release; the bench's `cubecl11`): its `MemoryManagement` with
  `MemoryConfiguration::default()`, `Adaptive`, over its `BytesStorage`, the same
  device properties (2 GiB pages at most, alignment 32, no capacity stated). Its server
  (`Command::reserve`) needs a driver and streams, so the bench reserves as it does, on
  one stream that never records: relocate when the memory asks for it, `reserve(size,
  PageUpdate::Allow)` (whose periodic cleanup gives back emptied outdated pages), and
  on a failure that a reclaim may cure, make room (a relocation when the page sizes ran
  out, an explicit cleanup otherwise) and retry once. Relocation is on: its copies go
  through CubeCL's own `HostCopies` (`memcpy`) on host memory and through a queue that
  copies nothing on the storage without bytes; with no capacity stated, memory pressure
  never asks for one, and only a full arena (64 page sizes) or a failed reserve does.
  The relocations column of the memory table counts the ones that ran. Its
  `BytesStorage` asks for 64-byte-aligned zeroed pages, which the system allocator
  serves with `aligned_alloc` and a `memset` (no lazily zeroed fresh pages), so every
  page is written and resident when allocated: on host memory its replays time that
  zeroing as much as the pools. The "(no bytes)" columns run it on a storage of address
  ranges without bytes (`cubecl11-virtual`), which times the pools alone, and its
  steady state runs there only (at its peak it holds {report.cubecl11_steady_peak()} of
  pages, which zeroed would not fit in the machine's RAM). Its peak memory is the most
  bytes that storage held at once, relocations included.
- **offset-allocator 0.2**: one `Allocator` over 2^32 - 1 units of 32 bytes (a 128 GiB
  virtual range; the issue's 4 GiB cannot hold the steady state's 22 GB live), sizes
  rounded up to whole units. Its "span" in the memory table is the highest byte
  offset it handed out: the size one contiguous buffer would need.
- **system**: `std::alloc::alloc`/`dealloc` (glibc malloc/free) with the same sizes,
  alignment 1 (plain `malloc`, 16-byte aligned). In the steady state its live set is
  22 GB of address space that nothing writes to except glibc's own chunk headers,
  which still cost it page faults on fresh pages.
- **Sizes.** The steady state keeps the issue's 8 B .. 32 MiB range for every allocator
  (no cap): its 10,000 initial sizes add up to 22 GB (20.8 GiB), but no allocator writes
  to the bytes, so the pages stay virtual address space (Linux overcommit) and the
  machine's RAM holds it; {rss}.
- **Peak memory** (every shared trace: the bundled ones and those in
  `$CUBEPOOL_TRACES`): CubeCL's `memory_usage().bytes_reserved` (the figure the issue
  names) and, through a counting wrapper around `BytesStorage`, the bytes its storage
  actually held; cubepool's `memory_usage().bytes_reserved`; both read after every
  reserve of an untimed replay, handles dropped as in the timed runs (given back at the
  next operation; `cubepool.replay`, below, frees each at once, and the virtual pool
  can place differently between the two). The torch columns are `cubepool::trace::replay_torch`'s
  peak reserved bytes: a model of PyTorch's CUDA caching allocator (the rules of
  `c10/cuda/CUDACachingAllocator.cpp`, see `src/trace/torch_model/`) with its default
  settings and with `expandable_segments:True`, no limit; a model, not PyTorch run on a
  GPU.
- **Utilization by layout, the release knob, the choice of the default**:
  `cubepool.replay` on virtual storage with the default device properties (the benches
  above use 2 GiB pages and 32-byte alignment), of the presets, the virtual pool's
  settings and the models of PyTorch's allocator. Replays are deterministic, so their
  utilization and calls do not depend on the machine or its load; the replay speeds
  and the plan times do.
- **Python**: `timeit`, best of several repeats; each statement (`reserve(n)`,
  `empty(n, uint8)`, `bytearray(n)`) discards its result, so the object is freed within
  the statement. `bytearray(n)` zero-fills; the other two do not. Replay overhead is the
  wall time of `cubepool.replay(trace)` minus the Rust loop time it reports (building the
  pools and storage, crossing into Rust, building the result).
- **Noise.** The machine is shared (2 cores, other jobs running). When this file was
  first generated, two consecutive full runs differed by up to 40 % on single rows and
  up to 30 % on ratios, and no target's verdict changed between them. The peers move
  too: with nothing changed on its side, CubeCL's FIFO W=400 took 518 ns in one full
  run (2026-11-30, 07:36 UTC) and 447 ns in the next (08:17 UTC), so a ratio within
  about 15 % of a target's line can land on either side of it from run to run. The
  "never slower" row gives the interval that the two medians' 95 % confidence
  intervals allow. The rows marked "interleaved" time the FIFO and steady-state loops
  again with `examples/peer_loops.rs` (the same loops, W=4000), every peer in rounds
  taken in turn and the best round of each kept, so a drift of the machine's speed
  within a run moves every peer alike. A drift between runs moves even those ratios: on
  2026-12-03, on one machine (AMD EPYC, 2 cores), two full runs gave offset-allocator's
  FIFO step 20 and 34 ns and the default's criterion ratio to it 1.66x and 1.26x at
  W=4000, and six interleaved runs in a row gave 1.68-1.82x in the five where
  offset-allocator took 19 ns and 1.31x in the one where it took 31 ns:
  offset-allocator's step, which runs more instructions a cycle, slows more when the
  machine does, so the default's ratio is at its worst on an otherwise idle machine.
  Verdicts near a line flip with such drifts, both ways: between two full runs on
  2026-12-03 (13:31 and 12:39 UTC), with `sub_slices`' steady-state step running the
  same instructions in both (796 a step, callgrind of `examples/peer_loops.rs steady
  sub-slices`), its criterion median went from 107 to 157 ns and its "within 2x of
  offset-allocator" rows from met to missed, and numpy.empty's 4 KiB step from 123 to
  136 ns, which turned the Python rows from missed to met (the default's own step ran
  125 ns in both).
"""


def planner_main(argv: list[str]) -> int:
    """``report.py planner --plan P --place Q [--out BENCHMARKS.md]``: only the planner's
    and the placement's sections, spliced into the existing file (each replaces the
    section of its heading; the others are left as they are)."""
    parser = argparse.ArgumentParser(prog="report.py planner", description=planner_main.__doc__)
    parser.add_argument("--plan", type=Path, help="the JSON of bench_plan.py")
    parser.add_argument("--place", type=Path, help="the JSON of bench_place.py")
    parser.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args(argv)
    sections = planner_sections(
        None if args.plan is None else json.loads(args.plan.read_text()),
        None if args.place is None else json.loads(args.place.read_text()),
    )
    document = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(splice_sections(document, sections, PLANNER_SECTIONS))
    print(f"wrote {os.fspath(args.out)} (the planner's sections)")
    return 0


def beside_only(argv: list[str]) -> int:
    """Writes only the section of the default beside PyTorch's allocator into
    BENCHMARKS.md, from the JSON of ``virtual_tradeoff.py --beside``: the part of the
    report that does not need the criterion benches."""
    parser = argparse.ArgumentParser(description="BENCHMARKS.md's section of the default")
    parser.add_argument("--beside-only", action="store_true", required=True)
    parser.add_argument("--virtual", type=Path, required=True, help="virtual_tradeoff.py's JSON")
    parser.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args(argv)
    report = Report({}, [], {}, virtual=json.loads(args.virtual.read_text()))
    if report.missing("beside", "virtual_tradeoff.py --beside"):
        parser.error(f"{os.fspath(args.virtual)} holds no --beside figures")
    text = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(
        splice_sections(text, report.beside_section(), (BESIDE_HEADING,), before=BESIDE_BEFORE)
    )
    print(f"wrote the section of the default beside torch into {os.fspath(args.out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Reads the results and writes BENCHMARKS.md (``report.py planner ...``: only the
    planner's sections, see :func:`planner_main`; with ``--beside-only``, only the
    section of the default beside PyTorch's allocator, see :func:`beside_only`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["planner"]:
        return planner_main(argv[1:])
    if "--beside-only" in argv:
        return beside_only(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--criterion", type=Path, required=True, help="criterion's output folder (target/criterion)"
    )
    parser.add_argument(
        "--peers-memory",
        type=Path,
        required=True,
        help="the JSON of the peers bench (peak memory and storage calls)",
    )
    parser.add_argument("--python", type=Path, required=True, help="the JSON of bench_reserve.py")
    parser.add_argument("--virtual", type=Path, help="the JSON of virtual_tradeoff.py")
    parser.add_argument("--plan", type=Path, help="the JSON of bench_plan.py")
    parser.add_argument("--place", type=Path, help="the JSON of bench_place.py")
    parser.add_argument(
        "--peers-maxrss",
        type=Path,
        help="a file holding the peers bench's peak resident set in KiB (GNU time %%M)",
    )
    parser.add_argument(
        "--interleaved",
        type=Path,
        nargs="*",
        default=[],
        help="the JSONs of examples/peer_loops.rs --json (interleaved rounds)",
    )
    parser.add_argument("--cache", type=Path, help="the JSON of benches/cache_profile.py")
    parser.add_argument("--books", type=Path, help="the JSON of benches/books_split.py")
    parser.add_argument("--fit", type=Path, help="the JSON of benches/python/fit_policies.py")
    parser.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args(argv)
    peers = json.loads(args.peers_memory.read_text())
    if isinstance(peers, list):
        # The peers bench before it counted storage calls wrote the memory rows alone.
        peers = {"memory": peers, "calls": []}
    report = Report(
        load_criterion(args.criterion),
        peers["memory"],
        json.loads(args.python.read_text()),
        peak_rss_kib(args.peers_maxrss),
        # When the peers bench ended (it writes this file last).
        args.peers_memory.stat().st_mtime,
        calls=peers["calls"],
        virtual=None if args.virtual is None else json.loads(args.virtual.read_text()),
        plan=None if args.plan is None else json.loads(args.plan.read_text()),
        place=None if args.place is None else json.loads(args.place.read_text()),
        interleaved=[json.loads(path.read_text()) for path in args.interleaved],
        cache=None
        if args.cache is None or not args.cache.exists()
        else json.loads(args.cache.read_text()),
        books=None if args.books is None else json.loads(args.books.read_text()),
        fit=None if args.fit is None else json.loads(args.fit.read_text()),
    )
    args.out.write_text(render(report))
    print(f"wrote {os.fspath(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
