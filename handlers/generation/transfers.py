"""Moving a step's small tensors between the host and the model's device without stalls.

A GPU runs what the host queued ahead of it; every time the host waits for a result (an index
list copied in with ``.to(device)``, a value read with ``.item()`` or ``.tolist()``), the queue
drains and the next kernels start late. The engine's step therefore sends its host-built inputs
in one copy the host does not wait for (`to_device`), and brings the step's results back in one
wait (`to_host`): the only time the host waits on the device in a step. On the CPU both are
no-ops.
"""

from __future__ import annotations

import torch


def to_device(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """1-D host tensors of one dtype (index lists built from Python) on ``device``, in one copy
    that the host does not wait for."""
    if device.type == "cpu":
        return list(tensors)
    packed = torch.cat([t.reshape(-1) for t in tensors]).to(device, non_blocking=True)
    return list(packed.split([t.numel() for t in tensors]))


def to_host(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Device tensors on the host after one wait for the device (None stays None)."""
    devices = {t.device for t in tensors if t is not None and t.device.type != "cpu"}
    if not devices:
        return list(tensors)
    host = [
        t.to("cpu", non_blocking=t.device.type == "cuda") if t is not None else None
        for t in tensors
    ]
    for device in devices:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
    return host
