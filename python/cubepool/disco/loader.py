"""TVM's ``ShardLoader``: a model's parameters from a tensor cache onto the workers.

Worker 0 reads each parameter from the cache (:mod:`cubepool.tensor_cache`), applies
the parameter's shard functions, and scatters the result's first axis over the workers;
a parameter with no shard function is broadcast whole. Presharded caches (names
``NAME_shard-K-of-N``, MLC-LLM's) are read by each worker for itself. The functions are
registered under TVM's names, so the controller reaches them as TVM's tests do::

    loader = sess.get_global_func("runtime.disco.ShardLoader")(
        path_to_tensor_cache_json, tensor_cache_json_text, shard_info_json_text, None)
    weight = sess.get_global_func("runtime.disco.ShardLoaderLoad")(loader, (0,))

``shard_info`` maps a parameter's name to its shard functions, applied in turn:
``[[func_name, [output_shape, output_dtype], int_arg, ...], ...]``. A shard function is
a registered function (``register_func``; on a ``ProcessSession`` registered in the
workers too, by a module they import) called as ``func(param, *int_args, out)`` with
``out`` an empty tensor of the output shape and dtype, which it fills (TVM's packed
call). The last output's first axis must be the number of workers.

What differs from TVM: there are no compiled modules, so the fourth argument of
``ShardLoader`` is None or a mapping of function names to callables, looked up before
the registry; every argument, the cache's metadata and its shard files' kinds and sizes
are checked on every worker when the loader is made (``InvalidArgument``,
``TensorFormatError``), and a parameter named twice in the cache is refused (TVM keeps
the last). When worker 0 fails to read or shard a parameter, it still takes its part in
the load's collective (sending zeros) before it raises, so the other workers are not left
waiting and the session goes on; TVM's workers would wait.
"""

from __future__ import annotations

import json
import operator
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cubepool
from cubepool._errors import InvalidArgument
from cubepool.disco.registry import get_global_func, register_func
from cubepool.disco.worker import current_worker
from cubepool.tensor_cache import (
    ParamRecord,
    ShardRecord,
    TensorCacheMetadata,
    decode_param,
    read_tensor_cache_metadata,
)

__all__ = ["ShardFunc", "ShardLoader"]

#: A presharded parameter's name: ``NAME_shard-K-of-N`` (K counts from 1).
_PRESHARDED = re.compile(r"^(?P<base>.*)_shard-(?P<k>\d+)-of-(?P<n>\d+)$")


@dataclass(frozen=True)
class ShardFunc:
    """One step of a parameter's sharding: ``func(param, *args, out)``."""

    name: str
    func: Callable[..., Any]
    shape: tuple[int, ...]
    dtype: str
    args: tuple[int, ...]


def _shard_funcs(
    name: str, steps: Any, functions: Mapping[str, Callable[..., Any]]
) -> tuple[ShardFunc, ...]:
    where = f"shard_info[{name!r:.60}]"
    if not isinstance(steps, list):
        raise InvalidArgument(f"{where} must be a list of shard functions, got {steps!r:.80}")
    funcs = []
    for i, step in enumerate(steps):
        at = f"{where}[{i}]"
        if not (
            isinstance(step, list)
            and len(step) >= 2
            and isinstance(step[0], str)
            and isinstance(step[1], list)
            and len(step[1]) == 2
            and isinstance(step[1][0], list)
            and isinstance(step[1][1], str)
        ):
            raise InvalidArgument(
                f"{at} must be [func_name, [shape, dtype], int, ...], got {step!r:.80}"
            )
        shape, dtype = step[1]
        args = step[2:]
        for value in [*shape, *args]:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgument(f"{at}: shape and arguments must be ints, got {step!r:.80}")
        if any(dim < 0 for dim in shape):
            raise InvalidArgument(f"{at}: shape {shape} has a negative dimension")
        func = functions.get(step[0]) or get_global_func(step[0], allow_missing=True)
        if func is None:
            raise InvalidArgument(f"{at}: undefined function {step[0]!r:.60} (not registered)")
        funcs.append(ShardFunc(step[0], func, tuple(shape), dtype, tuple(args)))
    return tuple(funcs)


def _index(value: Any, what: str) -> int:
    """An index given as an int or a one-element shape (TVM passes ``Shape([i])``)."""
    if isinstance(value, tuple | list) and len(value) == 1:
        value = value[0]
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise InvalidArgument(
            f"{what} must be an int or a one-element shape, got {value!r:.60}"
        ) from None


class ShardLoader:
    """A tensor cache with each parameter's shard functions, on one worker.

    Built by ``runtime.disco.ShardLoader`` on every worker; the other
    ``runtime.disco.ShardLoader*`` functions take it (its register) and return tensors
    of the worker's own pools.
    """

    def __init__(
        self,
        path_to_metadata: str | os.PathLike[str],
        metadata: str,
        shard_info: str,
        functions: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        if not isinstance(path_to_metadata, str | os.PathLike) or not isinstance(metadata, str):
            raise InvalidArgument("the cache's path must be a path and its metadata a string")
        if functions is not None and not isinstance(functions, Mapping):
            raise InvalidArgument(
                "cubepool has no compiled modules: the fourth argument must be None or a "
                f"mapping of function names to callables, got {type(functions).__name__}"
            )
        self.metadata: TensorCacheMetadata = read_tensor_cache_metadata(metadata, path_to_metadata)
        try:
            info = json.loads(shard_info) if shard_info else {}
        except (TypeError, ValueError, RecursionError) as error:
            raise InvalidArgument(f"shard_info is not JSON: {error}") from None
        if not isinstance(info, dict):
            raise InvalidArgument(f"shard_info must be a JSON object, got {shard_info!r:.80}")
        self.metadata.check_shards()
        self.params: list[tuple[ShardRecord, ParamRecord]] = self.metadata.params()
        self.index = {record.name: i for i, (_, record) in enumerate(self.params)}
        # As TVM: shard functions of parameters the cache lacks are not looked at (a
        # presharded cache comes with the model's unsharded shard_info).
        self.shard_funcs = {
            name: _shard_funcs(name, steps, functions or {})
            for name, steps in info.items()
            if name in self.index
        }
        self._shard: ShardRecord | None = None
        self._bytes = b""

    def load_direct(self, index: int) -> cubepool.Tensor:
        """Parameter ``index`` (in the cache's order), whole, in this worker's pools."""
        shard, record = self.params[index]
        if shard is not self._shard:
            # One shard file held at a time, as TVM's loader does.
            self._bytes = self.metadata.read_shard(shard)
            self._shard = shard
        tensor = current_worker().empty(record.shape, record.dtype)
        decode_param(record, self._bytes, tensor)
        return tensor

    def apply(self, step: ShardFunc, param: cubepool.Tensor) -> cubepool.Tensor:
        """``step`` run on ``param``: a new tensor of the step's output shape and dtype."""
        out = current_worker().empty(step.shape, step.dtype)
        step.func(param, *step.args, out)
        return out

    def _param(self, index: int) -> tuple[ShardRecord, ParamRecord]:
        if not 0 <= index < len(self.params):
            raise InvalidArgument(
                f"parameter index {index} is out of range: the cache holds {len(self.params)}"
            )
        return self.params[index]

    def load(self, index: int) -> cubepool.Tensor:
        """Parameter ``index`` as this worker's part: its shard functions' output, split
        over the workers along the first axis, or the whole parameter where it has none.
        Every worker must call it (it is a collective)."""
        worker = current_worker()
        _, record = self._param(index)
        steps = self.shard_funcs.get(record.name, ())
        if not steps:
            tensor, failure = _on_worker0(
                lambda: self.load_direct(index), record.shape, record.dtype
            )
            worker.communicator.broadcast_from_worker0(tensor, False, tensor)
            if failure is not None:
                raise failure
            return tensor
        last = steps[-1]
        if not last.shape or last.shape[0] != worker.num_workers:
            raise InvalidArgument(
                f"the first dimension of {record.name!r:.60}'s sharded shape {last.shape} "
                f"must be the number of shards ({worker.num_workers})"
            )

        def sharded() -> cubepool.Tensor:
            param = self.load_direct(index)
            for step in steps:
                param = self.apply(step, param)
            return param

        recv = worker.empty(last.shape[1:], last.dtype)
        send, failure = _on_worker0(sharded, last.shape, last.dtype)
        worker.communicator.scatter_from_worker0(send, False, recv)
        if failure is not None:
            raise failure
        return recv

    def load_all(self) -> list[cubepool.Tensor]:
        """Parameters ``param_0``, ``param_1``, ... in turn, as :meth:`load` gives them."""
        return [self.load(self._named(f"param_{i}")) for i in range(len(self.params))]

    def _named(self, name: str) -> int:
        if name not in self.index:
            raise InvalidArgument(f"parameter {name!r:.60} is not in the cache")
        return self.index[name]

    def load_presharded(self, index: int) -> cubepool.Tensor:
        """This worker's copy of presharded parameter ``index``: the cache holds each
        worker's parameters in turn, named ``NAME_shard-K-of-N``."""
        worker = current_worker()
        per_worker = len(self.params) // worker.num_workers
        position = worker.worker_id * per_worker + index
        if not 0 <= index < per_worker:
            raise InvalidArgument(
                f"presharded parameter {index} is out of range: each of the "
                f"{worker.num_workers} workers has {per_worker}"
            )
        _, record = self.params[position]
        self._check_shard(record.name, worker.worker_id, worker.num_workers)
        return self.load_direct(position)

    def load_all_presharded(self) -> list[cubepool.Tensor]:
        """This worker's ``param_I_shard-K-of-N`` for every I."""
        worker = current_worker()
        count = len(self.params) // worker.num_workers
        rank, total = worker.worker_id + 1, worker.num_workers
        return [
            self.load_direct(self._named(f"param_{i}_shard-{rank}-of-{total}"))
            for i in range(count)
        ]

    @staticmethod
    def _check_shard(name: str, worker_id: int, num_workers: int) -> None:
        match = _PRESHARDED.match(name)
        if match is None:
            raise InvalidArgument(f"{name!r:.60} is not a presharded name (NAME_shard-K-of-N)")
        k, n = int(match["k"]), int(match["n"])
        if n != num_workers or k - 1 != worker_id:
            raise InvalidArgument(
                f"{name!r:.60} is shard {k} of {n}, but worker {worker_id} of {num_workers} "
                f"wants shard {worker_id + 1} of {num_workers}"
            )

    def load_param_on_worker0(self, weight_index: int) -> cubepool.Tensor:
        """``param_{weight_index}`` read on worker 0; the other workers get an empty
        tensor of its shape and dtype."""
        worker = current_worker()
        index = self._named(f"param_{weight_index}")
        if worker.worker_id == 0:
            return self.load_direct(index)
        _, record = self.params[index]
        return worker.empty(record.shape, record.dtype)


def _on_worker0(
    make: Callable[[], cubepool.Tensor], shape: tuple[int, ...], dtype: str
) -> tuple[cubepool.Tensor, Exception | None]:
    """What this worker brings to a load's collective: on worker 0, ``make()``, or, when
    it fails, zeros of ``shape`` and ``dtype`` and the error to raise once the collective
    is done (so the other workers are not left in it); elsewhere an empty tensor of
    ``shape`` to receive into."""
    worker = current_worker()
    if worker.worker_id != 0:
        return worker.empty(shape, dtype), None
    try:
        return make(), None
    except Exception as error:
        zeros = worker.empty(shape, dtype)
        cubepool.copy_from_bytes(zeros, bytes(zeros.nbytes))
        return zeros, error


def _loader(value: Any) -> ShardLoader:
    if not isinstance(value, ShardLoader):
        raise InvalidArgument(f"expected a ShardLoader, got {type(value).__name__}")
    return value


@register_func("runtime.disco.ShardLoader")
def create_shard_loader(
    path_to_metadata: str | os.PathLike[str],
    metadata: str,
    shard_info: str,
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> ShardLoader:
    """A :class:`ShardLoader` on this worker (TVM's ``ShardLoaderObj::Create``)."""
    return ShardLoader(path_to_metadata, metadata, shard_info, functions)


@register_func("runtime.disco.ShardLoaderLoad")
def shard_loader_load(loader: Any, weight_index: Any) -> cubepool.Tensor:
    """This worker's part of parameter ``weight_index`` (a one-element shape or an int)."""
    return _loader(loader).load(_index(weight_index, "weight_index"))


@register_func("runtime.disco.ShardLoaderLoadPresharded")
def shard_loader_load_presharded(loader: Any, weight_index: Any) -> cubepool.Tensor:
    """This worker's presharded copy of parameter ``weight_index``."""
    return _loader(loader).load_presharded(_index(weight_index, "weight_index"))


@register_func("runtime.disco.ShardLoaderLoadAll")
def shard_loader_load_all(loader: Any) -> list[cubepool.Tensor]:
    """This worker's part of every parameter, ``param_0`` first."""
    return _loader(loader).load_all()


@register_func("runtime.disco.ShardLoaderLoadAllPresharded")
def shard_loader_load_all_presharded(loader: Any) -> list[cubepool.Tensor]:
    """This worker's presharded copy of every parameter."""
    return _loader(loader).load_all_presharded()


@register_func("runtime.disco.ShardLoaderLoadParamOnWorker0")
def shard_loader_load_param_on_worker0(loader: Any, param_index: Any) -> cubepool.Tensor:
    """``param_{param_index}`` on worker 0, an empty tensor of its shape elsewhere."""
    return _loader(loader).load_param_on_worker0(_index(param_index, "param_index"))
