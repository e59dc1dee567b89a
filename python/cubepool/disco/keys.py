"""How a session key reaches the workers ``mpiexec`` starts: as a file, never in its
environment.

``mpiexec`` (MPICH's hydra) hands its whole environment to the proxies that start the
ranks; across hosts each remote proxy connects back to a control port of mpiexec's,
which listens on every interface, and receives that environment there in clear text,
sent to whoever connects first. A key in the environment was readable on the network,
and with it anyone could pass as a worker and have the controller unpickle their
frames. So the key goes in a file only its owner can read, and the environment carries
the file's path (:data:`KEY_FILE_ENV`):

- a session on one host writes the key to a private temporary file
  (:class:`PrivateKeyFile`: a folder of mode 0700, a file of mode 0600), removed once
  every worker has connected;
- a session across hosts (``hostfile=``) reads it from a key file the user put at one
  path on every host (``key_file=``), as ``SocketSession``'s remote nodes read theirs
  (``--key-file``).

:func:`read_key_file` refuses a key file that others may read or write (as ``ssh``
refuses such a private key), and a worker takes its key with :func:`worker_key`, which
takes the variable out of its environment, so the processes it starts never inherit
it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile

from cubepool.disco.errors import FrameRejected
from cubepool.disco.wire import parse_key

#: The environment variable that names a worker's key file.
KEY_FILE_ENV = "CUBEPOOL_DISCO_KEY_FILE"

#: The environment variable of a key in hex: read by ``python -m cubepool.disco.remote``
#: and ``SocketSession`` when no key file is given; never passed to ``mpiexec``.
AUTHKEY_ENV = "CUBEPOOL_DISCO_AUTHKEY"


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """The key in file ``path`` (hex, as :func:`~cubepool.disco.wire.parse_key` reads
    it). ``FrameRejected`` naming the file when it cannot be read, holds no key, or is
    not a regular file of this process's user that only that user may read and write
    (mode 0600 or 0400): a file another user owns is a key that user knows and can
    change (ssh refuses such files too). Opened without blocking, so a FIFO in its
    place is refused, not waited on."""
    name = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        descriptor = os.open(name, flags)
        try:
            status = os.fstat(descriptor)
            if stat.S_ISDIR(status.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            _check_private(name, status)
            with os.fdopen(descriptor, encoding="ascii", closefd=False) as handle:
                text = handle.read(4096)
        finally:
            os.close(descriptor)
    except (OSError, UnicodeDecodeError) as exc:
        raise FrameRejected(f"cannot read key file {name}: {exc}") from None
    try:
        return parse_key(text.strip())
    except FrameRejected as exc:
        raise FrameRejected(f"key file {name}: {exc}") from None


def _check_private(name: str, status: os.stat_result) -> None:
    """Raises ``FrameRejected`` unless ``status`` is that of a regular file of this
    process's user that no one else may read or write (on POSIX)."""
    if not stat.S_ISREG(status.st_mode):
        raise FrameRejected(f"key file {name} is not a regular file")
    if os.name != "posix":
        return
    if status.st_mode & 0o077:
        raise FrameRejected(
            f"key file {name} may be read or written by others (mode "
            f"{stat.S_IMODE(status.st_mode):04o}): a session key is a secret (chmod 600 {name})"
        )
    if status.st_uid != os.geteuid():
        raise FrameRejected(
            f"key file {name} belongs to user {status.st_uid}, not to this process's user "
            f"{os.geteuid()}: its owner knows the key and can change it"
        )


def launch_environment(key_file: str) -> dict[str, str]:
    """The environment to start ``mpiexec`` with: this process's, with no key in it
    and :data:`KEY_FILE_ENV` naming ``key_file``."""
    env = {name: value for name, value in os.environ.items() if name != AUTHKEY_ENV}
    env[KEY_FILE_ENV] = key_file
    return env


def worker_key() -> bytes:
    """A worker's session key: from the file :data:`KEY_FILE_ENV` names, else (a worker
    started by hand) from :data:`AUTHKEY_ENV`. Both variables leave the environment."""
    path = os.environ.pop(KEY_FILE_ENV, None)
    text = os.environ.pop(AUTHKEY_ENV, None)
    if path is not None:
        return read_key_file(path)
    if text:
        return parse_key(text)
    raise FrameRejected(f"no session key: {KEY_FILE_ENV} (a key file) or {AUTHKEY_ENV} (hex)")


class PrivateKeyFile:
    """``key`` in a file of a new private folder (modes 0700 and 0600), until
    :meth:`remove`."""

    def __init__(self, key: bytes) -> None:
        self._folder: str | None = tempfile.mkdtemp(prefix="cubepool-disco-key-")
        self.path = os.path.join(self._folder, "key")
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(key.hex())

    def remove(self) -> None:
        """Removes the file and its folder (again: nothing)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
