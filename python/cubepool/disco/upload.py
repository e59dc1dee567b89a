"""Files the controller sends its workers: TVM's ``upload_vm_module`` and the worker's
``runtime.disco.upload_module``.

``Session.upload_vm_module(path)`` reads a file on the controller and sends its bytes to
every worker, which writes them at the same ``path`` relative to its own working
directory (TVM's: no shared file system or ``scp`` is needed). The controller is trusted
(its frames are authenticated), yet what a worker writes stays under its working
directory: :func:`relative_parts` refuses an absolute path and a ``..`` that would climb
out of it, and :func:`write_under_cwd` follows no symbolic link on the way (each folder is
opened with ``O_NOFOLLOW`` through the one before it), makes the missing folders, and
writes the file whole or not at all (a temporary beside it, synced, then renamed over
it). No size is bounded here beyond what a frame takes (the receiver's memory).
"""

from __future__ import annotations

import errno
import itertools
import os
from typing import Any

from cubepool._errors import InvalidArgument
from cubepool._files import host_tag, temporary_stem
from cubepool.disco.registry import register_func

_WRITES = itertools.count()
"""A number per write, so that writes of one path (threads of one process) never share
a temporary file."""


def relative_parts(path: object, name: str = "path") -> list[str]:
    """The folders and file name of ``path`` (``/``-separated, relative), with ``.``
    and empty parts dropped and each ``..`` taking back the part before it.

    Raises ``InvalidArgument`` naming ``name`` for a path that is not a ``str``, is
    empty, holds a NUL, is absolute (or, on Windows, has a drive), ends in a separator
    (a folder's name), names no file (``.``), or climbs out of the folder it is relative
    to (a ``..`` with no part before it)."""
    if not isinstance(path, str):
        raise InvalidArgument(f"{name} must be a str, got {type(path).__name__}")
    if not path or "\0" in path:
        raise InvalidArgument(f"{name} must be a non-empty path without NUL, got {path!r}")
    text = path.replace(os.sep, "/") if os.sep != "/" else path
    if text.startswith("/") or os.path.splitdrive(path)[0]:
        raise InvalidArgument(
            f"{name} {path!r} is absolute: a worker writes only under its working "
            "directory (give the path relative to it)"
        )
    if text.endswith("/"):
        raise InvalidArgument(f"{name} {path!r} names a folder, not a file")
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise InvalidArgument(
                    f"{name} {path!r} climbs out of the working directory with '..': a "
                    "worker writes only under it"
                )
            parts.pop()
        else:
            parts.append(part)
    if not parts:
        raise InvalidArgument(f"{name} {path!r} names the working directory, not a file")
    return parts


def _open_folder(name: str, parent: int, path: str) -> int:
    """A descriptor of folder ``name`` in ``parent``, made if missing; no link followed."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        pass
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InvalidArgument(
                f"cannot write {path!r}: its folder {name!r} is a symbolic link or not a "
                "folder (a worker follows no link out of its working directory)"
            ) from None
        raise OSError(exc.errno, exc.strerror, path) from None


def write_under_cwd(path: str, data: Any) -> None:
    """Write the bytes of ``data`` (bytes-like) to ``path``, relative to this process's
    working directory (checked by :func:`relative_parts`), whole or not at all.

    Missing folders are made; a folder on the way that is a symbolic link is refused
    (``InvalidArgument``). The bytes go to a temporary beside the file
    (``.{name}.{pid}-{n}.{host}.tmp``, as cubepool names its temporaries), synced, then
    renamed over ``path`` (a link there is replaced, not followed); on any failure the
    temporary is removed and ``path`` is left as it was. ``OSError`` names ``path``."""
    parts = relative_parts(path)
    view = memoryview(data).cast("B")
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    folder = os.open(".", flags)
    try:
        for part in parts[:-1]:
            inner = _open_folder(part, folder, path)
            os.close(folder)
            folder = inner
        target = parts[-1]
        host = host_tag()
        temporary = f".{temporary_stem(target, host)}.{os.getpid()}-{next(_WRITES)}.{host}.tmp"
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        created = False
        try:
            descriptor = os.open(temporary, create, 0o666, dir_fd=folder)
            created = True
            try:
                written = 0
                while written < len(view):
                    written += os.write(descriptor, view[written:])
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(temporary, target, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException as exc:
            if created:
                try:
                    os.unlink(temporary, dir_fd=folder)
                except OSError:
                    pass
            if isinstance(exc, OSError) and exc.errno is not None:
                raise OSError(exc.errno, exc.strerror, path) from None
            raise
    finally:
        os.close(folder)


@register_func("runtime.disco.upload_module")
def upload_module(blob: Any, path: str) -> None:
    """TVM's worker side of ``Session.upload_vm_module``: write ``blob`` (the file's
    bytes) at ``path`` relative to this worker's working directory
    (:func:`write_under_cwd`: no absolute path, no ``..`` out of it, no link followed,
    written whole or not at all)."""
    write_under_cwd(path, blob)
