"""The traps of issue 13, as a user meets them through `serve start | stop | status | logs`.

Each test runs the real CLI (detached servers on free loopback ports, records given with
--pid-file) and asserts the exact lines the user sees.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serve.cli import server_record
from tests.support.server import build_archive, echo_archive, pid_alive

PORTS = [
    "--inference-address",
    "http://127.0.0.1:0",
    "--management-address",
    "http://127.0.0.1:0",
    "--metrics-address",
    "http://127.0.0.1:0",
]


def serve(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serve.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


class Folder:
    """A folder a user starts servers in: its store, record and logs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "store"
        self.store.mkdir(parents=True, exist_ok=True)
        self.record = root / "server.json"
        self.started: list[Path] = []

    def start(self, *args: str, ports: list[str] = PORTS) -> subprocess.CompletedProcess[str]:
        result = serve(
            "start",
            "--model-store",
            str(self.store),
            "--pid-file",
            str(self.record),
            "--disable-token-auth",
            *ports,
            *args,
            cwd=self.root,
        )
        self.started.append(self.record)
        return result

    def stop(self) -> subprocess.CompletedProcess[str]:
        return serve("stop", "--pid-file", str(self.record), cwd=self.root)

    def info(self) -> dict:
        return json.loads(self.record.read_text())

    def snapshots(self) -> list[Path]:
        return sorted((self.root / "logs" / "config").glob("*-snapshot.json"))


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Folder]:
    f = Folder(tmp_path / "a")
    yield f
    if f.record.exists():
        f.stop()


def models_of(info: dict) -> list[str]:
    listed = httpx.get(f"{info['addresses']['management']}/models", timeout=10).json()
    return sorted(m["modelName"] for m in listed["models"])


def addresses_text(info: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in info["addresses"].items())


# --- 1. the server record ----------------------------------------------------------------------


def test_two_servers_in_two_folders_each_with_its_record(tmp_path: Path) -> None:
    a, b = Folder(tmp_path / "a"), Folder(tmp_path / "b")
    try:
        assert a.start().returncode == 0
        assert b.start().returncode == 0
        info_a, info_b = a.info(), b.info()
        assert info_a["cwd"] == str(a.root) and info_b["cwd"] == str(b.root)

        again = a.start()
        assert again.returncode == 3
        assert again.stderr.splitlines() == [
            f"Error: Lantern is already running (pid {info_a['pid']}, started in {a.root}: "
            f"{addresses_text(info_a)}). Stop it with 'serve stop --pid-file {a.record}', or "
            "start another server with its own --pid-file and addresses."
        ]

        stopped = b.stop()
        assert stopped.returncode == 0
        assert stopped.stdout.splitlines() == [f"Lantern has stopped (pid {info_b['pid']})."]
        assert not pid_alive(info_b["pid"]) and pid_alive(info_a["pid"])
        assert not b.record.exists() and a.record.exists()
    finally:
        for f in (a, b):
            if f.record.exists():
                f.stop()


def test_stop_with_a_stale_record_removes_it(folder: Folder) -> None:
    assert folder.start().returncode == 0
    info = folder.info()
    # The server dies without removing its record (SIGKILL): the record is stale.
    os.killpg(info["pid"], 9)  # its workers follow it (PR_SET_PDEATHSIG)
    _wait_gone(info["pid"])
    stopped = folder.stop()
    assert stopped.returncode == 0
    assert stopped.stdout.splitlines() == [
        f"Lantern is not running: pid {info['pid']} has exited; "
        f"removed the stale record {folder.record}."
    ]
    assert stopped.stderr == ""
    assert not folder.record.exists()
    # Nothing left to stop: one line, exit 1 (there was no record to act on).
    again = folder.stop()
    assert again.returncode == 1
    assert again.stderr.splitlines() == [
        f"Error: Lantern is not running (no server record at {folder.record})."
    ]


@pytest.mark.parametrize("identity", ["recorded", "none"])
def test_a_record_naming_another_program_is_never_signalled(folder: Folder, identity: str) -> None:
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        # A record like the one a Lantern server wrote, whose pid is now `sleep` (the pid was
        # reused); and, as older versions wrote, a record with no identity at all.
        data: dict = {"pid": sleeper.pid, "addresses": {}, "cwd": str(folder.root)}
        if identity == "recorded":
            data["identity"] = {"start_time": "1", "cmdline": [sys.executable, "-m", "serve.cli"]}
        folder.record.write_text(json.dumps(data))
        stopped = folder.stop()
        assert stopped.returncode == 0
        assert stopped.stdout.splitlines() == [
            f"Lantern is not running: pid {sleeper.pid} is now another program (sleep 600); "
            f"removed the stale record {folder.record} without signalling it."
        ]
        # stop returned only after deciding; had it signalled, SIGTERM kills sleep at once.
        assert sleeper.poll() is None
        assert not folder.record.exists()

        # A stale record does not block a start; the new server writes its own record.
        folder.record.write_text(json.dumps(data))
        assert folder.start().returncode == 0
        assert folder.info()["pid"] != sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_default_record_is_per_user(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path / "home")}
    assert server_record.default_path(env) == runtime / "lantern" / "server.json"
    no_runtime = {"HOME": str(tmp_path / "home")}
    assert server_record.default_path(no_runtime) == tmp_path / "home" / ".lantern" / "server.json"
    assert server_record.record_path(None, {**env, "LANTERN_PID_FILE": "x.json"}) == (
        Path("x.json").resolve()
    )
    # `serve stop` with no --pid-file reads the per-user default.
    result = serve("stop", cwd=tmp_path, env={**env, "LANTERN_PID_FILE": ""})
    default = runtime / "lantern" / "server.json"
    assert result.stderr.splitlines() == [
        f"Error: Lantern is not running (no server record at {default})."
    ]


# --- 2. snapshots ------------------------------------------------------------------------------


@pytest.fixture
def snapshot_folder(folder: Folder) -> Folder:
    """A folder whose newest snapshot holds the model `echo`."""
    echo_archive(folder.store, "echo")
    echo_archive(folder.store, "other")
    first = folder.start("--models", "echo=echo.mar")
    assert first.returncode == 0, first.stderr
    assert not any(line.startswith("Restored") for line in first.stdout.splitlines())
    assert folder.stop().returncode == 0
    assert len(folder.snapshots()) == 1
    return folder


def test_models_on_the_command_line_win_over_a_snapshot_which_is_named(
    snapshot_folder: Folder,
) -> None:
    f = snapshot_folder
    snapshot = f.snapshots()[-1]
    result = f.start("--models", "other=other.mar")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        f"Not restored: snapshot {snapshot}; --models names the models to load "
        "(a start without --models restores the newest snapshot)."
    )
    assert models_of(f.info()) == ["other"]
    # That start wrote its own snapshot: a start without --models brings `other` back.
    assert f.stop().returncode == 0
    newest = f.snapshots()[-1]
    assert newest != snapshot
    again = f.start()
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == f"Restored snapshot {newest}: other 1.0."
    assert models_of(f.info()) == ["other"]


def test_ts_config_with_a_snapshot_present_is_not_overridden(snapshot_folder: Folder) -> None:
    f = snapshot_folder
    props = f.root / "config.properties"
    props.write_text("load_models=other.mar\n")
    result = f.start("--ts-config", str(props))
    assert result.returncode == 0, result.stderr
    assert not any(line.startswith(("Restored", "Warning")) for line in result.stdout.splitlines())
    assert models_of(f.info()) == ["other"]


def test_ncs_ignores_the_snapshot(snapshot_folder: Folder) -> None:
    f = snapshot_folder
    result = f.start("--ncs", "--models", "other=other.mar")
    assert result.returncode == 0, result.stderr
    assert models_of(f.info()) == ["other"]
    assert len(f.snapshots()) == 1  # and writes none


def test_a_missing_store_with_a_snapshot_present_starts_nothing(snapshot_folder: Folder) -> None:
    f = snapshot_folder
    before = f.snapshots()
    missing = f.root / "moved-away"
    result = serve(
        "start", "--model-store", str(missing), "--pid-file", str(f.record), *PORTS, cwd=f.root
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"Error: Model store {missing} does not exist."]
    assert not f.record.exists() and f.snapshots() == before


def test_a_failed_restore_says_why_and_writes_no_snapshot(snapshot_folder: Folder) -> None:
    f = snapshot_folder
    (f.store / "echo.mar").unlink()  # the archive the snapshot names is gone
    before = f.snapshots()
    result = f.start()
    assert result.returncode == 5
    info = f.info()
    assert result.stderr.splitlines() == [
        f"Error: Lantern (pid {info['pid']}) is running, but 1 model did not load:",
        f"  echo 1.0: Model archive not found in the model store {f.store}: echo.mar",
        f"Logs: {f.root / 'logs' / 'lantern.log'} and {f.root / 'logs' / 'model_log.log'}.",
    ]
    assert f.snapshots() == before  # the good snapshot is still the newest
    assert f.stop().returncode == 0
    echo_archive(f.store, "echo")  # put it back: the next start restores the model again
    again = f.start()
    assert again.returncode == 0, again.stderr
    assert models_of(f.info()) == ["echo"]


# --- 3. failures told on the command line ------------------------------------------------------


def test_a_missing_model_store_is_a_usage_error(folder: Folder) -> None:
    missing = folder.root / "no-such-store"
    result = serve(
        "start", "--model-store", str(missing), "--pid-file", str(folder.record), cwd=folder.root
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"Error: Model store {missing} does not exist."]
    assert not folder.record.exists()


def test_a_busy_address_is_named(folder: Folder) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        ports = list(PORTS)
        ports[1] = f"http://127.0.0.1:{port}"
        result = folder.start(ports=ports)
        assert result.returncode == 4
        assert result.stderr.splitlines() == [
            f"Error: Cannot listen on inference address http://127.0.0.1:{port}: "
            "Address already in use"
        ]
        assert not folder.record.exists()
        # Attached, the same line and code.
        attached = folder.start("--foreground", ports=ports)
        assert attached.returncode == 4
        assert attached.stderr.splitlines()[-1] == (
            f"Error: Cannot listen on inference address http://127.0.0.1:{port}: "
            "Address already in use"
        )
    finally:
        busy.close()


def test_each_failed_model_is_named_with_its_reason(folder: Folder) -> None:
    handler = folder.root / "broken.py"
    handler.write_text("def handle(data, context):\n    raise RuntimeError('no weights')\n")
    build_archive(folder.store, "broken", handler)
    echo_archive(folder.store, "echo")
    result = folder.start("--models", "broken.mar,echo.mar,missing.mar")
    assert result.returncode == 5
    info = folder.info()
    lines = result.stderr.splitlines()
    assert lines[0] == f"Error: Lantern (pid {info['pid']}) is running, but 2 models did not load:"
    assert lines[1] == (
        f"  missing.mar: Model archive not found in the model store {folder.store}: missing.mar"
    )
    assert re.fullmatch(
        r'  broken 1\.0: Failed to start workers for model "broken" version 1\.0: .*no weights.*',
        lines[2],
    ), lines[2]
    assert lines[3].startswith("Logs: ")
    assert len(lines) == 4
    assert pid_alive(info["pid"])  # like TorchServe, the server itself keeps running
    assert folder.snapshots() == []  # a start that went wrong writes no snapshot


def test_status_and_logs(folder: Folder) -> None:
    echo_archive(folder.store, "echo", config={"minWorkers": 2})
    assert folder.start("--models", "echo=echo.mar", "--ncs").returncode == 0
    info = folder.info()
    status = serve("status", "--pid-file", str(folder.record), cwd=folder.root)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"Lantern pid {info['pid']}  health: Healthy  folder: {folder.root}"
    assert lines[1].split() == ["inference", info["addresses"]["inference"]]
    header = next(line.split() for line in lines if line.startswith("MODEL"))
    row = next(line.split() for line in lines if line.startswith("echo"))
    assert header[-4:] == ["HEALTH", "RSS", "PSS", "USS"]
    assert row[:8] == ["echo", "1.0", "*", "2", "2", "1", "0", "healthy"]
    for cell in row[8:11]:  # the workers' RSS, PSS and USS (real processes: all readable)
        assert re.fullmatch(r"[1-9]\d*MiB", cell), row
    (front,) = [line for line in lines if line.startswith("frontend  ")]
    assert re.fullmatch(r"frontend  RSS [1-9]\d*MiB  PSS [1-9]\d*MiB  USS [1-9]\d*MiB", front)
    (spares,) = [line for line in lines if line.startswith("spares (")]
    assert re.fullmatch(r"spares \(\d+ idle\)  RSS \d+MiB  PSS \d+MiB  USS \d+MiB", spares)

    listed = serve("logs", "--pid-file", str(folder.record), "--list", cwd=folder.root)
    logs = folder.root / "logs"
    assert listed.stdout.splitlines() == [
        f"lantern  {logs / 'lantern.log'}",
        f"model    {logs / 'model_log.log'}",
        f"access   {logs / 'access_log.log'}",
        f"console  {logs / 'console.log'}",
    ]
    tail = serve("logs", "--pid-file", str(folder.record), "-n", "3", cwd=folder.root)
    assert tail.returncode == 0
    assert tail.stdout.splitlines() == (logs / "lantern.log").read_text().splitlines()[-3:]


def _wait_gone(pid: int) -> None:
    import time

    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)


# --- 4. help -----------------------------------------------------------------------------------


def test_help_lists_every_command_whole_and_states_defaults(tmp_path: Path) -> None:
    top = serve("--help", cwd=tmp_path)
    commands = top.stdout.split("Commands:")[1].splitlines()
    assert [line.split()[0] for line in commands if line.strip()] == [
        "kserve",
        "llm",
        "logs",
        "ray",
        "start",
        "status",
        "stop",
    ]
    assert not any(line.rstrip().endswith("...") for line in commands), top.stdout
    start = " ".join(serve("start", "--help", cwd=tmp_path).stdout.split())
    for default in (
        "--ncs, --no-config-snapshots Neither restore nor write config snapshots. Default:",
        "auto (default): uvicorn, or hypercorn when HTTP/2 is asked for.",
        "(default text)",
        "Default: $LANTERN_PID_FILE, else $XDG_RUNTIME_DIR/lantern/server.json, else "
        "~/.lantern/server.json",
        "Exit codes: 0 healthy;",
    ):
        assert default in start, default
    for command in ("stop", "status", "logs"):
        text = " ".join(serve(command, "--help", cwd=tmp_path).stdout.split())
        assert "Default: $LANTERN_PID_FILE" in text, command
