"""``lantern ray config|deploy``: a model store as a Ray Serve application on a running cluster.

``deploy`` sends the same declarative config that Ray's ``serve deploy`` sends, to the Ray
dashboard's REST API, and waits until the application runs; ``config`` prints it as YAML for
``serve deploy`` or for keeping in git. Neither imports Ray: the cluster runs the builder.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import yaml

from serve.rayserve import dashboard

IMPORT_PATH = "serve.rayserve.app:build_app"
APP_NAME = "lantern"


def serve_config(
    model_store: str,
    models: list[str],
    *,
    http_host: str = "127.0.0.1",
    http_port: int = 8000,
    max_replicas_per_node: int | None = None,
    config_file: str | None = None,
    ts_config_file: str | None = None,
    dashboard_address: str | None = None,
) -> dict[str, Any]:
    """Ray Serve's declarative config (``ServeDeploySchema``) for one Lantern application."""
    args: dict[str, Any] = {"model_store": str(Path(model_store).resolve()), "models": models}
    if max_replicas_per_node:
        args["max_replicas_per_node"] = max_replicas_per_node
    if config_file:
        args["config"] = str(Path(config_file).resolve())
    if ts_config_file:
        args["ts_config"] = str(Path(ts_config_file).resolve())
    if dashboard_address:  # where the ingress applies PUT /models/{m}?min_worker=N
        args["dashboard_address"] = dashboard_address
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": http_host, "port": http_port},
        "applications": [
            {"name": APP_NAME, "route_prefix": "/", "import_path": IMPORT_PATH, "args": args}
        ],
    }


@click.group(name="ray")
def ray_group() -> None:
    """Serve a model store on a Ray cluster.

    Needs Ray: pip install 'lantern-serve[ray]' (docs/scale-out.md).
    """


def _options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--model-store", required=True, help="Folder of archives, on every node."),
            click.option("--models", default="all", show_default=True, help="As serve start."),
            click.option("--http-host", default="127.0.0.1", show_default=True),
            click.option("--http-port", default=8000, show_default=True, type=int),
            click.option(
                "--max-replicas-per-node", type=int, default=None, help="Spread replicas."
            ),
            click.option("--config", "config_file", default=None, help="Lantern YAML config."),
            click.option("--ts-config", "ts_config_file", default=None, help="config.properties."),
        ]
    ):
        fn = option(fn)
    return fn


def _config(options: dict[str, Any]) -> dict[str, Any]:
    models = [m for m in options.pop("models").replace(",", " ").split() if m]
    return serve_config(options.pop("model_store"), models, **options)


@ray_group.command("config")
@_options
def config_command(**options: Any) -> None:
    """Print the Ray Serve config (for `serve deploy` from Ray's own CLI)."""
    click.echo(yaml.safe_dump(_config(options), sort_keys=False), nl=False)


@ray_group.command("deploy")
@_options
@click.option(
    "--address",
    default="http://127.0.0.1:8265",
    show_default=True,
    help="The Ray dashboard's address (as RAY_DASHBOARD_ADDRESS for `serve deploy`).",
)
@click.option("--wait", "wait_timeout", default=300.0, show_default=True, help="Seconds to wait.")
def deploy_command(address: str, wait_timeout: float, **options: Any) -> None:
    """Deploy the model store to a running Ray cluster and wait until it serves."""
    config = _config({**options, "dashboard_address": address})
    base = address.rstrip("/")
    _request("PUT", f"{base}/api/serve/applications/", config)
    deadline = time.monotonic() + wait_timeout
    status, message = "NOT_STARTED", ""
    while time.monotonic() < deadline:
        apps = (_request("GET", f"{base}/api/serve/applications/") or {}).get("applications", {})
        app = apps.get(APP_NAME) or {}
        status, message = app.get("status", "NOT_STARTED"), app.get("message", "")
        if status == "RUNNING":
            http = config["http_options"]
            click.echo(f"Lantern is running on Ray: http://{http['host']}:{http['port']}")
            return
        if status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise click.ClickException(f"Ray Serve reports {status}: {message}")
        time.sleep(1.0)
    raise click.ClickException(f"Not running after {wait_timeout:g} s ({status}): {message}")


def _request(method: str, url: str, body: Any = None) -> Any:
    try:
        return dashboard.call(method, url, body)
    except dashboard.DashboardError as exc:
        if exc.status is None:
            raise click.ClickException(
                f"Cannot reach the Ray dashboard at {url}: {exc.detail}"
            ) from None
        raise click.ClickException(
            f"{method} {url}: HTTP {exc.status} {exc.detail[:2000]}"
        ) from None
