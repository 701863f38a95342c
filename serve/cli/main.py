"""``serve start | stop | status``: the command line, the only place that exits the process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from serve import __version__
from serve.cli import control, server_record, waiting
from serve.cli.control import CliError
from serve.cli.foreground import DETACHED_ENV, run_foreground
from serve.cli.startup_report import EXIT_USAGE
from serve.config import Config, ConfigError
from serve.http.server_choice import resolve_http_server

_PID_FILE_HELP = (
    "The server record: pid, addresses, folder. Default: $LANTERN_PID_FILE, else "
    "$XDG_RUNTIME_DIR/lantern/server.json, else ~/.lantern/server.json "
    f"(here: {server_record.default_path()})."
)


def _state_file(value: str | None) -> Path:
    return server_record.record_path(value)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lantern")
def main() -> None:
    """Lantern: serve TorchServe model archives over HTTP."""


@main.command(
    context_settings={"ignore_unknown_options": False},
    short_help="Start the server; returns once it is healthy.",
)
@click.option("--model-store", type=click.Path(file_okay=False), help="Folder of model archives.")
@click.option(
    "--workflow-store",
    type=click.Path(file_okay=False),
    help="Folder of workflow archives (.war); the model store if not given.",
)
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
    help="Neither restore nor write config snapshots. Default: write one after each change, "
    "and restore the newest at start when neither --config nor --ts-config is given.",
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
@click.option(
    "--log-dir", type=click.Path(file_okay=False), help="Folder for log files (default ./logs)."
)
@click.option(
    "--http-server",
    type=click.Choice(["auto", "hypercorn", "uvicorn"]),
    default=None,
    help="auto (default): uvicorn, or hypercorn when HTTP/2 is asked for.",
)
@click.option("--inference-address", default=None, help="e.g. http://127.0.0.1:8080")
@click.option("--management-address", default=None, help="e.g. http://127.0.0.1:8081")
@click.option("--metrics-address", default=None, help="e.g. http://127.0.0.1:8082")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=None,
    help="Log lines as text or one JSON object each (default text).",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default=None,
    help="Level of the server and model logs (default INFO).",
)
@click.option(
    "--watch",
    is_flag=True,
    default=None,
    help="Watch the model store: load new versions, swap and unload (docs/model-updates.md).",
)
@click.option(
    "--grpc-inference-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="gRPC inference port (grpc_inference_port; default 7070, 0: a free one).",
)
@click.option(
    "--grpc-management-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="gRPC management port (grpc_management_port; default 7071, 0: a free one).",
)
@click.option(
    "--model_config_file",
    "--model-config-file",
    "model_config_file",
    default=None,
    help="Serve the models of a TF Serving models.config (docs/migrating-from-tf-serving.md).",
)
@click.option(
    "--model_config_file_poll_wait_seconds",
    "--model-config-file-poll-wait-seconds",
    "model_config_file_poll_wait_seconds",
    type=float,
    default=None,
    help="Re-read --model_config_file this often (0: read once, TF Serving's default).",
)
@click.option(
    "--model_name", "--model-name", "model_name", default=None, help="TF Serving's single model."
)
@click.option(
    "--model_base_path",
    "--model-base-path",
    "model_base_path",
    default=None,
    help="The versioned tree (<base>/<version>/) of --model_name, its latest version served.",
)
@click.option(
    "--port",
    "tfs_grpc_port",
    type=int,
    default=None,
    help="TF Serving's --port: the gRPC inference port (grpc_inference_port).",
)
@click.option(
    "--rest_api_port",
    "--rest-api-port",
    "tfs_rest_port",
    type=int,
    default=None,
    help="TF Serving's --rest_api_port: the inference API's port, on its configured host.",
)
@click.option(
    "--batching_parameters_file",
    "--batching-parameters-file",
    "batching_parameters_file",
    default=None,
    help="TF Serving's BatchingParameters for the models of a TF Serving-style start.",
)
@click.option(
    "--model-control-mode",
    type=click.Choice(["none", "poll", "explicit"]),
    default=None,
    help="Triton's: none (the default), poll (= --watch), explicit (= --enable-model-api).",
)
@click.option(
    "--ovms-config",
    type=click.Path(dir_okay=False),
    default=None,
    help="OpenVINO Model Server's config.json: serve its model_config_list, follow its changes.",
)
@click.option("--no-grpc", "no_grpc", is_flag=True, help="Serve no gRPC (enable_grpc=false).")
@click.option("--foreground", is_flag=True, help="Stay attached; log to the console too.")
@click.option("--pid-file", default=None, help=_PID_FILE_HELP)
@click.option(
    "--wait",
    "wait_timeout",
    default=300.0,
    show_default=True,
    help="Seconds to wait for a healthy server before returning.",
)
def start(foreground: bool, pid_file: str | None, wait_timeout: float, **options: Any) -> None:
    """Start the server; returns once it is healthy unless --foreground.

    Exit codes: 0 healthy; 1 exited during startup or not healthy in time; 2 a bad option,
    setting or missing model store; 3 already running; 4 an address in use; 5 running, but a
    model did not load.
    """
    try:
        config = _load_config(options)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    control.check_model_store(config)
    state_file = _state_file(pid_file)
    control.refuse_if_running(state_file)
    try:
        choice = resolve_http_server(config)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    # TorchServe: the newest snapshot is restored only when no config file is given.
    restore = not (options["ncs"] or options["config_file"] or options["ts_config_file"])
    if foreground:  # the server logs its choice to the console
        run_foreground(config, state_file, restore=restore)
        return
    click.echo(choice.describe())
    _start_background(config, state_file, wait_timeout)


def _load_config(options: dict[str, Any]) -> Config:
    overrides: dict[str, Any] = {
        "model_store": options["model_store"],
        "workflow_store": options["workflow_store"],
        "log_dir": options["log_dir"],
        "http_server": options["http_server"],
        "inference_address": options["inference_address"],
        "management_address": options["management_address"],
        "metrics_address": options["metrics_address"],
        "log_format": options["log_format"],
        "log_level": options["log_level"],
        "disable_token_authorization": options["disable_token_auth"],
        "enable_model_api": options["enable_model_api"],
        "watch_model_store": options["watch"],
        # Lantern's flag, else TF Serving's --port
        "grpc_inference_port": options["grpc_inference_port"]
        if options["grpc_inference_port"] is not None
        else options["tfs_grpc_port"],
        "grpc_management_port": options["grpc_management_port"],
        "model_config_file": options["model_config_file"],
        "model_config_file_poll_wait_seconds": options["model_config_file_poll_wait_seconds"],
        "model_name": options["model_name"],
        "model_base_path": options["model_base_path"],
        "batching_parameters_file": options["batching_parameters_file"],
        "model_control_mode": options["model_control_mode"],
        "ovms_config": options["ovms_config"],
    }
    if options["tfs_rest_port"] is not None:  # TF Serving's flag: the port, Lantern's host
        base = options["inference_address"] or Config().inference_address
        scheme, _, rest = base.partition("://")
        host = rest.rsplit(":", 1)[0] if ":" in rest else rest
        overrides["inference_address"] = f"{scheme}://{host}:{options['tfs_rest_port']}"
    mode = options["model_control_mode"]
    if mode == "poll" and options["watch"] is None:
        overrides["watch_model_store"] = True
    if mode == "explicit" and options["enable_model_api"] is None:
        overrides["enable_model_api"] = True
    if options["models"]:
        overrides["load_models"] = list(options["models"])
    if options["ncs"]:
        overrides["snapshot"] = False
    if options["no_grpc"]:
        overrides["enable_grpc"] = False
    return Config.load(
        config_file=options["config_file"],
        ts_config_file=options["ts_config_file"],
        overrides=overrides,
    )


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
    state_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    state_file.unlink(missing_ok=True)
    console_log = log_dir / "console.log"
    offset = console_log.stat().st_size if console_log.exists() else 0
    with open(console_log, "ab") as console:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=console,
            start_new_session=True,
            env={**os.environ, DETACHED_ENV: "1"},
        )
    started = time.monotonic()
    deadline = started + wait_timeout
    line = waiting.StatusLine()  # which model it waits for, on a terminal only
    expected = waiting.expected_names(config.load_models)
    try:
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                line.clear()
                lines = control.startup_exit_lines(console_log, offset)
                raise CliError("\n".join(lines or ["Lantern exited during startup."]), code or 1)
            record = server_record.read(state_file)
            if record is not None and record.data.get("started"):
                line.clear()
                health = control.ping(record.addresses["inference"], control.ssl_context(record))
                lines = control.started_outcome(record, health, log_dir.resolve())
                click.echo("\n".join(lines))
                return
            if line.due():
                line.show(_waiting_line(record, expected, log_dir, time.monotonic() - started))
            time.sleep(0.2)
    finally:
        line.clear()
    raise CliError(
        f"Lantern (pid {proc.pid}) is not healthy after {wait_timeout:g} s; see {log_dir}."
    )


def _waiting_line(
    record: server_record.Record | None, expected: list[str], log_dir: Path, elapsed: float
) -> str:
    described = waiting.describe_all(record) if record is not None else {}
    pending = waiting.pending(expected, described, waiting.pip_lines(log_dir / "model_log.log"))
    width = shutil.get_terminal_size((100, 20)).columns - 1
    return waiting.status_line(pending, elapsed, width)


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


@main.command(short_help="Stop the server; in-flight requests finish first.")
@click.option("--pid-file", default=None, help=_PID_FILE_HELP)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for exit.")
def stop(pid_file: str | None, timeout: float) -> None:
    """Stop the server gracefully: in-flight requests finish first.

    Only a process whose start time and command line match the record is signalled. A stale
    record (the server is gone, or its pid now belongs to another program) is removed, exit 0.
    """
    control.stop(_state_file(pid_file), timeout)


@main.command(short_help="Models, health, workers, queues and memory of the server.")
@click.option("--pid-file", default=None, help=_PID_FILE_HELP)
def status(pid_file: str | None) -> None:
    """Show the server's addresses, and per model version: workers, health, queue and RSS."""
    control.status(_state_file(pid_file))


@main.command(short_help="Print the end of a log file; --list for the paths.")
@click.option("--pid-file", default=None, help=_PID_FILE_HELP)
@click.option(
    "--log-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Log folder. Default: the recorded server's, else ./logs.",
)
@click.option(
    "--file",
    "which",
    type=click.Choice(list(control.LOG_FILES)),
    default="lantern",
    show_default=True,
    help="lantern.log, model_log.log, access_log.log or console.log (a detached server's).",
)
@click.option("-n", "--lines", default=50, show_default=True, help="How many lines.")
@click.option("--list", "list_only", is_flag=True, help="Print the log files' paths only.")
def logs(
    pid_file: str | None, log_dir: str | None, which: str, lines: int, list_only: bool
) -> None:
    """Print the last lines of a log file of the server (follow one with: tail -F PATH)."""
    folder = control.log_folder(_state_file(pid_file), log_dir)
    if list_only:
        for name, file in control.LOG_FILES.items():
            click.echo(f"{name:<8} {folder / file}")
        return
    for line in control.tail(folder / control.LOG_FILES[which], lines):
        click.echo(line)


def _add_commands() -> None:
    from serve.cli.llm import llm
    from serve.kserve.command import kserve
    from serve.rayserve.command import ray_group

    main.add_command(llm)
    main.add_command(kserve)
    main.add_command(ray_group)


_add_commands()

if __name__ == "__main__":
    main()
