"""From a model's Lantern settings to Ray Serve deployment options: a pure function, no Ray.

- workers: ``minWorkers == maxWorkers`` gives that many replicas; otherwise Ray's autoscaler
  moves between them (``autoscaling_config``), starting at ``minWorkers``;
- batching: ``batchSize`` and ``maxBatchDelay`` become ``@serve.batch``'s ``max_batch_size`` and
  ``batch_wait_timeout_s``;
- devices: ``deviceType: gpu`` (or device ids) asks Ray for one GPU per replica, otherwise none;
- threads: each replica reserves the CPUs its intra-op threads use (``num_threads``, default 1);
- ``max_ongoing_requests`` lets a replica hold a few batches, so that batches can fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve.config import ModelSettings


@dataclass(frozen=True)
class DeploymentPlan:
    """Ray Serve options for one model version's deployment."""

    name: str
    options: dict[str, Any]
    max_batch_size: int
    batch_wait_timeout_s: float


def deployment_name(model: str, version: str) -> str:
    return f"model-{model}-{version}".replace("/", "-")


def replica_options(low: int, high: int, target_ongoing: float | None = None) -> dict[str, Any]:
    """``low`` replicas when ``low == high``, else Ray's autoscaler between them."""
    if low == high:
        return {"num_replicas": low}
    config: dict[str, Any] = {"min_replicas": low, "initial_replicas": low, "max_replicas": high}
    if target_ongoing:
        config["target_ongoing_requests"] = target_ongoing
    return {"autoscaling_config": config}


def plan_deployment(
    model: str, version: str, settings: ModelSettings, *, max_replicas_per_node: int | None = None
) -> DeploymentPlan:
    """The deployment options for ``settings``, as the module docstring maps them."""
    low = max(1, settings.min_workers or 1)
    high = max(low, settings.max_workers or low)
    gpu = (settings.device_type or "").lower() == "gpu" or (
        settings.device_type is None and bool(settings.device_ids)
    )
    threads = settings.num_threads or 1
    options: dict[str, Any] = {
        "name": deployment_name(model, version),
        "ray_actor_options": {"num_cpus": float(threads), "num_gpus": 1.0 if gpu else 0.0},
        "max_ongoing_requests": max(2 * settings.batch_size, 4),
        "graceful_shutdown_timeout_s": float(settings.response_timeout),
    }
    options.update(replica_options(low, high, float(settings.batch_size)))
    if max_replicas_per_node:
        options["max_replicas_per_node"] = max_replicas_per_node
    return DeploymentPlan(
        options["name"],
        options,
        settings.batch_size,
        settings.max_batch_delay / 1000.0,
    )
