"""Writing output files: checked before any work, written whole or not at all.

Every file cubepool writes (pictures, plan and layout files, placements, traces) goes
the same way: :func:`check_output_path` raises, before the work, the error writing would
raise at its end (a missing folder, a folder in the file's place, a folder that cannot
be written in), or refuses a path that names no file (empty) or a file that is not a
regular one (a device such as ``/dev/null``, a FIFO: the rename at the end would put a
regular file in its place), and :func:`atomic_path` has the file written under a temporary name
beside it, which replaces it only once complete. A failed write (a full disk) leaves
nothing under the name and raises an ``OSError`` that names the file, not the
temporary. The temporary is named as ``Trace.write`` names its own
(``.{name}.{pid}-{n}.{host}.tmp``, :func:`host_tag`; a name too long to carry all that
cut short, :func:`temporary_stem`), so that a save from Rust removes
what either left when killed on this host, and nothing another host writes in a shared
folder.
"""

from __future__ import annotations

import errno
import io
import itertools
import os
import re
import select
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "atomic_path",
    "check_output_path",
    "host_tag",
    "naming_reads",
    "non_regular",
    "open_regular",
    "printable_name",
    "temporary_stem",
    "write_text",
]

_SAVES = itertools.count()
"""A number per write, so that writes of one path never share a temporary file."""


def host_tag() -> str:
    """This host's name as temporary files carry it: the node name (what the Rust side
    reads from ``/proc/sys/kernel/hostname``) with every character but ASCII letters,
    digits, ``-`` and ``_`` replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", os.uname().nodename)


_NAME_MAX = 255
"""The most bytes of a file name (on Linux's and macOS's file systems)."""


def temporary_stem(name: str, host: str) -> str:
    """The part of a temporary's name (``.{stem}.{pid}-{n}.{host}.tmp``) that stands for
    the file ``name``: ``name`` itself, or, where a temporary of the longest pid (10
    digits) and count (20) would pass :data:`_NAME_MAX` bytes, its first characters
    that fit, so that a file of any legal name can be written. The Rust side cuts a
    name the same way (``temporary_stem`` in ``src/atomic_file.rs``), so that its saves
    still find and remove what killed writes of either left."""
    budget = _NAME_MAX - len(f"..{'9' * 10}-{'9' * 20}.{host}.tmp".encode())
    used = 0
    for index, character in enumerate(name):
        used += len(os.fsencode(character))
        if used > budget:
            return name[:index]
    return name


def _error(code: int, path: str | os.PathLike[str]) -> OSError:
    """The ``OSError`` of ``code`` for ``path``, as ``open()`` raises it."""
    return OSError(code, os.strerror(code), os.fspath(path))


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


@contextmanager
def naming_reads(path: str | os.PathLike[str]) -> Iterator[None]:
    """Names ``path`` in an ``OSError`` raised in the block that names no file: the
    error of a read (``EIO`` from a failing disk, a file of ``/proc``), unlike that of
    ``open()``, carries no file name, so the command line would say only "Input/output
    error". Errors without an ``errno`` (``gzip.BadGzipFile``, which readers tell as a
    format error) and errors naming a file already pass unchanged."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        # OSError(errno, ...) makes the subclass of errno (IsADirectoryError, ...).
        raise OSError(error.errno, error.strerror, os.fspath(path)) from error


def printable_name(path: str | os.PathLike[str]) -> str:
    """The last part of ``path`` as valid UTF-8 text: a file name's bytes that are not
    UTF-8 (the lone surrogates ``os.fsdecode`` makes of them) shown as U+FFFD, so that
    the name prints, encodes and goes into a trace's header anywhere."""
    return os.fsencode(Path(path).name).decode("utf-8", "replace")


def non_regular(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` names, in words (``"a directory"``, ``"a character device"``, ...),
    where it names something that is not a regular file (links followed); None where
    it names a regular file or nothing (no such file, or a name no file can have)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return _kind(mode)


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` is, in words, where it is not a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _refusal(kind: str, path: str | os.PathLike[str], what: str) -> OSError:
    """The error of an input ``path`` that is ``kind``, not a regular file:
    ``IsADirectoryError`` for a folder (saying it is no ``what``), an ``OSError`` of
    ``EINVAL`` saying what else it is."""
    if kind == "a directory":
        return IsADirectoryError(errno.EISDIR, f"a directory, not a {what}", os.fspath(path))
    return OSError(errno.EINVAL, f"{kind}, not a regular file", os.fspath(path))


WAITS: Final = "a stream that would keep a read waiting"
"""What a file is, in words, that stat calls a regular file but that has nothing to
read now and would keep a read waiting for more (``/proc/kmsg``, a tracing pipe): the
Rust side (``src/regular_file.rs``) says it so too."""


def _waits(fd: int) -> bool:
    """Whether a read of the open file ``fd`` would wait: it is not ready to read at
    once, as ``poll`` tells (which reads nothing: a file on disk is always ready, a
    stream of the kernel's ready only while it holds data)."""
    if not hasattr(select, "poll"):  # pragma: no cover - no poll (Windows)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return not poller.poll(0)


def refuse_non_regular(path: str | os.PathLike[str], what: str) -> None:
    """Refuses an input ``path`` that names something other than a regular file, before
    it is opened: a FIFO would block until a writer came (forever, for an input that
    never does), a device give nothing or never end (:func:`_refusal`'s errors); and
    a regular file by its kind that would keep a read waiting (:data:`WAITS`: opened
    without waiting to ask, nothing read); nothing for a file to read or a path that
    names nothing (opening it says so)."""
    kind = non_regular(path)
    if kind is not None:
        raise _refusal(kind, path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return  # opening it to read says why
    try:
        waits = _waits(fd)
    finally:
        os.close(fd)
    if waits:
        raise _refusal(WAITS, path, what)


class _NoWaitFile(io.FileIO):
    """A file opened without waiting whose reads do not wait either: a read that would
    (``None`` from :class:`io.FileIO`, where the file has nothing to read now) raises
    :func:`_refusal`'s error of :data:`WAITS` instead, naming the file."""

    def __init__(self, fd: int, path: str | os.PathLike[str], what: str) -> None:
        super().__init__(fd, "rb")
        self._path = path
        self._what = what

    def _refused(self) -> OSError:
        return _refusal(WAITS, self._path, self._what)

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        count = super().readinto(buffer)
        if count is None:
            raise self._refused()
        return count

    def read(self, size: int | None = -1, /) -> bytes:
        if size is None or size < 0:
            return self.readall()
        data = super().read(size)
        if data is None:
            raise self._refused()
        return data

    def readall(self) -> bytes:
        # FileIO's own returns what it read before a read that would wait, as if the
        # file ended there. The first read asks for what the file holds past here and a
        # byte more (as FileIO's own sizes its buffer), so a file on disk comes in one
        # read and one buffer: joining a single chunk returns it as it is.
        try:
            left = max(0, os.fstat(self.fileno()).st_size - self.tell())
        except OSError:
            left = 0
        chunks = []
        size = max(left + 1, _READ_CHUNK)
        while chunk := self.read(size):
            chunks.append(chunk)
            size = _READ_CHUNK
        return b"".join(chunks)


_READ_CHUNK: Final = 1 << 16
"""The bytes :meth:`_NoWaitFile.readall` asks for at a time."""


def open_regular(path: str | os.PathLike[str], what: str) -> io.BufferedReader:
    """``path`` opened to read once the open file is known to be a regular one: opened
    without waiting (a FIFO's open waits for a writer, and one may take the place of a
    file checked before) and refused as :func:`refuse_non_regular` refuses. Its reads do
    not wait either: a file on disk never makes one (Linux and macOS take no notice of
    the flag for it), and a stream with nothing left to read (``/proc/kmsg`` once read
    to its end) is refused at that read, not waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is None and _waits(fd):
            kind = WAITS
        if kind is not None:
            raise _refusal(kind, path, what)
        return io.BufferedReader(_NoWaitFile(fd, path, what))
    except BaseException:
        os.close(fd)
        raise


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a :class:`Path`, once it is known that a file can be written there:
    it is not empty, its folder exists, is a folder and may be written in, and ``path``
    is no folder and no other file that is not a regular one (a device, a FIFO, a
    socket: the temporary renamed over it at the end would take its place).

    Raises:
        OSError: the error writing ``path`` would raise (``FileNotFoundError``,
            ``NotADirectoryError``, ``IsADirectoryError``, ``PermissionError``), naming
            ``path``; ``FileNotFoundError`` for an empty path; an ``OSError`` of
            ``EINVAL`` for a device, a FIFO or a socket, saying which.
    """
    if not os.fspath(path):
        raise FileNotFoundError(errno.ENOENT, "an empty path names no file", "")
    target = Path(path)
    folder = target.parent
    if os.fspath(path).endswith((os.sep, "/")):
        # A name ending in a separator is a folder's, as open() takes it (Path drops it).
        raise _error(errno.EISDIR, path)
    if not folder.exists():
        raise _error(errno.ENOENT, path)
    if not folder.is_dir():
        raise _error(errno.ENOTDIR, path)
    if target.is_dir():
        raise _error(errno.EISDIR, path)
    kind = non_regular(target)
    if kind is not None:
        raise OSError(errno.EINVAL, f"{kind}, not a regular file", os.fspath(path))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _error(errno.EROFS if _read_only(folder) else errno.EACCES, path)
    return target


def _read_only(folder: Path) -> bool:
    """Whether ``folder`` is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # pragma: no cover - no statvfs
        return False


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` (created, empty) for the caller to write; it
    replaces ``path`` when the block ends without an error. On an error the temporary
    is removed and ``path`` is left as it was; an ``OSError`` of the temporary (or of
    no file) is raised again naming ``path``, any other error as it is."""
    target = Path(path)
    host = host_tag()
    stem = temporary_stem(target.name, host)
    temporary = target.with_name(f".{stem}.{os.getpid()}-{next(_SAVES)}.{host}.tmp")
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        try:
            yield temporary
            _sync(temporary)
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as error:
        if error.filename not in (None, os.fspath(temporary)):
            raise  # another file's (an input the block reads)
        if error.errno is None:
            raise OSError(f"{os.fspath(path)}: {error}") from error
        raise OSError(error.errno, error.strerror, os.fspath(path)) from error


def _sync(path: Path) -> None:
    """Puts ``path``'s bytes on the disk, so that a full disk fails here, not later."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Writes ``text`` (UTF-8) to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
