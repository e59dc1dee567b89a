"""Fuzz cubepool's tensor and parameter-dict loaders, and keep the interesting inputs.

    python tests/python/fuzz/fuzz_tensor_loader.py [--examples N] [--seed-only]

Writes the deterministic seed corpus to ``tests/python/corpus/tensor/`` (file names say what to
expect: ``tensor-ok-*`` and ``params-ok-*`` load, ``*-err-*`` raise ``TensorFormatError``),
then runs hypothesis over mutations of those files and random bytes. Any input that makes a
loader raise something other than ``TensorFormatError`` is saved as ``crash-<hash>.bin``
beside them and the script fails; ``tests/python/test_tensor_format.py`` replays the whole corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import struct
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cubepool as cp

CORPUS = Path(__file__).resolve().parent.parent / "corpus" / "tensor"

MAGIC = struct.pack("<Q", cp.TENSOR_MAGIC)
DICT_MAGIC = struct.pack("<Q", cp.PARAM_DICT_MAGIC)


def record(
    code: int, bits: int, lanes: int, shape: list[int], data: bytes, size: int | None = None
) -> bytes:
    """A raw tensor record, with an optionally forged data size."""
    head = MAGIC + bytes(8) + struct.pack("<iii", 1, 0, len(shape))
    head += struct.pack("<BBH", code, bits, lanes)
    head += b"".join(struct.pack("<q", d) for d in shape)
    head += struct.pack("<q", len(data) if size is None else size)
    return head + data


def param_dict(names: list[bytes], records: list[bytes], count2: int | None = None) -> bytes:
    """A raw parameter dict."""
    out = DICT_MAGIC + bytes(8) + struct.pack("<Q", len(names))
    out += b"".join(struct.pack("<Q", len(n)) + n for n in names)
    out += struct.pack("<Q", len(records) if count2 is None else count2)
    return out + b"".join(records)


def seed_corpus() -> dict[str, bytes]:
    """Interesting inputs, named by expected outcome."""
    f32 = np.array([1.0, 2.0], np.float32).tobytes()
    golden = record(2, 32, 1, [2], f32)
    files: dict[str, bytes] = {"tensor-ok-golden-float32.bin": golden}
    for dtype in [
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float64",
        "bool",
    ]:
        a = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
        saved = cp.save_tensor(cp.from_dlpack(a))
        assert saved is not None
        files[f"tensor-ok-{dtype}.bin"] = saved
    files["tensor-ok-bfloat16.bin"] = record(4, 16, 1, [2], bytes.fromhex("803f00c0"))
    files["tensor-ok-old-bool.bin"] = record(1, 1, 1, [3], b"\x01\x00\x01")
    files["tensor-ok-new-bool.bin"] = record(6, 8, 1, [3], b"\x01\x00\x01")
    files["tensor-ok-scalar.bin"] = record(0, 32, 1, [], b"\x07\x00\x00\x00")
    files["tensor-ok-empty.bin"] = record(2, 32, 1, [0, 5], b"")
    # TVM refuses a record of another device: "can only save as CPU tensor".
    files["tensor-err-cuda-device.bin"] = golden[:16] + struct.pack("<ii", 2, 1) + golden[24:]
    files["tensor-err-empty-input.bin"] = b""
    files["tensor-err-truncated-header.bin"] = golden[:20]
    files["tensor-err-truncated-shape.bin"] = golden[:36]
    files["tensor-err-truncated-data.bin"] = golden[:-1]
    files["tensor-err-trailing.bin"] = golden + b"\x00"
    files["tensor-err-bad-magic.bin"] = b"\x00" + golden[1:]
    files["tensor-err-negative-ndim.bin"] = golden[:24] + struct.pack("<i", -1) + golden[28:]
    files["tensor-err-huge-ndim.bin"] = golden[:24] + struct.pack("<i", 2**31 - 1) + golden[28:]
    files["tensor-err-negative-dim.bin"] = record(2, 32, 1, [-2], f32, size=8)
    files["tensor-err-size-mismatch.bin"] = record(2, 32, 1, [2], f32, size=12)
    files["tensor-err-negative-size.bin"] = record(2, 32, 1, [2], f32, size=-8)
    files["tensor-err-forged-size.bin"] = record(2, 32, 1, [2**40], f32, size=2**42)
    files["tensor-err-overflow-shape.bin"] = record(2, 32, 1, [2**62, 2**62], f32, size=8)
    files["tensor-err-zero-lanes.bin"] = record(2, 32, 0, [2], f32)
    files["tensor-err-vector-lanes.bin"] = record(2, 32, 2, [1], f32)
    files["tensor-err-complex.bin"] = record(5, 64, 1, [1], f32)
    files["tensor-err-float8.bin"] = record(2, 8, 1, [8], f32)
    files["tensor-err-bool-16.bin"] = record(6, 16, 1, [4], f32)
    files["tensor-err-uint1-lanes.bin"] = record(1, 1, 4, [2], b"\x00\x01")

    files["params-ok-two.bin"] = param_dict([b"w", b"bias"], [golden, files["tensor-ok-int8.bin"]])
    files["params-ok-empty.bin"] = param_dict([], [])
    files["params-ok-unicode.bin"] = param_dict(["pöids".encode()], [golden])
    files["params-err-count-mismatch.bin"] = param_dict([b"w"], [golden], count2=2)
    files["params-err-duplicate.bin"] = param_dict([b"w", b"w"], [golden, golden])
    files["params-err-bad-utf8.bin"] = param_dict([b"\xff\xfe"], [golden])
    files["params-err-forged-count.bin"] = DICT_MAGIC + bytes(8) + struct.pack("<Q", 2**63)
    files["params-err-forged-name.bin"] = (
        DICT_MAGIC + bytes(8) + struct.pack("<QQ", 1, 2**62) + b"w"
    )
    files["params-err-truncated.bin"] = param_dict([b"w"], [golden])[:-3]
    files["params-err-tensor-magic.bin"] = golden
    files["params-err-bad-record.bin"] = param_dict([b"w"], [b"\x00" + golden[1:]])
    return files


def outcome(data: bytes, kind: str) -> str:
    """'ok' or 'err'; raises anything that is not a TensorFormatError."""
    load = cp.load_tensor if kind == "tensor" else cp.load_param_dict
    try:
        load(data)
    except cp.TensorFormatError:
        result = "err"
    else:
        result = "ok"
    # The stream reader must agree on malformed input (it cannot see trailing bytes).
    try:
        load(io.BytesIO(data))
    except cp.TensorFormatError:
        if result == "ok":
            raise AssertionError("stream rejected what bytes accepted") from None
    return result


def save_crash(data: bytes) -> Path:
    path = CORPUS / f"crash-{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


def fuzz(examples: int) -> None:
    seeds = list(seed_corpus().values())

    mutation = st.tuples(
        st.sampled_from(seeds),
        st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
        st.one_of(st.none(), st.integers(0, 300)),
        st.binary(max_size=16),
    )

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(mutation, st.binary(max_size=200)), st.sampled_from(["tensor", "params"]))
    def run(case: object, kind: str) -> None:
        if isinstance(case, bytes):
            data = case
        else:
            assert isinstance(case, tuple)
            base, flips, cut, tail = case
            buf = bytearray(base)
            for pos, value in flips:
                if pos < len(buf):
                    buf[pos] = value
            if cut is not None:
                del buf[cut:]
            data = bytes(buf) + tail
        try:
            outcome(data, kind)
        except Exception:
            print(f"crash saved to {save_crash(data)}", file=sys.stderr)
            raise

    run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--seed-only", action="store_true")
    args = parser.parse_args()
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in seed_corpus().items():
        (CORPUS / name).write_bytes(data)
        kind = "tensor" if name.startswith("tensor-") else "params"
        expected = "ok" if "-ok-" in name else "err"
        got = outcome(data, kind)
        assert got == expected, f"{name}: expected {expected}, got {got}"
    if not args.seed_only:
        fuzz(args.examples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
