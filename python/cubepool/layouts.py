"""Pool layouts by name, as plain data, and in words.

* :func:`default_configuration` is the layout cubepool recommends without a plan, the
  ``virtual_pages`` preset: one virtual pool of 2 MiB granules placing blocks best-fit
  over reserved address space and mapping only the granules live blocks touch, with
  requests over 16 MiB in a range of their own (its docstring says the rest). The
  layout it replaced, sliced 8 MiB pages up to 4 MiB and exclusive pages above, is the
  ``compact`` preset.
* :func:`config_from_arg` turns a command-line ``--config`` value into a layout: a preset
  name, a JSON layout file (as ``cubepool plan --save`` writes), or the text of the pools
  configuration language when this build has ``MemoryConfiguration.parse``.
* :func:`to_spec` / :func:`from_spec` convert a layout to JSON-ready data and back. The
  data holds the layout's text (``str(layout)``, the pools configuration language, read
  back by :func:`from_text`): the text is the one serialisation of a layout, which the
  JSON spec, ``cubepool.toml`` and pickles all hold (layouts, pool options and pool
  types pickle as their text and unpickle through ``parse``), so layouts travel to
  worker processes and Dask workers.
* :func:`describe` says a layout in words: ``sliced 8 MiB pages (slices <= 4 MiB) ->
  exclusive pages``.
* :data:`TORCH_MODELS` are the comparison models ``torch`` and ``torch_expandable``: a
  model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``) with
  its default settings and with ``expandable_segments:True``. They replay a trace to show
  what PyTorch would reserve for it; they are models for comparison, not pools to
  allocate from (``MemoryManagement("torch")`` says so). Options go in parentheses,
  spelled as ``PYTORCH_CUDA_ALLOC_CONF`` spells them: ``torch(max_split_size_mb=128)``,
  ``torch_expandable(roundup_power2_divisions=4)``, or per size interval
  ``torch(roundup_power2_divisions=[256:1,>:8])``. Tables label them ``torch (model)``.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from cubepool._cubepool import (
    EXCLUSIVE_MEMORY_ONLY,
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryPoolOptions,
    PoolType,
    TorchAllocatorModel,
    plan_file_granule,
    pool_spec,
)
from cubepool._errors import CubepoolError, InvalidArgument, PoolConfigError
from cubepool._files import naming_reads, non_regular, open_regular, refuse_non_regular
from cubepool._format import human_bytes

__all__ = [
    "PRESETS",
    "TORCH_MODELS",
    "Layout",
    "LayoutLike",
    "as_configuration",
    "config_from_arg",
    "default_configuration",
    "describe",
    "from_spec",
    "from_text",
    "layout_label",
    "preset_name",
    "resolve_layout",
    "to_spec",
]

_TEMPORARY_PLAN: Final = re.compile(r"cubepool-plan-[A-Za-z0-9_]+\.json")
"""The name of the temporary plan file :func:`cubepool.plan` writes for the planned
layout it offers (``describe`` calls it so, since its path differs run to run)."""

_ANY_SIZE: Final = 1 << 62
"""A size larger than any page: pools clamp it to the device's largest page."""
# Properties under which resolving a layout changes nothing (alignment 1, huge pages),
# so `pools()` returns the layout's options as given.
_AS_GIVEN: Final = MemoryDeviceProperties(max_page_size=_ANY_SIZE, alignment=1)


def default_configuration() -> MemoryConfiguration:
    """Return the layout cubepool recommends when there is no plan.

    The ``virtual_pages`` preset: one virtual pool of 2 MiB granules (CUDA's mapping
    granularity) placing blocks best-fit over reserved address space, keeping free
    granules mapped up to the high-water mark of mapped bytes (``keep=none``: the peak
    of mapped bytes is eager unmapping's whatever is kept) and placing requests over
    16 MiB in a range of their own (``small=16MiB``). Sizes are bounded by the
    storage's memory (or a replay's ``limit``), not by a page. Utilization (peak live
    / peak reserved) on the shared traces: gpt2-train 0.97, gpt2-generate 0.94,
    transformer-train 0.98, vit-train 0.94, mixtral-train 0.98; ``compact`` reaches
    0.92, 0.88, 0.95, 0.81, 0.94.

    On a storage without virtual memory (``HostStorage`` off Linux) the preset falls
    back to ``compact``: one sliced pool of 8 MiB pages up to 4 MiB, then exclusive
    pages sized to each larger request. Builds with ``EXCLUSIVE_MEMORY_ONLY`` (no pool
    may share a page) get the ``ExclusivePages`` preset instead, as their Rust default
    is.
    """
    if EXCLUSIVE_MEMORY_ONLY:
        return MemoryConfiguration.exclusive_pages()
    return MemoryConfiguration.virtual_pages()


PRESETS: Final[Mapping[str, Callable[[], MemoryConfiguration]]] = {
    "default": default_configuration,
    "compact": MemoryConfiguration.compact,
    "sub_slices": MemoryConfiguration.sub_slices,
    "exclusive_pages": MemoryConfiguration.exclusive_pages,
    "virtual_pages": MemoryConfiguration.virtual_pages,
}
"""The layouts the command line knows by name."""


Layout = MemoryConfiguration | TorchAllocatorModel
"""What a replay runs a trace through: a pool layout, or a comparison model of PyTorch's
caching allocator (:data:`TORCH_MODELS`)."""

TORCH_MODELS: Final = ("torch", "torch_expandable")
"""The comparison models by name: PyTorch's caching allocator with its defaults, and with
``expandable_segments:True`` (see :class:`cubepool.TorchAllocatorModel`)."""

_MODEL_NAME: Final = re.compile(r"torch(_expandable)?\s*(\(.*\))?", re.DOTALL)


def layout_label(layout: Layout) -> str:
    """The name a layout goes by in tables: a preset's name, ``torch (model)`` for a
    comparison model (its options included), else the layout in words."""
    if isinstance(layout, TorchAllocatorModel):
        return f"{layout.name} (model)"
    return preset_name(layout) or describe(layout)


def preset_name(config: Layout) -> str | None:
    """Return the name under which :data:`PRESETS` holds ``config``, or ``None``."""
    if isinstance(config, TorchAllocatorModel):
        return None
    for name, make in PRESETS.items():
        if make() == config:
            return name
    return None


def _aliases(text: str) -> str:
    return text.strip().lower().replace("-", "_")


LayoutLike = MemoryConfiguration | TorchAllocatorModel | str | os.PathLike[str] | Any
"""Anything a layout argument takes (see :func:`resolve_layout`): a layout, a
:class:`cubepool.Plan`, a preset or model name, pools-language text, or a saved layout
file. (``Any`` stands for the plan, whose module imports this one.)"""

_LAYOUT_SUFFIXES: Final = (".json", ".toml", ".txt", ".pools", ".cfg", ".conf")


def _plan_config(value: object) -> MemoryConfiguration | None:
    """The layout of a :class:`cubepool.Plan` (or anything holding one as ``config``)."""
    config = getattr(value, "config", None)
    return config if isinstance(config, MemoryConfiguration) else None


def resolve_layout(value: LayoutLike) -> tuple[str, Layout]:
    """Turn any layout argument into ``(label, layout)``: the one rule of every function
    and command that takes a layout.

    Takes a :class:`MemoryConfiguration` or :class:`TorchAllocatorModel` (labelled by
    :func:`layout_label`), a :class:`cubepool.Plan` (its layout, labelled ``planned``),
    or a string or path read by :func:`config_from_arg`: a preset name (``default``
    included), a model name, a saved layout file, or pools-language text.

    Raises:
        InvalidArgument: a string that is none of these.
        FileNotFoundError: a layout file that does not exist.
        TypeError: a value of another type.
    """
    if isinstance(value, MemoryConfiguration | TorchAllocatorModel):
        return layout_label(value), value
    planned = _plan_config(value)
    if planned is not None:
        return "planned", planned
    if isinstance(value, str | os.PathLike):
        return config_from_arg(os.fspath(value))
    raise TypeError(
        "a layout is a MemoryConfiguration, a Plan, a preset or model name, pools-language "
        f"text or a layout file, got {type(value).__name__}"
    )


def as_configuration(value: LayoutLike) -> Layout:
    """The layout :func:`resolve_layout` reads from ``value``, without its label (what
    ``MemoryManagement(config)`` calls for anything but a ``MemoryConfiguration``)."""
    return resolve_layout(value)[1]


def _looks_like_path(text: str) -> bool:
    return (
        "\n" not in text
        and (text.lower().endswith(_LAYOUT_SUFFIXES) or os.sep in text or "/" in text)
        and "(" not in text
    )


def _toml_layout(path: Path) -> Layout:
    """The ``memory.pools`` layout of the ``cubepool.toml``-style file ``path``, read by
    the automatic search's reader (``src/config/environment.rs``): a string, or an array
    of strings, one pool each (read one by one: a ``#`` in one ends that entry, not the
    rest), and a relative plan file is the file's neighbour."""
    try:
        found = MemoryConfiguration.from_toml_file(path)
    except PoolConfigError as exc:
        # The caller names the file as it was given: the reader's message past its own
        # naming, the error's kind and position kept.
        exc.args = (str(exc).removeprefix(f"{path}: "), *exc.args[1:])
        raise
    if found is None:
        raise InvalidArgument('no layout: write it as pools = "..." under [memory]')
    return found


def config_from_arg(text: str) -> tuple[str, Layout]:
    """Turn a ``--config`` value into ``(label, layout)``.

    Tried in order: a preset name of :data:`PRESETS` (``default``, ``sub_slices``,
    ``exclusive_pages``; ``-`` may replace ``_``, case is ignored); a comparison model of
    :data:`TORCH_MODELS`, optionally with options (``torch(max_split_size_mb=128)``),
    labelled ``torch (model)``; a file holding a JSON
    layout (:func:`to_spec`'s form, as ``cubepool plan --save`` writes) or a plan file
    (``{"format": "cubepool-plan", ...}``, which ``--save`` writes for a planned layout:
    the layout is then ``planned(file=PATH)``), the text of
    the pools configuration language, or (a ``.toml`` file) ``memory.pools`` as
    ``cubepool.toml`` holds it; that text itself. The pools configuration language
    is read by ``MemoryConfiguration.parse`` where this build has it.

    Raises:
        InvalidArgument: the value is none of these (the message lists the presets).
        FileNotFoundError: the value names a layout file (it ends in ``.json``,
            ``.toml``, ``.txt``, ... or holds a ``/``) that does not exist.
        IsADirectoryError: such a value names a directory.
        OSError: such a value names a device, a FIFO or a socket (``EINVAL``, saying
            which), not a regular file.
    """
    name = _aliases(text)
    if name in PRESETS:
        return name, PRESETS[name]()
    if _MODEL_NAME.fullmatch(name):
        model = TorchAllocatorModel.parse(text)
        return layout_label(model), model
    path = Path(text)
    if "\n" not in text and _names_a_file(path):
        try:
            return path.name, _layout_file(path, text)
        except (CubepoolError, ValueError) as exc:
            # Every error of a layout file names it, as the command line gave it.
            exc.args = (f"{text}: {exc}", *exc.args[1:])
            raise
    if _looks_like_path(text):
        refuse_non_regular(text, "layout file")
        raise FileNotFoundError(errno.ENOENT, "no such layout file", text)
    try:
        return text, _layout_in(text)
    except InvalidArgument as exc:
        if not text.lstrip().startswith(("{", "[")):
            raise
        raise InvalidArgument(f"{text}: {exc}") from exc


def _names_a_file(path: Path) -> bool:
    """Whether ``path`` names a file: False for text no file can be named by (a name
    or path too long for the system, a NUL), which is then read as layout text."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


# The most bytes of a layout file read here, as ``cubepool.toml``'s bound: a layout
# takes a few lines. A larger file can only be a plan file, which the planned pool's
# reader reads and checks within its own bound (``MAX_PLAN_BYTES``), Python reading none
# of it: parsed here, a plan took twenty times its bytes.
_LAYOUT_FILE_BYTES: Final = 1 << 20

# The bytes of a larger layout file looked at to tell whether it may be a plan file (a
# JSON object, which ``cubepool plan --save`` starts with ``{``).
_PLAN_SNIFF_BYTES: Final = 4096


def _layout_file(path: Path, name: str) -> Layout:
    """The layout of the layout file ``path`` (named ``name`` on the command line): the
    whole file, a ``.toml``'s pools, or the plan a plan file holds."""
    # Opened without waiting and then looked at: a FIFO put in the file's place after it
    # was found would block the open.
    with naming_reads(path), open_regular(path, "layout file") as file:
        big = os.fstat(file.fileno()).st_size > _LAYOUT_FILE_BYTES
        data = file.read(_PLAN_SNIFF_BYTES) if big else file.read(_LAYOUT_FILE_BYTES + 1)
    if big or len(data) > _LAYOUT_FILE_BYTES:
        if not data[:_PLAN_SNIFF_BYTES].lstrip().startswith(b"{"):
            # No plan (a JSON object): told by its size, where the plan reader would
            # report a plan that does not parse.
            raise InvalidArgument(
                f"larger than {_LAYOUT_FILE_BYTES} bytes, too large for a layout file (a "
                "larger one is read only as a plan file, which is a JSON object, and this "
                "one does not start with '{')"
            )
        # Its name checked before the plan reader reads up to its bound.
        return planned_layout(check_plan_path_text(name), plan_file_granule(name))
    try:
        body = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"not UTF-8 text ({exc})") from exc
    if path.suffix.lower() == ".toml":
        return _toml_layout(path)
    # A relative plan file in it is the layout file's neighbour, wherever this runs.
    return _layout_in(body, name, path.parent)


def _layout_in(body: str, file: str | None = None, folder: Path | None = None) -> Layout:
    """The layout ``body`` holds (JSON or pools text), read from the layout file
    ``file`` in ``folder`` (whose relative plan files it names) or given as it is
    (None); errors are the caller's to name."""
    if body.lstrip().startswith(("{", "[")):
        try:
            spec = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InvalidArgument(f"not a JSON layout: {exc}") from exc
        except ValueError as exc:
            # An integer past Python's int-from-string digit limit (4,300 digits).
            raise InvalidArgument(f"not a JSON layout: {str(exc)[:200]}") from exc
        if isinstance(spec, dict) and spec.get("format") == "cubepool-plan" and file is not None:
            # A plan file (cubepool plan --save of a planned layout): the layout follows
            # it, with the granule it was chosen with where it names one.
            return planned_layout(file, spec.get("granule"))
        return from_spec(spec, folder=folder)
    try:
        return MemoryConfiguration.parse(body, folder)
    except PoolConfigError as exc:
        # A bare word that is no preset: list the presets; real configuration text
        # keeps the parser's error, which points at the problem.
        if exc.kind != "UnknownPreset":
            raise
    # A word with a dot is most likely a file name mistyped or missing; a word that
    # names a directory (or a device) was meant as a file, which it is not.
    kind = None if file is not None else non_regular(body.strip())
    if kind is not None:
        missing = f"; {body.strip()} is {kind}, not a layout file"
    else:
        missing = "; no file of that name exists" if "." in body else ""
    raise InvalidArgument(
        f"unknown layout {_short(body.strip())}{missing}: give a preset ({', '.join(PRESETS)}),"
        f" a comparison model ({', '.join(TORCH_MODELS)}), pools-language text (such as"
        ' "virtual(granule=2MiB)") or a layout file (JSON or a plan file as cubepool plan'
        " --save writes, pools text, a cubepool.toml)"
    )


def check_plan_path_text(path: str) -> str:
    """``path`` once the configuration language can carry it as ``planned(file=...)``:
    it holds none of ``,``, ``(``, ``)``, ``;``, ``=``, ``#`` or a new line (the language
    ends a value there: the rest would be read as more of the layout), does not start or
    end with spaces (which it strips) and is text a file name can be (no lone surrogate,
    which stands for a byte of a name that is not UTF-8 and would be read as ``?``).

    Raises:
        InvalidArgument: a character the configuration language cannot carry.
    """
    if any(c in path for c in ",();=#\n"):
        raise InvalidArgument(
            f"a plan file's path may not hold , ( ) ; = # or a new line: {path!r}"
        )
    if path != path.strip():
        # The configuration language strips a value's spaces: planned(file= a.json)
        # names "a.json", so the plan written to " a.json" would never be read back.
        raise InvalidArgument(f"a plan file's path may not start or end with spaces: {path!r}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"a plan file's path must be UTF-8 text (a layout names it so): {path!r}"
        ) from None
    return path


def planned_layout(path: str, granule: object = None) -> MemoryConfiguration:
    """The layout that follows the plan file at ``path``: ``planned(file=PATH)``, with
    ``granule=G`` where the plan file names the arena granule ``G`` it was chosen with
    (its ``"granule"``, which :func:`cubepool.plan` writes where a granule larger than
    the default keeps the plan within its budget of storage allocations; None for the
    default).

    Raises:
        InvalidArgument: ``granule`` is not a positive int, or ``path`` cannot be
            written in a layout (:func:`check_plan_path_text`).
    """
    check_plan_path_text(path)
    if granule is None:
        text = f"planned(file={path})"
    elif isinstance(granule, bool) or not isinstance(granule, int) or granule <= 0:
        raise InvalidArgument(
            f"plan file {path}: its granule must be a positive byte count, not {granule!r}"
        )
    else:
        text = f"planned(file={path}, granule={granule})"
    try:
        return MemoryConfiguration.parse(text)
    except PoolConfigError as exc:
        # The text is made here, not the user's: a place in it means nothing to them
        # (the message names the plan file and what in it is wrong).
        if exc.position is not None:
            exc.args = (_AT_CHARACTER.sub("", str(exc)), *exc.args[1:])
            exc.position = None
        raise


# The place a configuration text error ends with.
_AT_CHARACTER: Final = re.compile(r" \(at character \d+\)$")


# --------------------------------------------------------------------------- specs


def _pool_spec(options: MemoryPoolOptions) -> dict[str, Any]:
    spec = pool_spec(options)
    if spec["dealloc_period"] is None:
        del spec["dealloc_period"]
    return spec


def to_spec(config: Layout) -> dict[str, Any]:
    """Return ``config`` as JSON-ready data: ``{"layout": text}``, where ``text`` is the
    layout in the pools configuration language (``str(config)``: a preset's name such
    as ``"sub_slices"``, a comparison model such as
    ``"torch_expandable(max_split_size_mb=128)"``, or pools such as ``"sliced(page=8MiB,
    max_slice=4MiB); exclusive(max_alloc=1TiB)"``, each pool's options exactly as given,
    not fitted to a device). The text is the one serialisation of a layout: the JSON
    spec, ``cubepool.toml``'s ``memory.pools`` and pickles all hold it."""
    return {"layout": str(config)}


def from_text(text: str, *, folder: str | os.PathLike[str] | None = None) -> Layout:
    """The layout ``text`` says in the pools configuration language (what ``str`` of a
    layout gives), a comparison model's text included. With ``folder`` (the text read
    from a file there), a relative ``planned(file=...)`` names a plan in that folder.

    Raises:
        PoolConfigError: the text is not a layout.
        InvalidArgument: a comparison model's options are invalid.
    """
    if _MODEL_NAME.fullmatch(_aliases(text)):
        return TorchAllocatorModel.parse(text)
    return MemoryConfiguration.parse(text, folder)


_SPEC_FIELDS: Final = ("layout", "preset", "model", "pools")
"""The fields of a JSON layout, of which it has one: :func:`to_spec`'s ``layout``, and
the forms of earlier versions."""


def from_spec(
    spec: Mapping[str, Any] | list[Any], *, folder: str | os.PathLike[str] | None = None
) -> Layout:
    """Build the layout :func:`to_spec` described: ``{"layout": text}``. With ``folder``
    (the spec read from a file there), a relative ``planned(file=...)`` names a plan in
    that folder.

    The forms earlier versions wrote (and ``cubepool plan --save`` files saved by them
    hold) still load: ``{"preset": name}``, ``{"model": text}`` and ``{"pools": [{"kind":
    ..., sizes...}]}`` (a bare list is taken as ``pools``). The object has one of these
    fields and no other, as a pool's object has only its kind's fields.

    Raises:
        InvalidArgument: the data does not describe a layout (an unknown field, named
            with the known ones; two forms at once).
        PoolConfigError: the layout it describes is invalid.
    """
    if isinstance(spec, list):
        spec = {"pools": spec}
    if not isinstance(spec, Mapping):
        raise InvalidArgument(f"a layout is a JSON object, got {type(spec).__name__}")
    # One form, and nothing else: a field no form has (a misspelt one, a plan file's
    # given as layout text) or two forms at once would otherwise pass unsaid.
    unknown = [key for key in spec if key not in _SPEC_FIELDS]
    if unknown:
        raise InvalidArgument(
            f"unknown field {_short(unknown[0])} (a JSON layout has one of the fields "
            f"{', '.join(_SPEC_FIELDS)})"
        )
    given = [key for key in _SPEC_FIELDS if key in spec]
    if len(given) > 1:
        raise InvalidArgument(
            f"a JSON layout has one of the fields {', '.join(_SPEC_FIELDS)}, not "
            f"{' and '.join(given)}"
        )
    if "layout" in spec:
        text = spec["layout"]
        if not isinstance(text, str):
            raise InvalidArgument(f"a layout is written as text, got {_short(text)}")
        return from_text(text, folder=folder)
    # The forms of earlier versions, read for compatibility.
    if "model" in spec:
        model = spec["model"]
        if not isinstance(model, str):
            raise InvalidArgument(f"a model is named by a string, got {model!r}")
        return TorchAllocatorModel.parse(model)
    if "preset" in spec:
        preset = spec["preset"]
        if not isinstance(preset, str) or _aliases(preset) not in PRESETS:
            raise InvalidArgument(f"unknown preset {_short(preset)}; known: {', '.join(PRESETS)}")
        return PRESETS[_aliases(preset)]()
    pools = spec.get("pools")
    if not isinstance(pools, list) or not pools:
        raise InvalidArgument('a layout needs "layout", "preset" or a non-empty "pools" list')
    return MemoryConfiguration.custom([_pool_from_spec(p) for p in pools])


def _pool_from_spec(spec: object) -> MemoryPoolOptions:
    if not isinstance(spec, Mapping):
        raise InvalidArgument(f"a pool is a JSON object, got {type(spec).__name__}")
    fields = dict(spec)
    kind = fields.pop("kind", None)
    period = fields.pop("dealloc_period", None)
    makers: dict[str, Callable[..., PoolType]] = {
        "sliced_pages": PoolType.sliced_pages,
        "exclusive_pages": PoolType.exclusive_pages,
        "direct": PoolType.direct,
        "virtual_pages": PoolType.virtual_pages,
    }
    if not isinstance(kind, str) or kind not in makers:
        raise InvalidArgument(f"unknown pool kind {_short(kind)}; known: {', '.join(makers)}")
    _check_fields(kind, makers[kind], fields)
    try:
        return MemoryPoolOptions(makers[kind](**fields), period)
    except (TypeError, OverflowError, InvalidArgument) as exc:
        raise InvalidArgument(f"{kind}: {exc}") from exc


def _check_fields(kind: str, maker: Callable[..., PoolType], fields: Mapping[str, Any]) -> None:
    """Refuses a pool's fields that ``maker`` does not take, or lacking one it needs,
    naming them (not as Python names a call's arguments)."""
    parameters = inspect.signature(maker).parameters
    unknown = [name for name in fields if name not in parameters]
    needed = [
        name
        for name, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty and name not in fields
    ]
    if unknown or needed:
        problem = (
            f"unknown field {_short(unknown[0])}" if unknown else f"needs the field {needed[0]!r}"
        )
        raise InvalidArgument(
            f"{kind}: {problem} (its fields: {', '.join(parameters)}, dealloc_period)"
        )


def _short(value: object) -> str:
    """``repr(value)``, cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# --------------------------------------------------------------------------- words


def _size(n: int) -> str:
    return "any size" if n >= _ANY_SIZE else human_bytes(n).replace(".0 ", " ")


def describe(config: LayoutLike, properties: MemoryDeviceProperties | None = None) -> str:
    """Say ``config`` in words, pools in routing order, e.g.
    ``sliced 8 MiB pages (slices <= 4 MiB) -> exclusive pages``; the built-in presets by
    their CubeCL names (``SubSlices``, ``ExclusivePages``); a comparison model as
    ``model of PyTorch's caching allocator (expandable segments)``. With ``properties``,
    the pools as that device has them (pages shrunk to its largest page, sizes rounded
    to its alignment).

    ``config`` is anything a layout argument takes (:func:`resolve_layout`): a layout, a
    :class:`cubepool.Plan`, a preset or model name (``"sub_slices"``), pools-language
    text or a layout file.

    Raises:
        TypeError: ``config`` is of no type a layout argument takes (``None`` included:
            describe ``"default"`` for the default layout).
        InvalidArgument: a string that is no layout (as :func:`config_from_arg`).
        OSError: a layout file that does not exist or cannot be read.
    """
    if not isinstance(config, MemoryConfiguration | TorchAllocatorModel):
        try:
            config = as_configuration(config)
        except TypeError as exc:
            hint = " (describe 'default' for the default layout)" if config is None else ""
            raise TypeError(f"describe's config: {exc}{hint}") from None
    if isinstance(config, TorchAllocatorModel):
        options = ["expandable segments" if config.expandable_segments else "default settings"]
        # The options its name gives (those that differ from the defaults, as
        # ``PYTORCH_CUDA_ALLOC_CONF`` spells them).
        name = config.name
        if name.endswith(")"):
            options.append(name[name.index("(") + 1 : -1])
        return f"model of PyTorch's caching allocator ({', '.join(options)})"
    names = {"sub_slices": "SubSlices", "exclusive_pages": "ExclusivePages"}
    if config.preset in names:
        return names[config.preset]
    device = _AS_GIVEN if properties is None else properties
    return " -> ".join(_describe_pool(o) for o in config.pools(device))


def _describe_pool(options: MemoryPoolOptions) -> str:
    spec = _pool_spec(options)
    kind = spec["kind"]
    if kind == "sliced_pages":
        text = f"sliced {_size(spec['page_size'])} pages (slices <= {_size(spec['max_slice_size'])}"
        if spec["max_pool_size"] is not None:
            text += f", at most {_size(spec['max_pool_size'])}"
        text += ")"
    elif kind == "exclusive_pages":
        limit = spec["max_alloc_size"]
        text = "exclusive pages" + ("" if limit >= _ANY_SIZE else f" (<= {_size(limit)})")
    elif kind == "virtual_pages":
        keep = (
            "idle kept under the peak"
            if spec["keep"] is None
            else "eager unmap"
            if spec["keep"] == 0
            else f"keeps <= {_size(spec['keep'])} idle"
        )
        text = f"virtual {_size(spec['granule'])} granules ({keep}"
        if spec["small"] > 0:
            text += f", small <= {_size(spec['small'])} apart"
        text += ")"
    elif kind == "planned":
        file = spec["file"]
        if _TEMPORARY_PLAN.fullmatch(os.path.basename(file)):
            # cubepool.plan's own, until Plan.save_planned (or --save) writes it.
            file = "a temporary plan file"
        text = f"planned arena of {file} ({_size(spec['granule'])} granules, misses virtual)"
    else:
        reclaim = spec["reclaim_at"]
        text = "direct buffers" + (
            "" if reclaim is None else f" (cache released past {_size(reclaim)})"
        )
    if options.dealloc_period is not None:
        text += f" [free pages released after {options.dealloc_period:,} reserves]"
    return text
