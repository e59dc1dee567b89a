"""benches/python/fit_policies.py: its model of the virtual pool under eager unmapping
places, frees and counts granules as the default does, and each rule picks the free run
it is named for."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import ModuleType

import pytest

import cubepool
from conftest import load_script

BENCHES = Path(__file__).resolve().parents[2] / "benches" / "python"
MIB = 1 << 20


@pytest.fixture(scope="module")
def fit() -> ModuleType:
    # fit_policies.py imports virtual_tradeoff.py, a script beside it.
    load_script(BENCHES / "virtual_tradeoff.py")
    return load_script(BENCHES / "fit_policies.py")


def test_best_fit_takes_the_smallest_run_and_first_fit_the_lowest(fit: ModuleType) -> None:
    holes = [(0, 100), (200, 64), (400, 60), (600, 60)]
    assert fit.best_fit(holes, 55, {}) == 2  # 60 bytes, the lower of the two
    assert fit.first_fit(holes, 55, {}) == 0
    assert fit.best_fit(holes, 101, {}) is None
    assert fit.first_fit(holes, 101, {}) is None


def test_fewest_granules_prefers_a_run_in_a_granule_already_touched(fit: ModuleType) -> None:
    granule = fit.GRANULE
    # A small run inside granule 0 (touched by a live block) and a tighter one in
    # untouched granule 5: best fit takes the tighter, fewest-granules the touched.
    holes = [(MIB, MIB), (5 * granule, MIB // 2)]
    touched = {0: 1}
    assert fit.best_fit(holes, MIB // 4, touched) == 1
    assert fit.fewest_granules(holes, MIB // 4, touched) == 0
    assert fit.new_granules(MIB, MIB // 4, touched) == 0
    assert fit.new_granules(5 * granule, MIB // 4, touched) == 1
    # A block across a granule boundary touches both.
    assert fit.new_granules(granule - 64, 128, {}) == 2


def test_a_range_merges_what_is_freed_and_unmaps_untouched_granules(fit: ModuleType) -> None:
    # The granule numbers below are of 2 MiB granules, the default's.
    assert fit.GRANULE == 2 * MIB
    where = fit.Range()
    a, mapped_a = where.place(3 * MIB, fit.best_fit)  # granules 0 and 1
    b, mapped_b = where.place(2 * MIB, fit.best_fit)  # granules 1 and 2
    assert (a, mapped_a) == (0, 2)
    assert (b, mapped_b) == (3 * MIB, 1)
    assert where.free(a, 3 * MIB) == 1  # granule 1 is still b's
    assert where.touched == {1: 1, 2: 1}
    assert where.free(b, 2 * MIB) == 2
    assert where.touched == {}
    assert where.holes == [(0, fit.RANGE)]


def test_the_rules_map_different_granules_for_the_same_block(fit: ModuleType) -> None:
    where = fit.Range()
    blocks = [where.place(size, fit.best_fit)[0] for size in (2 * MIB, MIB, 3 * MIB // 2, 4 * MIB)]
    assert blocks == [0, 2 * MIB, 3 * MIB, 9 * MIB // 2]
    where.free(0, 2 * MIB)  # granule 0 untouched again
    where.free(3 * MIB, 3 * MIB // 2)  # a 1.5 MiB hole within granules 1 and 2, both touched
    first, best = copy.deepcopy(where), copy.deepcopy(where)
    assert first.place(MIB, fit.first_fit) == (0, 1)
    assert best.place(MIB, fit.best_fit) == (3 * MIB, 0)


def test_utilization_is_peak_live_over_peak_mapped_granules(fit: ModuleType) -> None:
    # Two 1 MiB blocks share one granule: live 2 MiB, mapped 2 MiB.
    events = [(0, "alloc", 1, MIB), (1, "alloc", 2, MIB), (2, "free", 1, 0), (3, "free", 2, 0)]
    assert fit.utilization(events, fit.best_fit) == 1.0
    # Live peaks at 5 MiB over granules 0-2; a 1 MiB block placed in the hole a free
    # left in granule 0 maps nothing new.
    events = [
        (0, "alloc", 1, MIB + MIB // 2),
        (1, "alloc", 2, MIB // 2),
        (2, "alloc", 3, 3 * MIB),
        (3, "free", 1, 0),
        (4, "alloc", 4, MIB),
    ]
    assert fit.utilization(events, fit.best_fit) == pytest.approx(5 / 6)
    # Sizes past 16 MiB go to a range of their own, as in the default.
    big = [(0, "alloc", 1, 17 * MIB), (1, "alloc", 2, 64)]
    assert fit.utilization(big, fit.best_fit) == pytest.approx((17 * MIB + 64) / (10 * fit.GRANULE))


def test_the_model_places_as_the_default_on_a_bundled_trace(fit: ModuleType) -> None:
    # Exact best fit and the default's arena (size classes) place gpt2-train's blocks
    # alike: the model's utilization is the default's eager-unmap limit's.
    trace = cubepool.load_trace(
        Path(cubepool.__file__).parent / "examples" / "data" / "gpt2-train.jsonl.gz"
    )
    modelled = fit.utilization(trace.events(), fit.best_fit)
    assert modelled == pytest.approx(cubepool.replay(trace, fit.EAGER).utilization, abs=1e-9)


def test_main_compares_every_policy_and_names_an_unknown_trace(
    fit: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fit.json"
    assert fit.main(["--only", "gpt2-generate", "--variants", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["policies"] == ["default", "best", "first", "fewest-granules"]
    assert [(row["trace"], row["variant"]) for row in result["rows"]] == [
        ("gpt2-generate", 0),
        ("gpt2-generate", 1),
    ]
    default = next(s for s in result["summary"] if s["policy"] == "default")
    assert default["above_default"] == default["below_default"] == 0
    assert "| gpt2-generate |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fit.main(["--only", "no-such-trace"])
    assert "no trace named no-such-trace" in capsys.readouterr().err
