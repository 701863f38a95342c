"""TF Serving's way to say what to serve: ``models.config`` or ``--model_name/--model_base_path``.

``models.config`` is a ``ModelServerConfig`` in protobuf text format (TF Serving's own message,
``serve/grpc/gen/tensorflow_serving/config``)::

    model_config_list {
      config { name: "resnet" base_path: "/models/resnet" model_platform: "tensorflow"
               model_version_policy { latest { num_versions: 2 } }
               version_labels { key: "stable" value: 1 } }
    }

Each model's ``base_path`` is a versioned tree (``<base_path>/<version>/``, read by
``serve.store.layouts``); `ConfigWatcher` is the watched store (`StoreWatcher`: the same
completeness rule, version plans, swaps and unloads through the registry) with the config as the
list of models instead of the store's folders. It re-reads the file every
``model_config_file_poll_wait_seconds`` (0: once, as TF Serving); a file that no longer parses
is logged and the models stay as they are. Version labels are applied once the versions they name
are served. A version's warm-up records are replayed (``warmup``) before it becomes the default.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import text_format

from serve.core.version_labels import VersionLabels
from serve.grpc.gen.tensorflow_serving.config import model_server_config_pb2
from serve.store import savedmodel  # noqa: F401  (plugs SavedModels into the loader)
from serve.store.layouts import NotAModel, recognise
from serve.store.tfs_batching import PER_MODEL, BatchingError, BatchingSettings, read_batching
from serve.store.version_policy import VersionPolicy
from serve.store.watcher import Candidate, StoreWatcher, fingerprint
from serve.wire.errors import ServeError

if TYPE_CHECKING:
    from serve.core.model import ModelVersion
    from serve.core.registry import Registry

# Replays a loaded version's warm-up requests (serve/grpc/tfs_warmup.py); the count replayed.
Warmup = Callable[["ModelVersion", Path], Awaitable[int]]

logger = logging.getLogger(__name__)

CONFIG_NAME = "models.config"
# model_platform values TF Serving knows; Lantern serves what the version folders hold.
PLATFORMS = ("", "tensorflow", "onnx", "pytorch", "openvino")


class ModelsConfigError(ValueError):
    """A ``models.config`` that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class ConfiguredModel:
    name: str
    base_path: Path
    platform: str = ""
    policy: VersionPolicy = field(default_factory=VersionPolicy)
    labels: dict[str, str] = field(default_factory=dict)


def parse_models_config(text: str, where: str, relative_to: Path) -> list[ConfiguredModel]:
    """The models a ``models.config`` lists; relative ``base_path``s are taken from
    ``relative_to``."""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ModelsConfigError(f"{where}: not a ModelServerConfig: {exc}") from None
    kind = config.WhichOneof("config")
    if kind == "custom_model_config":
        raise ModelsConfigError(f"{where}: custom_model_config is not supported")
    models: list[ConfiguredModel] = []
    for entry in config.model_config_list.config:
        what = f"{where}: model {entry.name or '(unnamed)'}"
        if not entry.name or not entry.base_path:
            raise ModelsConfigError(f"{what}: every config needs a name and a base_path")
        if any(m.name == entry.name for m in models):
            raise ModelsConfigError(f"{what}: listed twice")
        if entry.model_platform not in PLATFORMS:
            raise ModelsConfigError(
                f"{what}: unknown model_platform {entry.model_platform!r}; one of "
                f"{', '.join(p for p in PLATFORMS if p)}"
            )
        base = Path(entry.base_path)
        models.append(
            ConfiguredModel(
                entry.name,
                base if base.is_absolute() else relative_to / base,
                entry.model_platform,
                _policy(entry.model_version_policy, what),
                {label: str(v) for label, v in entry.version_labels.items()},
            )
        )
    return models


def _policy(proto: object, what: str) -> VersionPolicy:
    choice = proto.WhichOneof("policy_choice")  # type: ignore[attr-defined]
    if choice is None:
        return VersionPolicy()
    if choice == "all":
        return VersionPolicy("all")
    if choice == "latest":
        count = proto.latest.num_versions or 1  # type: ignore[attr-defined]
        return VersionPolicy("latest", latest=count)
    versions = tuple(str(v) for v in proto.specific.versions)  # type: ignore[attr-defined]
    if not versions:
        raise ModelsConfigError(f"{what}: a specific version policy must list versions")
    return VersionPolicy("specific", specific=versions)


def read_models_config(path: Path) -> list[ConfiguredModel]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelsConfigError(f"{path}: cannot be read: {exc}") from None
    return parse_models_config(text, str(path), path.parent)


def single_model(name: str, base_path: str) -> list[ConfiguredModel]:
    """``--model_name``/``--model_base_path``: one model, its latest version."""
    return [ConfiguredModel(name, Path(base_path).resolve())]


class ConfigWatcher(StoreWatcher):
    """Serves the models a ``models.config`` (or a single-model start) lists."""

    def __init__(
        self,
        registry: Registry,
        labels: VersionLabels,
        *,
        config_file: Path | None,
        models: list[ConfiguredModel],
        interval: float,
        config_poll: float = 0.0,
        batching: BatchingSettings | None = None,
        warmup: Warmup | None = None,
    ) -> None:
        store = registry.config.model_store
        super().__init__(registry, Path(store) if store else Path.cwd(), interval)
        self.labels = labels
        self.config_file = config_file
        self.models = {m.name: m for m in models}
        self.config_poll = config_poll
        self._read_at = time.monotonic()
        self._stamp = self._file_stamp()
        self._label_warned: dict[str, str] = {}
        self.batching = batching or BatchingSettings()
        self.warmup = warmup

    def _file_stamp(self) -> tuple[float, int] | None:
        if self.config_file is None:
            return None
        try:
            stat = self.config_file.stat()
        except OSError:
            return None
        return stat.st_mtime, stat.st_size

    def reread(self) -> None:
        """Read the config file again when it changed; a broken one keeps the models as they are."""
        if self.config_file is None or self.config_poll <= 0:
            return
        now = time.monotonic()
        if now - self._read_at < self.config_poll:
            return
        self._read_at = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        try:
            models = read_models_config(self.config_file)
        except ModelsConfigError as exc:
            logger.error("Keeping the models served as they are: %s", exc)
            return
        self._stamp = stamp
        self.models = {m.name: m for m in models}
        logger.info("Read %s again: %d models", self.config_file, len(models))

    async def _load(self, cand: Candidate) -> None:
        """Load as the watched store does, then replay the version's warm-up records (TF
        Serving's ``assets.extra/tf_serving_warmup_requests``) before it can become the default;
        a version whose warm-up fails is unloaded and not tried again until its files change."""
        await super()._load(cand)
        if self.warmup is None or cand.version not in self.owned.get(cand.name, {}):
            return
        try:
            model = self.registry.get(cand.name, cand.version)
            await self.warmup(model, cand.path)
        except Exception as exc:
            message = getattr(exc, "message", None) or str(exc)
            self._fail(cand, f"warm-up failed: {message}")
            await self._unload(cand.name, cand.version)

    def settings_for(self, cand: Candidate) -> dict[str, Any] | None:
        """TF Serving's batching parameters: the version's ``assets.extra/batching_params.pbtxt``,
        else ``--batching_parameters_file``; what has no equivalent is said once per load."""
        chosen = self.batching
        own = cand.path / PER_MODEL
        if own.is_file():
            try:
                chosen = read_batching(own)
            except BatchingError as exc:
                logger.error("Model %s: ignoring %s", cand.name, exc)
        if chosen.not_honoured:
            logger.warning(
                "Model %s: Lantern does not honour the batching parameters %s",
                cand.name,
                ", ".join(chosen.not_honoured),
            )
        return dict(chosen.settings) or None

    def policy(self, name: str) -> VersionPolicy:
        model = self.models.get(name)
        return model.policy if model is not None else super().policy(name)

    def _url(self, path: Path) -> str:
        """What the registry resolves for ``path``: relative to the model store when inside it."""
        resolved = path.resolve()
        if resolved.is_relative_to(self.store) and resolved != self.store:
            return resolved.relative_to(self.store).as_posix()
        return str(resolved)

    def _candidates(self) -> list[Candidate]:
        found = []
        for model in self.models.values():
            try:
                layout = recognise(model.base_path)
            except (NotAModel, ValueError, OSError) as exc:
                logger.warning(
                    "Model %s: nothing to serve at %s (%s)", model.name, model.base_path, exc
                )
                continue
            if layout.kind != "versioned":
                logger.warning("Model %s: %s is not a versioned tree", model.name, model.base_path)
                continue
            for version, entry in layout.versions.items():
                folder = entry.path if entry.path.is_dir() else entry.path.parent
                found.append(
                    Candidate(
                        model.name, version, folder, self._url(model.base_path), fingerprint(folder)
                    )
                )
        return found

    async def scan_once(self) -> None:
        self.reread()
        candidates = await asyncio.to_thread(self._candidates)
        complete = self.stability.complete(candidates, time.monotonic())
        by_name: dict[str, dict[str, Candidate]] = {name: {} for name in self.models}
        for cand in complete:
            by_name.setdefault(cand.name, {})[cand.version] = cand
        for name in sorted(set(by_name) | set(self.owned)):
            try:
                await self.reconcile(name, by_name.get(name, {}) if name in self.models else {})
            except Exception:
                logger.exception("Updating model %s from %s failed", name, self.config_file)
        self._apply_labels()

    def _apply_labels(self) -> None:
        for model in self.models.values():
            if self.labels.of(model.name) == model.labels or model.name not in self.registry.models:
                continue
            try:
                self.labels.assign(self.registry, model.name, model.labels)
            except ServeError as exc:  # a label naming a version not served (yet)
                if self._label_warned.get(model.name) != exc.message:
                    self._label_warned[model.name] = exc.message
                    logger.warning(
                        "Model %s: version labels not applied: %s", model.name, exc.message
                    )
