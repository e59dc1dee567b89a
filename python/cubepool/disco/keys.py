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
  (``--key-file``);
- a ``SocketSession`` whose nodes all run on this host (an IPv4 loopback address) and
  that was given no key makes one and, once it holds its port, writes it to
  :func:`loopback_key_path` of the port, in a folder only its user may enter
  (:func:`loopback_key_folder`; every step after the folder's check goes through its
  descriptor), where a node started with no key for the same loopback address and port
  reads it (:func:`read_loopback_key`), so
  TVM's ``SocketSession(num_nodes, workers, groups, "localhost", port)`` and its
  ``HOST PORT N`` nodes run as TVM's tests start them. The file goes once every node is
  in. The key is then as safe as the user's other files: any process of the same user
  could read it, as it could read the controller's memory.

:func:`read_key_file` refuses a key file that others may read or write, a link, and
one in a folder others may write (as ``ssh`` refuses such a private key), and a worker
takes its key with :func:`worker_key`, which takes the variable out of its
environment, so the processes it starts never inherit it.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import shutil
import socket
import stat
import tempfile
import time

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
    place is refused, not waited on.

    As ssh's ``StrictModes``: ``path`` must name the file itself, not a symbolic link
    (opened with ``O_NOFOLLOW``; whoever may change a link chooses the key), and every
    folder above the file (links resolved) must belong to this user or root and be
    writable by no one else, unless sticky (:func:`_check_folders`): in a folder others
    may write, another user could put a file of theirs in the key's place."""
    name = os.fspath(path)
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOCTTY", 0)
        | getattr(os, "O_NOFOLLOW", 0)
    )
    try:
        try:
            descriptor = os.open(name, flags)
        except OSError as exc:
            # O_NOFOLLOW on a link: ELOOP (Linux, macOS), EMLINK (FreeBSD).
            if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(name):
                raise FrameRejected(
                    f"key file {name} is a symbolic link: give the file itself (whoever "
                    "may change a link chooses the key)"
                ) from None
            raise
        try:
            status = os.fstat(descriptor)
            if stat.S_ISDIR(status.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            _check_private(name, status)
            _check_folders(name)
            with os.fdopen(descriptor, encoding="ascii", closefd=False) as handle:
                text = handle.read(4096)
        finally:
            os.close(descriptor)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # ValueError: a name no file can have (an embedded NUL byte).
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


def _check_folders(name: str) -> None:
    """Raises ``FrameRejected`` unless every folder above the file ``name`` (its folder
    with links resolved, up to ``/``) belongs to this process's user or root, and none
    may be written by its group or others unless it is sticky (``/tmp``: there no one
    may rename or remove another's file): ssh's ``StrictModes`` for a private key. Each
    refusal names the key file, the folder and what is wrong (on POSIX only)."""
    if os.name != "posix":
        return
    # The file's own path resolved first: `link/../key` is where the kernel finds it
    # (through the link), not the folder `abspath` would make of it as text.
    _check_folder_chain(name, os.path.dirname(os.path.realpath(name)))


def _check_folder_chain(name: str, folder: str) -> None:
    """:func:`_check_folders` from ``folder`` (links resolved) up to ``/``, naming the
    key file ``name`` in its refusals."""
    user = os.geteuid()
    while True:
        try:
            status = os.stat(folder)
        except OSError as exc:
            raise FrameRejected(
                f"key file {name}: cannot check its folder {folder}: {exc}"
            ) from None
        mode = stat.S_IMODE(status.st_mode)
        if status.st_uid not in (user, 0):
            raise FrameRejected(
                f"key file {name} is in folder {folder} of user {status.st_uid}, neither this "
                f"process's user {user} nor root: its owner could put another key in its place"
            )
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise FrameRejected(
                f"key file {name} is in folder {folder}, which others may write (mode "
                f"{mode:04o}, not sticky): another user could put a key of theirs in its "
                f"place (chmod go-w {folder})"
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def launch_environment(key_file: str) -> dict[str, str]:
    """The environment to start ``mpiexec`` with: this process's, with no key in it
    and :data:`KEY_FILE_ENV` naming ``key_file``."""
    env = {name: value for name, value in os.environ.items() if name != AUTHKEY_ENV}
    env[KEY_FILE_ENV] = key_file
    return env


class NoSessionKey(FrameRejected):
    """No key was given, and none can be found where one would be left."""


def worker_key() -> bytes:
    """A worker's session key: from the file :data:`KEY_FILE_ENV` names, else (a worker
    started by hand) from :data:`AUTHKEY_ENV`. Both variables leave the environment."""
    path = os.environ.pop(KEY_FILE_ENV, None)
    text = os.environ.pop(AUTHKEY_ENV, None)
    if path is not None:
        return read_key_file(path)
    if text:
        return parse_key(text)
    raise NoSessionKey(f"no session key: {KEY_FILE_ENV} (a key file) or {AUTHKEY_ENV} (hex)")


def _private_base() -> str:
    """A folder to make a private key folder in whose folders pass :func:`_check_folders`
    (the workers check the session's key as any key): the temporary folder, else
    ``$XDG_RUNTIME_DIR``, else the home folder. A ``$TMPDIR`` that its group may write
    (a shared project folder) would have the session's own workers refuse its key.

    Raises:
        FrameRejected: none of them passes, each refusal named.
    """
    candidates = [tempfile.gettempdir(), os.environ.get("XDG_RUNTIME_DIR"), os.path.expanduser("~")]
    refusals = []
    for base in candidates:
        if not base or not os.path.isdir(base):
            continue
        try:
            # The folder itself, links resolved: not through a name in it, which anyone
            # who may write there could make a link elsewhere.
            if os.name == "posix":
                _check_folder_chain(os.path.join(base, "key"), os.path.realpath(base))
        except FrameRejected as exc:
            refusals.append(str(exc))
            continue
        return base
    raise FrameRejected(
        "no folder to keep the session's key in that others cannot write: " + "; ".join(refusals)
    )


class PrivateKeyFile:
    """``key`` in a file of a new private folder (modes 0700 and 0600), until
    :meth:`remove`; the folder is made where the folders above it pass the checks every
    reader of a key file makes (:func:`_private_base`)."""

    def __init__(self, key: bytes) -> None:
        self._folder: str | None = tempfile.mkdtemp(
            prefix="cubepool-disco-key-", dir=_private_base()
        )
        self.path = os.path.join(self._folder, "key")
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(key.hex())

    def remove(self) -> None:
        """Removes the file and its folder (again: nothing)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


#: The environment variable of the folder where loopback sessions leave their keys
#: (default: ``$XDG_RUNTIME_DIR/cubepool-disco`` where that folder is the user's own, mode
#: 0700, as the XDG spec has it, else ``~/.cache/cubepool-disco``).
LOOPBACK_KEYS_ENV = "CUBEPOOL_DISCO_LOOPBACK_KEYS"


def loopback_address(host: str) -> str | None:
    """The IPv4 address ``host`` names, as a ``SocketSession`` listens on it (its
    listener is IPv4), if it is a loopback one; else None (a name that does not resolve
    too). Resolved once, so that the check and the connection use the same address."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    address = str(infos[0][4][0]) if infos else None
    return address if address and ipaddress.ip_address(address).is_loopback else None


def _private_runtime_dir() -> str | None:
    """``$XDG_RUNTIME_DIR`` where it is a directory of this user's that only it may
    enter, else None (a variable kept across ``su`` names another user's)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime:
        return None
    try:
        status = os.lstat(runtime)
    except OSError:
        return None
    private = stat.S_ISDIR(status.st_mode) and not status.st_mode & 0o077
    return runtime if private and status.st_uid == os.geteuid() else None


def _open_key_folder() -> tuple[int, str]:
    """A descriptor of this user's loopback key folder, made (mode 0700) if missing, and
    its path. Everything after goes through the descriptor (``dir_fd``), so the folder
    checked is the folder used. ``FrameRejected`` unless it is a directory (not a link)
    of this user's that only it may enter."""
    base = os.environ.get(LOOPBACK_KEYS_ENV)
    if not base:
        runtime = _private_runtime_dir()
        base = (
            os.path.join(runtime, "cubepool-disco")
            if runtime
            else os.path.join(os.path.expanduser("~"), ".cache", "cubepool-disco")
        )
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        descriptor = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise FrameRejected(f"cannot open the loopback key folder {base}: {exc}") from None
    status = os.fstat(descriptor)
    if status.st_uid != os.geteuid() or status.st_mode & 0o077:
        os.close(descriptor)
        raise FrameRejected(
            f"the loopback key folder {base} belongs to user {status.st_uid} or others may "
            f"enter it (mode {stat.S_IMODE(status.st_mode):04o}): refused"
        )
    if status.st_mode & 0o700 != 0o700:
        os.fchmod(descriptor, 0o700)  # a umask took the user's own rights
    return descriptor, base


def loopback_key_folder() -> str:
    """The folder of this user's loopback session keys (made, mode 0700, if missing;
    see :func:`_open_key_folder` for what is refused)."""
    descriptor, base = _open_key_folder()
    os.close(descriptor)
    return base


def _key_name(port: int) -> str:
    return f"socket-{port}.key"


def loopback_key_path(port: int) -> str:
    """Where a loopback ``SocketSession`` on ``port`` leaves its key."""
    return os.path.join(loopback_key_folder(), _key_name(port))


def _read_in(folder: int, name: str, where: str) -> bytes | None:
    """The key in ``name`` of ``folder`` (a private regular file of this user's, see
    :func:`read_key_file`), or None when there is none."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_NOCTTY", 0)
    try:
        descriptor = os.open(name, flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FrameRejected(f"cannot read key file {where}: {exc}") from None
    try:
        _check_private(where, os.fstat(descriptor))
        text = os.read(descriptor, 4096).decode("ascii", "replace")
    finally:
        os.close(descriptor)
    try:
        return parse_key(text.strip())
    except FrameRejected as exc:
        raise FrameRejected(f"key file {where}: {exc}") from None


class LoopbackKey:
    """``key`` at :func:`loopback_key_path` of ``port`` (mode 0600, replacing a file a
    session that died left there), until :meth:`remove`."""

    def __init__(self, port: int, key: bytes) -> None:
        self._folder, base = _open_key_folder()
        self._name = _key_name(port)
        self.path = os.path.join(base, self._name)
        self._key = key
        partial = f"{self._name}.{os.getpid()}.{os.urandom(4).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            descriptor = os.open(partial, flags, 0o600, dir_fd=self._folder)
            try:
                os.write(descriptor, key.hex().encode("ascii"))
            finally:
                os.close(descriptor)
            os.replace(partial, self._name, src_dir_fd=self._folder, dst_dir_fd=self._folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial, dir_fd=self._folder)
            os.close(self._folder)
            raise

    def remove(self) -> None:
        """Removes the file if it still holds this key (again: nothing)."""
        if self._folder < 0:
            return
        try:
            if _read_in(self._folder, self._name, self.path) == self._key:
                os.unlink(self._name, dir_fd=self._folder)
        except (OSError, FrameRejected):
            pass
        finally:
            os.close(self._folder)
            self._folder = -1


def read_loopback_key(port: int, timeout: float) -> bytes:
    """The key a loopback ``SocketSession`` on ``port`` left (:class:`LoopbackKey`),
    waiting up to ``timeout`` seconds for it to appear; ``FrameRejected`` when it does
    not, or is not a private regular file of this user's."""
    folder, base = _open_key_folder()
    where = os.path.join(base, _key_name(port))
    deadline = time.monotonic() + timeout
    try:
        while (key := _read_in(folder, _key_name(port), where)) is None:
            if time.monotonic() >= deadline:
                raise NoSessionKey(
                    f"no session key: no loopback session on port {port} left one at "
                    f"{where} within {timeout} s; set {AUTHKEY_ENV} (hex) or pass --key-file"
                )
            time.sleep(0.05)
    finally:
        os.close(folder)
    return key
