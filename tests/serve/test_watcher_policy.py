"""Where the store watcher takes a model's version policy from (in-process, no workers)."""

from __future__ import annotations

from pathlib import Path

from serve.config import Config, ModelSettings
from serve.core.model import ModelSource, ModelVersion
from serve.core.registry import ModelEntry, Registry
from serve.store.version_policy import VersionPolicy
from serve.store.watcher import StoreWatcher


def _with_version(registry: Registry, name: str, versions: dict[str, dict]) -> None:
    entry = ModelEntry(name)
    for version, model_config in versions.items():
        source = ModelSource("x.mar", registry.work_dir, {}, model_config, None)
        entry.versions[version] = ModelVersion(
            name, version, source, ModelSettings(), registry.config, registry.socket_dir
        )
        entry.default_version = version
    registry.models[name] = entry


def test_policy_precedence(tmp_path: Path) -> None:
    config = Config(
        version_policy="latest: 2", model_version_policies={"pinned": {"specific": [1]}}
    )
    registry = Registry(config, tmp_path)
    # The newest loaded version's model-config.yaml speaks for the model...
    newest_says_all = {"2": {"versionPolicy": "latest: 3"}, "10": {"versionPolicy": "all"}}
    _with_version(registry, "yaml", newest_says_all)
    # ...unless the server config names the model.
    _with_version(registry, "pinned", {"1": {"versionPolicy": "all"}})
    _with_version(registry, "bad", {"1": {"versionPolicy": "newest please"}})
    watcher = StoreWatcher(registry, tmp_path, 1.0)
    assert watcher.policy("yaml") == VersionPolicy("all")
    assert watcher.policy("pinned") == VersionPolicy("specific", specific=("1",))
    assert watcher.policy("bad") == VersionPolicy("latest", latest=2)  # logged and skipped
    assert watcher.policy("unknown") == VersionPolicy("latest", latest=2)


def test_per_model_policies_as_json_from_the_environment(tmp_path: Path) -> None:
    config = Config.load(env={"LANTERN_MODEL_VERSION_POLICIES": '{"m": "all"}'})
    watcher = StoreWatcher(Registry(config, tmp_path), tmp_path, 1.0)
    assert watcher.policy("m") == VersionPolicy("all")
    assert watcher.policy("other") == VersionPolicy("latest", latest=1)
