"""The MPI shared-memory files of a session's ranks, removed when the ranks cannot.

MPICH's ranks on one host share a file in ``/dev/shm`` (``mpich_shm_*``), which
``MPI_Finalize`` removes. A rank that is killed or ends with ``os._exit`` (a forced
close: a session collected unclosed, a timeout, a worker that died and took the others
with it, a controller that is gone) never finalizes, and the file, 1 to 4 MiB, stayed
until the machine restarted: hundreds of them piled up under a day of test runs.
:class:`MPISegments` notes which such files given processes map (their
``/proc/PID/maps``: what this session's ranks opened, not a guess by name) and removes
them once those processes are stopped. Linux only; elsewhere it notes nothing.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

#: Where Linux keeps POSIX shared memory (``shm_open``'s files).
_SHM_DIR = "/dev/shm/"
#: Name prefixes of the shared-memory files an MPI library makes there for the ranks of
#: one host (MPICH's ``mpich_shm_*``): only these are ever removed, never a file of the
#: user's own code.
MPI_SEGMENT_PREFIXES = ("mpich_shm_",)


class MPISegments:
    """The MPI shared-memory files in ``/dev/shm`` that the processes under one
    ``mpiexec`` (``launcher``: its ``Popen``, or a pid; 0 for none: :meth:`note_processes`
    only) mapped, to remove once they are gone (see the module).

    :meth:`remove` removes each file that is still the very file noted (same device and
    inode: one that finalize removed and another job made again under the same name is
    left alone).
    """

    def __init__(self, launcher: subprocess.Popen[Any] | int = 0) -> None:
        self._launcher = launcher
        #: Path -> (device, inode) of each file noted.
        self._files: dict[str, tuple[int, int]] = {}

    def note(self) -> None:
        """Note the MPI shared-memory files the launcher's descendants map now; nothing
        once a ``Popen`` launcher has ended: reaped, its pid may be another process's
        already, whose descendants' files are none of this session's (its ranks were
        noted while it ran, and the ones it left are no longer its descendants)."""
        launcher = self._launcher
        if isinstance(launcher, subprocess.Popen):
            # Not ended now: its pid stays its own (a zombie's) until this process reaps it.
            if launcher.poll() is not None:
                return
            launcher = launcher.pid
        if launcher:
            self.note_processes(_descendants(launcher))

    def note_processes(self, pids: list[int]) -> None:
        """Note the MPI shared-memory files that the processes ``pids`` map now."""
        for pid in pids:
            try:
                with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except OSError:
                continue
            for line in lines:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith(_SHM_DIR):
                    continue
                path = parts[5]
                if not path.removeprefix(_SHM_DIR).startswith(MPI_SEGMENT_PREFIXES):
                    continue  # (a removed file reads "PATH (deleted)": stat finds none)
                try:
                    status = os.stat(path)
                except OSError:
                    continue
                if status.st_uid == os.geteuid():
                    self._files[path] = (status.st_dev, status.st_ino)

    def remove(self) -> None:
        """Remove each noted file that is still the one noted (call once the launcher's
        processes are stopped: a rank still running keeps its mapping either way)."""
        for path, identity in self._files.items():
            try:
                status = os.stat(path)
                if (status.st_dev, status.st_ino) == identity:
                    os.unlink(path)
            except OSError:
                continue  # removed by MPI_Finalize, as after a normal shutdown
        self._files.clear()


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
