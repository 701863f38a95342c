"""Every worker gets ``OMP_WAIT_POLICY=PASSIVE`` and may take a spare; a generative engine's
workers keep OpenMP's own (spinning) wait policy and start cold only with ``engine_spin_wait``."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.config import Config, ModelSettings
from serve.core.model import ModelSource, ModelVersion, spawn_worker
from serve.core.pool import WorkerSlot
from serve.worker.spares import SparePool


def version(tmp_path: Path, handler: str, config: Config | None = None) -> ModelVersion:
    manifest = {"model": {"handler": handler}}
    source = ModelSource("m.mar", tmp_path, manifest, {"minWorkers": 1}, handler)
    return ModelVersion("m", "1.0", source, ModelSettings(), config or Config(), tmp_path)


@pytest.mark.parametrize(
    ("handler", "spin_wait", "policy", "spare"),
    [
        ("text_generation", False, "PASSIVE", True),
        ("text_generation", True, None, False),
        ("image_classifier", False, "PASSIVE", True),
        ("image_classifier", True, "PASSIVE", True),  # the key is the engine's alone
    ],
)
def test_the_wait_policy_and_spares_by_handler(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    handler: str,
    spin_wait: bool,
    policy: str | None,
    spare: bool,
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    model = version(tmp_path, handler, Config(engine_spin_wait=spin_wait))
    assert model.worker_env().get("OMP_WAIT_POLICY") == policy
    assert model.worker_env()["OMP_NUM_THREADS"] == str(model.threads_per_worker())
    model.expected_frameworks = frozenset({"torch"})  # what the archive's handler imports
    model.spares = SparePool(1, {})  # the server's (never started here)
    worker = spawn_worker(model, WorkerSlot(0, "m_1.0-w0", None))
    assert (worker.spares is not None) is spare


def test_the_key_is_read_from_the_environment() -> None:
    assert Config.load(env={"LANTERN_ENGINE_SPIN_WAIT": "true"}).engine_spin_wait is True


@pytest.mark.parametrize("spin_wait", [False, True])
def test_a_wait_policy_the_server_was_given_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spin_wait: bool
) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    config = Config(engine_spin_wait=spin_wait)
    assert version(tmp_path, "text_generation", config).worker_env()["OMP_WAIT_POLICY"] == "ACTIVE"
