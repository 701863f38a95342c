"""SnapshotStore on disk: atomic files, the newest usable one wins, corrupt ones are skipped."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from serve.config import Config
from serve.core.registry import Registry
from serve.store.snapshot import SnapshotError, SnapshotStore, validate

GOOD = {
    "model_snapshot": {
        "modelCount": 1,
        "models": {
            "echo": {"1.0": {"defaultVersion": True, "marName": "echo.mar", "minWorkers": 1}}
        },
    }
}


def test_save_writes_the_registry_state_atomically(tmp_path: Path) -> None:
    config = Config(model_store=str(tmp_path))
    registry = Registry(config, tmp_path / "work")
    store = SnapshotStore(tmp_path / "config")
    path = store.save(registry, config)
    assert path is not None and path.name.endswith("-snapshot.json")
    data = json.loads(path.read_text())
    assert data["model_snapshot"] == {"modelCount": 0, "models": {}}
    assert [p.name for p in (tmp_path / "config").iterdir()] == [path.name]  # no temp file left
    assert store.latest() == data


def test_only_the_newest_ten_are_kept(tmp_path: Path) -> None:
    config = Config(model_store=str(tmp_path))
    registry = Registry(config, tmp_path / "work")
    store = SnapshotStore(tmp_path / "config")
    for _ in range(13):
        store.save(registry, config)
    assert len(list((tmp_path / "config").glob("*-snapshot.json"))) == 10


def test_latest_skips_corrupt_snapshots(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "1-snapshot.json").write_text(json.dumps(GOOD))
    (folder / "2-snapshot.json").write_text("{truncated")
    (folder / "3-snapshot.json").write_bytes(b"\xff\xfe")
    (folder / "4-snapshot.json").write_text(json.dumps({"model_snapshot": {"models": []}}))
    with caplog.at_level(logging.ERROR, logger="serve.store.snapshot"):
        assert SnapshotStore(folder).latest() == GOOD
    assert caplog.text.count("Skipping corrupt snapshot") == 3
    assert SnapshotStore(tmp_path / "none").latest() is None


@pytest.mark.parametrize(
    "data",
    [
        [],
        {},
        {"model_snapshot": None},
        {"model_snapshot": {"models": "x"}},
        {"model_snapshot": {"models": {"m": []}}},
        {"model_snapshot": {"models": {"m": {"1.0": {"minWorkers": 1}}}}},
        {"model_snapshot": {"models": {"m": {"1.0": {"marName": "m.mar", "minWorkers": -1}}}}},
        {"model_snapshot": {"models": {"m": {"1.0": {"marName": "m.mar", "minWorkers": "2"}}}}},
    ],
)
def test_validate_rejects_unusable_snapshots(data: object) -> None:
    with pytest.raises(SnapshotError):
        validate(data)


def test_validate_accepts_a_good_snapshot() -> None:
    validate(GOOD)
