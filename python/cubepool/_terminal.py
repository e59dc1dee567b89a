"""Text for a terminal: the control characters in what the command line prints, shown
as escapes instead of acted on.

A trace names its workload, its phases and its frames with any characters, and a trace
may come from anyone. Printed raw, an escape sequence in a name (ESC, or one of the C1
controls) is run by the terminal that shows it: it can clear the screen, set the
window's title, hide the text after it or, on some terminals, write the clipboard. The
``cubepool`` command writes its output through :class:`ShownControls`, which shows each
such character as ``\\x1b``-style text. A newline and a tab stay, and a carriage
return in the progress bar's own writes (:meth:`ShownControls.for_progress`); where a
name is printed within a line (a table's cell, the trace's line), :func:`one_line`
shows its newlines and tabs too.

A name may also be of any length (a v1 header holds up to 16 MiB): :func:`short_name`
cuts a name to be shown, the workload's, a phase's or a layout's, to
:data:`MAX_NAME_CHARS` characters, as a trace cuts its frames, once, before it reaches
a line of output, a picture's text or a page's data. A name of 10 MiB printed whole
made a line of 14 MB and a page of 36 MB, and its width measured a character at a time
took seconds; the trace itself keeps the name whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, TextIO

__all__ = ["MAX_NAME_CHARS", "ShownControls", "one_line", "short_name", "shown"]

_CONTROLS: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""The C0 controls but tab and newline, DEL and the C1 controls."""

_CONTROLS_BUT_RETURN: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
""":data:`_CONTROLS` less the carriage return."""


MAX_NAME_CHARS: Final = 240
"""The most characters of a name shown, as of a frame (``MAX_FRAME_CHARS`` in
``src/trace/stacks.rs``): room for a path and a function, or a sentence; a longer one
is cut in its middle, marked ``...``."""

NAME_TAIL_CHARS: Final = 80
"""Of a name cut, the characters kept from its end: what tells two long names apart is
as often at their end (``run_a/t.jsonl`` and ``run_b/t.jsonl``, a layout's last pool, the
``#2`` that makes a label unique) as at their start."""


def short_name(name: str) -> str:
    """``name`` as shown: whole where it has at most :data:`MAX_NAME_CHARS` characters,
    else its first ``MAX_NAME_CHARS - NAME_TAIL_CHARS``, ``...`` and its last
    :data:`NAME_TAIL_CHARS`."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return f"{name[: MAX_NAME_CHARS - NAME_TAIL_CHARS]}...{name[-NAME_TAIL_CHARS:]}"


def name_cell(name: str) -> str:
    """A name from a trace or a user as a table cell or a name in a line: cut
    (:func:`short_name`), then kept to one line (:func:`one_line`)."""
    return one_line(short_name(name))


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def shown(text: str, *, carriage_return: bool = False) -> str:
    """``text`` with every control character but newline and tab (and the carriage
    return where ``carriage_return``) written as ``\\xNN``."""
    pattern = _CONTROLS_BUT_RETURN if carriage_return else _CONTROLS
    return pattern.sub(_escape, text)


def one_line(text: str) -> str:
    """``text`` for one line of output, a table's cell or a name in a sentence: its
    newlines and tabs written as ``\\n`` and ``\\t``, so that a name from a trace
    cannot begin lines of its own, or move a table's columns."""
    return text.replace("\n", "\\n").replace("\t", "\\t")


class ShownControls:
    """A text stream that writes to ``stream`` what it is given as text (``write``,
    ``writelines``), its control characters shown (:func:`shown`); everything else
    (``flush``, ``isatty``, ``encoding``, ...) is ``stream``'s own, ``buffer`` too: bytes
    written there are not looked at (the command writes no bytes to its streams)."""

    def __init__(self, stream: TextIO, *, carriage_return: bool = False) -> None:
        self.stream = stream
        self._carriage_return = carriage_return

    def write(self, text: str) -> int:
        """Writes ``text``, its controls shown; returns ``len(text)``, as a text stream
        counts what it was given."""
        self.stream.write(shown(text, carriage_return=self._carriage_return))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Writes each of ``lines`` as :meth:`write` does."""
        for line in lines:
            self.write(line)

    def for_progress(self) -> ShownControls:
        """This stream for a progress bar, which draws with carriage returns: they are
        kept there and nowhere else. A carriage return in a trace's text, kept on stderr,
        let an error message quoting it write over its own line (the file's name and the
        problem hidden behind made-up text)."""
        return ShownControls(self.stream, carriage_return=True)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)
