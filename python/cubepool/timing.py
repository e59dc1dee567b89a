"""``time_evaluator``: TVM's ``WrapTimeEvaluator`` timing loop, in pure Python."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cubepool._errors import InvalidArgument

__all__ = ["BenchmarkResult", "time_evaluator"]

_GOLDEN_RATIO = 1.618


@dataclass(frozen=True)
class BenchmarkResult:
    """Timings of one ``time_evaluator`` run.

    ``results`` holds one entry per repeat: the mean seconds per call in that repeat.
    ``mean``, ``median``, ``std`` (population standard deviation), ``min`` and ``max``
    summarise them, in seconds.
    """

    results: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Mean seconds per call over the repeats."""
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        """Median seconds per call over the repeats."""
        return statistics.median(self.results)

    @property
    def std(self) -> float:
        """Population standard deviation of the repeats, in seconds."""
        return statistics.pstdev(self.results)

    @property
    def min(self) -> float:
        """Fastest repeat, in seconds per call."""
        return min(self.results)

    @property
    def max(self) -> float:
        """Slowest repeat, in seconds per call."""
        return max(self.results)

    def __str__(self) -> str:
        head = "Execution time summary:\n"
        cols = f"{'mean (ms)':^12} {'median (ms)':^12} {'max (ms)':^12} {'min (ms)':^12} "
        cols += f"{'std (ms)':^12}\n"
        vals = (self.mean, self.median, self.max, self.min, self.std)
        return head + cols + " ".join(f"{v * 1000:^12.4f}" for v in vals) + "\n"


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {value}")


def time_evaluator(
    f: Callable[..., Any],
    number: int = 10,
    repeat: int = 1,
    min_repeat_ms: int = 0,
    limit_zero_time_iterations: int = 100,
    cooldown_interval_ms: int = 0,
    repeats_to_cooldown: int = 1,
    cache_flush_bytes: int = 0,
    f_preproc: Callable[..., Any] | None = None,
) -> Callable[..., BenchmarkResult]:
    """Wrap ``f`` in a timer, as TVM's ``WrapTimeEvaluator`` does.

    The returned callable takes ``f``'s arguments. It calls ``f`` once to warm up (not
    timed), then for each of ``repeat`` rounds: calls ``f_preproc`` (with the same
    arguments) when given, touches ``cache_flush_bytes`` bytes to flush the CPU caches when
    positive, and times ``number`` calls. While a round lasts less than ``min_repeat_ms``
    and has not measured zero time ``limit_zero_time_iterations`` times, ``number`` grows to
    ``max(min_repeat_ms / (duration_ms / number) + 1, number * 1.618)`` and the round is
    timed again; the grown ``number`` carries over to later rounds. After round ``i``, when
    ``cooldown_interval_ms`` is positive and ``i % repeats_to_cooldown == 0``, it sleeps that
    long. The result holds the seconds per call of each round.
    """
    if not callable(f):
        raise TypeError("f must be callable")
    if f_preproc is not None and not callable(f_preproc):
        raise TypeError("f_preproc must be callable or None")
    _check_int("number", number, 1)
    _check_int("repeat", repeat, 1)
    _check_int("min_repeat_ms", min_repeat_ms, 0)
    _check_int("limit_zero_time_iterations", limit_zero_time_iterations, 0)
    _check_int("cooldown_interval_ms", cooldown_interval_ms, 0)
    _check_int("repeats_to_cooldown", repeats_to_cooldown, 1)
    _check_int("cache_flush_bytes", cache_flush_bytes, 0)

    def evaluator(*args: Any, **kwargs: Any) -> BenchmarkResult:
        n = number
        flush = bytearray(cache_flush_bytes) if cache_flush_bytes > 0 else None
        f(*args, **kwargs)  # warm-up, discarded
        results: list[float] = []
        for i in range(repeat):
            if f_preproc is not None:
                f_preproc(*args, **kwargs)
            if flush is not None:
                # Writing every cache line evicts f's data from the CPU caches.
                flush[::64] = bytes(len(range(0, len(flush), 64)))
            duration_ms = 0.0
            zero_times = 0
            while True:
                if duration_ms > 0.0:
                    n = int(max(min_repeat_ms / (duration_ms / n) + 1, n * _GOLDEN_RATIO))
                start = time.perf_counter_ns()
                for _ in range(n):
                    f(*args, **kwargs)
                elapsed_ns = time.perf_counter_ns() - start
                if elapsed_ns == 0:
                    zero_times += 1
                duration_ms = elapsed_ns / 1e6
                if not (duration_ms < min_repeat_ms and zero_times < limit_zero_time_iterations):
                    break
            results.append(duration_ms / 1e3 / n)
            if cooldown_interval_ms > 0 and i % repeats_to_cooldown == 0:
                time.sleep(cooldown_interval_ms / 1e3)
        return BenchmarkResult(tuple(results))

    return evaluator
