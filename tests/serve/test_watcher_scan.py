"""The model store scan (both layouts) and the completeness rule, on real files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from serve.store.watcher import Candidate, Stability, fingerprint, scan_store
from tests.support.server import echo_archive


@pytest.fixture
def built(tmp_path: Path) -> dict[str, Path]:
    out = tmp_path / "built"
    out.mkdir()
    v1 = echo_archive(out, version="1.0")
    v1 = v1.rename(out / "echo-1.mar")
    v2 = echo_archive(out, version="2.0").rename(out / "echo-2.mar")
    folder = echo_archive(out, name="unpacked", version="7", archive_format="no-archive")
    return {"v1": v1, "v2": v2, "folder": folder}


def _seen(found: list[Candidate]) -> set[tuple[str, str, str]]:
    return {(c.name, c.version, c.url) for c in found}


def test_flat_layout_names_versions_from_manifests(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(built["v1"], store / "echo.mar")
    shutil.copy(built["v2"], store / "echo-v2.mar")
    shutil.copytree(built["folder"], store / "unpacked")
    (store / "notes.txt").write_text("not a model")
    found = scan_store(store, {})
    assert _seen(found) == {
        ("echo", "1.0", "echo.mar"),
        ("echo", "2.0", "echo-v2.mar"),
        ("unpacked", "7", "unpacked"),
    }


def test_versioned_layout_folder_names(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    (store / "m" / "3").mkdir(parents=True)
    shutil.copy(built["v1"], store / "m" / "3" / "anything.mar")
    shutil.copytree(built["folder"], store / "m" / "4")
    (store / "m" / "5").mkdir()  # empty: nothing to serve yet
    (store / "m" / "6").mkdir()  # two archives: ambiguous, skipped
    shutil.copy(built["v1"], store / "m" / "6" / "a.mar")
    shutil.copy(built["v2"], store / "m" / "6" / "b.mar")
    (store / "m" / "all").mkdir()  # a reserved version name
    shutil.copy(built["v1"], store / "m" / "all" / "a.mar")
    found = scan_store(store, {})
    assert _seen(found) == {("m", "3", "m/3/anything.mar"), ("m", "4", "m/4")}


def test_partial_and_hidden_names_are_ignored(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    (store / "m" / ".1").mkdir(parents=True)
    shutil.copy(built["v1"], store / "m" / ".1" / "a.mar")
    shutil.copy(built["v1"], store / ".hidden.mar")
    shutil.copy(built["v1"], store / "echo.mar.part")
    (store / "m" / "2").mkdir()
    shutil.copy(built["v1"], store / "m" / "2" / "a.mar.tmp")
    assert scan_store(store, {}) == []


def test_truncated_archive_is_not_a_candidate(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    data = built["v1"].read_bytes()
    (store / "echo.mar").write_bytes(data[: len(data) // 2])  # a copy still under way
    assert scan_store(store, {}) == []
    (store / "echo.mar").write_bytes(data)
    assert _seen(scan_store(store, {})) == {("echo", "1.0", "echo.mar")}


def test_complete_only_once_unchanged_for_an_interval(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    store = tmp_path / "store"
    (store / "m" / "1").mkdir(parents=True)
    target = store / "m" / "1" / "m.mar"
    data = built["v1"].read_bytes()
    target.write_bytes(data[:100])
    stability = Stability(min_age=2.0)
    assert stability.complete(scan_store(store, {}), now=0.0) == []  # first sight
    target.write_bytes(data)  # still growing
    assert stability.complete(scan_store(store, {}), now=2.0) == []
    # Unchanged, but only for 1 s: an early scan (a change notification) is not enough.
    assert stability.complete(scan_store(store, {}), now=3.0) == []
    done = stability.complete(scan_store(store, {}), now=4.0)  # unchanged for 2 s
    assert [(c.name, c.version) for c in done] == [("m", "1")]
    os.utime(target, ns=(1, 1))  # touched again: not complete until it settles again
    assert stability.complete(scan_store(store, {}), now=5.0) == []
    assert stability.complete(scan_store(store, {}), now=6.0) == []
    assert len(stability.complete(scan_store(store, {}), now=7.0)) == 1


def test_a_vanished_candidate_starts_over(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(built["v1"], store / "echo.mar")
    stability = Stability(min_age=1.0)
    stability.complete(scan_store(store, {}), now=0.0)
    (store / "echo.mar").rename(store / ".echo.mar.part")  # gone for one scan
    assert stability.complete(scan_store(store, {}), now=1.0) == []
    (store / ".echo.mar.part").rename(store / "echo.mar")
    assert stability.complete(scan_store(store, {}), now=2.0) == []
    assert len(stability.complete(scan_store(store, {}), now=3.0)) == 1


def test_fingerprint_covers_every_file_of_a_folder(tmp_path: Path) -> None:
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "x").write_bytes(b"12")
    first = fingerprint(tmp_path / "a")
    (tmp_path / "a" / "sub" / "y").write_bytes(b"345")
    second = fingerprint(tmp_path / "a")
    assert first[:2] == (1, 2) and second[:2] == (2, 5)


def test_manifest_cache_follows_the_fingerprint(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(built["v1"], store / "echo.mar")
    cache: dict = {}
    assert _seen(scan_store(store, cache)) == {("echo", "1.0", "echo.mar")}
    shutil.copy(built["v2"], store / "echo.mar")  # replaced by a new version, same file name
    assert _seen(scan_store(store, cache)) == {("echo", "2.0", "echo.mar")}


def test_triton_and_ovms_version_folders(tmp_path: Path) -> None:
    """A model file in a version folder: the candidate opens the model folder (its config.pbtxt
    is read) at that version."""
    store = tmp_path / "store"
    for version in ("1", "2"):
        (store / "t" / version).mkdir(parents=True)
        (store / "t" / version / "model.onnx").write_bytes(b"")
    (store / "t" / "config.pbtxt").write_text("max_batch_size: 4")
    (store / "ov" / "3").mkdir(parents=True)
    (store / "ov" / "3" / "net.xml").write_text("<net/>")
    (store / "ov" / "3" / "net.bin").write_bytes(b"")
    (store / "ov" / "4").mkdir()  # no model yet
    found = scan_store(store, {})
    assert _seen(found) == {("t", "1", "t"), ("t", "2", "t"), ("ov", "3", "ov")}
    assert {c.path for c in found if c.name == "t"} == {store / "t" / "1", store / "t" / "2"}
