"""The Python fuzz targets' smoke run: every seed, then a few hundred mutations, through
the whole path a trace file takes (``tests/python/fuzz/fuzz_importers.py`` is the long run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from conftest import load_script

fuzz_importers = load_script(Path(__file__).parent / "fuzz" / "fuzz_importers.py")


def test_every_seed_loads_or_is_refused_with_a_trace_error(tmp_path: Path) -> None:
    outcomes = [fuzz_importers.check(seed, tmp_path) for seed in fuzz_importers.SEEDS]
    assert len(outcomes) >= 30
    # The seeds hold both kinds: inputs that load and inputs that are refused.
    assert "ok" in outcomes and "TraceFormatError" in outcomes


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fuzz_importers.inputs)
def test_mutated_traces_load_or_are_refused_with_a_trace_error(tmp_path: Path, data: bytes) -> None:
    fuzz_importers.check(data, tmp_path)


@pytest.mark.parametrize("data", [b"", b"\x1f\x8b", b"\x80\x04", b"{", b"["])
def test_degenerate_inputs_are_refused(tmp_path: Path, data: bytes) -> None:
    assert fuzz_importers.check(data, tmp_path) == "TraceFormatError"
