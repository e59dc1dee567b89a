"""Telling a trace file's format from its content, and reading it through gzip."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from typing import Final

from cubepool._errors import TraceFormatError
from cubepool._files import naming_reads, open_regular
from cubepool.importers._values import StrPath
from cubepool.importers.limits import Limits
from cubepool.importers.records import Format

GZIP_MAGIC: Final = b"\x1f\x8b"
"""The first bytes of a gzip file."""
DECOMPRESS_ERRORS: Final = (gzip.BadGzipFile, EOFError, zlib.error)
"""What reading corrupt or truncated gzip data raises."""
_SNIFF_BYTES: Final = 1 << 20
_V1_START: Final = re.compile(rb'\{\s*"format"\s*:\s*"cubepool-trace"')
"""How every header line cubepool writes starts: its first field names the format."""
_RMM_HEADER: Final = ["thread", "time", "action", "pointer", "size", "stream"]


@contextlib.contextmanager
def decompressed(path: StrPath) -> Iterator[io.BufferedIOBase]:
    """The file's bytes, seen through gzip when it starts with the gzip magic; a read
    that fails in the block raises an ``OSError`` naming ``path``. Only a regular file is
    read, and no read waits (:func:`cubepool._files.open_regular`: a device, a FIFO or
    a stream such as ``/proc/kmsg`` is refused, not waited on)."""
    with naming_reads(path), open_regular(path, "trace file") as raw:
        magic = raw.read(2)
        raw.seek(0)
        if magic == GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz
        else:
            yield raw


_READ_CHUNK: Final = 1 << 24
"""The most bytes :func:`read_document` asks for at a time."""


def _read_at_most(f: io.BufferedIOBase, size: int) -> bytes:
    """Up to ``size`` bytes of ``f``, read a chunk at a time: ``f.read(size)`` sets
    ``size`` bytes aside before it reads any, so a bound raised past the memory there is
    would fail the read of every file, however small."""
    out = io.BytesIO()
    while out.tell() < size:
        chunk = f.read(min(_READ_CHUNK, size - out.tell()))
        if not chunk:
            break
        out.write(chunk)
    return out.getvalue()


def read_document(path: StrPath, limits: Limits) -> bytes:
    """The whole (decompressed) file, refused past ``limits.max_bytes``."""
    max_bytes = limits.max_bytes
    try:
        with decompressed(path) as f:
            data = f.read() if max_bytes is None else _read_at_most(f, max_bytes + 1)
    except DECOMPRESS_ERRORS as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data: {exc}", path) from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise limits.too_large()
    return data


def detect_format(path: StrPath) -> Format:
    """Tell the format of a trace file from its content, not its name.

    Gzip is seen through by its magic bytes. A pickle (protocol 2-5) is a PyTorch memory
    snapshot; JSON whose first line is a header with ``"format": "cubepool-trace"`` is
    cubepool trace v1; JSON with a ``"traceEvents"`` key (or a top-level array, the other
    chrome trace form) is a profiler trace; CSV with the header
    ``Thread,Time,Action,Pointer,Size,Stream`` is an RMM log.

    Args:
        path: the file.

    Returns:
        One of ``"cubepool"``, ``"torch-profiler"``, ``"torch-snapshot"``, ``"rmm-csv"``.

    Raises:
        TraceFormatError: the file is empty, corrupt gzip, or of no known format.
        OSError: the file cannot be read.
    """
    try:
        with decompressed(path) as f:
            prefix = f.read(_SNIFF_BYTES)
            complete = len(prefix) < _SNIFF_BYTES or not f.read(1)
    except DECOMPRESS_ERRORS as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data: {exc}", path) from exc
    return sniff(prefix, complete, path)


def sniff(prefix: bytes, complete: bool, path: StrPath) -> Format:
    """The format of a file that starts with ``prefix`` (all of it when ``complete``)."""
    if not prefix:
        raise TraceFormatError("empty file", path)
    if prefix[0] == 0x80 and len(prefix) >= 2 and 2 <= prefix[1] <= 5:
        return "torch-snapshot"
    text = prefix.removeprefix(b"\xef\xbb\xbf").lstrip()
    if text[:1] in (b"{", b"["):
        first_line, newline, _ = text.partition(b"\n")
        if newline or complete:
            try:
                head = json.loads(first_line)
            except (ValueError, RecursionError):
                head = None
            if isinstance(head, dict):
                if head.get("format") == "cubepool-trace":
                    return "cubepool"
                if "traceEvents" in head:
                    return "torch-profiler"
        elif _V1_START.match(text):
            # A header line longer than the prefix (many phases): cubepool writes
            # "format" first, which names it; the Rust reader checks the rest.
            return "cubepool"
        if text[:1] == b"[" or re.search(rb'"traceEvents"\s*:', text):
            return "torch-profiler"
        raise TraceFormatError(
            "JSON that is neither cubepool trace v1 (a first-line header with "
            '"format": "cubepool-trace") nor a chrome trace (no "traceEvents" key '
            "in the first MiB)",
            path,
        )
    first = text.partition(b"\n")[0].decode("utf-8", "replace")
    if [c.strip().lower() for c in first.split(",")][:6] == _RMM_HEADER:
        return "rmm-csv"
    raise TraceFormatError(
        "unknown trace format: expected cubepool trace v1 (JSON Lines), a PyTorch profiler "
        "chrome trace (JSON), a PyTorch CUDA memory snapshot (pickle) or an RMM log (CSV "
        "with the header Thread,Time,Action,Pointer,Size,Stream), optionally gzip-compressed",
        path,
    )
