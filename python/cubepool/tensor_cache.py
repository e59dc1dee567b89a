"""TVM's tensor cache: a model's parameters as ``tensor-cache.json`` and binary shards.

The format MLC-LLM ships weights in and TVM's Disco ``ShardLoader`` reads
(``tvm.contrib.tvmjs.dump_tensor_cache``, ``TensorCacheMetadata`` in TVM's runtime). A
cache directory holds ``tensor-cache.json``::

    {"metadata": {...},
     "records": [{"dataPath": "params_shard_0.bin", "format": "raw-shard",
                  "nbytes": 1234, "md5sum": "...",
                  "records": [{"name": "w", "shape": [4, 4], "dtype": "float32",
                               "format": "raw", "nbytes": 64, "byteOffset": 0}, ...]},
                 ...]}

and the shard files it names: each parameter is ``nbytes`` bytes at ``byteOffset`` of its
shard, in C order, raw or (``"f32-to-bf16"``, float32 parameters only) as the upper half
of each float32, rounded to nearest even.

The metadata is attack surface: :func:`read_tensor_cache_metadata` checks every field
before anything is read. A ``dataPath`` must be a relative path with no ``..`` and no
control characters, so the metadata alone cannot name a file outside the cache's
directory; symbolic links inside the directory are followed (a Hugging Face snapshot's
files are links into its blob store), so whoever can place links there chooses what is
read. A shard is read only when it is a regular file of exactly the size the metadata
says. Every problem is a :class:`~cubepool.TensorFormatError` naming the file and the
record.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from cubepool._cubepool import Tensor, copy_from_bytes, empty
from cubepool._errors import InvalidArgument, TensorError, TensorFormatError
from cubepool._tensor import bfloat16_values

__all__ = [
    "CACHE_FILE",
    "ParamRecord",
    "ShardRecord",
    "TensorCacheMetadata",
    "dump_tensor_cache",
    "load_tensor_cache",
    "read_tensor_cache_metadata",
]

CACHE_FILE = "tensor-cache.json"
"""The name of a cache's metadata file in its directory."""
LEGACY_CACHE_FILE = "ndarray-cache.json"
"""The name older caches (MLC-LLM's weights before TVM renamed NDArray) give it, read
where a directory has no :data:`CACHE_FILE`."""

ENCODE_FORMATS = ("raw", "f32-to-bf16")
"""How a parameter's bytes may be stored."""


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int | None:
    """Bytes of one element of ``dtype`` as a cubepool tensor holds it, None for a dtype
    tensors do not hold: the tensor library's own reading of dtypes, so a cache holds
    what a tensor can."""
    try:
        return empty((1,), dtype).nbytes
    except (TensorError, TypeError, ValueError):
        return None


_MAX_METADATA_BYTES = 64 << 20
"""The largest ``tensor-cache.json`` read: a model's is kilobytes to a few megabytes, and
Python's JSON parser builds tens of bytes for each byte of a hostile one (10 million
empty lists, a 30 MB file, took 764 MB: helper-138's measurement), so 1 GiB allowed
some 25 GB; 64 MiB allows some 1.6 GB."""

_MAX_DIMS = 64
"""The most dimensions a parameter may have (TVM's tensors have a handful)."""

_LIMIT = 1 << 63
"""Sizes, offsets and element counts must stay below this."""


@dataclass(frozen=True)
class ParamRecord:
    """One parameter of a shard file."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    format: str
    nbytes: int
    byte_offset: int


@dataclass(frozen=True)
class ShardRecord:
    """One shard file and the parameters it holds."""

    data_path: str
    nbytes: int
    md5sum: str | None
    records: tuple[ParamRecord, ...]


@dataclass(frozen=True)
class TensorCacheMetadata:
    """A checked ``tensor-cache.json``: its shard files and their parameters, in order.

    ``directory`` is where the shard files are (the metadata file's own directory).
    """

    directory: Path
    metadata: Any
    shards: tuple[ShardRecord, ...]

    def params(self) -> list[tuple[ShardRecord, ParamRecord]]:
        """Every parameter with its shard file, in the order of the file (TVM's order)."""
        return [(shard, record) for shard in self.shards for record in shard.records]

    def shard_path(self, shard: ShardRecord) -> Path:
        """The file of ``shard`` (inside :attr:`directory`, checked when read)."""
        return self.directory / shard.data_path

    def read_shard(self, shard: ShardRecord) -> bytes:
        """The bytes of ``shard``'s file; :class:`TensorFormatError` unless it has the
        size the metadata says."""
        path = self.shard_path(shard)
        try:
            # Not blocking on a FIFO: the kind and size are checked before any read.
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (OSError, ValueError) as error:
            raise TensorFormatError(f"{path}: cannot read the shard file: {error}") from None
        try:
            # Checked on the descriptor before a file object is made of it: `open` of a
            # directory's descriptor fails naming the descriptor, and leaves it open.
            _check_shard_file(path, os.fstat(fd), shard.nbytes)
            file = open(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with file:
            data = file.read(shard.nbytes)
        if len(data) != shard.nbytes:
            raise TensorFormatError(f"{path}: the shard file shrank while it was read")
        return data

    def check_shards(self) -> None:
        """Checks that every shard file is a regular file of its size, and a file of its
        own, reading none. Two records naming one file (by two paths, or through a link)
        would each read it whole: 6,000 records over one 1 MiB file made 6 GiB of
        tensors."""
        seen: dict[tuple[int, int], Path] = {}
        for shard in self.shards:
            path = self.shard_path(shard)
            try:
                info = os.stat(path)
            except (OSError, ValueError) as error:
                raise TensorFormatError(f"{path}: cannot read the shard file: {error}") from None
            _check_shard_file(path, info, shard.nbytes)
            file = (info.st_dev, info.st_ino)
            if file in seen:
                raise TensorFormatError(
                    f"{path}: the same shard file as {seen[file]} (each record's shard is a "
                    "file of its own)"
                )
            seen[file] = path


def _check_shard_file(path: Path, info: os.stat_result, nbytes: int) -> None:
    """``TensorFormatError`` unless ``info`` is of a regular file of ``nbytes`` bytes."""
    if not stat.S_ISREG(info.st_mode):
        raise TensorFormatError(f"{path}: the shard is not a regular file")
    if info.st_size != nbytes:
        raise TensorFormatError(
            f"{path}: the shard file holds {info.st_size:,} bytes, the metadata says "
            f"{nbytes:,} (truncated or replaced?)"
        )


def _fail(where: str, message: str) -> TensorFormatError:
    return TensorFormatError(f"{where}: {message}")


def _field(record: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(record, dict):
        raise _fail(where, f"must be an object, got {type(record).__name__}")
    if key not in record:
        raise _fail(where, f"has no {key!r}")
    value = record[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        raise _fail(where, f"{key!r} must be {expected}, got {value!r:.60}")
    return value


def _count(record: Any, key: str, where: str) -> int:
    value = _field(record, key, int, where)
    if not 0 <= value < _LIMIT:
        raise _fail(where, f"{key!r} must be in 0..2**63, got {value!r:.40}")
    return int(value)


def _data_path(text: str, where: str) -> str:
    path = PurePosixPath(text.replace("\\", "/"))
    if not text or not text.isprintable() or path.is_absolute() or ".." in path.parts:
        raise _fail(where, f"dataPath {text!r:.80} must be a printable relative path without '..'")
    return str(path)


def _param(record: Any, shard_nbytes: int, where: str) -> ParamRecord:
    name = _field(record, "name", str, where)
    where = f"{where} ({name!r:.60})"
    dims = _field(record, "shape", list, where)
    if len(dims) > _MAX_DIMS:
        raise _fail(where, f"shape has {len(dims)} dimensions, more than {_MAX_DIMS}")
    shape = []
    elements = 1
    for dim in dims:
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < _LIMIT:
            raise _fail(where, f"shape {dims!r:.80} must hold ints in 0..2**63")
        shape.append(dim)
        elements = min(elements * dim, _LIMIT)
    dtype = _field(record, "dtype", str, where)
    dtype_bytes = _itemsize(dtype)
    if dtype_bytes is None:
        raise _fail(where, f"dtype {dtype!r:.40} is not one cubepool tensors hold")
    encode = _field(record, "format", str, where)
    if encode not in ENCODE_FORMATS:
        raise _fail(where, f"format {encode!r:.40} must be one of {list(ENCODE_FORMATS)}")
    nbytes = _count(record, "nbytes", where)
    offset = _count(record, "byteOffset", where)
    itemsize = 2 if encode == "f32-to-bf16" and dtype == "float32" else dtype_bytes
    if nbytes != elements * itemsize:
        takes = f"{elements * itemsize:,}" if elements < _LIMIT else "2**63 or more"
        raise _fail(
            where,
            f"nbytes is {nbytes:,}, but shape {tuple(shape)!r:.80} of {dtype} stored "
            f"{encode} takes {takes}",
        )
    if offset + nbytes > shard_nbytes:
        raise _fail(
            where,
            f"bytes {offset:,}..{offset + nbytes:,} lie past the shard's {shard_nbytes:,}",
        )
    return ParamRecord(name, tuple(shape), dtype, encode, nbytes, offset)


def read_tensor_cache_metadata(
    text: str | bytes, path: str | os.PathLike[str]
) -> TensorCacheMetadata:
    """Checks the text of a ``tensor-cache.json`` read from ``path`` (the shard files are
    looked for beside it). :class:`TensorFormatError`, naming ``path`` and the record, for
    anything but the format above: every field present and of its type, known dtypes and
    formats, each parameter's ``nbytes`` what its shape and dtype take, its bytes inside
    its shard, shard paths printable, relative and without ``..``, no parameter named
    twice."""
    where = os.fspath(path)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise _fail(where, f"not JSON: {error}") from None
    if not isinstance(doc, dict):
        raise _fail(where, f"must be a JSON object, got {type(doc).__name__}")
    files = _field(doc, "records", list, where)
    shards = []
    seen: set[str] = set()
    for i, file in enumerate(files):
        at = f"{where}: records[{i}]"
        data_path = _data_path(_field(file, "dataPath", str, at), at)
        encode = _field(file, "format", str, at)
        if encode != "raw-shard":
            raise _fail(at, f"format {encode!r:.40} must be 'raw-shard'")
        nbytes = _count(file, "nbytes", at)
        md5sum = file.get("md5sum")
        if md5sum is not None and not isinstance(md5sum, str):
            raise _fail(at, f"'md5sum' must be a string, got {md5sum!r:.60}")
        params = []
        for j, record in enumerate(_field(file, "records", list, at)):
            param = _param(record, nbytes, f"{at}.records[{j}]")
            if param.name in seen:
                raise _fail(f"{at}.records[{j}]", f"parameter {param.name!r:.60} is named twice")
            seen.add(param.name)
            params.append(param)
        _check_disjoint(params, at)
        shards.append(ShardRecord(data_path, nbytes, md5sum, tuple(params)))
    directory = Path(os.path.dirname(os.path.abspath(where)))
    return TensorCacheMetadata(directory, doc.get("metadata"), tuple(shards))


def _check_disjoint(params: list[ParamRecord], where: str) -> None:
    """Refuses parameters whose bytes overlap in their shard: TVM writes each into bytes
    of its own, and overlapping records would let a small shard stand for any number of
    parameters (6,000 records over one 1 MiB shard made 6 GiB of tensors)."""
    end = 0
    previous = ""
    for param in sorted(params, key=lambda p: (p.byte_offset, p.nbytes)):
        if not param.nbytes:
            continue  # no bytes: nothing to overlap
        if param.byte_offset < end:
            raise _fail(
                where,
                f"parameters {previous!r:.60} and {param.name!r:.60} overlap in the shard "
                f"(bytes from {param.byte_offset:,})",
            )
        end, previous = param.byte_offset + param.nbytes, param.name


def _metadata_path(cache: str | os.PathLike[str]) -> Path:
    """The metadata file of the cache ``cache`` names (a directory, or the file itself)."""
    path = Path(cache)
    if not path.is_dir():
        return path
    legacy = path / LEGACY_CACHE_FILE
    if not (path / CACHE_FILE).exists() and legacy.exists():
        return legacy
    return path / CACHE_FILE


def open_tensor_cache(cache: str | os.PathLike[str]) -> TensorCacheMetadata:
    """The checked metadata of the cache in directory ``cache`` (its
    ``tensor-cache.json``, or an older cache's ``ndarray-cache.json`` where it has none),
    or of the metadata file ``cache`` names."""
    path = _metadata_path(cache)
    try:
        with open(path, "rb") as file:
            text = file.read(_MAX_METADATA_BYTES + 1)
    except OSError as error:
        raise TensorFormatError(f"{path}: cannot read the tensor cache: {error}") from None
    if len(text) > _MAX_METADATA_BYTES:
        raise TensorFormatError(f"{path}: over {_MAX_METADATA_BYTES:,} bytes of metadata")
    return read_tensor_cache_metadata(text, path)


def decode_param(record: ParamRecord, shard_bytes: bytes, out: Tensor) -> None:
    """Writes ``record``'s parameter from its shard's bytes into ``out`` (a tensor of its
    shape and dtype): float32 stored ``f32-to-bf16`` is widened back, as TVM does."""
    raw = memoryview(shard_bytes)[record.byte_offset : record.byte_offset + record.nbytes]
    if record.format == "f32-to-bf16" and record.dtype == "float32":
        halves = np.frombuffer(raw, dtype=np.uint16)
        copy_from_bytes(out, bfloat16_values(halves).tobytes())
    else:
        copy_from_bytes(out, raw)


def load_tensor_cache(
    cache: str | os.PathLike[str], device: Any = None
) -> tuple[dict[str, Tensor], Any]:
    """Every parameter of a cache as a tensor, by name, and the cache's ``metadata``
    (``tvmjs.load_tensor_cache``). ``cache`` is the directory or its ``tensor-cache.json``."""
    meta = open_tensor_cache(cache)
    meta.check_shards()
    params: dict[str, Tensor] = {}
    for shard in meta.shards:
        data = meta.read_shard(shard)
        for record in shard.records:
            tensor = empty(record.shape, record.dtype, device)
            decode_param(record, data, tensor)
            params[record.name] = tensor
    return params, meta.metadata


def _f32_to_bf16(value: np.ndarray) -> np.ndarray:
    """float32 to the upper 16 bits, rounded to nearest even inside bfloat16's range and
    cut outside it (TVM's ``_convert_f32_to_bf16``: masks stay at the largest finite).

    One departure from TVM's bytes: a NaN whose payload lies only in its low 16 bits,
    cut, would be an infinity (TVM's turns ``0x7F800001`` into ``inf``); it stays a NaN,
    made quiet, as ``Tensor.copyfrom`` keeps one (helper-138's find)."""
    limit = np.array([(np.finfo(np.float32).max.view(np.uint32) >> 16) << 16], np.uint32)
    bf16_limit = limit.view(np.float32)[0]
    data = value.view(np.uint32)
    inside = np.logical_and(value < bf16_limit, value > -bf16_limit)
    bias = np.where(inside, ((data >> 16) & 1) + 0x7FFF, 0).astype(np.uint32)
    bits = ((data + bias) >> 16).astype(np.uint16)
    cut_to_infinity = np.logical_and(np.isnan(value), (bits & 0x007F) == 0)
    return np.where(cut_to_infinity, bits | 0x0040, bits).astype(np.uint16)


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    name = str(dtype)
    if _itemsize(name) is None:
        raise InvalidArgument(f"dtype {name!r} is not one a tensor cache holds")
    return name


def _as_bytes(value: Any) -> bytes:
    """The bytes of an array or tensor in C order (a bfloat16 tensor reads as uint16)."""
    return np.ascontiguousarray(np.asarray(value)).tobytes()


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _existing_shards(directory: Path) -> tuple[list[dict[str, Any]], Any]:
    """The shard records and metadata of the cache in ``directory``, checked, as plain
    JSON (so that fields cubepool does not read are written back as they were)."""
    open_tensor_cache(directory)
    doc = json.loads(_metadata_path(directory).read_text(encoding="utf-8"))
    return list(doc["records"]), doc.get("metadata")


def dump_tensor_cache(
    params: Mapping[str, Any] | Iterable[tuple[str, Any]],
    cache_dir: str | os.PathLike[str],
    encode_format: str = "f32-to-bf16",
    meta_data: Any = None,
    shard_cap_mb: int = 32,
    show_progress: bool = False,
    update_if_exists: bool = False,
) -> None:
    """Writes ``params`` (numpy arrays or tensors, by name, in order) as a tensor cache in
    ``cache_dir`` (``tvmjs.dump_tensor_cache``): shard files ``params_shard_N.bin`` of at
    most ``shard_cap_mb`` MiB each (a parameter of half that or more gets a file of its
    own), and ``tensor-cache.json``. With ``encode_format="f32-to-bf16"`` float32
    parameters are stored as bfloat16, and ``tensor-cache-b16.json`` describes them as
    bfloat16 too, as TVM writes it. ``meta_data`` (JSON, or a callable returning it) is
    stored as the cache's ``metadata``. With ``update_if_exists`` an existing cache there
    is kept: a parameter it holds is overwritten in place (its stored size must not
    change), new ones go to new shard files, and its metadata stays unless ``meta_data``
    is given; without, the cache is written anew. ``show_progress`` prints each name."""
    if encode_format not in ENCODE_FORMATS:
        raise InvalidArgument(
            f"encode_format must be one of {list(ENCODE_FORMATS)}, got {encode_format!r}"
        )
    if isinstance(shard_cap_mb, bool) or not isinstance(shard_cap_mb, int) or shard_cap_mb < 1:
        raise InvalidArgument(f"shard_cap_mb must be an int >= 1, got {shard_cap_mb!r}")
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    cap = shard_cap_mb << 20
    shards: list[dict[str, Any]] = []
    if update_if_exists and (directory / CACHE_FILE).exists():
        shards, old_meta = _existing_shards(directory)
        meta_data = old_meta if meta_data is None else meta_data
    # Each stored parameter's shard (by index) and record.
    stored = {rec["name"]: (i, rec) for i, shard in enumerate(shards) for rec in shard["records"]}
    updated: set[int] = set()
    pending: list[dict[str, Any]] = []
    data = bytearray()
    names: set[str] = set()
    bf16 = False

    def commit(blob: bytes | bytearray, records: list[dict[str, Any]]) -> None:
        # The first shard name no shard of the cache holds: an updated cache's shards
        # need not be numbered 0 to n - 1 (TVM names them as it likes), and the next
        # number may be an old shard's, whose bytes the write would replace.
        held = {shard["dataPath"] for shard in shards}
        number = len(shards)
        while f"params_shard_{number}.bin" in held:
            number += 1
        data_path = f"params_shard_{number}.bin"
        path = directory / data_path
        path.write_bytes(blob)
        shards.append(
            {
                "dataPath": data_path,
                "format": "raw-shard",
                "nbytes": len(blob),
                "records": records,
                "md5sum": _md5(path),
            }
        )

    items = params.items() if isinstance(params, Mapping) else params
    for count, (name, value) in enumerate(items, 1):
        if not isinstance(name, str):
            raise InvalidArgument(f"parameter names must be strings, got {name!r:.60}")
        if name in names:
            raise InvalidArgument(f"parameter {name!r:.60} is named twice")
        names.add(name)
        if show_progress:
            print(f"[{count:04d}] saving {name}")
        dtype = _dtype_name(value)
        if encode_format == "f32-to-bf16" and dtype == "float32":
            blob = _f32_to_bf16(np.ascontiguousarray(value, dtype=np.float32)).tobytes()
            bf16 = True
        else:
            blob = _as_bytes(value)
        record = {
            "name": name,
            "shape": [int(d) for d in value.shape],
            "dtype": dtype,
            "format": encode_format,
            "nbytes": len(blob),
        }
        if name in stored:
            index, old = stored[name]
            if old["nbytes"] != len(blob):
                raise InvalidArgument(
                    f"cannot update {name!r:.60} in place: it is stored in {old['nbytes']:,} "
                    f"bytes, the new value takes {len(blob):,}"
                )
            with open(directory / shards[index]["dataPath"], "r+b") as file:
                file.seek(old["byteOffset"])
                file.write(blob)
            old.update(record)
            updated.add(index)
            continue
        if len(data) + len(blob) >= cap:
            if len(blob) * 2 >= cap:
                commit(blob, [{**record, "byteOffset": 0}])
                continue
            if data:
                commit(data, pending)
                data, pending = bytearray(), []
        pending.append({**record, "byteOffset": len(data)})
        data += blob
    if data or pending:
        commit(data, pending)
    for index in updated:
        shards[index]["md5sum"] = _md5(directory / shards[index]["dataPath"])
    meta = meta_data() if callable(meta_data) else ({} if meta_data is None else meta_data)
    (directory / CACHE_FILE).write_text(
        json.dumps({"metadata": meta, "records": shards}, indent=4), encoding="utf-8"
    )
    if bf16:
        for shard in shards:
            for item in shard["records"]:
                if item["dtype"] == "float32" and item["format"] == "f32-to-bf16":
                    item["format"], item["dtype"] = "raw", "bfloat16"
        (directory / "tensor-cache-b16.json").write_text(
            json.dumps({"metadata": meta, "records": shards}, indent=4), encoding="utf-8"
        )
