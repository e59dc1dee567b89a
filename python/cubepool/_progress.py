"""Progress of long runs (plans, sweeps): a one-line bar on stderr, and the rule that
turns a ``progress`` argument into a callback."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO, cast

from cubepool._terminal import ShownControls

__all__ = ["Progress", "ProgressBar", "progress_callback"]

Progress = Callable[[int, int, str], None]
"""Called as ``progress(done, total, stage)`` while a long run goes on."""


class ProgressBar:
    """A one-line progress bar on stderr, drawn only where stderr is a terminal (or when
    forced), so logs and pipes stay clean. Plain text: no dependency is worth it."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        # A closed stderr (None) shows nothing.
        target = stream if stream is not None else sys.stderr
        if isinstance(target, ShownControls):
            # The command's stderr shows carriage returns as text but for the bar's.
            target = cast("TextIO", target.for_progress())
        self.stream: TextIO | None = target
        if self.stream is None:
            self.enabled = False
        else:
            self.enabled = self.stream.isatty() if enabled is None else enabled
        self._shown: tuple[str, int] | None = None
        self._started = time.perf_counter()

    def __call__(self, done: int, total: int, stage: str) -> None:
        """Show ``done`` of ``total`` for ``stage``."""
        if not self.enabled or total <= 0:
            return
        percent = 100 * done // total
        if self._shown == (stage, percent) and done != total:
            return
        self._shown = (stage, percent)
        width = 28
        filled = width * done // total
        elapsed = time.perf_counter() - self._started
        stream = self.stream
        if stream is None:
            return
        try:
            stream.write(
                f"\r{stage:<18} [{'#' * filled}{'.' * (width - filled)}] "
                f"{done:,}/{total:,} {elapsed:5.1f}s"
            )
            if done == total:
                stream.write("\n")
            stream.flush()
        except OSError:
            # A bar that cannot be drawn (stderr on a full disk) stops, and the run goes
            # on: its results are on stdout.
            self.enabled = False


def progress_callback(progress: Progress | bool | None) -> Progress | None:
    """The callback a ``progress`` argument means: ``True`` a :class:`ProgressBar` on
    stderr (drawn even when stderr is no terminal), ``False`` or ``None`` nothing, a
    callable itself. Anything else is a ``TypeError`` naming ``progress``, before any
    work is done (it was called, and failed, only once the first wave had run)."""
    if progress is True:
        return ProgressBar(enabled=True)
    if progress is False or progress is None:
        return None
    if not callable(progress):
        raise TypeError(
            "progress must be True, False, None or a callable (stage, done, total), "
            f"got {type(progress).__name__}"
        )
    return progress
