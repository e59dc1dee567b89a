"""``Session.upload_vm_module`` and its worker side, ``runtime.disco.upload_module``:
a file read on the controller, written by every worker at the same path relative to the
worker's working directory, never outside it, whole or not at all. And
``load_vm_module``, which needs TVM's compiler: a typed error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import cubepool
from cubepool import disco
from cubepool.disco.upload import relative_parts, write_under_cwd


@pytest.fixture
def threaded() -> Iterator[disco.ThreadedSession]:
    """A two-worker ``ThreadedSession``."""
    with disco.ThreadedSession(2, timeout=30) as session:
        yield session


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("mod.so", ["mod.so"]),
        ("./mod.so", ["mod.so"]),
        ("a//b/./mod.so", ["a", "b", "mod.so"]),
        ("a/../mod.so", ["mod.so"]),
        ("a/b/../../c/mod.so", ["c", "mod.so"]),
        ("..mod", ["..mod"]),
    ],
)
def test_a_relative_path_is_split_into_its_parts(path: str, parts: list[str]) -> None:
    assert relative_parts(path) == parts


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc/mod.so", "is absolute"),
        ("//mod.so", "is absolute"),
        ("../mod.so", r"climbs out of the working directory with '\.\.'"),
        ("a/../../mod.so", "climbs out"),
        ("./..", "climbs out"),
        ("a/", "names a folder"),
        (".", "names the working directory"),
        ("a/..", "names the working directory"),
        ("", "non-empty path"),
        ("a\0b", "without NUL"),
    ],
)
def test_a_path_out_of_the_working_directory_is_refused(path: str, message: str) -> None:
    with pytest.raises(cubepool.InvalidArgument, match=f"path .*{message}"):
        relative_parts(path)


def test_a_path_that_is_not_text_is_refused() -> None:
    with pytest.raises(cubepool.InvalidArgument, match="path must be a str, got bytes"):
        relative_parts(b"mod.so")


def test_a_write_makes_folders_and_replaces_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_under_cwd("lib/x86/mod.so", b"first")
    assert (tmp_path / "lib/x86/mod.so").read_bytes() == b"first"
    write_under_cwd("./lib/x86/mod.so", bytearray(b"second"))
    assert (tmp_path / "lib/x86/mod.so").read_bytes() == b"second"
    assert sorted(os.listdir(tmp_path / "lib/x86")) == ["mod.so"]  # no temporary left


def test_a_write_follows_no_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder on the way that is a link (out of the working directory) is refused, and
    a link in the file's place is replaced, not written through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "escape").symlink_to(outside)
    victim = outside / "victim"
    victim.write_bytes(b"keep")
    (work / "mod.so").symlink_to(victim)
    monkeypatch.chdir(work)
    with pytest.raises(cubepool.InvalidArgument, match="'escape' is a symbolic link"):
        write_under_cwd("escape/mod.so", b"x")
    assert sorted(os.listdir(outside)) == ["victim"]
    write_under_cwd("mod.so", b"new")
    assert victim.read_bytes() == b"keep"
    assert not (work / "mod.so").is_symlink()
    assert (work / "mod.so").read_bytes() == b"new"


def test_a_failed_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mod.so").write_bytes(b"old")

    def full_disk(_: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left on device") as caught:
        write_under_cwd("mod.so", b"new bytes")
    assert caught.value.filename == "mod.so"
    assert (tmp_path / "mod.so").read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["mod.so"]


def test_upload_vm_module_writes_the_file_for_every_worker(
    threaded: disco.ThreadedSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "built" / "mod.so"
    source.parent.mkdir()
    data = os.urandom(1 << 16)
    source.write_bytes(data)
    monkeypatch.chdir(tmp_path)
    before = source.stat().st_ino
    # The workers share the controller's directory: they write the file it read, anew
    # (a new file renamed over it), with the same bytes.
    assert threaded.upload_vm_module(Path("built/mod.so")) == "built/mod.so"
    assert source.stat().st_ino != before
    assert source.read_bytes() == data
    assert threaded.upload_vm_module("./built/../built/mod.so") == "./built/../built/mod.so"
    assert source.read_bytes() == data
    assert os.listdir(source.parent) == ["mod.so"]  # no temporary left


def test_upload_vm_module_refuses_before_reading(
    threaded: disco.ThreadedSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path the workers would refuse is refused on the controller, before the file is
    read (here it does not even exist), and the session goes on."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cubepool.InvalidArgument, match=r"path '/no/such\.so' is absolute"):
        threaded.upload_vm_module("/no/such.so")
    with pytest.raises(cubepool.InvalidArgument, match="climbs out"):
        threaded.upload_vm_module("../no-such.so")
    with pytest.raises(cubepool.InvalidArgument, match="path must be a str or a path"):
        threaded.upload_vm_module(3)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        threaded.upload_vm_module("no-such.so")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        threaded.upload_vm_module("fifo")  # refused, not waited on
    threaded.sync_workers()


def test_a_process_session_writes_in_the_workers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers write where they run (the directory they started in), not where the
    controller read the file; a write that fails there is a ``WorkerError`` at the
    upload, and the session goes on."""
    workers_dir = tmp_path / "workers"
    controller_dir = tmp_path / "controller"
    workers_dir.mkdir()
    controller_dir.mkdir()
    monkeypatch.chdir(workers_dir)
    with disco.ProcessSession(2, entrypoint="cubepool.disco", timeout=30) as session:
        monkeypatch.chdir(controller_dir)
        data = os.urandom(100_000)
        (controller_dir / "sub").mkdir()
        (controller_dir / "sub" / "mod.so").write_bytes(data)
        assert session.upload_vm_module("sub/mod.so") == "sub/mod.so"
        assert (workers_dir / "sub" / "mod.so").read_bytes() == data
        assert sorted(os.listdir(workers_dir / "sub")) == ["mod.so"]

        (workers_dir / "blocked").write_bytes(b"a file where a folder is needed")
        (controller_dir / "blocked").mkdir()
        (controller_dir / "blocked" / "mod.so").write_bytes(b"x")
        with pytest.raises(disco.WorkerError, match="blocked") as caught:
            session.upload_vm_module("blocked/mod.so")
        assert caught.value.exc_type.endswith("InvalidArgument")
        session.sync_workers()


@pytest.mark.parametrize("path", ["mod.so", Path("mod.so")])
def test_load_vm_module_says_it_needs_tvm(threaded: disco.ThreadedSession, path: object) -> None:
    """It was an ``AttributeError``: the method was missing."""
    with pytest.raises(
        disco.DiscoUnsupported, match=r"load_vm_module\(.*mod\.so.*TVM's compiler"
    ) as caught:
        threaded.load_vm_module(path)  # type: ignore[arg-type]
    assert isinstance(caught.value, NotImplementedError)
    assert isinstance(caught.value, disco.DiscoError)
    assert caught.value.feature.startswith("load_vm_module(")
    threaded.sync_workers()  # the session goes on


def test_upload_vm_module_reads_the_path_the_workers_write(
    threaded: disco.ThreadedSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `d/../m.so` with `d` a link elsewhere: the controller read `elsewhere/../m.so`
    # (the kernel follows the link) and the workers wrote `m.so` (`..` taken back as
    # text), so `m.so` was overwritten with another file's bytes. Both read it as text.
    elsewhere = tmp_path / "other" / "deep"
    elsewhere.mkdir(parents=True)
    (tmp_path / "other" / "m.so").write_bytes(b"other")
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.so").write_bytes(b"mine")
    (work / "d").symlink_to(elsewhere)
    monkeypatch.chdir(work)
    assert threaded.upload_vm_module("d/../m.so") == "d/../m.so"
    assert (work / "m.so").read_bytes() == b"mine"
    assert (tmp_path / "other" / "m.so").read_bytes() == b"other"
