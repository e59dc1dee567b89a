"""Functions registered by name, so that a controller can have workers call them.

A worker looks a name up here when it runs ``Session.get_global_func(name)``. Code that
workers should run is registered at import time of a module
(``@cubepool.disco.register_func("my.func")``), and the session has every worker import
that module (``Session.import_python_module("my_module")``); in a ``ThreadedSession`` the
workers share the controller's registry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from cubepool._errors import InvalidArgument, NotFound

F = TypeVar("F", bound=Callable[..., Any])

_FUNCTIONS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


@overload
def register_func(name: str, func: None = None, *, override: bool = False) -> Callable[[F], F]: ...
@overload
def register_func(name: str, func: F, *, override: bool = False) -> F: ...
def register_func(
    name: str, func: F | None = None, *, override: bool = False
) -> F | Callable[[F], F]:
    """Register ``func`` under ``name`` (as a decorator when ``func`` is omitted).

    Registering a taken name raises ``InvalidArgument`` (a ``ValueError``) unless
    ``override`` is true.
    """

    def register(f: F) -> F:
        if not callable(f):
            raise TypeError(f"register_func({name!r}) needs a callable, got {type(f).__name__}")
        with _LOCK:
            if name in _FUNCTIONS and not override and _FUNCTIONS[name] is not f:
                raise InvalidArgument(f"a function is already registered as {name!r}")
            _FUNCTIONS[name] = f
        return f

    if func is None:
        return register
    return register(func)


def get_global_func(name: str, allow_missing: bool = False) -> Callable[..., Any] | None:
    """The function registered as ``name``; ``NotFound`` (or None with ``allow_missing``)."""
    with _LOCK:
        func = _FUNCTIONS.get(name)
    if func is None and not allow_missing:
        raise NotFound(f"no function is registered as {name!r} in this process")
    return func


def list_global_func_names() -> list[str]:
    """The registered names, sorted."""
    with _LOCK:
        return sorted(_FUNCTIONS)
