"""The ``serve kserve`` command: the container command of Lantern's KServe ``ServingRuntime``."""

from __future__ import annotations

import logging
import os
from dataclasses import fields

import click

from serve.config import Config, ConfigError
from serve.kserve.pod import model_dir_from, plan_models, pod_overrides, port_from


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--model_name",
    "--model-name",
    "model_name",
    default=None,
    help="The InferenceService's name ({{.Name}}); names a single archive.",
)
@click.option(
    "--model_dir",
    "--model-dir",
    "model_dir",
    default=None,
    help="Where the storage initializer put the model (default $MODEL_DIR or /mnt/models).",
)
@click.option(
    "--http_port",
    "--http-port",
    "http_port",
    default=None,
    help="HTTP port for KServe v1, v2 and TorchServe routes (default $PORT or 8080).",
)
@click.option(
    "--grpc_port",
    "--grpc-port",
    "grpc_port",
    default=None,
    help="gRPC port (default $GRPC_PORT or 8081).",
)
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False), help="Lantern YAML config file."
)
@click.option("--pid-file", default=None, help="Where the server's pid and ports are kept.")
def kserve(
    model_name: str | None,
    model_dir: str | None,
    http_port: str | None,
    grpc_port: str | None,
    config_file: str | None,
    pid_file: str | None,
) -> None:
    """Serve /mnt/models as KServe's runtime container.

    The container command of deploy/kserve/servingruntime.yaml (docs/scale-out.md); it runs in the
    foreground.
    """
    from serve.cli.foreground import run_foreground
    from serve.cli.server_record import record_path

    env = dict(os.environ)
    try:
        plan = plan_models(model_dir_from(model_dir, env), model_name)
        overrides = pod_overrides(
            plan,
            env,
            http_port=port_from(http_port, 0, "--http_port") if http_port else None,
            grpc_port=port_from(grpc_port, 0, "--grpc_port") if grpc_port else None,
            known_settings=frozenset(f.name for f in fields(Config)),
        )
        config = Config.load(
            config_file=config_file, ts_config_file=plan.ts_config, overrides=overrides
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    logging.getLogger(__name__).info("KServe model folder read as the %s layout", plan.layout)
    click.echo(
        f"Lantern for KServe: {plan.layout} layout in {plan.model_store}; "
        f"HTTP {config.inference_address}, metrics {config.metrics_address}",
        err=True,
    )
    run_foreground(config, record_path(pid_file), restore=False)
