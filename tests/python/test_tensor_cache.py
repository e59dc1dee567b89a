"""TVM's tensor cache (``cubepool.tensor_cache``), its hostile inputs, and the Disco
``ShardLoader``'s checks (TVM's own loader tests are ported in ``test_tvm_loader.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disco_tvm import close_all, threaded_session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cubepool
from conftest import load_script
from cubepool import InvalidArgument, TensorFormatError
from cubepool import disco as di
from cubepool.disco.dref import HostArray
from cubepool.tensor_cache import (
    dump_tensor_cache,
    load_tensor_cache,
    open_tensor_cache,
    read_tensor_cache_metadata,
)

fuzz = load_script(Path(__file__).parent / "fuzz" / "fuzz_tensor_cache.py")


@pytest.fixture(autouse=True)
def _close_sessions() -> Any:
    yield
    close_all()


def _tvm_f32_to_bf16(value: np.ndarray) -> np.ndarray:
    """TVM's ``tvmjs._convert_f32_to_bf16``, as written there, for comparison."""
    cap = np.finfo("float32").max
    bf16_limit = ((np.array([cap.view("uint32")]) >> 16) << 16).view("float32")[0]
    data = value.view("uint32")
    rounding_bias = np.where(
        np.logical_and(value < bf16_limit, value > -bf16_limit),
        ((data >> 16) & 1) + 0x7FFF,
        np.zeros_like(data),
    )
    return ((data + rounding_bias) >> 16).astype("uint16")


def test_a_raw_cache_reads_back_every_parameter_bit_for_bit(tmp_path: Path) -> None:
    params = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(6, dtype=np.int64),
        "c": np.array([[True, False]]),
        "d": np.linspace(0, 1, 10).astype(np.float16),
    }
    dump_tensor_cache(params, tmp_path, encode_format="raw", meta_data={"model": "m"})
    loaded, meta = load_tensor_cache(tmp_path)
    assert meta == {"model": "m"}
    assert list(loaded) == list(params)
    for name, value in params.items():
        assert loaded[name].shape == value.shape
        assert loaded[name].dtype == str(value.dtype)
        np.testing.assert_array_equal(loaded[name].numpy(), value)


def test_float32_stored_as_bfloat16_is_rounded_as_tvm_rounds_it(tmp_path: Path) -> None:
    value = np.array(
        [1.0, 1.00390625, 1.01171875, -3.3, 3.4e38, -3.4e38, 1e-30, 0.0], dtype=np.float32
    )
    dump_tensor_cache({"w": value}, tmp_path)
    record = json.loads((tmp_path / "tensor-cache.json").read_text())["records"][0]
    assert record["records"][0]["format"] == "f32-to-bf16"
    stored = np.frombuffer((tmp_path / record["dataPath"]).read_bytes(), np.uint16)
    np.testing.assert_array_equal(stored, _tvm_f32_to_bf16(value))
    loaded, _ = load_tensor_cache(tmp_path)
    widened = (stored.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(loaded["w"].numpy(), widened)
    b16 = json.loads((tmp_path / "tensor-cache-b16.json").read_text())
    assert b16["records"][0]["records"][0]["dtype"] == "bfloat16"


def test_a_nan_stored_as_bfloat16_stays_a_nan(tmp_path: Path) -> None:
    """TVM's conversion cuts a NaN outside bfloat16's rounding, so a NaN whose payload
    lies only in its low 16 bits became an infinity (helper-138's find). It stays a NaN,
    made quiet; a NaN with payload in its high bits keeps TVM's bytes."""
    bits = np.array([0x7F800001, 0xFF80FFFF, 0x7FC00000, 0x7FBFFFFF, 0x7FA00001], np.uint32)
    dump_tensor_cache({"w": bits.view(np.float32)}, tmp_path)
    loaded, _ = load_tensor_cache(tmp_path)
    back = loaded["w"].numpy().view(np.uint32)
    assert np.isnan(loaded["w"].numpy()).all()
    tvm = _tvm_f32_to_bf16(bits.view(np.float32)).astype(np.uint32) << 16
    assert [hex(b) for b in back] == ["0x7fc00000", "0xffc00000", *map(hex, tvm[2:])]


def test_metadata_past_64_mib_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """A hostile ``tensor-cache.json`` of empty lists builds tens of bytes a byte when
    parsed (764 MB for 30 MB, helper-138's measurement); the metadata read is at most
    64 MiB now (1 GiB before)."""
    text = '{"records": [], "metadata": [' + "[]," * ((64 << 20) // 3) + "[]]}"
    (tmp_path / "tensor-cache.json").write_text(text)
    with pytest.raises(TensorFormatError, match="over 67,108,864 bytes of metadata"):
        load_tensor_cache(tmp_path)


def test_shards_split_at_the_cap_and_a_large_parameter_gets_a_file_of_its_own(
    tmp_path: Path,
) -> None:
    mib = 1 << 20
    params = {
        "small0": np.zeros(mib // 4, np.uint8),
        "small1": np.zeros(mib // 4, np.uint8),
        "big": np.zeros(mib, np.uint8),
        "small2": np.zeros(400 << 10, np.uint8),
        "small3": np.zeros(400 << 10, np.uint8),
    }
    dump_tensor_cache(params, tmp_path, encode_format="raw", shard_cap_mb=1)
    meta = open_tensor_cache(tmp_path)
    groups = [[r.name for r in shard.records] for shard in meta.shards]
    # As TVM's writer: a parameter of half the cap or more is written at once, alone.
    assert groups == [["big"], ["small0", "small1", "small2"], ["small3"]]
    for shard in meta.shards:
        assert shard.nbytes <= mib
        assert (tmp_path / shard.data_path).stat().st_size == shard.nbytes


def test_writing_refuses_what_the_format_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="encode_format"):
        dump_tensor_cache({"a": np.zeros(2)}, tmp_path, encode_format="zstd")
    with pytest.raises(InvalidArgument, match="named twice"):
        dump_tensor_cache([("a", np.zeros(2)), ("a", np.zeros(2))], tmp_path)
    with pytest.raises(InvalidArgument, match="complex64"):
        dump_tensor_cache({"a": np.zeros(2, np.complex64)}, tmp_path)


@pytest.mark.parametrize("name", sorted(p.name for p in fuzz.CORPUS.iterdir()))
def test_every_corpus_document_is_read_or_refused_as_its_name_says(
    name: str, tmp_path: Path
) -> None:
    data = (fuzz.CORPUS / name).read_bytes()
    expected = "ok" if name.startswith("ok-") else "TensorFormatError"
    assert fuzz.check(data, tmp_path) == expected


def test_the_corpus_holds_every_seed() -> None:
    for name, data in fuzz.seed_corpus().items():
        assert (fuzz.CORPUS / name).read_bytes() == data


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.one_of(fuzz.documents, fuzz.mutations))
def test_fuzzed_metadata_is_read_or_refused_with_a_tensor_format_error(
    tmp_path: Path, data: bytes
) -> None:
    fuzz.check(data, tmp_path)


def test_a_shard_path_that_leaves_the_cache_is_refused_by_name(tmp_path: Path) -> None:
    text = (fuzz.CORPUS / "err-traversal.json").read_text()
    with pytest.raises(TensorFormatError, match=r"records\[0\].*dataPath '\.\./\.\./etc/passwd'"):
        read_tensor_cache_metadata(text, tmp_path / "tensor-cache.json")


def test_a_truncated_or_missing_shard_file_is_refused_naming_it(tmp_path: Path) -> None:
    dump_tensor_cache({"a": np.arange(8, dtype=np.int32)}, tmp_path, encode_format="raw")
    shard = tmp_path / "params_shard_0.bin"
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(TensorFormatError, match=r"params_shard_0\.bin.*holds 31 bytes.*32"):
        load_tensor_cache(tmp_path)
    shard.unlink()
    with pytest.raises(TensorFormatError, match=r"params_shard_0\.bin: cannot read"):
        load_tensor_cache(tmp_path)


def _one_shard_cache(tmp_path: Path, records: list[dict[str, Any]], nbytes: int) -> None:
    doc = {
        "metadata": {},
        "records": [
            {"dataPath": "shard.bin", "format": "raw-shard", "nbytes": nbytes, "records": records}
        ],
    }
    (tmp_path / "tensor-cache.json").write_text(json.dumps(doc))


def _uint8_record(name: str, offset: int, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "shape": [count],
        "dtype": "uint8",
        "format": "raw",
        "nbytes": count,
        "byteOffset": offset,
    }


def test_parameters_whose_bytes_overlap_in_their_shard_are_refused(tmp_path: Path) -> None:
    # 6,000 records over one 1 MiB shard made 6 GiB of tensors from 1.6 MB of files.
    (tmp_path / "shard.bin").write_bytes(bytes(64))
    records = [_uint8_record("a", 0, 32), _uint8_record("b", 16, 32)]
    _one_shard_cache(tmp_path, records, 64)
    with pytest.raises(TensorFormatError, match=r"records\[0\].*'a' and 'b' overlap.*from 16"):
        open_tensor_cache(tmp_path)
    # Side by side, in any order, with empty ones between and inside: read.
    records = [
        _uint8_record("b", 32, 32),
        _uint8_record("e", 32, 0),
        _uint8_record("a", 0, 32),
        _uint8_record("f", 16, 0),
    ]
    _one_shard_cache(tmp_path, records, 64)
    loaded, _ = load_tensor_cache(tmp_path)
    assert sorted(loaded) == ["a", "b", "e", "f"]


def test_two_records_naming_one_shard_file_are_refused(tmp_path: Path) -> None:
    # Each record's parameters are disjoint, but records naming one file (by two paths
    # or through a link) would each read it whole.
    (tmp_path / "shard.bin").write_bytes(bytes(64))
    (tmp_path / "link.bin").symlink_to("shard.bin")
    for second in ("shard.bin", "./shard.bin", "link.bin"):
        doc = {
            "metadata": {},
            "records": [
                {
                    "dataPath": path,
                    "format": "raw-shard",
                    "nbytes": 64,
                    "records": [_uint8_record(name, 0, 64)],
                }
                for path, name in (("shard.bin", "a"), (second, "b"))
            ],
        }
        (tmp_path / "tensor-cache.json").write_text(json.dumps(doc))
        with pytest.raises(TensorFormatError, match=r"the same shard file as .*shard\.bin"):
            load_tensor_cache(tmp_path)


def test_a_shard_path_naming_a_directory_is_refused_by_name_and_leaks_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "shard.bin").mkdir()
    _one_shard_cache(tmp_path, [], 0)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(TensorFormatError, match=r"shard\.bin.*not a regular file"):
            load_tensor_cache(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_copyfrom_reads_a_strided_array_in_c_order() -> None:
    tensor = cubepool.empty((3, 2), "float32")
    source = np.arange(6, dtype=np.float32).reshape(2, 3).T
    assert not source.flags["C_CONTIGUOUS"]
    tensor.copyfrom(source)
    np.testing.assert_array_equal(tensor.numpy(), source)
    with pytest.raises(cubepool.TensorError):
        tensor.copyfrom(np.arange(8, dtype=np.float32).reshape(2, 4).T)


def test_debug_get_from_remote_gives_arrays_with_tvms_numpy_method() -> None:
    sess = threaded_session(num_workers=2)
    x = sess.empty((2, 2), "float32")
    x.debug_copy_from(1, np.ones((2, 2), np.float32))
    value = x.debug_get_from_remote(1)
    assert isinstance(value, HostArray) and isinstance(value, np.ndarray)
    assert type(value.numpy()) is np.ndarray
    np.testing.assert_array_equal(value.numpy(), np.ones((2, 2)))


def _loader(sess: di.Session, path: Path, shard_info: Any) -> di.DRef:
    text = (path / "tensor-cache.json").read_text()
    create = sess.get_global_func("runtime.disco.ShardLoader")
    return create(str(path / "tensor-cache.json"), text, json.dumps(shard_info), None)


def test_the_loader_refuses_an_unknown_shard_function_where_it_is_made(tmp_path: Path) -> None:
    dump_tensor_cache({"w": np.zeros((2, 2), np.float32)}, tmp_path, encode_format="raw")
    sess = threaded_session(num_workers=2)
    with pytest.raises(di.WorkerError, match=r"undefined function 'no\.such\.func'"):
        _loader(sess, tmp_path, {"w": [["no.such.func", [[2, 1, 2], "float32"], 2]]})
        sess.sync_worker_0()


def test_a_sharded_shape_must_have_one_part_per_worker(tmp_path: Path) -> None:
    dump_tensor_cache({"w": np.zeros((4, 2), np.float32)}, tmp_path, encode_format="raw")
    sess = threaded_session(num_workers=2)
    sess.import_python_module("disco_helpers")
    loader = _loader(
        sess, tmp_path, {"w": [["tests.disco.shard_dim_0", [[4, 1, 2], "float32"], 4]]}
    )
    load = sess.get_global_func("runtime.disco.ShardLoaderLoad")
    with pytest.raises(di.WorkerError, match=r"must be the number of shards \(2\)"):
        load(loader, (0,))
        sess.sync_worker_0()


def test_a_presharded_cache_of_other_shards_is_refused(tmp_path: Path) -> None:
    params = {f"param_0_shard-{k}-of-3": np.zeros(2, np.float32) for k in (1, 2, 3)}
    params["param_0_shard-4-of-3"] = np.zeros(2, np.float32)
    dump_tensor_cache(params, tmp_path, encode_format="raw")
    sess = threaded_session(num_workers=2)
    loader = _loader(sess, tmp_path, {})
    load = sess.get_global_func("runtime.disco.ShardLoaderLoadPresharded")
    with pytest.raises(di.WorkerError, match=r"is shard \d of 3, but worker \d of 2"):
        load(loader, (0,))
        sess.sync_worker_0()


def test_a_parameter_index_out_of_range_is_named(tmp_path: Path) -> None:
    dump_tensor_cache({"w": np.zeros(2, np.float32)}, tmp_path, encode_format="raw")
    sess = threaded_session(num_workers=2)
    loader = _loader(sess, tmp_path, {})
    load = sess.get_global_func("runtime.disco.ShardLoaderLoad")
    with pytest.raises(di.WorkerError, match="index 5 is out of range: the cache holds 1"):
        load(loader, (5,))
        sess.sync_worker_0()


def _one_param_doc(**param: Any) -> str:
    record = {"name": "w", "shape": [2], "dtype": "float32", "format": "raw", "nbytes": 8}
    shard = {"dataPath": "s.bin", "format": "raw-shard", "nbytes": 8}
    return json.dumps({"records": [{**shard, "records": [{**record, "byteOffset": 0, **param}]}]})


def test_a_long_or_huge_shape_is_refused_by_name(tmp_path: Path) -> None:
    where = tmp_path / "tensor-cache.json"
    with pytest.raises(TensorFormatError, match="300 dimensions, more than 64"):
        read_tensor_cache_metadata(_one_param_doc(shape=[2**61] * 300), where)
    with pytest.raises(TensorFormatError, match="takes 2\\*\\*63 or more"):
        read_tensor_cache_metadata(_one_param_doc(shape=[2**62] * 60), where)


@pytest.mark.parametrize("data_path", ["a\x00b", "\ud800", "a\nb", "x/../../y", "/etc/passwd"])
def test_a_data_path_that_is_not_a_plain_relative_path_is_refused(
    data_path: str, tmp_path: Path
) -> None:
    doc = json.loads(_one_param_doc())
    doc["records"][0]["dataPath"] = data_path
    with pytest.raises(TensorFormatError, match=r"printable relative path without '\.\.'"):
        read_tensor_cache_metadata(json.dumps(doc), tmp_path / "tensor-cache.json")


def test_a_shard_that_is_not_a_regular_file_of_its_size_is_not_read(tmp_path: Path) -> None:
    import os

    (tmp_path / "tensor-cache.json").write_text(_one_param_doc())
    os.mkfifo(tmp_path / "s.bin")  # reading a FIFO would wait forever
    with pytest.raises(TensorFormatError, match=r"s\.bin: the shard is not a regular file"):
        load_tensor_cache(tmp_path)
    (tmp_path / "s.bin").unlink()
    (tmp_path / "s.bin").symlink_to("/dev/zero")
    with pytest.raises(TensorFormatError, match="not a regular file"):
        load_tensor_cache(tmp_path)
    doc = json.loads(_one_param_doc())
    doc["records"][0]["nbytes"] = 2**62  # a forged size is never allocated
    doc["records"][0]["records"][0]["byteOffset"] = 2**62 - 8
    (tmp_path / "s.bin").unlink()
    (tmp_path / "s.bin").write_bytes(bytes(8))
    (tmp_path / "tensor-cache.json").write_text(json.dumps(doc))
    with pytest.raises(TensorFormatError, match="holds 8 bytes, the metadata says"):
        load_tensor_cache(tmp_path)


def test_a_truncated_shard_is_refused_on_every_worker_when_the_loader_is_made(
    tmp_path: Path,
) -> None:
    dump_tensor_cache({"param_0": np.arange(4, dtype=np.float32)}, tmp_path, encode_format="raw")
    shard = tmp_path / "params_shard_0.bin"
    shard.write_bytes(shard.read_bytes()[:-4])
    sess = threaded_session(num_workers=2)
    with pytest.raises(di.WorkerError, match="holds 12 bytes, the metadata says 16"):
        _loader(sess, tmp_path, {})
        sess.sync_worker_0()


def test_a_failed_shard_function_leaves_the_session_usable(tmp_path: Path) -> None:
    dump_tensor_cache({"param_0": np.zeros((2, 2), np.float32)}, tmp_path, encode_format="raw")
    calls = {"n": 0}

    def flaky(src: Any, num_shards: int, out: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the shard function failed")
        out.copyfrom(np.arange(4, dtype=np.float32).reshape(2, 1, 2))

    sess = threaded_session(num_workers=2)
    text = (tmp_path / "tensor-cache.json").read_text()
    info = json.dumps({"param_0": [["tests.flaky", [[2, 1, 2], "float32"], 2]]})
    create = sess.get_global_func("runtime.disco.ShardLoader")
    loader = create(str(tmp_path / "tensor-cache.json"), text, info, {"tests.flaky": flaky})
    load = sess.get_global_func("runtime.disco.ShardLoaderLoad")
    with pytest.raises(di.WorkerError, match="the shard function failed"):
        load(loader, (0,))
        sess.sync_worker_0()
    # Worker 0 joined the scatter before raising: the next load pairs up as it should.
    part = load(loader, (np.int64(0),))
    np.testing.assert_array_equal(part.debug_get_from_remote(1).numpy(), [[2.0, 3.0]])


def test_shard_info_for_parameters_the_cache_lacks_is_ignored_as_tvm_does(
    tmp_path: Path,
) -> None:
    params = {f"param_0_shard-{k}-of-2": np.full(2, k, np.float32) for k in (1, 2)}
    dump_tensor_cache(params, tmp_path, encode_format="raw")
    sess = threaded_session(num_workers=2)
    unsharded = {"param_0": [["no.such.func", [[2, 1], "float32"], 2]]}
    loader = _loader(sess, tmp_path, unsharded)
    got = sess.get_global_func("runtime.disco.ShardLoaderLoadAllPresharded")(loader)
    assert [got.debug_get_from_remote(w)[0].numpy().tolist() for w in (0, 1)] == [
        [1.0, 1.0],
        [2.0, 2.0],
    ]


def test_a_strided_source_of_another_shape_is_refused() -> None:
    tensor = cubepool.empty((2, 3), "float32")
    with pytest.raises(cubepool.TensorError, match=r"source shape \[3, 2\], tensor shape \[2, 3\]"):
        tensor.copyfrom(np.arange(6, dtype=np.float32).reshape(2, 3).T)


def test_what_numpy_computes_from_a_host_array_is_plain_and_numpy_copies() -> None:
    from cubepool.disco.dref import as_host_value

    value = as_host_value(np.arange(3, dtype=np.float32))
    assert type(value.sum()) is np.float32 and type(value + 1) is np.ndarray
    copy = value.numpy()
    copy[0] = 7
    assert value[0] == 0


def test_host_values_of_shared_or_cyclic_containers_are_converted_once() -> None:
    from cubepool.disco.dref import as_host_value

    looped: list[Any] = []
    looped.append(looped)
    looped.append(looped)
    as_host_value(looped)  # 2**32 visits without the memo
    shared = [np.zeros(1)]
    out = as_host_value({"a": shared, "b": (shared, shared)})
    assert out["a"] is out["b"][0] is out["b"][1]
    assert isinstance(out["a"][0], HostArray)


def test_an_update_overwrites_in_place_and_appends_new_parameters(tmp_path: Path) -> None:
    first = {"a": np.zeros(4, np.int32), "b": np.ones(2, np.float64)}
    dump_tensor_cache(first, tmp_path, encode_format="raw", meta_data={"v": 1})
    second = {"a": np.arange(4, dtype=np.int32), "c": np.full(3, 7, np.int16)}
    dump_tensor_cache(second, tmp_path, encode_format="raw", update_if_exists=True)
    loaded, meta = load_tensor_cache(tmp_path)
    assert meta == {"v": 1}
    assert sorted(loaded) == ["a", "b", "c"]
    np.testing.assert_array_equal(loaded["a"].numpy(), np.arange(4))
    np.testing.assert_array_equal(loaded["b"].numpy(), np.ones(2))
    np.testing.assert_array_equal(loaded["c"].numpy(), np.full(3, 7))
    shards = json.loads((tmp_path / "tensor-cache.json").read_text())["records"]
    assert [s["dataPath"] for s in shards] == ["params_shard_0.bin", "params_shard_1.bin"]
    assert shards[0]["md5sum"] == _md5_of(tmp_path / "params_shard_0.bin")
    with pytest.raises(InvalidArgument, match="stored in 16 bytes, the new value takes 8"):
        dump_tensor_cache(
            {"a": np.zeros(2, np.int32)}, tmp_path, encode_format="raw", update_if_exists=True
        )


def test_an_update_names_its_new_shard_after_none_the_cache_holds(tmp_path: Path) -> None:
    # A cache whose one shard is params_shard_1.bin (TVM names shards as it likes): the
    # update named its new shard by the count, 1, and wrote b's bytes over a's
    # (helper-145's find).
    dump_tensor_cache({"a": np.arange(4, dtype=np.int32)}, tmp_path, encode_format="raw")
    (tmp_path / "params_shard_0.bin").rename(tmp_path / "params_shard_1.bin")
    meta = json.loads((tmp_path / "tensor-cache.json").read_text())
    meta["records"][0]["dataPath"] = "params_shard_1.bin"
    (tmp_path / "tensor-cache.json").write_text(json.dumps(meta))
    b = np.full(3, 7, np.int16)
    dump_tensor_cache({"b": b}, tmp_path, encode_format="raw", update_if_exists=True)
    loaded, _ = load_tensor_cache(tmp_path)
    np.testing.assert_array_equal(loaded["a"].numpy(), np.arange(4))
    np.testing.assert_array_equal(loaded["b"].numpy(), b)
    shards = json.loads((tmp_path / "tensor-cache.json").read_text())["records"]
    assert [s["dataPath"] for s in shards] == ["params_shard_1.bin", "params_shard_2.bin"]


def _md5_of(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def test_an_older_caches_ndarray_cache_json_is_read_from_its_directory(tmp_path: Path) -> None:
    # MLC-LLM's weights before TVM renamed NDArray name the file ndarray-cache.json; the
    # directory form looked for tensor-cache.json alone.
    dump_tensor_cache({"w": np.arange(4, dtype=np.float32)}, tmp_path, encode_format="raw")
    (tmp_path / "tensor-cache.json").rename(tmp_path / "ndarray-cache.json")
    loaded, _ = load_tensor_cache(tmp_path)
    np.testing.assert_array_equal(loaded["w"].numpy(), np.arange(4, dtype=np.float32))
