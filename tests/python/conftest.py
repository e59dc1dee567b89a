"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cubepool

KIB = 1024
MIB = 1024 * KIB


def sliced(
    page: int, max_slice: int, cap: int | None = None, dealloc_period: int | None = None
) -> cubepool.MemoryPoolOptions:
    """A sliced pool's options."""
    return cubepool.MemoryPoolOptions(
        cubepool.PoolType.sliced_pages(page, max_slice, cap), dealloc_period
    )


def custom(*pools: cubepool.MemoryPoolOptions, alignment: int = 32) -> cubepool.MemoryManagement:
    """A MemoryManagement over a custom pool list."""
    return cubepool.MemoryManagement(
        cubepool.MemoryConfiguration.custom(list(pools)),
        cubepool.MemoryDeviceProperties(max_page_size=2**31, alignment=alignment),
    )


@pytest.fixture
def mm() -> cubepool.MemoryManagement:
    """A default MemoryManagement."""
    return cubepool.MemoryManagement()


@pytest.fixture(autouse=True)
def _no_configured_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps a CUBEPOOL_MEMORY_POOLS of the shell out of the tests' default layouts."""
    monkeypatch.delenv("CUBEPOOL_MEMORY_POOLS", raising=False)


def load_script(path: Path) -> ModuleType:
    """Imports a script (a benchmark's, say) by its path, as a module named after it."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@contextmanager
def running(command: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """A child process (text mode) that is killed and reaped where the test leaves it
    running, so that a failed assertion leaves no process behind."""
    process = subprocess.Popen(command, text=True, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
