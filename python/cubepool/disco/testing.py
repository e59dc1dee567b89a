"""TVM's ``tests.disco.*`` worker functions, registered under TVM's names.

TVM's worker module, ``tvm.exec.disco_worker``, registers these on every worker it
starts (and in a test process that imports it, for a ``ThreadedSession``); TVM's Disco
tests call them by name (``sess.get_global_func("tests.disco.add_one")``). Importing this
module registers them in cubepool's registry, so those tests run as written:

- a ``ProcessSession`` started with TVM's default ``entrypoint``
  (``"tvm.exec.disco_worker"``) and every ``SocketSession`` have their workers import it
  at start, as TVM's workers run ``tvm.exec.disco_worker``;
- ``Session.import_python_module("tvm.exec.disco_worker")`` imports it (TVM's
  ``test_callback.py`` does that);
- for a ``ThreadedSession``, whose workers share the controller's registry, import it on
  the controller (TVM's ``test_session.py`` imports ``tvm.exec.disco_worker`` there).

The functions are TVM's, with TVM's objects as Python's: a ``String`` is a ``str``, a
``Shape`` a ``tuple``, a ``Tensor`` a ``cubepool.Tensor`` from the worker's own pools.
They are registered with ``override=True``, as TVM registers them, so importing this
module again, or after a module that registered the same names, replaces them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import cubepool
from cubepool.disco.registry import register_func
from cubepool.disco.worker import current_worker


@register_func("tests.disco.add_one", override=True)
def add_one(x: int) -> int:
    """``x + 1``."""
    return x + 1


@register_func("tests.disco.add_one_float", override=True)
def add_one_float(x: float) -> float:
    """``x + 0.5``."""
    return x + 0.5


@register_func("tests.disco.add_one_tensor", override=True)
def add_one_tensor(x: Any) -> cubepool.Tensor:
    """A new tensor of ``x + 1``, from this worker's pools."""
    return cubepool.tensor(np.asarray(x) + 1, memory=current_worker().memory)


@register_func("tests.disco.str", override=True)
def str_func(x: str) -> str:
    """``x + "_suffix"``."""
    return x + "_suffix"


@register_func("tests.disco.str_obj", override=True)
def str_obj_func(x: str) -> str:
    """``x + "_suffix"`` (TVM passes and returns a ``String`` object; here a ``str``)."""
    if not isinstance(x, str):
        raise TypeError(f"tests.disco.str_obj takes a str, got {type(x).__name__}")
    return x + "_suffix"


@register_func("tests.disco.shape_tuple", override=True)
def shape_tuple_func(x: tuple[int, ...]) -> tuple[int, ...]:
    """``x`` with 4 and 5 appended (TVM's ``Shape``; here a tuple)."""
    if not isinstance(x, tuple):
        raise TypeError(f"tests.disco.shape_tuple takes a tuple, got {type(x).__name__}")
    return (*x, 4, 5)


@register_func("tests.disco.test_callback", override=True)
def make_callback(device: Any) -> Callable[[str, int], cubepool.Tensor]:
    """TVM's callback for lazy parameter loading (``tests/python/disco/test_callback.py``):
    a function of a parameter's name and index that returns the parameter, a tensor on
    ``device`` from this worker's pools: ``"A"`` (index 0) is ``arange(16)`` as 4x4
    int32, ``"B"`` (index 1) ``arange(4)`` as 2x2 float32; any other index raises
    ``ValueError``. The function stays in a register on the worker, to be passed to
    other calls there (it does not travel to the controller: it cannot be pickled)."""
    memory = current_worker().memory

    def fget_item(param_name: str, param_index: int) -> cubepool.Tensor:
        if param_index == 0:
            if param_name != "A":
                raise ValueError(f"parameter 0 is 'A', not {param_name!r}")
            array = np.arange(16).reshape([4, 4]).astype("int32")
        elif param_index == 1:
            if param_name != "B":
                raise ValueError(f"parameter 1 is 'B', not {param_name!r}")
            array = np.arange(4).reshape([2, 2]).astype("float32")
        else:
            raise ValueError(f"Unexpected index {param_index}")
        return cubepool.tensor(array, device=device, memory=memory)

    return fget_item
