"""The Python fuzz targets' smoke run: every seed, then a few hundred mutations, through
the whole path a trace file takes (``tests/python/fuzz/fuzz_importers.py`` is the long run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings

FUZZ = Path(__file__).parent / "fuzz" / "fuzz_importers.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_importers", FUZZ)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fuzz_importers = _load()


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
