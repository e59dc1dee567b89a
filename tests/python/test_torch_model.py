"""The models of PyTorch's caching allocator as comparison layouts (issue 18): replays
through the public API on small hand-made traces whose answers are worked out in the
comments, and the names wherever a layout name is taken. The rules one by one are pinned
by the Rust tests of ``src/trace/torch_model/``."""

from __future__ import annotations

import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import cubepool
from cubepool import layouts
from cubepool.cli import main

MIB = 1 << 20
TORCH = cubepool.TorchAllocatorModel()
EXPANDABLE = cubepool.TorchAllocatorModel(expandable_segments=True)


def trace_of(*steps: tuple[str, int, int]) -> cubepool.Trace:
    """A trace of ``(op, id, size)`` steps, 10 ns apart."""
    return cubepool.Trace.from_events(
        [(10 * (i + 1), op, ident, size) for i, (op, ident, size) in enumerate(steps)]
    )


def test_segments_and_expandable_granules_through_replay() -> None:
    # 5 MiB, then 30 MiB. PyTorch's defaults: a 20 MiB segment for the first (under
    # 10 MiB), a 30 MiB one for the second (its size rounded to 2 MiB): 50 MiB, two
    # cudaMallocs, both in the large pool. Expandable segments: one 20 MiB granule for
    # the first (15 MiB of it left free), then one more mapped at the top joins those
    # 15 MiB to hold the 30 MiB: 40 MiB in two maps.
    trace = trace_of(("alloc", 0, 5 * MIB), ("alloc", 1, 30 * MIB))
    plain = cubepool.replay(trace, TORCH)
    assert (plain.peak_reserved, plain.storage_allocations) == (50 * MIB, 2)
    assert plain.utilization == pytest.approx(35 / 50)
    expandable = cubepool.replay(trace, EXPANDABLE)
    assert (expandable.peak_reserved, expandable.storage_allocations) == (40 * MIB, 2)
    # Two pools, small then large; all of it is in the large one.
    assert [p.kind for p in plain.pools] == ["torch_small", "torch_large"]
    assert [p.peak_reserved for p in plain.pools] == [0, 50 * MIB]
    assert [p.reservations for p in plain.pools] == [0, 2]
    assert plain.pools[1].pages_peak == 2 and expandable.pools[1].pages_peak == 1
    assert plain.pools[1].options is None and plain.pools[1].pool_type is None
    assert plain.timeline.reserved_max[-1] == 50 * MIB
    assert plain.to_dict()["pools"][1]["pool_type"].startswith("torch large pool")


def test_small_requests_share_2_mib_segments() -> None:
    # 3000 small requests of 1000 B: each rounds to 1024 B, 2048 fit a 2 MiB segment,
    # so two segments (4 MiB) hold them; freeing all keeps both (no empty_cache).
    steps = [("alloc", i, 1000) for i in range(3000)] + [("free", i, 0) for i in range(3000)]
    result = cubepool.replay(trace_of(*steps), TORCH)
    assert result.peak_reserved == 4 * MIB
    assert result.pools[0].pages_peak == 2
    assert result.final_usage.bytes_reserved == 4 * MIB
    assert result.final_usage.bytes_in_use == 0


def test_under_a_limit_cached_segments_go_back_before_a_request_fails() -> None:
    # Device of 40 MiB. 12 MiB (a 12 MiB segment) is freed and cached; 30 MiB does not
    # fit beside it, so the cached segment is freed (one cudaFree) and 30 MiB retried.
    # Then 12 MiB more: nothing is cached, 42 MiB > 40 MiB, it fails (event 3).
    trace = trace_of(
        ("alloc", 0, 12 * MIB), ("free", 0, 0), ("alloc", 1, 30 * MIB), ("alloc", 2, 12 * MIB)
    )
    result = cubepool.replay(trace, TORCH, limit=40 * MIB)
    assert (result.storage_frees, result.failed_reserves) == (1, 1)
    assert result.first_failed_event == 3
    assert result.peak_reserved == 30 * MIB
    # Without the limit nothing goes back: 12 + 30 + 12 (the cached 12 MiB serves it).
    assert cubepool.replay(trace, TORCH).peak_reserved == 42 * MIB


def test_models_are_named_wherever_layouts_are() -> None:
    trace = trace_of(("alloc", 0, 5 * MIB), ("alloc", 1, 30 * MIB))
    comparison = cubepool.compare(trace, ["default", "torch", "torch-expandable"])
    labels = [row.label for row in comparison.rows]
    assert set(labels) == {"default", "torch (model)", "torch_expandable (model)"}
    table = comparison.table()
    assert "torch (model)" in table and "torch_expandable (model)" in table
    rows = {row.label: row.to_dict() for row in comparison.rows}
    assert rows["torch (model)"]["layout"] == {"layout": "torch"}
    assert rows["torch (model)"]["description"] == (
        "model of PyTorch's caching allocator (default settings)"
    )
    # A model object is labelled the same way.
    assert cubepool.compare(trace, [EXPANDABLE]).rows[0].label == "torch_expandable (model)"


def test_model_options_in_pytorch_spelling() -> None:
    label, model = layouts.config_from_arg("torch(max_split_size_mb=128)")
    assert label == "torch(max_split_size_mb=128) (model)"
    assert isinstance(model, cubepool.TorchAllocatorModel)
    assert (model.max_split_size_mb, model.expandable_segments) == (128, False)
    same = cubepool.TorchAllocatorModel.parse(
        "torch(expandable_segments:True,roundup_power2_divisions:4)"
    )
    assert same == cubepool.TorchAllocatorModel(True, roundup_power2_divisions=4)
    assert same.name == "torch_expandable(roundup_power2_divisions=4)"
    assert layouts.describe(same) == (
        "model of PyTorch's caching allocator (expandable segments, roundup_power2_divisions=4)"
    )
    with pytest.raises(cubepool.InvalidArgument, match="max_split_size_mb must be at least 20"):
        layouts.config_from_arg("torch(max_split_size_mb=16)")
    with pytest.raises(cubepool.InvalidArgument, match='unknown option "garbage"'):
        layouts.config_from_arg("torch(garbage=1)")
    with pytest.raises(ValueError, match="power of two"):
        cubepool.TorchAllocatorModel(roundup_power2_divisions=3)


def test_models_travel_as_specs_and_pickles() -> None:
    model = cubepool.TorchAllocatorModel(True, max_split_size_mb=64)
    spec = layouts.to_spec(model)
    assert spec == {"layout": "torch_expandable(max_split_size_mb=64)"}
    assert layouts.from_spec(json.loads(json.dumps(spec))) == model
    # The form earlier versions wrote still loads.
    assert layouts.from_spec({"model": "torch_expandable(max_split_size_mb=64)"}) == model
    assert pickle.loads(pickle.dumps(model)) == model
    with pytest.raises(cubepool.InvalidArgument):
        layouts.from_spec({"model": 3})


def test_a_model_is_no_pool_to_allocate_from() -> None:
    for config in ("torch", "torch_expandable(max_split_size_mb=64)", TORCH):
        with pytest.raises(cubepool.PoolConfigError, match="not a pool layout") as info:
            cubepool.MemoryManagement(config)
        assert info.value.kind == "ComparisonModel"


def test_sweep_and_plot_take_the_models(tmp_path: Path) -> None:
    trace = trace_of(("alloc", 0, 5 * MIB), ("alloc", 1, 30 * MIB))
    with ThreadPoolExecutor(2) as pool:
        study = cubepool.sweep({"t": trace}, ["default", "torch", "torch_expandable"], pool)
    grid = study.pivot("peak_reserved")["t"]
    assert (grid["torch (model)"], grid["torch_expandable (model)"]) == (50 * MIB, 40 * MIB)
    assert study.rows[1].spec == {"layout": "torch"}
    out = cubepool.plot(trace, ["default", "torch_expandable"], tmp_path / "mem.html")
    page = out.read_text(encoding="utf-8")
    assert "torch_expandable (model)" in page
    assert "torch large pool (model)" in page


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_cli_compare_replay_and_report_show_the_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run(
        capsys, "compare", "--example", "gpt2-train", "--config", "default", "--config", "torch"
    )
    assert "torch (model)" in out
    out = run(capsys, "replay", "--example", "gpt2-train", "--config", "torch_expandable")
    assert "layout torch_expandable (model) (from --config): model of PyTorch's caching" in out
    assert "torch large pool" in out
    out = run(capsys, "report", "--example", "gpt2-train", "--no-plan", "--no-progress")
    assert "torch (model)" in out and "torch_expandable (model)" in out


LIST_MODEL = "torch(roundup_power2_divisions=[256:1,>:8])"


def test_roundup_power2_divisions_per_size_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # [256:1,>:8]: 1 division (512 B rounding) up to the [256, 512) MiB interval, 8 from
    # 512 MiB. 300 MiB + 1 B rounds to 300 MiB + 512 B; 600 MiB + 1 B to the next
    # 64 MiB step of [512, 1024) MiB, 640 MiB. Each is a segment of its own (rounded
    # to 2 MiB): 302 + 640 MiB. With 8 everywhere 300 MiB + 1 B takes a 32 MiB step:
    # 320 + 640 MiB.
    trace = trace_of(("alloc", 0, 300 * MIB + 1), ("alloc", 1, 600 * MIB + 1))
    label, model = layouts.config_from_arg(LIST_MODEL)
    assert label == f"{LIST_MODEL} (model)"
    assert isinstance(model, cubepool.TorchAllocatorModel)
    assert model.roundup_power2_divisions == [1] * 9 + [8] * 7
    assert cubepool.replay(trace, model).peak_reserved == 302 * MIB + 640 * MIB
    eight = cubepool.TorchAllocatorModel(roundup_power2_divisions=8)
    assert cubepool.replay(trace, eight).peak_reserved == 320 * MIB + 640 * MIB
    # The 16 values build the same model, which reads back from its name and pickle.
    same = cubepool.TorchAllocatorModel(roundup_power2_divisions=[1] * 9 + [8] * 7)
    assert same == model and same.name == LIST_MODEL
    assert cubepool.TorchAllocatorModel.parse(str(same)) == same
    assert pickle.loads(pickle.dumps(same)) == same
    assert layouts.from_spec(layouts.to_spec(same)) == same
    assert layouts.describe(same) == (
        "model of PyTorch's caching allocator (default settings, "
        "roundup_power2_divisions=[256:1,>:8])"
    )
    # With expandable segments and max_split_size_mb after the list, as a snapshot's
    # settings name it.
    both = cubepool.TorchAllocatorModel.parse(
        "torch_expandable(roundup_power2_divisions=[256:1,>:8], max_split_size_mb=512)"
    )
    assert (both.expandable_segments, both.max_split_size_mb) == (True, 512)
    assert both.name == (
        "torch_expandable(max_split_size_mb=512, roundup_power2_divisions=[256:1,>:8])"
    )
    # The same value everywhere is the scalar; none, PyTorch's default.
    assert cubepool.TorchAllocatorModel(roundup_power2_divisions=[4] * 16).name == (
        "torch(roundup_power2_divisions=4)"
    )
    assert cubepool.TorchAllocatorModel(roundup_power2_divisions=(0,) * 16).name == "torch"
    assert (
        cubepool.TorchAllocatorModel(roundup_power2_divisions=[0] * 16).roundup_power2_divisions
        is None
    )
    # --config takes the list.
    out = run(capsys, "compare", "--example", "gpt2-train", "--config", LIST_MODEL)
    assert f"{LIST_MODEL} (model)" in out


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ([1] * 15, cubepool.InvalidArgument, "takes 16 values, one per size interval"),
        ([1] * 15 + [3], cubepool.InvalidArgument, "entry 32768:3"),
        ([1] * 15 + [-1], cubepool.InvalidArgument, r"roundup_power2_divisions\[15\]"),
        ("[256:1]", TypeError, "must be None, an int or a list of 16 ints"),
        (True, TypeError, "must be an int, got bool"),
        (0, cubepool.InvalidArgument, "must be a power of two, got 0"),
    ],
)
def test_bad_divisions_are_refused_naming_them(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        cubepool.TorchAllocatorModel(roundup_power2_divisions=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("torch(roundup_power2_divisions=[256:3])", "entry 256:3"),
        ("torch(roundup_power2_divisions=[3:1])", "entry 3: the interval must be a power of two"),
        ("torch(roundup_power2_divisions=[256:1)", "']' closing"),
        ("torch(roundup_power2_divisions=256:1])", "'\\[' before '\\]'"),
    ],
)
def test_bad_lists_in_names_are_refused_naming_them(name: str, message: str) -> None:
    with pytest.raises(cubepool.InvalidArgument, match=message):
        layouts.config_from_arg(name)


def test_the_models_replay_reads_samples_as_the_layouts_replay_does() -> None:
    # samples was a usize argument: -1 and 2**70 raised OverflowError naming nothing, and
    # True was one sample (helper-143's find).
    trace = cubepool.load_trace("gpt2-generate")
    for layout in ("torch", "default"):
        with pytest.raises(cubepool.InvalidArgument, match="samples"):
            cubepool.replay(trace, layout, samples=-1)
        with pytest.raises(TypeError, match="samples"):
            cubepool.replay(trace, layout, samples=True)
        with pytest.raises(cubepool.InvalidArgument, match="samples is too large"):
            cubepool.replay(trace, layout, samples=2**70)
        every = cubepool.replay(trace, layout, samples=2**64 - 1)
        assert len(every.timeline) == len(cubepool.replay(trace, layout, samples=10**9).timeline)


def test_a_models_name_with_a_lone_surrogate_is_an_invalid_argument() -> None:
    # The str conversion failed first, with an untyped UnicodeEncodeError (helper-145).
    for call in (
        lambda: cubepool.TorchAllocatorModel.parse("torch(\ud800)"),
        lambda: cubepool.layouts.from_spec({"model": "torch\ud800"}),
    ):
        with pytest.raises(cubepool.InvalidArgument, match="lone surrogate"):
            call()
