"""What ``serve start | stop | status | logs`` do around a server record; `serve.cli` wires them.

Every message here is one the user sees; each raises `CliError` with its exit code
(`serve.cli.startup_report`), so that `serve.cli` stays a thin layer of options.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from serve.cli import server_record
from serve.cli.server_record import Record, Status
from serve.cli.startup_report import (
    EXIT_ALREADY_RUNNING,
    EXIT_ERROR,
    EXIT_MODELS_FAILED,
    EXIT_USAGE,
    StartupReport,
    failure_lines,
    report_lines,
    store_lines,
)
from serve.config import Config
from serve.core.host import ProcessMemory, child_pids, process_memory

LOG_FILES = {
    "lantern": "lantern.log",
    "model": "model_log.log",
    "access": "access_log.log",
    "console": "console.log",
}


class CliError(click.ClickException):
    """``Error: <message>`` on stderr and the given exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        # click declares exit_code a ClassVar, yet reads it off the instance it catches.
        self.exit_code = exit_code  # type: ignore[misc]


# --- start -------------------------------------------------------------------------------------


def check_model_store(config: Config) -> None:
    """A model store that is named but missing is a usage error, before anything starts."""
    if config.model_store and not Path(config.model_store).is_dir():
        raise CliError(f"Model store {config.model_store} does not exist.", EXIT_USAGE)


def refuse_if_running(path: Path) -> None:
    """Stop a second start that would share this record with a running server."""
    record = server_record.read(path)
    if record is not None and record.status() is Status.RUNNING:
        raise CliError(
            f"Lantern is already running ({record.describe()}). "
            f"Stop it with 'serve stop --pid-file {path}', or start another server with its own "
            "--pid-file and addresses.",
            EXIT_ALREADY_RUNNING,
        )


def started_outcome(record: Record, health: int | None, log_dir: Path) -> list[str]:
    """The lines for a server that has finished loading; raises when it is not healthy."""
    report = StartupReport.from_dict(record.data.get("startup"))
    if health != 200:
        failed = failure_lines(report)
        count = len(report.failed)
        head = (
            f"Lantern (pid {record.pid}) is running, but "
            + (f"{count} model{'s' if count != 1 else ''} did not load:" if failed else "/ping is")
            + ("" if failed else " Unhealthy.")
        )
        tail = f"Logs: {log_dir / 'lantern.log'} and {log_dir / 'model_log.log'}."
        raise CliError("\n".join([head, *failed, *store_lines(report), tail]), EXIT_MODELS_FAILED)
    rows = list(record.addresses.items())
    if record.data.get("key_file"):
        rows.append(("tokens", record.data["key_file"]))
    rows += [("record", str(record.path)), ("logs", str(log_dir))]
    return [f"Lantern is running (pid {record.pid}).", *labelled(rows)] + report_lines(report)


def labelled(rows: list[tuple[str, str]]) -> list[str]:
    """``  name  value`` lines, the values in one column (after the longest name)."""
    width = max((len(name) for name, _ in rows), default=0)
    return [f"  {name:<{width}}  {value}" for name, value in rows]


def startup_exit_lines(console: Path, offset: int) -> list[str]:
    """What a server that exited during startup wrote: its ``Error:`` lines, else the tail."""
    try:
        with open(console, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    return [e[len("Error: ") :] for e in errors] if errors else lines[-15:]


# --- stop / status / logs ----------------------------------------------------------------------


def running_record(path: Path, command: str) -> Record:
    """The record of a running server; otherwise explain (and remove a stale record) and exit.

    ``serve stop`` with a stale record exits 0 (the server is gone, which is what was asked);
    ``serve status`` and ``serve logs`` exit 1.
    """
    record = server_record.read(path)
    if record is None:
        raise CliError(f"Lantern is not running (no server record at {path}).")
    state = record.status()
    if state is Status.RUNNING:
        return record
    if state is Status.EXITED:
        why = f"pid {record.pid} has exited"
    else:
        why = f"pid {record.pid} is now another program ({record.program()})"
    record.remove()
    line = f"Lantern is not running: {why}; removed the stale record {path}"
    if command == "stop":
        click.echo(line + (" without signalling it." if state is Status.OTHER else "."))
        raise SystemExit(0)
    raise CliError(line + ".")


def stop(path: Path, timeout: float) -> None:
    record = running_record(path, "stop")
    os.kill(record.pid, signal.SIGTERM)  # verified just now: start time and command line match
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if record.status() is not Status.RUNNING:
            click.echo(f"Lantern has stopped (pid {record.pid}).")
            return
        time.sleep(0.1)
    raise CliError(f"Lantern (pid {record.pid}) did not stop within {timeout:g} s.")


def status(path: Path) -> None:
    record = running_record(path, "status")
    addresses = record.addresses
    context = ssl_context(record)
    token = _token(record.data.get("key_file"), "management")
    health = ping(addresses["inference"], context)
    shown = "Healthy" if health == 200 else "Unhealthy"
    click.echo(f"Lantern pid {record.pid}  health: {shown}  folder: {record.cwd}")
    for line in labelled(list(addresses.items())):
        click.echo(line)
    mgmt = addresses["management"]
    models = get_json(f"{mgmt}/models?limit=1000", token, context).get("models", [])
    rows = [
        (
            "MODEL", "VERSION", "DEFAULT", "WORKERS", "READY", "BATCH", "QUEUED", "HEALTH",
            "RSS", "PSS", "USS",
        )
    ]  # fmt: skip
    serving: set[int] = set()  # worker pids: a spare that became a worker keeps "--spare"
    engines: list[str] = []
    for entry in models:
        name = entry["modelName"]
        default = get_json(f"{mgmt}/models/{name}", token, context)[0]["modelVersion"]
        for d in get_json(f"{mgmt}/models/{name}/all", token, context):
            workers = d["workers"]
            serving.update(int(w.get("pid") or -1) for w in workers)
            ready = sum(1 for w in workers if w["status"] == "READY")
            rows.append(
                (
                    name,
                    d["modelVersion"],
                    "*" if d["modelVersion"] == default else "",
                    str(len(workers)),
                    str(ready),
                    str(d["batchSize"]),
                    str(d["jobQueueStatus"]["pendingRequests"]),
                    model_health(len(workers), ready),
                    *memory_cells(workers),
                )
            )
            engines.extend(engine_line(name, d))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for line in engines:
        click.echo(line)
    own = process_memory(record.pid)  # read here: `serve status` runs on the server's machine
    click.echo(memory_line("frontend", [own] if own is not None else []))
    spares = [
        process_memory(p) for p in child_pids(record.pid) if p not in serving and _is_spare(p)
    ]
    idle = [m for m in spares if m is not None]
    click.echo(memory_line(f"spares ({len(idle)} idle)", idle))


def _is_spare(pid: int) -> bool:
    """Started as a warm spare (``python -m serve.worker --spare``); one that has become a
    worker keeps that command line, so the caller leaves the workers out first."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"--spare" in fh.read().split(b"\0")
    except OSError:
        return False


def memory_line(label: str, readings: list[ProcessMemory]) -> str:
    """``label  RSS ..MiB  PSS ..MiB  USS ..MiB`` summed over ``readings``; "-" for a measure
    some reading lacks."""
    cells = []
    for name in ("rss", "pss", "uss"):
        values = [getattr(m, name) for m in readings]
        known = [v for v in values if v is not None]
        shown = f"{sum(known) / 2**20:.0f}MiB" if len(known) == len(values) else "-"
        cells.append(f"{name.upper()} {shown}")
    return f"{label}  " + "  ".join(cells)


def memory_cells(workers: list[dict[str, Any]]) -> tuple[str, str, str]:
    """The workers' RSS, PSS and USS summed, in MiB; "-" for a measure some worker lacks (an
    older server, or no smaps_rollup). Summed RSS counts shared library pages once per worker;
    summed PSS is what they hold together; summed USS what stopping them all frees at least."""
    cells = []
    for field in ("memoryUsage", "memoryPss", "memoryUss"):
        values = [w.get(field) for w in workers]
        known = [int(v) for v in values if v is not None]
        if len(known) < len(values):
            cells.append("-")
        else:
            cells.append(f"{sum(known) / 2**20:.0f}MiB")
    return cells[0], cells[1], cells[2]


def engine_line(name: str, described: dict[str, Any]) -> list[str]:
    """One line for a version whose workers run many requests at once (describe's ``limits``):
    its kind (a generative engine, or ``asyncCommunication``), the first worker's limits, and the
    requests running over all its workers; nothing for a one-batch-at-a-time model."""
    workers = [w for w in described.get("workers", []) if w.get("limits")]
    if not workers:
        return []
    limits = dict(workers[0]["limits"])
    kind = "generative" if "max_running_sequences" in limits else "concurrent"
    shown = ", ".join(f"{key} {value}" for key, value in limits.items())
    running = sum(int(w.get("runningRequests") or 0) for w in workers)
    line = f"  {name} {described['modelVersion']}: {kind}; {shown}; running {running}"
    engines = [w["engine"] for w in workers if w.get("engine")]
    if engines:  # the engines' own counts, as their last report gave them
        waiting = sum(int(e.get("waiting") or 0) for e in engines)
        usage = max(float(e.get("kvCacheUsage") or 0.0) for e in engines)
        line += f"; waiting in engine {waiting}; KV cache {usage:.0%}"
    return [line]


def model_health(workers: int, ready: int) -> str:
    """One word per model version: every worker ready, some, none, or none asked for."""
    if workers == 0:
        return "no-workers"
    if ready == workers:
        return "healthy"
    return "degraded" if ready else "unhealthy"


def log_folder(path: Path, log_dir: str | None) -> Path:
    """``--log-dir`` if given, else the record's (running or not), else ``./logs``."""
    if log_dir:
        return Path(log_dir).resolve()
    record = server_record.read(path)
    if record is not None and record.data.get("log_dir"):
        return Path(record.data["log_dir"])
    return Path("logs").resolve()


def tail(file: Path, lines: int) -> list[str]:
    if not file.is_file():
        raise CliError(f"No log file {file}.")
    with open(file, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - max(lines, 1) * 2000))
        text = fh.read().decode(errors="replace")
    return text.splitlines()[-lines:] if lines > 0 else []


# --- HTTP to the running server ----------------------------------------------------------------


def ssl_context(record: Record | dict[str, Any] | None) -> ssl.SSLContext | None:
    """Trust exactly the certificate the server serves (it may be self-signed)."""
    data = record.data if isinstance(record, Record) else (record or {})
    cert = data.get("certificate_file")
    if not cert:
        return None
    context = ssl.create_default_context(cafile=cert)
    context.check_hostname = False  # the certificate is pinned; it may name another host
    return context


def ping(base: str, context: ssl.SSLContext | None = None) -> int | None:
    try:
        with urllib.request.urlopen(f"{base}/ping", timeout=2, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ssl.SSLError):
        return None


def _token(key_file: str | None, kind: str) -> str | None:
    if not key_file:
        return None
    try:
        return str(json.loads(Path(key_file).read_text())[kind]["key"])
    except (OSError, ValueError, KeyError):
        return None


def get_json(url: str, token: str | None, context: ssl.SSLContext | None = None) -> Any:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise CliError(f"{url}: HTTP {exc.code} {detail}") from None
