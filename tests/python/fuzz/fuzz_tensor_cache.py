"""Fuzz the tensor cache's metadata reader (``cubepool.tensor_cache``), and keep the corpus.

    python tests/python/fuzz/fuzz_tensor_cache.py [--examples N] [--seed-only]

Writes the seed corpus to ``tests/python/corpus/tensor_cache/`` (``ok-*`` files are read,
``err-*`` files raise ``TensorFormatError``), then runs hypothesis over JSON documents
built from the seeds' fields and over mutated bytes of the seeds. Any input that makes
``read_tensor_cache_metadata`` raise anything but ``TensorFormatError`` is saved as
``crash-<hash>.json`` beside them and the script fails; ``tests/python/test_tensor_cache.py``
replays the corpus and a few hundred examples of both strategies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cubepool import TensorFormatError
from cubepool.tensor_cache import read_tensor_cache_metadata

CORPUS = Path(__file__).resolve().parent.parent / "corpus" / "tensor_cache"


def _param(**fields: Any) -> dict[str, Any]:
    base = {"name": "w", "shape": [2, 2], "dtype": "float32", "format": "raw", "nbytes": 16}
    return {**base, "byteOffset": 0, **fields}


def _doc(params: list[Any], **shard: Any) -> dict[str, Any]:
    base = {"dataPath": "params_shard_0.bin", "format": "raw-shard", "nbytes": 64}
    return {"metadata": {}, "records": [{**base, "records": params, **shard}]}


def seed_corpus() -> dict[str, bytes]:
    """Interesting documents, named by expected outcome."""
    docs: dict[str, Any] = {
        "ok-one-param": _doc([_param()]),
        "ok-bf16": _doc([_param(format="f32-to-bf16", nbytes=8)]),
        "ok-empty": {"metadata": {}, "records": []},
        "ok-two-shards": {
            "records": [
                _doc([_param()])["records"][0],
                _doc([_param(name="v", dtype="float16", nbytes=8)], dataPath="b/x.bin")["records"][
                    0
                ],
            ]
        },
        "err-not-object": [1, 2],
        "err-no-records": {"metadata": {}},
        "err-traversal": _doc([_param()], dataPath="../../etc/passwd"),
        "err-absolute": _doc([_param()], dataPath="/etc/passwd"),
        "err-past-shard": _doc([_param(byteOffset=60)]),
        "err-nbytes-lie": _doc([_param(nbytes=4)]),
        "err-negative-dim": _doc([_param(shape=[-2, -8], nbytes=16)]),
        "err-huge-offset": _doc([_param(byteOffset=2**64)]),
        "err-bool-nbytes": _doc([_param(nbytes=True)]),
        "err-unknown-dtype": _doc([_param(dtype="float8_e4m3fn")]),
        "err-unknown-format": _doc([_param(format="zstd")]),
        "err-shard-format": _doc([_param()], format="npz"),
        "err-duplicate": _doc([_param(), _param()]),
        "err-shape-not-list": _doc([_param(shape="2x2")]),
    }
    files = {f"{name}.json": json.dumps(doc).encode() for name, doc in docs.items()}
    files["err-not-json.json"] = b'{"records": ['
    files["err-deep.json"] = b"[" * 100_000
    return files


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.sampled_from(["w", "", "float32", "raw", "raw-shard", "../x", "f32-to-bf16", "bfloat16"]),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
_params = st.fixed_dictionaries(
    {},
    optional={
        "name": _values,
        "shape": st.one_of(st.lists(st.integers(-3, 2**40), max_size=4), _values),
        "dtype": _values,
        "format": _values,
        "nbytes": st.one_of(st.integers(-1, 2**40), _values),
        "byteOffset": st.one_of(st.integers(-1, 2**40), _values),
    },
)
_shards = st.fixed_dictionaries(
    {},
    optional={
        "dataPath": _values,
        "format": _values,
        "nbytes": st.one_of(st.integers(-1, 2**40), _values),
        "md5sum": _values,
        "records": st.one_of(st.lists(_params, max_size=3), _values),
    },
)
documents = st.one_of(
    st.fixed_dictionaries(
        {}, optional={"records": st.one_of(st.lists(_shards, max_size=3), _values)}
    ),
    _values,
).map(lambda doc: json.dumps(doc).encode())
"""JSON documents with the format's fields, in and out of range."""

mutations = st.builds(
    lambda seed, at, byte: seed[:at] + bytes([byte]) + seed[at + 1 :],
    st.sampled_from(sorted(seed_corpus().values())),
    st.integers(0, 400),
    st.integers(0, 255),
)
"""A seed with one byte replaced."""


def check(data: bytes, directory: Path) -> str:
    """Reads ``data`` as the metadata of a cache in ``directory``: ``"ok"`` or
    ``"TensorFormatError"``; anything else propagates (a crash)."""
    try:
        read_tensor_cache_metadata(data, directory / "tensor-cache.json")
    except TensorFormatError:
        return "TensorFormatError"
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--seed-only", action="store_true")
    args = parser.parse_args()
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in seed_corpus().items():
        (CORPUS / name).write_bytes(data)
    if args.seed_only:
        return 0
    crashes: list[Path] = []

    @settings(
        max_examples=args.examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(st.one_of(documents, mutations))
    def run(data: bytes) -> None:
        try:
            check(data, CORPUS)
        except Exception:
            path = CORPUS / f"crash-{hashlib.sha256(data).hexdigest()[:16]}.json"
            path.write_bytes(data)
            crashes.append(path)
            raise

    run()
    print(f"{args.examples} examples, {len(crashes)} crashes")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
