"""time_evaluator: TVM's WrapTimeEvaluator loop, checked against a fake clock."""

from __future__ import annotations

import statistics

import pytest

import cubepool as cp
import cubepool.timing as timing


class FakeClock:
    """perf_counter_ns that advances only when the timed function runs."""

    def __init__(self) -> None:
        self.now = 0
        self.sleeps: list[float] = []

    def perf_counter_ns(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("cubepool.timing.time.perf_counter_ns", fake.perf_counter_ns)
    monkeypatch.setattr("cubepool.timing.time.sleep", fake.sleep)
    return fake


def test_counts_and_statistics(clock: FakeClock) -> None:
    calls: list[tuple[int, str]] = []
    costs = iter([5, 1, 1, 1, 2, 2, 2])  # warm-up, then 2 rounds of 3 calls (ms)

    def f(x: int, *, tag: str) -> None:
        calls.append((x, tag))
        clock.now += next(costs) * 1_000_000

    result = cp.time_evaluator(f, number=3, repeat=2)(7, tag="t")
    assert calls == [(7, "t")] * 7  # 1 warm-up + number * repeat
    assert result.results == pytest.approx((0.001, 0.002))
    assert result.mean == pytest.approx(0.0015)
    assert result.median == pytest.approx(0.0015)
    assert result.std == pytest.approx(statistics.pstdev([0.001, 0.002]))
    assert (result.min, result.max) == pytest.approx((0.001, 0.002))
    assert "mean (ms)" in str(result)


def test_min_repeat_ms_grows_number(clock: FakeClock) -> None:
    count = 0

    def f() -> None:
        nonlocal count
        count += 1
        clock.now += 1_000_000  # 1 ms a call

    result = cp.time_evaluator(f, number=1, repeat=2, min_repeat_ms=10)()
    # Round 1: 1 call = 1 ms < 10 -> number = max(10 / 1 + 1, 1.618) = 11 -> 11 ms.
    # Round 2 keeps number = 11.
    assert count == 1 + 1 + 11 + 11
    assert result.results == pytest.approx((0.001, 0.001))


def test_golden_ratio_growth(clock: FakeClock) -> None:
    sizes: list[int] = []
    state = {"calls": 0}

    def f() -> None:
        state["calls"] += 1
        clock.now += 1_000_000

    original = timing.time_evaluator

    def counting() -> None:
        before = state["calls"]
        original(f, number=10, min_repeat_ms=12)()
        sizes.append(state["calls"] - before)

    counting()
    # 10 calls = 10 ms < 12 -> max(12 / 1 + 1, 16.18) = 16 -> 16 ms >= 12.
    assert sizes == [1 + 10 + 16]


def test_zero_time_is_bounded(clock: FakeClock) -> None:
    count = 0

    def f() -> None:
        nonlocal count
        count += 1  # the fake clock never advances

    result = cp.time_evaluator(f, number=2, min_repeat_ms=5, limit_zero_time_iterations=4)()
    assert count == 1 + 4 * 2
    assert result.results == (0.0,)


def test_cooldown_and_preproc(clock: FakeClock) -> None:
    pre: list[int] = []

    def f(x: int) -> None:
        clock.now += 1000

    result = cp.time_evaluator(
        f,
        number=1,
        repeat=4,
        cooldown_interval_ms=5,
        repeats_to_cooldown=2,
        f_preproc=pre.append,
        cache_flush_bytes=4096,
    )(3)
    assert pre == [3, 3, 3, 3]
    assert clock.sleeps == [0.005, 0.005]  # after rounds 0 and 2
    assert len(result.results) == 4


def test_real_clock_smoke() -> None:
    result = cp.time_evaluator(lambda: sum(range(100)), number=5, repeat=3)()
    assert len(result.results) == 3
    assert all(r >= 0 for r in result.results)
    assert result.min <= result.median <= result.max


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"number": 0}, ValueError),
        ({"repeat": 0}, ValueError),
        ({"min_repeat_ms": -1}, ValueError),
        ({"repeats_to_cooldown": 0}, ValueError),
        ({"number": 1.5}, TypeError),
        ({"f_preproc": 3}, TypeError),
    ],
)
def test_argument_checks(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        cp.time_evaluator(lambda: None, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cp.time_evaluator(3)  # type: ignore[arg-type]
