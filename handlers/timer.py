"""``@timed``: TorchServe's opt-in per-method latency metric (``ts.handler_utils.timer``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def _profiling_enabled(handler: Any) -> bool:
    context = getattr(handler, "context", None)
    config = getattr(context, "model_yaml_config", None) or {}
    handler_config = config.get("handler") if isinstance(config, dict) else None
    return isinstance(handler_config, dict) and bool(handler_config.get("profile"))


def timed(func: F) -> F:
    """Record ``ts_handler_<method>`` (gauge, ms) when model-config.yaml sets handler.profile."""

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _profiling_enabled(self):
            return func(self, *args, **kwargs)
        start = time.perf_counter()
        result = func(self, *args, **kwargs)
        device = getattr(self, "device", None)
        if getattr(device, "type", None) == "cuda":
            import torch

            # Kernels run asynchronously; wait for them so the time covers the work.
            torch.cuda.synchronize(device)
        elapsed_ms = (time.perf_counter() - start) * 1000
        self.context.metrics.add_metric(
            name=f"ts_handler_{func.__name__}", value=elapsed_ms, unit="ms", metric_type="gauge"
        )
        return result

    return cast(F, wrapper)  # functools.wraps: func's signature
