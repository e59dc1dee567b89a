"""Functions the Disco tests run on workers (imported there by ``import_python_module``).

TVM's own ``tests.disco.*`` functions (``add_one``, ``str``, ...) are
:mod:`cubepool.disco.testing`'s, imported here so that every session that imports this
module has them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

import cubepool
from cubepool import disco
from cubepool.disco import register_func
from cubepool.disco import testing as _tvm_tests  # noqa: F401  (TVM's tests.disco.*)


@register_func("tests.disco.ring", override=True)
def ring(send: Any, recv: Any) -> None:
    """Worker i sends to i+1 and receives from i-1 (even workers send first)."""
    me, n = disco.worker_id(), disco.num_workers()
    if me % 2 == 0:
        disco.send_to_worker(send, (me + 1) % n)
        disco.recv_from_worker(recv, (me - 1) % n)
    else:
        disco.recv_from_worker(recv, (me - 1) % n)
        disco.send_to_worker(send, (me + 1) % n)


@register_func("tests.disco.from_worker0", override=True)
def from_worker0(buffer: Any) -> None:
    """Worker 0 sends ``buffer`` to every other worker, which receive it."""
    if disco.worker_id() == 0:
        for other in range(1, disco.num_workers()):
            disco.send_to_worker(buffer, other)
    disco.recv_from_worker0(buffer)


@register_func("tests.disco.pipeline", override=True)
def pipeline(buffer: Any) -> None:
    """Each group passes ``buffer`` on to the next, one group after the other."""
    worker = disco.current_worker()
    if worker.group_id > 0:
        disco.recv_from_prev_group(buffer)
    if worker.group_id < worker.num_groups - 1:
        disco.send_to_next_group(buffer)


@register_func("tests.disco.past_the_ends", override=True)
def past_the_ends(buffer: Any, which: str) -> None:
    """The last group sends to a next group, or the first receives from a previous one."""
    worker = disco.current_worker()
    if which == "next" and worker.group_id == worker.num_groups - 1:
        disco.send_to_next_group(buffer)
    if which == "prev" and worker.group_id == 0:
        disco.recv_from_prev_group(buffer)


@register_func("tests.disco.raise_on", override=True)
def raise_on(worker: int, message: str) -> int:
    """Raise ``ValueError(message)`` on worker ``worker``; return the worker id elsewhere."""
    if disco.worker_id() == worker:
        raise ValueError(message)
    return disco.worker_id()


@register_func("tests.disco.fail_then_allreduce", override=True)
def fail_then_allreduce(worker: int, send: Any, recv: Any) -> None:
    """Worker ``worker`` raises; the others enter an allreduce that cannot complete."""
    if disco.worker_id() == worker:
        raise RuntimeError("failed before the collective")
    disco.allreduce(send, "sum", False, recv)


@register_func("tests.disco.ccl", override=True)
def ccl() -> str | None:
    """The engine ``init_ccl`` recorded on this worker."""
    return disco.current_worker().ccl


@register_func("tests.disco.sleep", override=True)
def sleep(seconds: float) -> None:
    """Sleep (to outlast a timeout)."""
    time.sleep(seconds)


@register_func("tests.disco.pid", override=True)
def pid() -> int:
    """This worker's process id."""
    return os.getpid()


@register_func("tests.disco.unpicklable", override=True)
def unpicklable() -> Any:
    """A value that cannot travel to the controller."""
    return lambda: None


@register_func("tests.disco.allreduce_through_a_view", override=True)
def allreduce_through_a_view(src: Any, dst: Any) -> Any:
    """Allreduce into ``dst`` and return what a numpy view of ``dst``, taken before the
    collective, sees afterwards: MPI wrote into the tensor's own pool memory."""
    view = np.asarray(dst)
    disco.allreduce(src, "sum", False, dst)
    return view.copy()


@register_func("tests.disco.block_forever", override=True)
def block_forever(buffer: Any) -> None:
    """Worker 0 waits for a message from worker 1 that never comes."""
    if disco.worker_id() == 0:
        disco.recv_from_worker(buffer, 1)


@register_func("tests.disco.touch", override=True)
def touch(folder: str) -> None:
    """Create ``folder/ran-<worker id>``: a mark that this worker ran the call."""
    (Path(folder) / f"ran-{disco.worker_id()}").touch()


@register_func("tests.disco.write_raw", override=True)
def write_raw(data: bytes) -> None:
    """Write ``data`` straight to this worker's socket to the controller, unsealed: bytes
    an on-path attacker put into the stream (no key used)."""
    os.write(disco.current_worker().channel._channel.fd, data)  # type: ignore[attr-defined]


@register_func("tests.disco.identity", override=True)
def identity(value: Any) -> Any:
    """``value`` itself: a second register for the same object."""
    return value


# TVM's shard functions of tests/python/disco/test_loader.py, under their names there:
# each fills `tgt` from `src` as TVM's packed functions do (`tgt.copyfrom(...)` of a
# reshaped, transposed numpy view).
@register_func("tests.disco.shard_dim_0", override=True)
def shard_dim_0(src: Any, num_shards: int, tgt: Any) -> None:
    s_0, s_1 = src.shape
    tgt.copyfrom(src.numpy().reshape(num_shards, s_0 // num_shards, s_1))


@register_func("tests.disco.shard_dim_1", override=True)
def shard_dim_1(src: Any, num_shards: int, tgt: Any) -> None:
    s_0, s_1 = src.shape
    tgt.copyfrom(src.numpy().reshape(s_0, num_shards, s_1 // num_shards).transpose(1, 0, 2))


@register_func("tests.disco.shard_qkv_0", override=True)
def shard_qkv_0(src: Any, num_shards: int, q_heads: int, kv_heads: int, tgt: Any) -> None:
    total_dim, hidden_size = src.shape
    head_dim = total_dim // (q_heads + kv_heads + kv_heads)
    q_dim = q_heads * head_dim
    kv_dim = kv_heads * head_dim
    w_q = src.numpy()[:q_dim, :].reshape(num_shards, q_heads // num_shards, head_dim, hidden_size)
    w_k = src.numpy()[q_dim : q_dim + kv_dim, :].reshape(
        num_shards, kv_heads // num_shards, head_dim, hidden_size
    )
    w_v = src.numpy()[q_dim + kv_dim :, :].reshape(
        num_shards, kv_heads // num_shards, head_dim, hidden_size
    )
    tgt.copyfrom(np.concatenate([w_q, w_k, w_v], axis=1))


@register_func("tests.disco.shard_qkv_1", override=True)
def shard_qkv_1(src: Any, tgt: Any) -> None:
    s, _, _, h = src.shape
    tgt.copyfrom(src.numpy().reshape(s, -1, h))


# TVM's test_callback.py compiles `transform_params` (two TIR slices) and loads it with
# `load_vm_module`; this is the same function in Python, for the port of that test.
@register_func("tests.disco.transform_params", override=True)
def transform_params(rank: int, fget_item: Any) -> tuple[Any, Any]:
    """Worker ``rank``'s shards of the parameters ``fget_item`` loads: rows
    ``2 * rank, 2 * rank + 1`` of ``A`` (4x4 int32) and column ``rank`` of ``B`` (2x2
    float32, kept 2x1), as tensors from this worker's pools."""
    memory = disco.current_worker().memory
    a = np.asarray(fget_item("A", 0))
    b = np.asarray(fget_item("B", 1))
    a_sharded = cubepool.tensor(a[rank * 2 : rank * 2 + 2, :], memory=memory)
    b_sharded = cubepool.tensor(np.ascontiguousarray(b[:, rank : rank + 1]), memory=memory)
    return a_sharded, b_sharded


@register_func("tests.disco.numpy_ones", override=True)
def numpy_ones(count: int) -> Any:
    """A plain numpy array of ``count`` float32 ones plus the worker's id."""
    import numpy as np

    return np.ones(count, np.float32) + disco.worker_id()
