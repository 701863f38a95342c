"""``ts.utils.util``: the helpers TorchServe handlers import from it."""

from __future__ import annotations

import enum
import functools
import logging
import re
import warnings
from collections.abc import Callable
from typing import Any

import yaml

from handlers.exceptions import PredictionException
from handlers.labels import load_label_mapping, map_class_to_label
from handlers.modules import list_classes_from_module

__all__ = [
    "CLEANUP_REGEX",
    "PT2Backend",
    "PredictionException",
    "check_valid_pt2_backend",
    "deprecated",
    "get_yaml_config",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
]

logger = logging.getLogger(__name__)

# HTML tags and entities, as TorchServe's text handlers strip them.
CLEANUP_REGEX = re.compile("<.*?>|&([a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")


class PT2Backend(str, enum.Enum):
    """``torch.compile`` backends TorchServe accepts in model-config.yaml."""

    EAGER = "eager"
    AOT_EAGER = "aot_eager"
    INDUCTOR = "inductor"
    NVFUSER = "nvfuser"
    AOT_NVFUSER = "aot_nvfuser"
    AOT_CUDAGRAPHS = "aot_cudagraphs"
    OFI = "ofi"
    FX2TRT = "fx2trt"
    ONNXRT = "onnxrt"
    IPEX = "ipex"
    TORCHXLA_TRACE_ONCE = "torchxla_trace_once"
    OPENVINO = "openvino"
    TENSORRT = "tensorrt"


def check_valid_pt2_backend(backend: str) -> bool:
    if backend in {member.value for member in PT2Backend}:
        return True
    logger.warning("%s is not a supported backend", backend)
    return False


def get_yaml_config(yaml_file_path: str) -> dict:
    """``yaml.safe_load`` of a file."""
    with open(yaml_file_path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def deprecated(
    version: str, replacement: str = "", klass: type[Warning] = PendingDeprecationWarning
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator that warns that the function is deprecated."""

    def deprecator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(
                f"{func.__name__} is deprecated in {version} and moved to {replacement}",
                klass,
                stacklevel=2,
            )
            return func(*args, **kwargs)

        return wrapper

    return deprecator
