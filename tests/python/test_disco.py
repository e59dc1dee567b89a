"""cubepool.disco: every collective and reduce op against numpy, in threads and in MPI processes.

One session of each kind (4 workers in 2 groups) serves the whole module; each
collective runs both within the groups (``in_group=True``) and across all workers.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from disco_procs import wait_gone

import cubepool
from cubepool import disco

N, GROUPS = 4, 2
GROUP = N // GROUPS
DTYPES = ["float32", "float64", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
TESTS = Path(__file__).parent

Array = npt.NDArray[Any]


def start(kind: str, num_workers: int = N, num_groups: int = GROUPS) -> disco.Session:
    """A session whose workers can import the tests' helper module."""
    if kind == "threads":
        session: disco.Session = disco.ThreadedSession(num_workers, num_groups, timeout=30)
    else:
        with pytest.MonkeyPatch.context() as patch:
            path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
            patch.setenv("PYTHONPATH", path)
            session = disco.ProcessSession(num_workers, num_groups, timeout=30)
    session.import_python_module("disco_helpers")
    return session


@pytest.fixture(scope="module", params=["threads", "processes"])
def sess(request: pytest.FixtureRequest) -> Iterator[disco.Session]:
    """One session per kind for the module; afterwards, no worker process is left."""
    session = start(request.param)
    pids = session.worker_pids if isinstance(session, disco.ProcessSession) else []
    yield session
    session.shutdown()
    assert wait_gone(pids) == []
    if isinstance(session, disco.ThreadedSession):
        assert not any(thread.is_alive() for thread in session.worker_threads)


def members(worker: int, in_group: bool) -> list[int]:
    """The workers a collective of ``worker`` spans."""
    if not in_group:
        return list(range(N))
    first = worker // GROUP * GROUP
    return list(range(first, first + GROUP))


def random_values(
    dtype: str, shape: tuple[int, ...], seed: int, small: bool = False
) -> list[Array]:
    """One random array per worker."""
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        bound = 3 if small else 1000
        return [rng.integers(-bound, bound + 1, shape).astype(dtype) for _ in range(N)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(N)]


def put(session: disco.Session, values: list[Array]) -> disco.DRef:
    """A DRef holding ``values[i]`` (copied into worker i's pools) on each worker."""
    ref = session.empty(values[0].shape, str(values[0].dtype))
    for worker, value in enumerate(values):
        ref.debug_copy_from(worker, value)
    return ref


def fetch(ref: disco.DRef) -> list[Any]:
    """The value of ``ref`` on every worker."""
    return [ref.debug_get_from_remote(worker) for worker in range(N)]


def reduce_reference(values: list[Array], op: str) -> Array:
    """What ``allreduce`` with ``op`` yields, by numpy."""
    stacked = np.stack(values)
    if op == "sum":
        return stacked.sum(axis=0, dtype=stacked.dtype)
    if op == "prod":
        return stacked.prod(axis=0, dtype=stacked.dtype)
    if op == "min":
        return stacked.min(axis=0)
    if op == "max":
        return stacked.max(axis=0)
    total = stacked.sum(axis=0, dtype=stacked.dtype)
    if np.issubdtype(stacked.dtype, np.integer):
        magnitude = np.abs(total) // len(values)
        return np.where(total < 0, -magnitude, magnitude).astype(stacked.dtype)
    return (total / len(values)).astype(stacked.dtype)


def assert_matches(actual: Array, expected: Array) -> None:
    """Exact for integers, to rounding for floats (MPI may sum in another order)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected)
    else:
        tol = 1e-5 if expected.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_op_matches_numpy(sess: disco.Session, dtype: str, in_group: bool) -> None:
    for seed, op in enumerate(OPS):
        values = random_values(dtype, (3, 5), seed, small=op == "prod")
        src = put(sess, values)
        dst = sess.empty((3, 5), dtype)
        sess.allreduce(src, dst, op, in_group=in_group)
        for worker, got in enumerate(fetch(dst)):
            expected = reduce_reference([values[m] for m in members(worker, in_group)], op)
            assert_matches(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_in_place(sess: disco.Session, dtype: str) -> None:
    values = random_values(dtype, (16,), 7)
    buf = put(sess, values)
    sess.allreduce(buf, buf, "max", in_group=False)
    for got in fetch(buf):
        assert_matches(got, reduce_reference(values, "max"))


def bfloat16_tensor(values: list[float]) -> cubepool.Tensor:
    """A host bfloat16 tensor of ``values`` (rounded to nearest, as copyfrom rounds)."""
    tensor = cubepool.empty((len(values),), "bfloat16")
    tensor.copyfrom(np.array(values, np.float32))
    return tensor


def bfloat16_values(bits: Any) -> Array:
    """The float32 values of a bfloat16 tensor copied back (its uint16 bits)."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("in_group", [True, False])
def test_allreduce_of_bfloat16_reduces_the_numbers_not_their_bits(
    sess: disco.Session, in_group: bool
) -> None:
    """bfloat16 is stored as the uint16 of its bits, which were reduced as integers: a
    sum of 1.5 and 2.25 gave a NaN (helper-134's find). It is reduced in float32 and
    rounded back (ties to even), as NCCL reduces ncclBfloat16, on every engine; the
    values here are exact in bfloat16, so every op's result is too."""
    rows = [[1.5, -1.0, 2.0, 0.5], [2.25, 3.0, -4.0, 0.25], [-0.5, 1.0, 8.0, 1.0], [4.0, 2.0]]
    values = [np.array(row + [1.0] * (4 - len(row)), np.float32) for row in rows]
    src = sess.empty((4,), "bfloat16")
    for worker, value in enumerate(values):
        src.debug_copy_from(worker, bfloat16_tensor(list(value)))
    for op in OPS:
        dst = sess.empty((4,), "bfloat16")
        sess.allreduce(src, dst, op, in_group=in_group)
        for worker, got in enumerate(fetch(dst)):
            expected = reduce_reference([values[m] for m in members(worker, in_group)], op)
            np.testing.assert_array_equal(bfloat16_values(got), expected)
    # In place too, summed in float32 and rounded once to nearest: worker 0's 1 and
    # three workers' 2**-9 make 1.00586, between bfloat16's 1 and 1.0078 (a step of
    # 2**-7), nearer the second; cut to bfloat16 it is 1, and so is every partial sum
    # rounded in bfloat16 (1 + 2**-9 is nearer 1).
    assert N == 4
    buf = sess.empty((1,), "bfloat16")
    for worker in range(N):
        buf.debug_copy_from(worker, bfloat16_tensor([1.0 if worker == 0 else 2.0**-9]))
    sess.allreduce(buf, buf, "sum", in_group=False)
    assert [bfloat16_values(got)[0] for got in fetch(buf)] == [1.0 + 2.0**-7] * N


def test_allreduce_refuses_bool_and_a_bfloat16_beside_a_uint16(sess: disco.Session) -> None:
    """bool does not reduce (numpy made a sum an or and an average failed; TVM refuses
    it), and a bfloat16 operand beside a uint16 one, the same bytes, is refused rather
    than reduced as one or the other."""
    flags = sess.empty((2,), "bool")
    with pytest.raises(disco.WorkerError, match="bool tensors do not reduce"):
        sess.allreduce(flags, sess.empty((2,), "bool"), "sum")
        sess.sync_worker_0()
    with pytest.raises(disco.WorkerError, match="both be bfloat16 or neither"):
        sess.allreduce(sess.empty((2,), "bfloat16"), sess.empty((2,), "uint16"), "sum")
        sess.sync_worker_0()


def test_allreduce_rejects_an_unknown_op(sess: disco.Session) -> None:
    ref = sess.empty((2,), "float32")
    with pytest.raises(cubepool.InvalidArgument, match="unknown reduce op 'mean'"):
        sess.allreduce(ref, ref, "mean")


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_matches_numpy(sess: disco.Session, dtype: str, in_group: bool) -> None:
    values = random_values(dtype, (2, 3), 11)
    src = put(sess, values)
    parts = GROUP if in_group else N
    dst = sess.empty((parts * 2, 3), dtype)
    sess.allgather(src, dst, in_group=in_group)
    for worker, got in enumerate(fetch(dst)):
        expected = np.concatenate([values[m] for m in members(worker, in_group)])
        assert_matches(got, expected)


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_from_worker0_matches_numpy(
    sess: disco.Session, dtype: str, in_group: bool
) -> None:
    values = random_values(dtype, (4, 2), 13)
    src = put(sess, values)
    dst = sess.empty((4, 2), dtype)
    sess.broadcast_from_worker0(src, dst, in_group=in_group)
    for worker, got in enumerate(fetch(dst)):
        assert_matches(got, values[members(worker, in_group)[0]])


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_of_a_host_array(sess: disco.Session, dtype: str, in_group: bool) -> None:
    host = random_values(dtype, (5,), 17)[0]
    dst = sess.broadcast(host, in_group=in_group)
    for got in fetch(dst):
        assert_matches(got, host)


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_from_worker0_matches_numpy(
    sess: disco.Session, dtype: str, in_group: bool
) -> None:
    parts = GROUP if in_group else N
    values = random_values(dtype, (parts, 3), 19)
    src = put(sess, values)
    dst = sess.empty((3,), dtype)
    sess.scatter_from_worker0(src, dst, in_group=in_group)
    for worker, got in enumerate(fetch(dst)):
        group = members(worker, in_group)
        assert_matches(got, values[group[0]][group.index(worker)])


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_of_a_host_array(sess: disco.Session, dtype: str, in_group: bool) -> None:
    parts = GROUP if in_group else N
    host = random_values(dtype, (parts, 2, 2), 23)[0]
    dst = sess.scatter(host, in_group=in_group)
    for worker, got in enumerate(fetch(dst)):
        assert_matches(got, host[members(worker, in_group).index(worker)])


@pytest.mark.parametrize("in_group", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_to_worker0_matches_numpy(sess: disco.Session, dtype: str, in_group: bool) -> None:
    values = random_values(dtype, (3,), 29)
    src = put(sess, values)
    parts = GROUP if in_group else N
    dst = sess.empty((parts, 3), dtype, worker0_only=True, in_group=in_group)
    sess.gather_to_worker0(src, dst, in_group=in_group)
    for worker, got in enumerate(fetch(dst)):
        group = members(worker, in_group)
        if worker == group[0]:
            assert_matches(got, np.stack([values[m] for m in group]))
        else:
            assert got is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_send_and_receive_between_workers(sess: disco.Session, dtype: str) -> None:
    values = random_values(dtype, (6,), 31)
    src = put(sess, values)
    dst = sess.empty((6,), dtype)
    sess.call_packed(sess.get_global_func("tests.disco.ring"), src, dst)
    for worker, got in enumerate(fetch(dst)):
        assert_matches(got, values[(worker - 1) % N])


@pytest.mark.parametrize("dtype", DTYPES)
def test_recv_from_worker0(sess: disco.Session, dtype: str) -> None:
    values = random_values(dtype, (4,), 37)
    buf = put(sess, values)
    sess.get_global_func("tests.disco.from_worker0")(buf)
    for got in fetch(buf):
        assert_matches(got, values[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_send_to_next_group_and_recv_from_prev_group(sess: disco.Session, dtype: str) -> None:
    values = random_values(dtype, (2, 2), 41)
    buf = put(sess, values)
    sess.get_global_func("tests.disco.pipeline")(buf)
    for worker, got in enumerate(fetch(buf)):
        assert_matches(got, values[worker % GROUP])


@pytest.mark.parametrize(
    ("which", "message"),
    [("next", "is in the last group: no next group"), ("prev", "first group: no previous")],
)
def test_no_group_past_the_ends(sess: disco.Session, which: str, message: str) -> None:
    buf = sess.empty((2,), "float32")
    sess.get_global_func("tests.disco.past_the_ends")(buf, which)
    with pytest.raises(disco.WorkerError, match=message) as info:
        sess.sync_workers()
    failed = {info.value.worker_id, *(other.worker_id for other in info.value.others)}
    assert failed == ({2, 3} if which == "next" else {0, 1})
    assert info.value.exc_type == "cubepool._errors.InvalidArgument"
    sess.sync_workers()  # the session goes on


def test_collective_operands_are_checked(sess: disco.Session) -> None:
    src = sess.empty((4,), "float32")
    dst = sess.empty((5,), "float32")
    with pytest.raises(cubepool.InvalidArgument, match=r"send is \(4,\) float32 but recv is"):
        sess.allreduce(src, dst)  # the controller knows both layouts: nothing is sent
    sess.sync_workers()
    # Tensors a function made have no layout on the controller: the workers refuse.
    make = sess.get_global_func("runtime.disco.empty")
    src, dst = make((4,), "float32", None, False, True), make((5,), "float32", None, False, True)
    sess.allreduce(src, dst)  # every worker refuses before entering the collective
    with pytest.raises(disco.WorkerError, match="send is 4 x float32 but recv is 5 x float32"):
        sess.sync_workers()
    sess.sync_workers()


def test_collectives_write_into_the_tensors_pool_memory(sess: disco.Session) -> None:
    values = random_values("float64", (32,), 43)
    src = put(sess, values)
    dst = sess.empty((32,), "float64")
    seen = sess.get_global_func("tests.disco.allreduce_through_a_view")(src, dst)
    for got in fetch(seen):
        assert_matches(got, reduce_reference(values, "sum"))


def test_empty_on_an_explicit_device(sess: disco.Session) -> None:
    ref = sess.empty((2, 3), "int32", device=cubepool.Device("cpu", 0))
    assert fetch(ref)[3].shape == (2, 3)
    assert repr(sess).endswith("workers=4 groups=2 open>")


def test_worker_ids(sess: disco.Session) -> None:
    ids = sess.get_global_func("runtime.disco.worker_id")()
    assert fetch(ids) == [0, 1, 2, 3]


def test_tvms_sync_all_waits_for_every_worker(sess: disco.Session) -> None:
    result = sess.get_global_func("tests.disco.raise_on")(3, "boom on three")
    with pytest.raises(disco.WorkerError, match=r"worker 3 raised builtins\.ValueError"):
        sess._sync_all()  # TVM's name for sync_workers: worker 3's failure comes back
    assert [result.debug_get_from_remote(w) for w in (0, 1, 2)] == [0, 1, 2]
    sess._clear_ipc_memory_pool()  # TVM's, a no-op without CUDA IPC memory
    assert not sess.closed


def test_tvms_per_engine_names_reach_the_in_worker_functions(sess: disco.Session) -> None:
    engine = type(sess).available_ccls[0]
    x = sess.empty((2,), "float32")
    for worker in range(N):
        x.debug_copy_from(worker, np.full(2, worker, np.float32))
    sess.get_global_func(f"runtime.disco.{engine}.test_worker2_sends_to_worker0")(x)
    assert x.debug_get_from_remote(0).tolist() == [2.0, 2.0]  # worker 2's, TVM's test hook
    total = sess.empty((2,), "float32")
    sess.get_global_func(f"runtime.disco.{engine}.allreduce")(x, 0, False, total)
    assert total.debug_get_from_remote(3).tolist() == [2.0 + 1 + 2 + 3] * 2


def test_tvms_ccl_test_functions_need_its_world_of_four_workers_in_two_groups() -> None:
    sess = disco.ThreadedSession(2)
    try:
        x = sess.empty((1,), "float32")
        hook = sess.get_global_func("runtime.disco.threads.test_worker2_sends_to_worker0")
        with pytest.raises(disco.WorkerError, match="needs 4 workers in 2 groups"):
            hook(x)
            sess.sync_workers()
    finally:
        sess.shutdown()


def test_tvms_cpuccl_is_the_sessions_own_engine(sess: disco.Session) -> None:
    sess.init_ccl("cpuccl", *range(N))
    assert sess.ccl == "cpuccl"
    engine = type(sess).available_ccls[0]
    assert fetch(sess.get_global_func("tests.disco.ccl")()) == [engine] * N
    x = sess.empty((2,), "float32")
    for worker in range(N):
        x.debug_copy_from(worker, np.full(2, worker, np.float32))
    total = sess.empty((2,), "float32")
    sess.get_global_func("runtime.disco.cpuccl.allreduce")(x, 0, False, total)
    assert total.debug_get_from_remote(1).tolist() == [6.0, 6.0]


@pytest.mark.parametrize("kind", [disco.ThreadedSession, disco.ProcessSession])
def test_tvms_build_ring_is_taken_and_must_be_a_bool(kind: Any) -> None:
    with pytest.raises(cubepool.InvalidArgument, match="build_ring must be a bool"):
        kind(2, 1, build_ring="yes")
    sess = kind(2, build_ring=True)  # TVM's cpuccl ring: cubepool's engines need none
    try:
        sess.init_ccl("cpuccl", 0, 1)
        assert sess.ccl == "cpuccl"
    finally:
        sess.shutdown()


def test_tvms_worker_rank_world_size_and_device(sess: disco.Session) -> None:
    assert fetch(sess.get_global_func("runtime.disco.worker_rank")()) == [0, 1, 2, 3]
    assert fetch(sess.get_global_func("runtime.disco.world_size")()) == [N] * N
    # A device crosses from a worker process pickled.
    assert fetch(sess.get_global_func("runtime.disco.device")()) == [cubepool.Device("cpu", 0)] * N


def test_copy_to_and_from_worker_0(sess: disco.Session) -> None:
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    remote = sess.copy_to_worker_0(host)
    assert [remote.debug_get_from_remote(w) is None for w in range(N)] == [False, True, True, True]
    back = np.zeros_like(host)
    sess.copy_from_worker_0(back, remote)
    np.testing.assert_array_equal(back, host)
    into_tensor = cubepool.empty((3, 4), "int64")
    sess.copy_from_worker_0(into_tensor, remote)
    np.testing.assert_array_equal(np.asarray(into_tensor), host)
    with pytest.raises(cubepool.InvalidArgument, match="the host array has 8 bytes"):
        sess.copy_from_worker_0(np.zeros(1, np.int64), remote)


def test_no_bytes_are_written_over_an_object_arrays_pointers(sess: disco.Session) -> None:
    # copy_from_worker_0 wrote a worker's bytes over an object array's items, which the
    # array then freed as objects (SIGSEGV); debug_copy_from copied an object array's
    # pointers into a tensor, to come back out that way as pointers to freed objects.
    remote = sess.copy_to_worker_0(np.array([0x4141414141414141], np.uint64))
    for target in (np.empty(1, dtype=object), np.zeros(1, dtype=[("a", "O")])):
        with pytest.raises(cubepool.InvalidArgument, match="must hold numbers or bytes"):
            sess.copy_from_worker_0(target, remote)
    objects = np.empty(1, dtype=object)
    objects[0] = bytearray(b"V" * 64)
    with pytest.raises(cubepool.InvalidArgument, match="a tensor takes numbers, got dtype object"):
        remote.debug_copy_from(0, objects)
    # The worker refuses it too where the controller knows no layout to check against.
    unknown = sess.get_global_func("tests.disco.add_one_tensor")(sess.empty((1,), "uint64"))
    assert unknown.layout is None
    with pytest.raises(disco.WorkerError, match="cannot copy an array of dtype object"):
        unknown.debug_copy_from(0, objects)
        sess.sync_worker_0()
    back = np.zeros(1, np.uint64)
    sess.copy_from_worker_0(back, remote)
    assert back[0] == 0x4141414141414141


def live_registers(session: disco.Session) -> list[list[int]]:
    """Every worker's live register ids."""
    return fetch(session.get_global_func("runtime.disco.live_registers")())


def test_dref_freed_on_every_worker(sess: disco.Session) -> None:
    gc.collect()
    sess.sync_workers()  # earlier tests' freed registers go first
    ref = sess.empty((1024,), "float64")
    reg = ref.reg_id
    in_use = [report.usage.bytes_in_use for report in sess.memory_report()]
    assert all(reg in registers for registers in live_registers(sess))
    del ref
    gc.collect()
    assert all(reg not in registers for registers in live_registers(sess))
    after = [report.usage.bytes_in_use for report in sess.memory_report()]
    assert [before - now for before, now in zip(in_use, after, strict=True)] == [8192] * N


def test_tensors_come_from_each_workers_pool(sess: disco.Session) -> None:
    before = [report.usage.bytes_in_use for report in sess.memory_report()]
    sizes = [1000, 2000, 3000, 4000]
    ref = sess.get_global_func("runtime.disco.sync_worker")()  # None on every worker
    for worker, size in enumerate(sizes):
        ref.debug_copy_from(worker, np.zeros(size, np.uint8))  # a fresh tensor there
    records = sess.record_memory("after copies")
    assert [record.label for record in records] == ["after copies"] * N
    grown = [r.report.usage.bytes_in_use - b for r, b in zip(records, before, strict=True)]
    assert grown == sizes
    peaks = [report.dynamic[0].bytes_in_use_peak for report in sess.memory_report()]
    assert all(peak >= size for peak, size in zip(peaks, sizes, strict=True))


def test_worker_error_reaches_the_controller(sess: disco.Session) -> None:
    result = sess.get_global_func("tests.disco.raise_on")(2, "boom on two")
    with pytest.raises(disco.WorkerError) as info:
        sess.sync_workers()
    error = info.value
    assert error.worker_id == 2 and error.exc_type == "builtins.ValueError"
    assert error.message == "boom on two"
    assert (
        "raise_on" in error.remote_traceback and "ValueError: boom on two" in error.remote_traceback
    )
    assert "worker 2 raised builtins.ValueError: boom on two" in str(error)
    assert not sess.closed
    assert [result.debug_get_from_remote(w) for w in (0, 1, 3)] == [0, 1, 3]


def test_unknown_function_raises_where_it_is_asked_for(sess: disco.Session) -> None:
    with pytest.raises(
        cubepool.NotFound,
        match=r"no function is registered as 'no\.such\.function' on worker\(s\) \[0, 1, 2, 3\]",
    ):
        sess.get_global_func("no.such.function")
    sess.sync_workers()  # nothing is left to surface at a later call
    assert not sess.closed


def test_a_value_that_cannot_travel_is_a_worker_error(sess: disco.Session) -> None:
    ref = sess.get_global_func("tests.disco.unpicklable")()
    if isinstance(sess, disco.ThreadedSession):
        assert callable(ref.debug_get_from_remote(1))  # nothing to pickle in-process
        return
    for worker in (1, 2):  # each failure to send is raised, the second too
        with pytest.raises(disco.WorkerError, match="cannot be sent to the controller"):
            ref.debug_get_from_remote(worker)
    sess.sync_workers()


def test_an_argument_that_cannot_travel_is_refused_naming_it(sess: disco.Session) -> None:
    """Worker processes get a call's arguments pickled: one that does not pickle is
    refused before anything is sent, naming the function, the argument and its type."""
    identity = sess.get_global_func("tests.disco.identity")
    lock = threading.Lock()
    if isinstance(sess, disco.ThreadedSession):
        assert identity(lock).debug_get_from_remote(1) is lock  # nothing to pickle in-process
        return
    with pytest.raises(cubepool.InvalidArgument) as refused:
        identity(lock)
    assert "call of 'tests.disco.identity': argument 1, a _thread.lock," in str(refused.value)
    assert isinstance(refused.value.__cause__, TypeError)
    assert identity(7).debug_get_from_remote(3) == 7  # the session goes on
    assert not sess.closed


def test_session_driven_from_several_threads(sess: disco.Session) -> None:
    ids = sess.get_global_func("runtime.disco.worker_id")()
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            for _ in range(10):
                scratch = sess.empty((8,), "int32")  # sends interleave with the waits
                assert fetch(ids) == [0, 1, 2, 3]
                del scratch
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=drive) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)


def test_worker_id_out_of_range(sess: disco.Session) -> None:
    ref = sess.empty((1,), "int32")
    with pytest.raises(cubepool.InvalidArgument, match=r"worker id 4 is out of range 0\.\.3"):
        ref.debug_get_from_remote(4)


@pytest.mark.parametrize(
    ("kind", "num_groups"),
    [("threads", 1), ("threads", 2), ("threads", 4), ("processes", 1), ("processes", 4)],
)
def test_group_counts(kind: str, num_groups: int) -> None:
    with start(kind, num_groups=num_groups) as session:
        pids = session.worker_pids if isinstance(session, disco.ProcessSession) else []
        values = random_values("int64", (3,), num_groups)
        src = put(session, values)
        dst = session.empty((3,), "int64")
        session.allreduce(src, dst, "sum", in_group=True)
        size = 4 // num_groups
        for worker, got in enumerate(fetch(dst)):
            first = worker // size * size
            assert_matches(got, reduce_reference(values[first : first + size], "sum"))
        gathered = session.empty((size, 3), "int64")
        session.allgather(src, gathered, in_group=True)
        for worker, got in enumerate(fetch(gathered)):
            first = worker // size * size
            assert_matches(got, np.stack(values[first : first + size]))
    assert wait_gone(pids) == []


def test_reduce_kind_and_disco_action_have_the_seed_values() -> None:
    assert [int(kind) for kind in disco.ReduceKind] == [0, 1, 2, 3, 4]
    assert [kind.name for kind in disco.ReduceKind] == ["kSum", "kProd", "kMin", "kMax", "kAvg"]
    assert {action.name: int(action) for action in disco.DiscoAction} == {
        "kShutDown": 0,
        "kKillReg": 1,
        "kGetGlobalFunc": 2,
        "kCallPacked": 3,
        "kSyncWorker": 4,
        "kCopyFromWorker0": 5,
        "kCopyToWorker0": 6,
        "kDebugGetFromRemote": 7,
        "kDebugSetRegister": 8,
    }
    assert disco.reduce_kind_to_str(4) == "kAvg"
    assert disco.disco_action_to_str(1) == "kKillReg"


def test_in_worker_functions_refuse_outside_a_worker() -> None:
    with pytest.raises(disco.DiscoError, match="not inside a Disco worker"):
        disco.worker_id()


def test_operands_that_overlap_partly_are_refused() -> None:
    from cubepool.disco.communicator import as_array, in_place

    backing = cubepool.empty((8,), "float32")
    first = cubepool.create_view(backing, (4,), "float32", 0)
    shifted = cubepool.create_view(backing, (4,), "float32", 8)
    again = cubepool.create_view(backing, (4,), "float32", 0)
    apart = cubepool.empty((4,), "float32")

    def check(a: Any, b: Any) -> bool:
        return in_place(a, b, as_array(a, "send"), as_array(b, "recv"))

    assert check(first, first) and check(first, again)
    assert not check(first, apart)
    with pytest.raises(cubepool.InvalidArgument, match="overlap without being the same"):
        check(first, shifted)


def test_reduce_kinds_as_workers_accept_them() -> None:
    from cubepool.disco.collectives import _reduce_kind

    assert _reduce_kind("avg") is disco.ReduceKind.kAvg
    assert _reduce_kind(2) is disco.ReduceKind.kMin
    assert _reduce_kind((1,)) is disco.ReduceKind.kProd  # TVM's ShapeTuple([kind])
    for bad in ["mean", 9, (0, 1), None]:
        with pytest.raises(cubepool.InvalidArgument, match="unknown"):
            _reduce_kind(bad)
