"""Small text helpers shared by the CLI and reports."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cubepool._terminal import name_cell

_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]

_PLACEHOLDERS = frozenset({"incomplete", "-", "n/a", ""})
"""Words that stand in a numeric column where a row has no figure."""


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``340.0 MiB``."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural but for one: ``"1 storage allocation"``,
    ``"3 storage allocations"``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def listed(items: Sequence[str], limit: int = 10) -> str:
    """``items`` for a message: the first ``limit`` joined with commas and, past them,
    how many more (``"cuda:0, ..., cuda:9 and 3 more"``); ``"none"`` for none. A trace
    or a file can name any number of devices, streams or phases: a message names a
    few."""
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    rest = len(items) - limit
    return f"{shown} and {rest:,} more" if rest > 0 else shown


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with right-aligned numeric columns, one line a row (a cell's
    newlines and tabs shown as ``\\n`` and ``\\t``, a cell past
    :data:`~cubepool._terminal.MAX_NAME_CHARS` characters cut as a long name is)."""
    cells = [[name_cell(str(h)) for h in headers]] + [
        [name_cell(str(c)) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    # A column of numbers stays right-aligned when some rows have a word in place of a
    # number (an incomplete replay's "incomplete"), so a row never moves the column.
    numeric = [
        any(_is_number(row[i]) for row in cells[1:])
        and all(_is_number(row[i]) or row[i] in _PLACEHOLDERS for row in cells[1:])
        for i in range(len(headers))
    ]

    def line(row: list[str]) -> str:
        parts = [
            cell.rjust(w) if num else cell.ljust(w)
            for cell, w, num in zip(row, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _is_number(text: str) -> bool:
    head = text.split(" ")[0].replace(",", "").rstrip("%x")
    try:
        float(head)
    except ValueError:
        return False
    return True


def unique_labels(labels: Sequence[str], fallbacks: Sequence[str]) -> list[str]:
    """``labels`` made unique, so that no two rows or columns merge: a label that
    another shares gives way to its fallback (the path given, where the label is a
    file's name or a trace's workload), and one still shared is numbered (``x #2``)."""
    shared = Counter(labels)
    chosen = [f if shared[x] > 1 else x for x, f in zip(labels, fallbacks, strict=True)]
    seen: Counter[str] = Counter()
    out = []
    for label in chosen:
        seen[label] += 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out
