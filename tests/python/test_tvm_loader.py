"""A port of TVM's ``tests/python/disco/test_loader.py`` (apache/tvm) to cubepool.disco.

Each test keeps TVM's steps and assertions. Adapted:

* ``tvm.runtime.disco`` -> ``cubepool.disco``; ``tvmjs.dump_tensor_cache`` ->
  ``cubepool.tensor_cache.dump_tensor_cache``; ``tvm.runtime.tensor`` -> numpy arrays
  (what the cache writer takes); ``Shape([i])`` -> ``(i,)``; ``.numpy()`` of what
  ``debug_get_from_remote`` returns is kept (its arrays have TVM's ``.numpy()``).
* TVM runs these on a ``ThreadedSession`` with NCCL over two GPUs (skipped without
  them); here on a ``ThreadedSession``, a ``ProcessSession`` and a two-node
  ``SocketSession`` on host memory, with each kind's engine (``init_ccl`` with its
  ``available_ccls[0]``, and a node's devices on the ``SocketSession``). The shard functions
  TVM registers in the test module (``tests.disco.shard_dim_0``, ...) are registered in
  ``disco_helpers``, which the sessions' workers import.
* ``test_load_shard_in_relax`` compiles a Relax module (TVM's compiler, which cubepool
  does not have): skipped with that reason.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from disco_tvm import close_all, create_socket_session, process_session, threaded_session

from cubepool import disco as di
from cubepool.tensor_cache import dump_tensor_cache

SessionKind = Callable[..., di.Session]
Shape = tuple

_all_session_kinds: list[SessionKind] = [threaded_session, process_session, create_socket_session]
_CCL = {threaded_session: di.ThreadedSession.available_ccls[0]}
_CCL[process_session] = di.ProcessSession.available_ccls[0]
_CCL[create_socket_session] = di.SocketSession.available_ccls[0]


@pytest.fixture(autouse=True)
def _close_sessions() -> Iterator[None]:
    yield
    close_all()


def _run_with_session(session_kind: SessionKind, devices: list[int], func: Any) -> Any:
    sess = session_kind(num_workers=len(devices))
    # A node's devices (TVM's init_ccl takes one per worker of a node): all of them but
    # on a SocketSession, whose nodes here hold one worker each.
    per_node = getattr(sess, "num_workers_per_node", len(devices))
    sess.init_ccl(_CCL[session_kind], *devices[:per_node])
    return func(sess)


def _create_loader(sess: di.Session, path: str, param_dict: Any, shard_info: Any) -> di.DRef:
    path_tensor_cache = path + "/tensor-cache.json"
    dump_tensor_cache(param_dict, path, encode_format="raw")
    with open(path_tensor_cache, encoding="utf-8") as i_f:
        tensor_cache = i_f.read()
    loader_create = sess.get_global_func("runtime.disco.ShardLoader")
    return loader_create(path_tensor_cache, tensor_cache, json.dumps(shard_info), None)


def _simulate_presharded_weights(
    base_path: str, param_dict: Any, num_shards: int, shard_info: Any
) -> None:
    """Create fake weights to simulate those produced MLC-LLM's pre-sharding"""
    sharded_params = {}
    for key, ndarray in param_dict.items():
        assert key in shard_info, f"ShardInfo lacks shard info about param: {key}"
        shard_dim = shard_info[key]
        sharded_params[key] = np.split(ndarray, num_shards, axis=shard_dim)
    # Sorted first by shard, then by parameter, as MLC-LLM orders them.
    sharded_params = {
        f"{key}_shard-{i + 1}-of-{num_shards}": shards[i]
        for i in range(num_shards)
        for key, shards in sharded_params.items()
    }
    dump_tensor_cache(sharded_params, base_path, encode_format="raw")


def _create_presharded_loader(sess: di.Session, path: str) -> di.DRef:
    path_tensor_cache = path + "/tensor-cache.json"
    with open(path_tensor_cache, encoding="utf-8") as i_f:
        tensor_cache = i_f.read()
    loader_create = sess.get_global_func("runtime.disco.ShardLoader")
    return loader_create(path_tensor_cache, tensor_cache, json.dumps({}), None)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_load_shard(session_kind: SessionKind) -> None:
    devices = [0, 1]
    num_shards = len(devices)
    param_dict = {
        "x_0": np.random.uniform(size=[64, 128]).astype("float16"),
        "x_1": np.random.uniform(size=[32, 128]).astype("float32"),
    }
    shard_info = {
        "x_0": [["tests.disco.shard_dim_1", [(num_shards, 64, 64), "float16"], num_shards]],
        "x_1": [["tests.disco.shard_dim_0", [(num_shards, 16, 128), "float32"], num_shards]],
    }
    with tempfile.TemporaryDirectory() as path:

        def run_test(sess: di.Session) -> None:
            loader = _create_loader(sess, path, param_dict, shard_info)
            loader_load = sess.get_global_func("runtime.disco.ShardLoaderLoad")
            d_0 = loader_load(loader, Shape([0]))
            d_1 = loader_load(loader, Shape([1]))
            np.testing.assert_equal(
                param_dict["x_0"][:, 0:64], d_0.debug_get_from_remote(0).numpy()
            )
            np.testing.assert_equal(
                param_dict["x_0"][:, 64:128], d_0.debug_get_from_remote(1).numpy()
            )
            np.testing.assert_equal(
                param_dict["x_1"][0:16, :], d_1.debug_get_from_remote(0).numpy()
            )
            np.testing.assert_equal(
                param_dict["x_1"][16:32, :], d_1.debug_get_from_remote(1).numpy()
            )

        _run_with_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_load_presharded(session_kind: SessionKind) -> None:
    devices = [0, 1]
    param_dict = {
        "x_0": np.random.uniform(size=[64, 128]).astype("float16"),
        "x_1": np.random.uniform(size=[32, 128]).astype("float32"),
    }
    shard_info = {"x_0": 1, "x_1": 0}
    with tempfile.TemporaryDirectory() as path:
        _simulate_presharded_weights(path, param_dict, len(devices), shard_info)

        def run_test(sess: di.Session) -> None:
            loader = _create_presharded_loader(sess, path)
            loader_load = sess.get_global_func("runtime.disco.ShardLoaderLoadPresharded")
            d_0 = loader_load(loader, Shape([0]))
            d_1 = loader_load(loader, Shape([1]))
            np.testing.assert_equal(
                param_dict["x_0"][:, 0:64], d_0.debug_get_from_remote(0).numpy()
            )
            np.testing.assert_equal(
                param_dict["x_0"][:, 64:128], d_0.debug_get_from_remote(1).numpy()
            )
            np.testing.assert_equal(
                param_dict["x_1"][0:16, :], d_1.debug_get_from_remote(0).numpy()
            )
            np.testing.assert_equal(
                param_dict["x_1"][16:32, :], d_1.debug_get_from_remote(1).numpy()
            )

        _run_with_session(session_kind, devices, run_test)


@pytest.mark.skip(
    reason="compiles a Relax module with TVM's compiler, which cubepool does not have"
)
def test_load_shard_in_relax() -> None:
    """TVM's test builds a Relax module that takes the loaded weights."""


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_load_shard_all(session_kind: SessionKind) -> None:
    devices = [0, 1]
    num_shards = len(devices)
    param_dict = {
        "param_0": np.random.uniform(size=[64, 128]).astype("float16"),
        "param_1": np.random.uniform(size=[32, 128]).astype("float32"),
    }
    shard_info = {
        "param_0": [["tests.disco.shard_dim_1", [(num_shards, 64, 64), "float16"], num_shards]],
        "param_1": [["tests.disco.shard_dim_0", [(2, 16, 128), "float32"], num_shards]],
    }
    with tempfile.TemporaryDirectory() as path:

        def run_test(sess: di.Session) -> None:
            loader = _create_loader(sess, path, param_dict, shard_info)
            loader_load = sess.get_global_func("runtime.disco.ShardLoaderLoadAll")
            params = loader_load(loader)
            p_0 = params.debug_get_from_remote(0)
            p_1 = params.debug_get_from_remote(1)
            np.testing.assert_equal(param_dict["param_0"][:, 0:64], p_0[0].numpy())
            np.testing.assert_equal(param_dict["param_0"][:, 64:128], p_1[0].numpy())
            np.testing.assert_equal(param_dict["param_1"][0:16, :], p_0[1].numpy())
            np.testing.assert_equal(param_dict["param_1"][16:32, :], p_1[1].numpy())

        _run_with_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_load_all_presharded(session_kind: SessionKind) -> None:
    devices = [0, 1]
    param_dict = {
        "param_0": np.random.uniform(size=[64, 128]).astype("float16"),
        "param_1": np.random.uniform(size=[32, 128]).astype("float32"),
    }
    shard_info = {"param_0": 0, "param_1": 1}
    with tempfile.TemporaryDirectory() as path:
        _simulate_presharded_weights(path, param_dict, len(devices), shard_info)

        def run_test(sess: di.Session) -> None:
            loader = _create_presharded_loader(sess, path)
            loader_load = sess.get_global_func("runtime.disco.ShardLoaderLoadAllPresharded")
            params = loader_load(loader)
            p_0 = params.debug_get_from_remote(0)
            p_1 = params.debug_get_from_remote(1)
            np.testing.assert_equal(param_dict["param_0"][0:32, :], p_0[0].numpy())
            np.testing.assert_equal(param_dict["param_0"][32:64, :], p_1[0].numpy())
            np.testing.assert_equal(param_dict["param_1"][:, 0:64], p_0[1].numpy())
            np.testing.assert_equal(param_dict["param_1"][:, 64:128], p_1[1].numpy())

        _run_with_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_load_shard_broadcast(session_kind: SessionKind) -> None:
    devices = [0, 1]
    param_dict = {
        "param_0": np.random.uniform(size=[64, 128]).astype("float16"),
        "param_1": np.random.uniform(size=[32, 128]).astype("float32"),
    }
    shard_info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as path:

        def run_test(sess: di.Session) -> None:
            loader = _create_loader(sess, path, param_dict, shard_info)
            loader_load = sess.get_global_func("runtime.disco.ShardLoaderLoadAll")
            params = loader_load(loader)
            p_0 = params.debug_get_from_remote(0)
            p_1 = params.debug_get_from_remote(1)
            np.testing.assert_equal(param_dict["param_0"], p_0[0].numpy())
            np.testing.assert_equal(param_dict["param_0"], p_1[0].numpy())
            np.testing.assert_equal(param_dict["param_1"], p_0[1].numpy())
            np.testing.assert_equal(param_dict["param_1"], p_1[1].numpy())

        _run_with_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_load_qkv_proj_shard(session_kind: SessionKind) -> None:
    devices = [0, 1]
    num_shards = len(devices)
    q_heads = 8
    kv_heads = 10
    head_dim = 10
    hidden_size = 20
    w_q = np.random.uniform(size=[q_heads * head_dim, hidden_size]).astype("float16")
    w_k = np.random.uniform(size=[kv_heads * head_dim, hidden_size]).astype("float16")
    w_v = np.random.uniform(size=[kv_heads * head_dim, hidden_size]).astype("float16")
    w_qkv = np.concatenate([w_q, w_k, w_v], axis=0)
    param_dict = {"w_qkv": w_qkv}
    np_qkv = np.concatenate(
        [
            w_q.reshape((num_shards, q_heads // num_shards, head_dim, hidden_size)),
            w_k.reshape((num_shards, kv_heads // num_shards, head_dim, hidden_size)),
            w_v.reshape((num_shards, kv_heads // num_shards, head_dim, hidden_size)),
        ],
        axis=1,
    ).reshape((num_shards, -1, hidden_size))
    shard_info = {
        "w_qkv": [
            [
                "tests.disco.shard_qkv_0",
                [
                    (num_shards, (q_heads + kv_heads * 2) // num_shards, head_dim, hidden_size),
                    "float16",
                ],
                num_shards,
                q_heads,
                kv_heads,
            ],
            [
                "tests.disco.shard_qkv_1",
                [
                    (num_shards, (q_heads + kv_heads * 2) // num_shards * head_dim, hidden_size),
                    "float16",
                ],
            ],
        ],
    }
    with tempfile.TemporaryDirectory() as path:

        def run_test(sess: di.Session) -> None:
            loader = _create_loader(sess, path, param_dict, shard_info)
            loader_load = sess.get_global_func("runtime.disco.ShardLoaderLoad")
            d_0 = loader_load(loader, Shape([0]))
            np.testing.assert_equal(np_qkv[0], d_0.debug_get_from_remote(0).numpy())
            np.testing.assert_equal(np_qkv[1], d_0.debug_get_from_remote(1).numpy())

        _run_with_session(session_kind, devices, run_test)
