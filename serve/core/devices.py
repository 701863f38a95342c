"""The GPUs workers can use, found without importing torch in the frontend."""

from __future__ import annotations

import os

_GPU_COUNT: int | None = None


def visible_gpus(cap: int | None = None) -> int:
    """GPUs visible to workers, found without importing torch in the frontend."""
    global _GPU_COUNT
    if _GPU_COUNT is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is not None:
            _GPU_COUNT = len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
        else:
            try:
                _GPU_COUNT = len(
                    [d for d in os.listdir("/dev") if d[:6] == "nvidia" and d[6:].isdigit()]
                )
            except OSError:
                _GPU_COUNT = 0
    return min(_GPU_COUNT, cap) if cap is not None else _GPU_COUNT
