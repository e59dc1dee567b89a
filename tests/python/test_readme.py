"""The README's Python examples run as scripts, as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
TIMEOUT_S = 300


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_as_a_script(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CUBEPOOL_MEMORY_POOLS"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"README block {index}:\n{BLOCKS[index]}\n{done.stderr}"


# A transcript is a command, indented as a shell line, and the ```text block right after
# it: what the command prints. The test runs the command and compares, with exactly three
# things masked because they vary from run to run: the planner's seconds (its count of
# replays does not vary: its workers replay in waves, see cubepool.plan.search), the
# ns/event column of timing tables, and the figures of the static placement of the whole
# trace (a search with a time limit, "best in 1 s": how far it gets, and whether it proves
# its best optimal in time, depends on the machine's speed).
TRANSCRIPTS = re.findall(
    r"^    (cubepool [^\n]+)\n\n```text\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S
)
_SECONDS = re.compile(r"( replays \([\d,]+ stopped early\)) in [\d.]+ s")
_TIME_LIMITED = re.compile(r"^(static placement of the whole trace \(.*?\)): .*$")


def _masked(text: str) -> list[str]:
    """``text`` with what varies between runs masked, line by line."""
    out: list[str] = []
    timed = False
    for line in text.splitlines():
        line = _SECONDS.sub(r"\1 in T s", line)
        line = _TIME_LIMITED.sub(r"\1: (a time-limited search)", line)
        if line.rstrip().endswith("ns/event"):
            timed = True
        elif not line.strip():
            timed = False
        elif timed and not set(line) <= {"-", " "}:
            line = re.sub(r"\s+\d[\d,]*$", " #", line)
        out.append(line.rstrip())
    return out


def test_the_readme_has_transcripts() -> None:
    assert any(command.startswith("cubepool report") for command, _ in TRANSCRIPTS)


@pytest.mark.parametrize("index", range(len(TRANSCRIPTS)))
def test_readme_transcript_is_what_the_command_prints(index: int, tmp_path: Path) -> None:
    command, expected = TRANSCRIPTS[index]
    env = {k: v for k, v in os.environ.items() if k != "CUBEPOOL_MEMORY_POOLS"}
    done = subprocess.run(
        [sys.executable, "-m", "cubepool.cli", *shlex.split(command)[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    assert _masked(done.stdout) == _masked(expected), command


def test_the_transcript_mask_hides_only_what_varies() -> None:
    run_a = "planned\nderived; 512 replays (28 stopped early) in 0.2 s\n"
    run_b = "planned\nderived; 512 replays (28 stopped early) in 0.6 s\n"
    assert _masked(run_a) == _masked(run_b)
    # The count of replays is not masked: it is the same from run to run.
    assert _masked(run_a) != _masked(run_a.replace("512 replays", "509 replays"))
    assert _masked(run_a) != _masked(run_a.replace("(28 stopped", "(27 stopped"))
    table = "layout  peak  ns/event\n------  ----  --------\ndefault  350.0 MiB  39\n"
    other = "layout  peak  ns/event\n------  ----  --------\ndefault  350.0 MiB  95\n"
    assert _masked(table) == _masked(other)
    assert _masked(table) != _masked(table.replace("350.0", "351.0"))
    assert _masked("0.971 utilization\n") != _masked("0.970 utilization\n")


BENCHMARKS = README.parent / "BENCHMARKS.md"
SHARED = ("gpt2-train", "gpt2-generate", "transformer-train", "vit-train", "mixtral-train")


def _benchmarks_section(heading: str) -> str:
    text = BENCHMARKS.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_readmes_replay_figures_are_benchmarks_md_s() -> None:
    # The README quotes BENCHMARKS.md's replay ratios; a regenerated BENCHMARKS.md left
    # them stale once (helper-144's find).
    section = _benchmarks_section("Replay speed: the default against the default before it")
    rows = dict(
        re.findall(
            r"^\| ([\w-]+(?: \(synthetic\))?) \| [\d.]+ \| [\d.]+ \| ([\d.]+)x \|$", section, re.M
        )
    )
    shared = sorted(float(rows[name]) for name in SHARED)
    scaled = {
        factor: (int(within), total, median)
        for factor, within, total, median in re.findall(
            r"x(\d+): (\d+) of (\d+) within 1\.25x \(median ([\d.]+)x", section
        )
    }
    readme = _one_line(README.read_text(encoding="utf-8"))
    assert (
        f"Its replays run {shared[0]:.2f}-{shared[-1]:.2f}x `compact`'s ns/event on the five "
        f"shared traces and {rows['large-tensors (synthetic)']}x on a synthetic trace"
    ) in readme
    over = [scaled["16"], scaled["128"]]
    assert (
        f"the ratio's median is {over[0][2]}x and {over[1][2]}x, and "
        f"{over[0][0] + over[1][0]} of the {int(over[0][1]) + int(over[1][1])} are within 1.25x"
    ) in readme


def test_the_readmes_placement_figures_are_benchmarks_md_s() -> None:
    section = _one_line(_benchmarks_section("Offline placement: MiniMalloc's instances A-K"))
    times = [float(t) for t in re.findall(r"\| yes \| ([\d.]+) s \|", section)]
    (synthetic,) = re.findall(r"buffers, no capacity: [^|]*? in ([\d.]+) s \(CPU", section)
    readme = _one_line(README.read_text(encoding="utf-8"))
    assert f"in {min(times):.2f}-{max(times):.2f} s, where a greedy" in readme
    assert f"buffers were placed in {synthetic} s at" in readme
