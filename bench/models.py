"""The benchmark's models, built in code, and the request body each one is driven with.

* ``tiny``: a 100→64→10 MLP in TorchScript behind the built-in ``base_handler``; the body is a
  ~1.2 KB JSON list of 100 floats. Its compute is microseconds, so it measures serving overhead.
* ``resnet18``: torchvision's ResNet-18 with random weights, traced, behind ``image_classifier``;
  the body is the bundled kitten JPEG. Compute-bound (tens of ms per image on one thread).
* ``efficientnet``: the pretrained EfficientNet-Lite0 example classifier
  (``examples/image_classifier/build.py``), same handler and image.

Each *variant* (workers, batch size, delay) is its own folder-format archive whose
``model-config.yaml`` carries those settings, so one server can hold them all side by side.
"""

from __future__ import annotations

import json
import random
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from archiver import build

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "examples" / "data"
TINY_FEATURES = 100


@dataclass(frozen=True)
class ModelSpec:
    """A benchmark model: how to build its serialized file and what to send it."""

    name: str
    handler: str
    body_file: str  # relative to the work folder, or absolute
    content_type: str
    extra_files: tuple[str, ...] = ()


MODELS: dict[str, ModelSpec] = {
    "tiny": ModelSpec("tiny", "base_handler", "tiny_body.json", "application/json"),
    "resnet18": ModelSpec(
        "resnet18",
        "image_classifier",
        str(DATA / "kitten.jpg"),
        "image/jpeg",
        (str(DATA / "index_to_name.json"),),
    ),
    "efficientnet": ModelSpec(
        "efficientnet",
        "image_classifier",
        str(DATA / "kitten.jpg"),
        "image/jpeg",
        (str(DATA / "index_to_name.json"),),
    ),
}


@dataclass(frozen=True)
class Variant:
    """How one copy of a model is served: workers, threads per worker, batching."""

    model: str
    workers: int
    threads: int
    batch_size: int = 1
    max_batch_delay: int = 0  # ms

    @property
    def name(self) -> str:
        tag = f"b{self.batch_size}d{self.max_batch_delay}" if self.batch_size > 1 else "b1"
        return f"{self.model}_w{self.workers}t{self.threads}_{tag}"

    @property
    def batching(self) -> str:
        if self.batch_size == 1:
            return "off"
        return f"{self.batch_size}/{self.max_batch_delay}ms"

    def model_config(self) -> dict[str, Any]:
        return {
            "minWorkers": self.workers,
            "maxWorkers": self.workers,
            "batchSize": self.batch_size,
            "maxBatchDelay": self.max_batch_delay,
            "numThreads": self.threads,
            "jobQueueSize": 1000,  # c=32 on 2 workers must never see a 429 from the benchmark
        }


def _torchscript(module: Any, example: Any, path: Path) -> Path:
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # TorchScript deprecation
        traced = torch.jit.trace(module.eval(), example, check_trace=False)
    traced.save(str(path))
    return path


def _tiny(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(TINY_FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    return _torchscript(mlp, torch.zeros(1, TINY_FEATURES), path)


def _resnet18(path: Path) -> Path:
    import torch
    import torchvision

    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None)
    return _torchscript(resnet, torch.zeros(1, 3, 224, 224), path)


def _efficientnet(path: Path) -> Path:
    import importlib.util

    script = REPO / "examples" / "image_classifier" / "build.py"
    spec = importlib.util.spec_from_file_location("_lantern_example_image_classifier", script)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.trace(example.pretrained_model(), path)


_BUILDERS = {"tiny": _tiny, "resnet18": _resnet18, "efficientnet": _efficientnet}


class ModelFactory:
    """Builds each model's TorchScript file once, then one archive folder per variant."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.store = work / "store"
        self.store.mkdir(parents=True, exist_ok=True)
        self._weights: dict[str, Path] = {}

    def body(self, model: str) -> tuple[Path, str]:
        """The request body file and its Content-Type."""
        spec = MODELS[model]
        path = Path(spec.body_file)
        if not path.is_absolute():
            path = self.work / path
            if not path.exists():
                rng = random.Random(0)
                values = [round(rng.uniform(-1, 1), 6) for _ in range(TINY_FEATURES)]
                path.write_text(json.dumps(values))
        return path, spec.content_type

    def weights(self, model: str) -> Path:
        if model not in self._weights:
            path = self.work / f"{model}.pt"
            if not path.exists():
                _BUILDERS[model](path)
            self._weights[model] = path
        return self._weights[model]

    def archive(self, variant: Variant) -> Path:
        """A folder-format archive of ``variant`` in the store (built once)."""
        target = self.store / variant.name
        if (target / "MAR-INF" / "MANIFEST.json").is_file():
            return target
        spec = MODELS[variant.model]
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "model-config.yaml"
            config.write_text(yaml.safe_dump(variant.model_config()))
            return build(
                model_name=variant.name,
                version="1.0",
                handler=spec.handler,
                serialized_file=str(self.weights(variant.model)),
                extra_files=list(spec.extra_files),
                export_path=str(self.store),
                archive_format="no-archive",
                force=True,
                config_file=str(config),
            )
