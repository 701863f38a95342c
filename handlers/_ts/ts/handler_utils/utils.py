"""``ts.handler_utils.utils``: streaming partial results and ``import_class``."""

from __future__ import annotations

import importlib
from typing import Any

from handlers.streaming import send_intermediate_predict_response

__all__ = ["import_class", "send_intermediate_predict_response"]


def import_class(class_name: str, module_prefix: str | None = None) -> Any:
    """``"pkg.mod.Class"`` (or ``"mod.Class"`` under ``module_prefix``) -> the class."""
    if not class_name:
        raise ImportError("class name is not defined")
    module_name, _, name = class_name.rpartition(".")
    if module_prefix:
        target = f"{module_prefix}.{module_name}" if module_name else module_prefix
    elif module_name:
        target = module_name
    else:
        raise ImportError("module name is not defined.")
    cls = getattr(importlib.import_module(target), name, None)
    if cls is None:
        raise ImportError(f"class:{name} not found in module:{module_name}.")
    return cls
