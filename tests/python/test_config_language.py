"""The pools configuration language: parse, str round trips, errors, and where a
configuration is read from when none is given."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cubepool
from conftest import KIB, MIB
from cubepool import MemoryConfiguration, MemoryPoolOptions, PoolConfigError, PoolType

CORPUS = Path(__file__).parent / "corpus" / "config"
ENV = "CUBEPOOL_MEMORY_POOLS"
EXCLUSIVE_ONLY = cubepool.EXCLUSIVE_MEMORY_ONLY
SLICED = pytest.mark.skipif(EXCLUSIVE_ONLY, reason="sliced pools are unavailable in this build")


@SLICED
def test_the_issue_example_reads_and_writes_back() -> None:
    text = (
        "sliced(page=8MiB, max_slice=512KiB); sliced(page=32MiB, max_slice=4MiB, cap=256MiB); "
        "exclusive(max_alloc=2GiB, dealloc_period=5000)"
    )
    config = MemoryConfiguration.parse(text)
    assert config == MemoryConfiguration.custom(
        [
            MemoryPoolOptions(PoolType.sliced_pages(8 * MIB, 512 * KIB)),
            MemoryPoolOptions(PoolType.sliced_pages(32 * MIB, 4 * MIB, 256 * MIB)),
            MemoryPoolOptions(PoolType.exclusive_pages(2 << 30), 5000),
        ]
    )
    assert str(config) == text
    assert str(config.pools()[1]) == "sliced(page=32MiB, max_slice=4MiB, cap=256MiB)"


def test_sizes_take_binary_and_decimal_units() -> None:
    for text, size in [
        ("4096", 4096),
        ("4096B", 4096),
        ("4 KiB", 4 * KIB),
        ("1.5MiB", 3 * MIB // 2),
        ("2gib", 2 << 30),
        ("1TiB", 1 << 40),
        ("64KB", 64_000),
        ("3MB", 3_000_000),
        ("1_000_000", 1_000_000),
    ]:
        config = MemoryConfiguration.parse(f"exclusive(max_alloc={text})")
        assert config.pools(cubepool.MemoryDeviceProperties(alignment=1, max_page_size=1 << 50))[
            0
        ].pool_type == PoolType.exclusive_pages(size), text


def test_presets_by_name() -> None:
    assert MemoryConfiguration.presets()[:3] == ["compact", "sub_slices", "exclusive_pages"]
    assert MemoryConfiguration.parse("compact") == MemoryConfiguration.compact()
    assert MemoryConfiguration.parse("virtual_pages") == MemoryConfiguration.virtual_pages()
    assert MemoryConfiguration.parse("exclusive_pages") == MemoryConfiguration.exclusive_pages()
    assert MemoryConfiguration.parse("ExclusivePages") == MemoryConfiguration.exclusive_pages()
    assert str(MemoryConfiguration.exclusive_pages()) == "exclusive_pages"
    with pytest.raises(PoolConfigError) as info:
        MemoryConfiguration.parse("speedy")
    assert (info.value.kind, info.value.position) == ("UnknownPreset", 0)
    assert "sub_slices" in str(info.value)


@pytest.mark.parametrize(
    ("text", "kind", "position", "field"),
    [
        ("", "EmptyPoolList", 0, None),
        ("direct(", "Syntax", 7, None),
        ("direct() direct()", "Syntax", 9, None),
        ("pool(x=1)", "UnknownPoolKind", 0, None),
        ("direct(page=1)", "UnknownField", 7, "page"),
        ("exclusive()", "MissingField", 0, "max_alloc"),
        ("exclusive(max_alloc=1, max_alloc=1)", "DuplicateField", 23, "max_alloc"),
        ("exclusive(max_alloc=7 parsecs)", "InvalidValue", 20, "max_alloc"),
        ("exclusive(max_alloc=none)", "InvalidValue", 20, "max_alloc"),
        ("direct(dealloc_period=0)", "ZeroSize", 22, "dealloc_period"),
        ("exclusive_pages; direct()", "PresetInPoolList", 0, None),
    ],
)
def test_errors_name_the_problem_and_its_position(
    text: str, kind: str, position: int, field: str | None
) -> None:
    with pytest.raises(PoolConfigError) as info:
        MemoryConfiguration.parse(text)
    error = info.value
    assert (error.kind, error.position, error.field, error.source) == (
        kind,
        position,
        field,
        None,
    )
    assert isinstance(error, ValueError)
    assert f"at character {position}" in str(error)
    if field is not None:
        assert field in str(error)


@SLICED
def test_validation_errors_point_at_the_field() -> None:
    with pytest.raises(PoolConfigError) as info:
        MemoryConfiguration.parse("direct(); sliced(page=1MiB, max_slice=2MiB)")
    assert (info.value.kind, info.value.position, info.value.field) == (
        "SliceLargerThanPage",
        38,
        "max_slice_size",
    )


def test_configurations_pickle_as_their_text() -> None:
    config = MemoryConfiguration.parse("exclusive(max_alloc=1MiB); direct(reclaim_at=1GB)")
    assert pickle.loads(pickle.dumps(config)) == config


def test_the_corpus_reads_as_recorded() -> None:
    manifest = json.loads((CORPUS / "MANIFEST.json").read_text())
    files = sorted(p.name for p in CORPUS.glob("*.txt"))
    assert files == sorted(manifest), "every corpus file has an expected outcome"
    for name, expected in manifest.items():
        text = (CORPUS / name).read_bytes().decode("utf-8")
        if EXCLUSIVE_ONLY and ("sliced" in text or "sub" in text.lower()):
            continue
        if "canonical" in expected:
            config = MemoryConfiguration.parse(text)
            assert str(config) == expected["canonical"], name
            assert MemoryConfiguration.parse(str(config)) == config, name
        else:
            with pytest.raises(PoolConfigError) as info:
                MemoryConfiguration.parse(text)
            got = (info.value.kind, info.value.position, info.value.field)
            assert got == (expected["kind"], expected["position"], expected["field"]), name


# Sizes of every shape: small, multiples of binary and decimal units, anything.
sizes = st.one_of(
    st.integers(0, 5000),
    st.builds(lambda n, k: n << (10 * k), st.integers(0, 4096), st.integers(0, 4)),
    st.builds(lambda n, k: n * 1000**k, st.integers(0, 4096), st.integers(1, 4)),
    st.integers(0, 2**64 - 1),
)
pool_types = st.one_of(
    st.builds(
        lambda page, percent, pages: PoolType.sliced_pages(
            page, max(page * percent // 100, 1), None if pages is None else pages * page
        ),
        st.integers(1, 1 << 40),
        st.integers(1, 100),
        st.none() | st.integers(1, 65_535),
    ),
    st.builds(PoolType.exclusive_pages, sizes),
    st.builds(PoolType.direct, st.none() | sizes),
)
pools = st.builds(MemoryPoolOptions, pool_types, st.none() | st.integers(1, 2**64 - 1))


@st.composite
def configurations(draw: st.DrawFn) -> MemoryConfiguration:
    """Any configuration the Python API can make."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return MemoryConfiguration.exclusive_pages()
    if choice == 1 and not EXCLUSIVE_ONLY:
        return MemoryConfiguration.sub_slices()
    options = draw(st.lists(pools, min_size=1, max_size=8))
    if EXCLUSIVE_ONLY:
        options = [o for o in options if o.pool_type.kind != "sliced_pages"] or [
            MemoryPoolOptions(PoolType.direct())
        ]
    return MemoryConfiguration.custom(options)


@settings(max_examples=400, deadline=None)
@given(configurations())
def test_any_configuration_round_trips(config: MemoryConfiguration) -> None:
    text = str(config)
    assert MemoryConfiguration.parse(text) == config
    assert str(MemoryConfiguration.parse(text)) == text


INTERESTING = [
    ";",
    ",",
    "(",
    ")",
    "=",
    ".",
    "_",
    "#",
    "\n",
    " ",
    "é",
    "\x00",
    "\ud800",
    "0",
    "9",
    "K",
]


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    """Valid configuration text with a few characters replaced, inserted or removed."""
    chars = list(str(draw(configurations())))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(chars)))
        c = draw(st.sampled_from(INTERESTING) | st.characters())
        edit = draw(st.integers(0, 2))
        if edit == 0 and at < len(chars):
            chars[at] = c
        elif edit == 1 and at < len(chars):
            del chars[at]
        else:
            chars.insert(at, c)
    return "".join(chars)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(mutated_texts(), st.text(max_size=60)))
def test_malformed_text_is_always_a_pool_config_error(text: str) -> None:
    try:
        config = MemoryConfiguration.parse(text)
    except PoolConfigError as error:
        assert isinstance(error.kind, str) and error.kind
        assert error.position is not None and 0 <= error.position <= len(text)
    else:
        assert MemoryConfiguration.parse(str(config)) == config


def test_the_environment_variable_configures_memory_management(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert MemoryConfiguration.from_environment() is None
    monkeypatch.setenv(ENV, "exclusive(max_alloc=1MiB); direct()")
    found = MemoryConfiguration.from_environment()
    assert found is not None and found[1] == ENV
    assert str(cubepool.MemoryManagement().config) == "exclusive(max_alloc=1MiB); direct()"
    # An explicit argument wins.
    explicit = MemoryConfiguration.exclusive_pages()
    assert cubepool.MemoryManagement(explicit).config == explicit
    assert cubepool.MemoryManagement("direct()").config == MemoryConfiguration.parse("direct()")
    # replay(config=None) reads it too: one direct buffer per allocation.
    trace = cubepool.Trace.from_events([(0, "alloc", 0, 2 * MIB), (1, "free", 0, 0)])
    assert cubepool.replay(trace).peak_reserved == 2 * MIB


def test_a_bad_variable_is_a_pool_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "direct(reclaim=1)")
    with pytest.raises(PoolConfigError) as info:
        cubepool.MemoryManagement()
    assert (info.value.kind, info.value.position, info.value.source) == ("UnknownField", 7, ENV)
    assert str(info.value).startswith(ENV)


def test_cubepool_toml_is_found_upward_and_the_variable_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "cubepool.toml").write_text('[memory]\npools = "exclusive(max_alloc=2MiB)"\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    found = MemoryConfiguration.from_environment()
    assert found is not None
    config, source = found
    assert str(config) == "exclusive(max_alloc=2MiB)"
    assert source.endswith("cubepool.toml: memory.pools")
    assert cubepool.MemoryManagement().config == config
    monkeypatch.setenv(ENV, "direct()")
    assert str(cubepool.MemoryManagement().config) == "direct()"
    monkeypatch.setenv(ENV, "   ")
    assert cubepool.MemoryManagement().config == config, "a blank variable counts as unset"


def test_cubepool_toml_arrays_and_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    toml = tmp_path / "cubepool.toml"
    toml.write_text('memory.pools = ["exclusive(max_alloc=1KiB)", "direct()"]\n')
    assert str(cubepool.MemoryManagement().config) == "exclusive(max_alloc=1KiB); direct()"
    toml.write_text('memory.pools = ["direct()", "direct(bogus=1)"]\n')
    with pytest.raises(PoolConfigError) as info:
        cubepool.MemoryManagement()
    assert info.value.kind == "UnknownField"
    assert info.value.source is not None and info.value.source.endswith("memory.pools[1]")
    toml.write_text("[memory\n")
    with pytest.raises(PoolConfigError) as info:
        cubepool.MemoryManagement()
    assert info.value.kind == "InvalidToml"
    toml.write_text("memory.pools = 5\n")
    with pytest.raises(PoolConfigError) as info:
        cubepool.MemoryManagement()
    assert (info.value.kind, info.value.field) == ("WrongType", "memory.pools")
    toml.write_text("[tool]\nx = 1\n")
    assert cubepool.MemoryManagement().config == MemoryConfiguration.parse(
        "exclusive_pages" if EXCLUSIVE_ONLY else "virtual_pages"
    )


def test_a_relative_plan_file_is_the_config_files_neighbour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `planned(file=plan.json)` in proj/cubepool.toml or a layout file was read from the
    # working folder: run from elsewhere it failed, or read another plan.json there
    # silently (helper-142's find). It is the file's neighbour now, in every form.
    from cubepool.cli import main
    from cubepool.plan.planned import save_planned

    project = tmp_path / "proj"
    project.mkdir()
    save_planned(cubepool.load_trace("gpt2-generate"), project / "plan.json")
    (project / "cubepool.toml").write_text('[memory]\npools = "planned(file=plan.json)"\n')
    (project / "layout.json").write_text('{"layout": "planned(file=plan.json)"}')
    (project / "layout.txt").write_text("planned(file=plan.json)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A plan of the same name where the command runs, which must not be read.
    (elsewhere / "plan.json").write_text("not a plan")
    monkeypatch.chdir(elsewhere)
    for name in ("cubepool.toml", "layout.json", "layout.txt"):
        config = str(project / name)
        assert main(["replay", "--example", "gpt2-generate", "--config", config]) == 0
        layout = cubepool.layouts.config_from_arg(config)[1]
        assert f"file={project / 'plan.json'}" in str(layout)
    # The toml found above the working folder, too.
    below = project / "sub"
    below.mkdir()
    monkeypatch.chdir(below)
    monkeypatch.delenv("CUBEPOOL_MEMORY_POOLS", raising=False)
    capsys.readouterr()
    assert main(["replay", "--example", "gpt2-generate"]) == 0
    assert f"planned arena of {project / 'plan.json'}" in capsys.readouterr().out
    # Text given as it is (not read from a file) names the working folder's plan, by
    # the name given, as does a file in the working folder.
    with pytest.raises(PoolConfigError, match=r"plan\.json"):
        MemoryConfiguration.parse("planned(file=plan.json)")
    monkeypatch.chdir(project)
    for folder in (None, "."):
        parsed = MemoryConfiguration.parse("planned(file=plan.json)", folder)
        assert "(file=plan.json)" in str(parsed)


def test_a_variable_that_is_not_utf8_is_refused_at_its_first_such_byte(tmp_path: Path) -> None:
    # Read with a replacement character, planned(file=...\xff.json) loaded the plan named
    # ...\ufffd.json, which the variable never named (helper-145's find).
    import os
    import subprocess
    import sys

    from cubepool.plan.planned import save_planned

    save_planned(cubepool.load_trace("gpt2-generate"), tmp_path / "\ufffd.json")
    env = {k.encode(): v.encode() for k, v in os.environ.items()}
    env[b"CUBEPOOL_MEMORY_POOLS"] = b"planned(file=" + os.fsencode(tmp_path) + b"/\xff.json)"
    code = "import cubepool; print(cubepool.MemoryConfiguration.from_environment())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout
    assert "UTF-8 text" in done.stderr and "CUBEPOOL_MEMORY_POOLS" in done.stderr
