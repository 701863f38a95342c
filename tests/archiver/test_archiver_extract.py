"""open_archive / read_manifest: safe extraction, format detection and manifest handling."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from archiver import ArchiveError, ManifestError, UnsafeArchive, open_archive, read_manifest, unpack
from archiver.safety import is_within

MANIFEST = {
    "createdOn": "01/02/2024 10:00:00",
    "runtime": "python",
    "model": {"modelName": "evil", "handler": "h.py", "modelVersion": "1.0"},
    "archiverVersion": "0.12.0",
}
MANIFEST_BYTES = json.dumps(MANIFEST, indent=2).encode()
MiB = 1024 * 1024


def listing(folder: Path) -> list[str]:
    """Every path under ``folder``, relative and sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# --- crafting archives with zipfile / tarfile directly -----------------------------------------

ZipEntry = tuple[str, bytes, int]  # name, data, unix mode (with file type bits) or 0


def make_zip(path: Path, entries: list[ZipEntry], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0))
            info.compress_type = method
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


def tar_file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def tar_special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, b""


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


ZIP_OK = ("MAR-INF/MANIFEST.json", MANIFEST_BYTES, 0o100644)

# name of the case -> (entries after a valid manifest, the entry that must be named)
ZIP_CASES: dict[str, tuple[list[ZipEntry], str]] = {
    "dotdot": ([("../x", b"pwned", 0o100644)], "../x"),
    "nested-dotdot": ([("a/../../x", b"pwned", 0)], "a/../../x"),
    "absolute": ([("/tmp/lantern-abs-x", b"pwned", 0)], "/tmp/lantern-abs-x"),
    "windows-drive": ([("C:/x", b"pwned", 0)], "C:/x"),
    "backslash": ([("..\\x", b"pwned", 0)], "..\\x"),
    "symlink": ([("link", b"/etc/passwd", stat.S_IFLNK | 0o777)], "link"),
    "device": ([("dev", b"", stat.S_IFCHR | 0o600)], "dev"),
    "fifo": ([("fifo", b"", stat.S_IFIFO | 0o600)], "fifo"),
    "sibling-prefix": ([("../dest-evil/pwned", b"pwned", 0)], "../dest-evil/pwned"),
    "duplicate": ([("a.txt", b"1", 0), ("a.txt", b"2", 0)], "a.txt"),
    "bomb-ratio": ([("zeros.bin", bytes(4 * MiB), 0)], "zeros.bin"),
    "file-at-root": ([(".", b"x", 0)], "."),
}

TAR_CASES: dict[str, tuple[list[tuple[tarfile.TarInfo, bytes]], str]] = {
    "dotdot": ([tar_file("../x")], "../x"),
    "absolute": ([tar_file("/tmp/lantern-abs-x")], "/tmp/lantern-abs-x"),
    "windows-drive": ([tar_file("C:/x")], "C:/x"),
    "backslash": ([tar_file("..\\x")], "..\\x"),
    "symlink": ([tar_special("m/link", tarfile.SYMTYPE, "/etc")], "m/link"),
    "symlink-then-write": (
        [tar_special("m/link", tarfile.SYMTYPE, "../../dest-evil"), tar_file("m/link/pwned")],
        "m/link",
    ),
    "hardlink": ([tar_special("m/hard", tarfile.LNKTYPE, "/etc/passwd")], "m/hard"),
    "device": ([tar_special("m/dev", tarfile.CHRTYPE)], "m/dev"),
    "fifo": ([tar_special("m/fifo", tarfile.FIFOTYPE)], "m/fifo"),
    "sibling-prefix": ([tar_file("../dest-evil/pwned")], "../dest-evil/pwned"),
    "duplicate": ([tar_file("m/a.txt"), tar_file("m/a.txt")], "m/a.txt"),
    "bomb-ratio": ([tar_file("m/zeros.bin", bytes(4 * MiB))], "m/zeros.bin"),
    "file-at-root": ([tar_file("./")], "./"),
}


def _tar_with(members: list[tuple[tarfile.TarInfo, bytes]], path: Path) -> Path:
    # A valid file first: the refusal then comes after something was already written.
    return make_tar(path, [tar_file("m/MAR-INF/MANIFEST.json", MANIFEST_BYTES), *members])


def assert_refused(archive: Path, work: Path, entry: str, **limits: float) -> None:
    """Opening ``archive`` into ``work/dest`` raises UnsafeArchive for ``entry``; no trace left."""
    before = listing(work)
    with pytest.raises(UnsafeArchive) as info:
        open_archive(archive, work / "dest", **limits)  # type: ignore[arg-type]
    assert info.value.entry == entry
    assert repr(entry) in str(info.value)
    assert listing(work) == before  # not in dest (removed), not next to it, not anywhere below
    assert not Path("/tmp/lantern-abs-x").exists()


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("case", ZIP_CASES)
def test_malicious_zip_is_refused(tmp_path: Path, case: str) -> None:
    entries, entry = ZIP_CASES[case]
    archive = make_zip(tmp_path / "evil.mar", [("ok.txt", b"ok", 0), ZIP_OK, *entries])
    assert_refused(archive, tmp_path, entry)


@pytest.mark.parametrize("case", TAR_CASES)
def test_malicious_tar_is_refused(tmp_path: Path, case: str) -> None:
    members, entry = TAR_CASES[case]
    assert_refused(_tar_with(members, tmp_path / "evil.tar.gz"), tmp_path, entry)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_bomb_by_total_size_is_refused(tmp_path: Path, kind: str) -> None:
    # Incompressible data, so only the size limit can refuse it: 3 x 40 KiB against 100 KiB.
    chunks = [(f"m/part{i}.bin", os.urandom(40 * 1024)) for i in range(3)]
    if kind == "zip":
        archive = make_zip(tmp_path / "big.mar", [ZIP_OK, *[(n, d, 0) for n, d in chunks]])
    else:
        archive = _tar_with([tar_file(n, d) for n, d in chunks], tmp_path / "big.tgz")
    assert_refused(archive, tmp_path, "m/part2.bin", max_size=100 * 1024)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_too_many_entries_is_refused(tmp_path: Path, kind: str) -> None:
    names = [f"m/f{i}" for i in range(12)]
    if kind == "zip":
        archive = make_zip(tmp_path / "many.mar", [ZIP_OK, *[(n, b"x", 0) for n in names]])
    else:
        archive = _tar_with([tar_file(n) for n in names], tmp_path / "many.tgz")
    assert_refused(archive, tmp_path, "m/f9", max_entries=10)


def test_many_small_compressible_entries_are_refused_before_any_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,000 x 1 MiB of zeros: each entry is at the per-entry threshold, 1 GiB in about 1 MB.
    zeros = bytes(MiB)
    path = tmp_path / "many-zeros.mar"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("MAR-INF/MANIFEST.json", MANIFEST_BYTES)
        for i in range(1000):
            zf.writestr(f"m/z{i}.bin", zeros)
    assert path.stat().st_size < 2 * MiB
    written: list[str] = []
    monkeypatch.setattr(unpack, "_write_file", lambda root, rel, *a: written.append(str(rel)))
    # Refused from the central directory at the first entry: nothing was ever opened to write.
    assert_refused(path, tmp_path, "m/z0.bin")
    assert written == []


def test_archive_wide_ratio_lets_ordinary_archives_through(tmp_path: Path) -> None:
    # Random weights beside a few compressible text files: an ordinary model archive.
    entries = [(f"m/vocab{i}.txt", b"token\n" * 2000, 0) for i in range(20)]
    archive = make_zip(tmp_path / "ok.mar", [ZIP_OK, ("m/w.bin", os.urandom(2 * MiB), 0), *entries])
    opened = open_archive(archive, tmp_path / "dest")
    assert (opened.model_dir / "m" / "w.bin").stat().st_size == 2 * MiB


def test_ratio_limit_is_configurable(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "z.mar", [ZIP_OK, ("zeros.bin", bytes(4 * MiB), 0)])
    opened = open_archive(archive, tmp_path / "dest", max_ratio=10_000)
    assert (opened.model_dir / "zeros.bin").stat().st_size == 4 * MiB


def test_refusal_in_existing_empty_dest_leaves_it_empty(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    archive = _tar_with([tar_file("../x")], tmp_path / "evil.tgz")
    with pytest.raises(UnsafeArchive):
        open_archive(archive, dest)
    assert dest.is_dir() and listing(dest) == []


def test_refusal_removes_created_parent_folders(tmp_path: Path) -> None:
    archive = _tar_with([tar_file("../x")], tmp_path / "evil.tgz")
    with pytest.raises(UnsafeArchive):
        open_archive(archive, tmp_path / "a" / "b" / "dest")
    assert sorted(os.listdir(tmp_path)) == ["evil.tgz"]


def test_is_within_compares_components_not_strings(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    evil = tmp_path / "dest-evil" / "x"
    assert str(evil).startswith(str(dest))  # the check TorchServe's Zip Slip fix made
    assert not is_within(dest, evil)
    assert is_within(dest, dest / "sub" / "x")


def test_extracted_files_lose_setuid_but_keep_exec(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "m.mar",
        [ZIP_OK, ("run.sh", b"#!/bin/sh\n", 0o104777), ("data.txt", b"d", 0o100666)],
    )
    model_dir = open_archive(archive, tmp_path / "dest").model_dir
    assert stat.S_IMODE((model_dir / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((model_dir / "data.txt").stat().st_mode) == 0o644


# --- formats and layout ------------------------------------------------------------------------


def test_format_is_detected_by_content(tmp_path: Path) -> None:
    zipped = make_zip(tmp_path / "model.tar.gz", [ZIP_OK, ("w.bin", b"w", 0)])
    assert open_archive(zipped, tmp_path / "a").model_name == "evil"
    tarred = _tar_with([tar_file("m/w.bin")], tmp_path / "model.mar")
    assert open_archive(tarred, tmp_path / "b").model_dir == (tmp_path / "b" / "m").resolve()
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tf:
        info, data = tar_file("MAR-INF/MANIFEST.json", MANIFEST_BYTES)
        tf.addfile(info, io.BytesIO(data))
    assert open_archive(plain, tmp_path / "c").model_dir == (tmp_path / "c").resolve()
    text = tmp_path / "notes.mar"
    text.write_text("not an archive")
    with pytest.raises(ArchiveError, match="not a model archive"):
        open_archive(text, tmp_path / "d")
    with pytest.raises(ArchiveError, match="no such file"):
        open_archive(tmp_path / "missing.mar", tmp_path / "e")
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


def test_tar_with_dot_slash_names_is_accepted(tmp_path: Path) -> None:
    # `tar -C model -czf m.tgz .` writes "./" and "./name" entries; they are ordinary.
    root = tar_special("./", tarfile.DIRTYPE)
    archive = make_tar(
        tmp_path / "m.tgz",
        [root, tar_file("./MAR-INF/MANIFEST.json", MANIFEST_BYTES), tar_file("./w.bin", b"w")],
    )
    opened = open_archive(archive, tmp_path / "dest")
    assert opened.model_dir == (tmp_path / "dest").resolve()
    assert listing(opened.model_dir) == ["MAR-INF", "MAR-INF/MANIFEST.json", "w.bin"]


def test_corrupt_archive_is_an_archive_error(tmp_path: Path) -> None:
    good = make_zip(tmp_path / "m.mar", [ZIP_OK, ("w.bin", os.urandom(4096), 0)])
    broken = tmp_path / "broken.mar"
    broken.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ArchiveError):
        open_archive(broken, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_tgz_top_folder_is_the_model_dir_and_junk_is_ignored(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "m.mar",
        [("__MACOSX/m/._x", b"", 0), ("m/w.bin", b"w", 0), ("m/" + ZIP_OK[0], MANIFEST_BYTES, 0)],
    )
    assert open_archive(archive, tmp_path / "dest").model_dir == (tmp_path / "dest" / "m").resolve()


def test_dest_must_be_empty(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.mar", [ZIP_OK])
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(ArchiveError, match="not empty"):
        open_archive(archive, dest)
    assert listing(dest) == ["keep.txt"]


def test_read_manifest_does_not_extract(tmp_path: Path) -> None:
    mar = make_zip(tmp_path / "m.mar", [ZIP_OK, ("w.bin", b"w", 0)])
    tgz = _tar_with([tar_file("m/w.bin")], tmp_path / "m.tgz")
    folder = tmp_path / "folder"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_bytes(MANIFEST_BYTES)
    before = listing(tmp_path)
    for source in (mar, tgz, folder):
        assert read_manifest(source) == MANIFEST
    assert listing(tmp_path) == before


# --- manifest and model config -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("w.bin", b"w", 0)], "no MAR-INF/MANIFEST.json"),
        ([("MAR-INF/MANIFEST.json", b"{not json", 0)], "not valid JSON"),
        ([("MAR-INF/MANIFEST.json", b"[]", 0)], "must hold a JSON object"),
        ([("MAR-INF/MANIFEST.json", b'{"runtime": "python"}', 0)], "no 'model' object"),
        ([("MAR-INF/MANIFEST.json", b'{"model": {"modelName": "m"}}', 0)], "no model.handler"),
    ],
)
def test_bad_manifest(tmp_path: Path, entries: list[ZipEntry], message: str) -> None:
    archive = make_zip(tmp_path / "m.mar", entries)
    with pytest.raises(ManifestError, match=message):
        read_manifest(archive)
    with pytest.raises(ManifestError, match=message):
        open_archive(archive, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def _with_config(tmp_path: Path, config_name: str, files: list[ZipEntry]) -> Path:
    manifest = json.loads(MANIFEST_BYTES)
    manifest["model"]["configFile"] = config_name
    return make_zip(
        tmp_path / "m.mar", [("MAR-INF/MANIFEST.json", json.dumps(manifest).encode(), 0), *files]
    )


def test_model_config_and_version_default(tmp_path: Path) -> None:
    archive = _with_config(tmp_path, "cfg.yaml", [("cfg.yaml", b"batchSize: 8\npt2: {}\n", 0)])
    opened = open_archive(archive, tmp_path / "a")
    assert opened.model_config == {"batchSize": 8, "pt2": {}}
    no_version = json.loads(MANIFEST_BYTES)
    del no_version["model"]["modelVersion"]
    legacy = make_zip(
        tmp_path / "l.mar", [("MAR-INF/MANIFEST.json", json.dumps(no_version).encode(), 0)]
    )
    opened = open_archive(legacy, tmp_path / "b")
    assert (opened.version, opened.model_config, opened.runtime) == ("1.0", {}, "python")


@pytest.mark.parametrize(
    ("config_name", "files", "message"),
    [
        ("cfg.yaml", [("cfg.yaml", b"a: [1, 2\n", 0)], "invalid YAML"),
        ("cfg.yaml", [("cfg.yaml", b"- 1\n- 2\n", 0)], "must be a YAML mapping"),
        (
            "cfg.yaml",
            [("cfg.yaml", b"!!python/object/apply:os.system ['true']\n", 0)],
            "invalid YAML",
        ),
        ("cfg.yaml", [], "is missing"),
        ("../cfg.yaml", [], "points outside the archive"),
        ("/etc/hostname", [], "points outside the archive"),
    ],
)
def test_bad_model_config(
    tmp_path: Path, config_name: str, files: list[ZipEntry], message: str
) -> None:
    (tmp_path / "cfg.yaml").write_text("outside: true\n")
    archive = _with_config(tmp_path, config_name, files)
    with pytest.raises(ManifestError, match=message):
        open_archive(archive, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_unsafe_archive_survives_pickling() -> None:
    # Errors may cross process boundaries in the server; the entry must survive the trip.
    error = pickle.loads(pickle.dumps(UnsafeArchive("../x", "escapes")))
    assert (error.entry, error.reason, str(error)) == (
        "../x",
        "escapes",
        "unsafe archive entry '../x': escapes",
    )
