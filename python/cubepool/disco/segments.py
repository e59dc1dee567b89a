"""The MPI shared-memory files of a session's ranks, removed when the ranks cannot.

MPICH's ranks on one host share a file in ``/dev/shm`` (``mpich_shm_*``), which
``MPI_Finalize`` removes. A rank that is killed or ends with ``os._exit`` (a forced
close: a session collected unclosed, a timeout, a worker that died and took the others
with it, a controller that is gone) never finalizes, and the file, 1 to 4 MiB, stayed
until the machine restarted: hundreds of them piled up under a day of test runs.

Whoever starts an ``mpiexec`` (a session's controller for node 0, a remote node for its
own workers) keeps an :class:`MPISegments` and removes those files once its ranks have
stopped. It learns them two ways, both facts about this launch, never a guess by name:

* **The ranks' records.** The launcher makes a private folder (mode 0700) and names it
  to the ranks in :data:`RECORDS_ENV`; right after ``MPI_Init`` (where MPICH makes the
  file of the host's ranks) each rank writes the files it maps (its own
  ``/proc/self/maps``) there (:func:`record_segments`). A record outlives its rank: a
  worker killed at once (the remote node of a session looked at ``/proc`` too late, and
  its file stayed behind every time) is covered as well as one killed later. The
  launcher reads the records and removes the folder once all its ranks have recorded
  (:meth:`MPISegments.collect`), so that only a launcher killed during the start leaves
  it behind.
* **A last look.** At the close, before the ranks are stopped, the ``/proc/PID/maps`` of
  the processes beneath ``mpiexec``, while it still runs: files made after a record,
  and ranks that had not recorded yet (a start that failed while they were in
  ``MPI_Init``). Once ``mpiexec`` has ended (a remote node reaps it within a fifth of a
  second), a rank killed between ``MPI_Init`` and its record leaves its file: a narrow
  window, not covered.

Invariants of :meth:`MPISegments.remove`, so that another job's file is never removed:

* a path is only ever one under ``/dev/shm`` itself, whose name starts with
  :data:`MPI_SEGMENT_PREFIXES` (a record naming anything else is ignored);
* it is removed only while it is a regular file owned by this user and still the very
  file noted (same device and inode: one that finalize removed and another job made
  again under the same name is left alone);
* only while no live process maps it other than this launch's ranks (those that
  recorded, and those of the last look): the ranks of another job attach only to the
  files of their own job;
* a record's pid is taken as one of this launch's ranks (only this user can write
  the folder: a record is a statement of this user's own processes);
* a record is read only from the launcher's own private folder, only if it is a small
  regular file of this user, only if it was written on this boot of this machine (the
  folder may be on a file system other hosts share), and only as the JSON it must be.

Linux only (``/proc``); elsewhere nothing is recorded or noted, and nothing removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from typing import Any

#: Where Linux keeps POSIX shared memory (``shm_open``'s files).
_SHM_DIR = "/dev/shm/"
#: Name prefixes of the shared-memory files an MPI library makes there for the ranks of
#: one host (MPICH's ``mpich_shm_*``): only these are ever removed, never a file of the
#: user's own code.
MPI_SEGMENT_PREFIXES = ("mpich_shm_",)
#: The environment variable that names the launcher's private folder of records to its
#: ranks (it leaves a rank's environment once read).
RECORDS_ENV = "CUBEPOOL_DISCO_SEGMENT_RECORDS"
#: The largest record read, in bytes (one holds a few paths).
_RECORD_LIMIT = 1 << 16
#: The characters of a name :func:`_is_segment_path` takes (MPICH's are
#: ``mpich_shm_<hex>_<n>``): no ``/``, no space (``PATH (deleted)`` in the maps).
_SEGMENT_NAME = re.compile(r"[A-Za-z0-9_.-]+")
#: This boot of this machine, as Linux names it.
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

#: A noted file: its path, device and inode.
_File = tuple[str, int, int]


class MPISegments:
    """The MPI shared-memory files in ``/dev/shm`` of the processes under one
    ``mpiexec``, to remove once they are gone (see the module).

    ``launcher`` is that ``mpiexec``: its ``Popen`` or a pid (0: none yet; see
    :meth:`watch`). Use: :meth:`environment` for ``mpiexec``'s environment (makes the
    folder of records), :meth:`watch` the ``mpiexec`` started, :meth:`collect` once its
    ranks have recorded (the folder goes), :meth:`note` before its processes are
    stopped, :meth:`remove` after (which reads any records left and removes the folder,
    if still there).
    """

    def __init__(self, launcher: subprocess.Popen[Any] | int = 0) -> None:
        self._launcher = launcher
        #: The files noted: from the ranks' records and the looks at ``/proc``.
        self._files: set[_File] = set()
        #: The pids of this launch's ranks (as recorded or seen beneath the launcher):
        #: their mappings do not keep a file from removal.
        self._ranks: set[int] = set()
        #: The private folder of the ranks' records, from :meth:`environment` until
        #: :meth:`collect` or :meth:`remove`.
        self._folder: str | None = None
        #: The names of the records read (a record is whole once named: never rewritten).
        self._read: set[str] = set()

    def environment(self) -> dict[str, str]:
        """The variables to start ``mpiexec`` with so that its ranks record their files:
        :data:`RECORDS_ENV` naming a new private folder (made on the first call; none
        where there is no ``/proc`` to record from)."""
        if self._folder is None:
            if not os.path.exists("/proc/self/maps"):
                return {}
            self._folder = tempfile.mkdtemp(prefix="cubepool-disco-shm-")
        return {RECORDS_ENV: self._folder}

    def watch(self, launcher: subprocess.Popen[Any] | int) -> None:
        """The ``mpiexec`` whose processes :meth:`note` looks at."""
        self._launcher = launcher

    def note(self) -> None:
        """Note the MPI shared-memory files the launcher's descendants map now; nothing
        once a ``Popen`` launcher has ended: reaped, its pid may be another process's
        already, whose descendants' files are none of this session's (its ranks
        recorded theirs, and the ones it left are no longer its descendants)."""
        launcher = self._launcher
        if isinstance(launcher, subprocess.Popen):
            # Not ended now: its pid stays its own (a zombie's) until this process reaps it.
            if launcher.poll() is not None:
                return
            launcher = launcher.pid
        if launcher:
            self.note_processes(_descendants(launcher))

    def note_processes(self, pids: list[int]) -> None:
        """Note the MPI shared-memory files that the processes ``pids`` map now, and
        count those processes as this launch's ranks."""
        for pid in pids:
            self._ranks.add(pid)
            self._files.update(mapped_segments(pid))

    def collect(self, ranks: int | None = None) -> bool:
        """Read the records written so far; once ``ranks`` ranks have recorded (None:
        now, as once every rank of this host has said hello, which each does after its
        record), remove the folder, so that a launcher killed later leaves none behind
        (the files stay noted for :meth:`remove`). Whether the folder is gone."""
        if self._folder is None:
            return True
        if ranks is not None and self._read_records() < ranks:
            return False
        self._drop_folder()
        return True

    def remove(self) -> None:
        """Remove each noted or recorded file that is still the one noted, unless a
        process other than this launch's ranks maps it (see the module); then the folder
        of records. Call once the launcher's processes are stopped (a rank still running
        keeps its mapping either way, and its finalize finds the file gone)."""
        self._drop_folder()
        candidates: list[tuple[str, os.stat_result]] = []
        for path, device, inode in sorted(self._files):
            try:
                status = os.lstat(path)
            except OSError:
                continue  # removed by MPI_Finalize, as after a normal shutdown
            if _is_segment_path(path) and _is_ours(status, device, inode):
                candidates.append((path, status))
        self._files.clear()
        if not candidates:
            return
        mapped = _mapped_elsewhere(self._ranks)
        for path, status in candidates:
            identity = (os.major(status.st_dev), os.minor(status.st_dev), status.st_ino)
            if identity in mapped:
                continue  # in use by a process not of this launch: leave it
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _drop_folder(self) -> None:
        """Read the records, then remove their folder."""
        if self._folder is not None:
            self._read_records()
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _read_records(self) -> int:
        """Add the files (and pids) of each valid record in the folder not read yet (see
        the module); how many records (whole ones, valid or not) the folder holds."""
        if self._folder is None:
            return 0
        boot = _boot_id()
        try:
            names = [name for name in os.listdir(self._folder) if name.isdigit()]
        except OSError:
            return 0
        # (A name not all digits is a record being written, or one killed while it was.)
        for name in names:
            if name in self._read:
                continue
            self._read.add(name)
            record = _read_record(os.path.join(self._folder, name))
            if record is None or boot is None or record.get("boot") != boot:
                continue
            pid, files = record.get("pid"), record.get("files")
            if not (type(pid) is int and pid > 0 and isinstance(files, list)):
                continue
            self._ranks.add(pid)
            for entry in files:
                if (
                    isinstance(entry, list)
                    and len(entry) == 3
                    and isinstance(entry[0], str)
                    and _is_segment_path(entry[0])
                    and type(entry[1]) is int
                    and type(entry[2]) is int
                ):
                    self._files.add((entry[0], entry[1], entry[2]))
        return len(names)


def record_segments() -> None:
    """In a rank (call after ``MPI_Init``): write the MPI shared-memory files this process
    maps to the folder :data:`RECORDS_ENV` names, for the launcher to remove should this
    rank never finalize (see the module). Takes the variable out of the environment.
    Nothing where it is unset, where the folder is not a private one of this user (a
    rank on another host: the launcher's folder is on its host), or without ``/proc``;
    a failure to write is ignored (the record helps the cleanup, the rank needs none)."""
    folder = os.environ.pop(RECORDS_ENV, None)
    boot = _boot_id()
    if folder is None or boot is None:
        return
    try:
        status = os.lstat(folder)
        if not (
            stat.S_ISDIR(status.st_mode)
            and status.st_uid == os.geteuid()
            and status.st_mode & 0o077 == 0
        ):
            return
        files = sorted(mapped_segments(os.getpid()))
        text = json.dumps({"boot": boot, "pid": os.getpid(), "files": files})
        # Written under a temporary name, then renamed: the launcher reads whole records.
        path = os.path.join(folder, str(os.getpid()))
        partial = os.path.join(folder, f".{os.getpid()}.partial")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(partial, flags, 0o600), "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    except (OSError, ValueError):
        return


def remove_own_segments() -> None:
    """In a rank that is about to end without ``MPI_Finalize``: remove the MPI
    shared-memory files this process maps (its job's, which its finalize would have
    removed); the mappings of the job's ranks stay valid until each one's exit."""
    for path, device, inode in mapped_segments(os.getpid()):
        try:
            if _is_ours(os.lstat(path), device, inode):
                os.unlink(path)
        except OSError:
            continue


def mapped_segments(pid: int) -> set[_File]:
    """The MPI shared-memory files (path, device, inode) that process ``pid`` maps now
    and this user owns; none where its ``/proc/PID/maps`` cannot be read."""
    found: set[_File] = set()
    for path in _mapped_paths(pid):
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if _is_ours(status, status.st_dev, status.st_ino):
            found.add((path, status.st_dev, status.st_ino))
    return found


def _shm_mappings(pid: int) -> list[list[str]]:
    """The lines of ``pid``'s ``/proc/PID/maps`` that map a file under ``/dev/shm``, each
    split in its six fields (address, perms, offset, device, inode, path); none where
    they cannot be read (the process ended, or is not this user's)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    fields = (line.split(None, 5) for line in lines)
    return [parts for parts in fields if len(parts) == 6 and parts[5].startswith(_SHM_DIR)]


def _mapped_paths(pid: int) -> set[str]:
    """The paths of the MPI shared-memory files that ``pid``'s maps name (a file removed
    reads ``PATH (deleted)`` there, and is left out by the name check)."""
    return {parts[5] for parts in _shm_mappings(pid) if _is_segment_path(parts[5])}


def _is_segment_path(path: str) -> bool:
    """Whether ``path`` is one an MPI names its shared-memory files by: right under
    ``/dev/shm``, a name with one of :data:`MPI_SEGMENT_PREFIXES` and nothing that
    leads elsewhere (letters, digits, ``_``, ``.``, ``-``)."""
    if not path.startswith(_SHM_DIR):
        return False
    name = path.removeprefix(_SHM_DIR)
    return name.startswith(MPI_SEGMENT_PREFIXES) and _SEGMENT_NAME.fullmatch(name) is not None


def _is_ours(status: os.stat_result, device: int, inode: int) -> bool:
    """Whether ``status`` (an ``lstat``'s) is a regular file of this user and the file
    ``device``/``inode`` names."""
    return (
        stat.S_ISREG(status.st_mode)
        and status.st_uid == os.geteuid()
        and (status.st_dev, status.st_ino) == (device, inode)
    )


def _mapped_elsewhere(ranks: set[int]) -> set[tuple[int, int, int]]:
    """The MPI shared-memory files (device major, minor, inode) that live processes
    other than ``ranks`` map, from every ``/proc/PID/maps`` this user may read (the
    files are this user's, mode 0600: a process that cannot be read cannot have opened
    one, unless it is root's)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    mapped: set[tuple[int, int, int]] = set()
    for entry in entries:
        if not entry.isdigit() or int(entry) in ranks:
            continue
        for parts in _shm_mappings(int(entry)):
            try:
                major, minor = (int(part, 16) for part in parts[3].split(":"))
                mapped.add((major, minor, int(parts[4])))
            except ValueError:
                continue
    return mapped


def _read_record(path: str) -> dict[str, Any] | None:
    """The JSON object of the record at ``path``, or None where it is not a small regular
    file of this user holding one (a partial record, or anything else)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        try:
            status = os.fstat(handle.fileno())
            if not (
                stat.S_ISREG(status.st_mode)
                and status.st_uid == os.geteuid()
                and status.st_size <= _RECORD_LIMIT
            ):
                return None
            record = json.loads(handle.read(_RECORD_LIMIT + 1))
        except (OSError, ValueError):
            return None
    return record if isinstance(record, dict) else None


def _boot_id() -> str | None:
    """This boot of this machine (Linux), or None."""
    try:
        with open(_BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip() or None
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs, ...), from ``/proc``; none where
    there is no ``/proc``."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []  # not Linux: no /proc to read
    children: dict[int, list[int]] = {}
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rpartition(b")")[2].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    # The ranks are not in mpiexec's process group (hydra makes each its own
    # session), so they are found by descent: mpiexec, its proxies, their ranks.
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found
