"""Lantern settings to Ray Serve deployment options: table tests, no Ray needed."""

from __future__ import annotations

from typing import Any

import pytest

from serve.config import ModelSettings
from serve.rayserve.command import serve_config
from serve.rayserve.plan import plan_deployment


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, {"num_replicas": 1}),
        ({"min_workers": 3, "max_workers": 3}, {"num_replicas": 3}),
        ({"min_workers": 0, "max_workers": 0}, {"num_replicas": 1}),
        (
            {"min_workers": 1, "max_workers": 4, "batch_size": 8},
            {
                "autoscaling_config": {
                    "min_replicas": 1,
                    "initial_replicas": 1,
                    "max_replicas": 4,
                    "target_ongoing_requests": 8.0,
                }
            },
        ),
        ({"min_workers": 5, "max_workers": 2}, {"num_replicas": 5}),
    ],
)
def test_replicas_from_workers(settings: dict[str, Any], expected: dict[str, Any]) -> None:
    options = plan_deployment("m", "1.0", ModelSettings(**settings)).options
    scaling = {k: options[k] for k in ("num_replicas", "autoscaling_config") if k in options}
    assert scaling == expected


@pytest.mark.parametrize(
    ("settings", "gpus"),
    [
        ({}, 0.0),
        ({"device_type": "cpu", "device_ids": [0]}, 0.0),
        ({"device_type": "gpu"}, 1.0),
        ({"device_ids": [1, 2]}, 1.0),
    ],
)
def test_gpus_from_device_settings(settings: dict[str, Any], gpus: float) -> None:
    options = plan_deployment("m", "1.0", ModelSettings(**settings)).options
    assert options["ray_actor_options"]["num_gpus"] == gpus


def test_batching_threads_and_names() -> None:
    plan = plan_deployment(
        "resnet",
        "2.0",
        ModelSettings(batch_size=8, max_batch_delay=25, num_threads=2, response_timeout=30),
        max_replicas_per_node=1,
    )
    assert (plan.name, plan.max_batch_size, plan.batch_wait_timeout_s) == (
        "model-resnet-2.0",
        8,
        0.025,
    )
    assert plan.options["ray_actor_options"]["num_cpus"] == 2.0
    assert plan.options["max_ongoing_requests"] == 16  # room for a batch to fill
    assert plan.options["max_replicas_per_node"] == 1
    assert plan.options["graceful_shutdown_timeout_s"] == 30.0


def test_serve_config_names_our_builder(tmp_path: Any) -> None:
    config = serve_config(str(tmp_path), ["all"], http_port=9000, max_replicas_per_node=1)
    (app,) = config["applications"]
    assert app["import_path"] == "serve.rayserve.app:build_app"
    assert app["args"] == {
        "model_store": str(tmp_path.resolve()),
        "models": ["all"],
        "max_replicas_per_node": 1,
    }
    assert config["http_options"] == {"host": "127.0.0.1", "port": 9000}


def test_the_core_server_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import serve.cli, serve.server, sys; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
