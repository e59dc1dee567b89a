"""Receive-path throughput of large Disco frames over a socket pair.

Each frame is sealed before the clock starts; a thread writes it while the receiving
channel's ``recv()`` is timed. Prints the median and best GiB/s per frame size. Run it
on two checkouts in turn to compare their receive paths (stop 61: reads capped
at ``MAX_READ``, no slower for large frames)::

    python benches/python/bench_disco_frames.py
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

from cubepool.disco.wire import Channel, write_all

MIB = 1 << 20
#: Frame sizes in MiB and how many of each are timed.
SIZES = ((1, 200), (16, 30), (256, 7))


def receive_time(frame: bytes, receiver: Channel, sender_fd: int) -> float:
    """Seconds from the start of the write of ``frame`` until ``receiver`` has it."""
    writer = threading.Thread(target=write_all, args=(sender_fd, frame))
    start = time.perf_counter()
    writer.start()
    receiver.recv()
    elapsed = time.perf_counter() - start
    writer.join()
    return elapsed


def main() -> None:
    up, down = os.urandom(32), os.urandom(32)
    for size_mib, repeat in SIZES:
        a, b = socket.socketpair()
        sender, receiver = Channel(a, up, down), Channel(b, down, up)
        payload = os.urandom(size_mib * MIB)
        times = [receive_time(sender.seal(payload), receiver, a.fileno()) for _ in range(repeat)]
        median, best = statistics.median(times), min(times)
        print(
            f"{size_mib:4d} MiB: median {size_mib / median / 1024:.2f} GiB/s, "
            f"best {size_mib / best / 1024:.2f} GiB/s"
        )
        a.close()
        b.close()


if __name__ == "__main__":
    main()
