"""``serve start | stop | status``: the command line, the only place that exits the process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from serve import __version__
from serve.config import Config, ConfigError

_DETACHED_ENV = "_LANTERN_DETACHED"
DEFAULT_STATE_FILE = Path(tempfile.gettempdir()) / ".lantern" / "server.json"


def _state_file(value: str | None) -> Path:
    return Path(value or os.environ.get("LANTERN_PID_FILE") or DEFAULT_STATE_FILE).resolve()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lantern")
def main() -> None:
    """Lantern: serve TorchServe model archives over HTTP."""


@main.command(context_settings={"ignore_unknown_options": False})
@click.option("--model-store", type=click.Path(file_okay=False), help="Folder of model archives.")
@click.option(
    "--models",
    multiple=True,
    help="Models to load: name=file.mar, file.mar, or 'all' (repeatable, comma-separated).",
)
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False), help="Lantern YAML config file."
)
@click.option(
    "--ts-config",
    "ts_config_file",
    type=click.Path(dir_okay=False),
    help="TorchServe config.properties (the keys that apply).",
)
@click.option(
    "--ncs",
    "--no-config-snapshots",
    "ncs",
    is_flag=True,
    help="Neither restore nor write config snapshots.",
)
@click.option(
    "--disable-token-auth",
    "--dt",
    "disable_token_auth",
    is_flag=True,
    default=None,
    help="Serve without bearer tokens.",
)
@click.option(
    "--enable-model-api",
    is_flag=True,
    default=None,
    help="Allow registering and unregistering models over the management API.",
)
@click.option("--log-dir", type=click.Path(file_okay=False), help="Folder for log files.")
@click.option("--http-server", type=click.Choice(["hypercorn", "uvicorn"]), default=None)
@click.option("--inference-address", default=None, help="e.g. http://127.0.0.1:8080")
@click.option("--management-address", default=None, help="e.g. http://127.0.0.1:8081")
@click.option("--metrics-address", default=None, help="e.g. http://127.0.0.1:8082")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default=None,
    help="Level of the server and model logs (default INFO).",
)
@click.option("--foreground", is_flag=True, help="Stay attached; log to the console too.")
@click.option("--pid-file", default=None, help="Where the running server's pid and ports are kept.")
@click.option(
    "--wait",
    "wait_timeout",
    default=300.0,
    show_default=True,
    help="Seconds to wait for a healthy server before returning.",
)
def start(foreground: bool, pid_file: str | None, wait_timeout: float, **options: Any) -> None:
    """Start the server; returns once it is healthy unless --foreground."""
    try:
        config = _load_config(options)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    state_file = _state_file(pid_file)
    running = _read_state(state_file)
    if running and _alive(running["pid"]):
        raise click.ClickException(
            f"Lantern is already running (pid {running['pid']}); run 'serve stop' first."
        )
    if foreground:
        _run_foreground(config, state_file, restore=not options["ncs"])
        return
    _start_background(config, state_file, wait_timeout)


def _load_config(options: dict[str, Any]) -> Config:
    overrides: dict[str, Any] = {
        "model_store": options["model_store"],
        "log_dir": options["log_dir"],
        "http_server": options["http_server"],
        "inference_address": options["inference_address"],
        "management_address": options["management_address"],
        "metrics_address": options["metrics_address"],
        "log_format": options["log_format"],
        "log_level": options["log_level"],
        "disable_token_authorization": options["disable_token_auth"],
        "enable_model_api": options["enable_model_api"],
    }
    if options["models"]:
        overrides["load_models"] = list(options["models"])
    if options["ncs"]:
        overrides["snapshot"] = False
    return Config.load(
        config_file=options["config_file"],
        ts_config_file=options["ts_config_file"],
        overrides=overrides,
    )


def _run_foreground(config: Config, state_file: Path, *, restore: bool) -> None:
    from serve.logs import setup_logging
    from serve.server import Server

    setup_logging(
        config.log_dir,
        level=config.log_level,
        fmt=config.log_format,
        # A detached server's console is console.log, beside the log files: log only once.
        console=os.environ.get(_DETACHED_ENV) != "1",
        access_log=config.access_log,
    )

    async def run() -> None:
        server = Server(config, state_file=state_file, restore_snapshot=restore)
        await server.serve()

    try:
        _event_loop_runner()(run())
    except OSError as exc:  # e.g. address already in use
        raise click.ClickException(str(exc)) from exc


def _event_loop_runner() -> Any:
    """uvloop's runner when it is installed (the uvicorn extra brings it), else asyncio's."""
    if os.environ.get("LANTERN_EVENT_LOOP", "auto") != "asyncio":
        try:
            import uvloop

            return uvloop.run
        except (ImportError, AttributeError):
            pass
    return asyncio.run


def _start_background(config: Config, state_file: Path, wait_timeout: float) -> None:
    log_dir = Path(config.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    args = [a for a in sys.argv[2:] if a != "--foreground"]
    cmd = [
        sys.executable,
        "-m",
        "serve.cli",
        "start",
        "--foreground",
        "--pid-file",
        str(state_file),
        *_strip_pid_file(args),
    ]
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.unlink(missing_ok=True)
    with open(log_dir / "console.log", "ab") as console:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=console,
            start_new_session=True,
            env={**os.environ, _DETACHED_ENV: "1"},
        )
    deadline = time.monotonic() + wait_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (log_dir / "console.log").read_text(errors="replace").splitlines()[-15:]
            raise click.ClickException("Lantern exited during startup:\n" + "\n".join(tail))
        state = _read_state(state_file)
        health = _ping(state["addresses"]["inference"]) if state else None
        if state and state.get("started") and health != 200:
            raise click.ClickException(
                f"Lantern (pid {proc.pid}) is running, but not every model loaded (/ping is "
                f"Unhealthy); see {log_dir / 'lantern.log'} and {log_dir / 'model_log.log'}."
            )
        if state and health == 200:
            click.echo(f"Lantern is running (pid {proc.pid}).")
            for name, address in state["addresses"].items():
                click.echo(f"  {name:<10} {address}")
            if state.get("key_file"):
                click.echo(f"  tokens     {state['key_file']}")
            return
        time.sleep(0.2)
    raise click.ClickException(
        f"Lantern (pid {proc.pid}) is not healthy after {wait_timeout:g} s; see {log_dir}."
    )


def _strip_pid_file(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--pid-file":
            skip = True
            continue
        if arg.startswith("--pid-file="):
            continue
        out.append(arg)
    return out


@main.command()
@click.option("--pid-file", default=None)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for exit.")
def stop(pid_file: str | None, timeout: float) -> None:
    """Stop the server gracefully: in-flight requests finish first."""
    state = _read_state(_state_file(pid_file))
    if not state or not _alive(state["pid"]):
        raise click.ClickException("Lantern is not running.")
    pid = state["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            click.echo("Lantern has stopped.")
            return
        time.sleep(0.1)
    raise click.ClickException(f"Lantern (pid {pid}) did not stop within {timeout:g} s.")


@main.command()
@click.option("--pid-file", default=None)
def status(pid_file: str | None) -> None:
    """Show the models, versions, workers and queues of the running server."""
    state = _read_state(_state_file(pid_file))
    if not state or not _alive(state["pid"]):
        raise click.ClickException("Lantern is not running.")
    mgmt = state["addresses"]["management"]
    token = _token(state.get("key_file"), "management")
    health = _ping(state["addresses"]["inference"])
    click.echo(f"Lantern pid {state['pid']}  health: {'Healthy' if health == 200 else 'Unhealthy'}")
    models = _get_json(f"{mgmt}/models?limit=100", token).get("models", [])
    rows = [("MODEL", "VERSION", "DEFAULT", "WORKERS", "READY", "BATCH", "QUEUED")]
    for entry in models:
        name = entry["modelName"]
        default = _get_json(f"{mgmt}/models/{name}", token)[0]["modelVersion"]
        for d in _get_json(f"{mgmt}/models/{name}/all", token):
            ready = sum(1 for w in d["workers"] if w["status"] == "READY")
            rows.append(
                (
                    name,
                    d["modelVersion"],
                    "*" if d["modelVersion"] == default else "",
                    str(len(d["workers"])),
                    str(ready),
                    str(d["batchSize"]),
                    str(d["jobQueueStatus"]["pendingRequests"]),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process its parent has not reaped yet is a zombie: gone for us
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _ping(base: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{base}/ping", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _token(key_file: str | None, kind: str) -> str | None:
    if not key_file:
        return None
    try:
        return json.loads(Path(key_file).read_text())[kind]["key"]
    except (OSError, ValueError, KeyError):
        return None


def _get_json(url: str, token: str | None) -> Any:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise click.ClickException(f"{url}: HTTP {exc.code} {detail}") from None


def _add_commands() -> None:
    from serve.kserve_command import kserve
    from serve.rayserve.command import ray_group

    main.add_command(kserve)
    main.add_command(ray_group)


_add_commands()

if __name__ == "__main__":
    main()
