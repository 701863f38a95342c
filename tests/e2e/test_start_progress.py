"""``serve start`` on a terminal says which model it waits for and how long it has waited; with
its output captured (no terminal) it prints only the outcome. The model here starts only when the
test lets it (a file), so the wait is observed, never timed."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import build_archive

PORTS = [
    "--inference-address",
    "http://127.0.0.1:0",
    "--management-address",
    "http://127.0.0.1:0",
    "--metrics-address",
    "http://127.0.0.1:0",
]
HANDLER = """
import os, time

RELEASE = {release!r}


def handle(data, context):
    if data is None:  # initialisation: wait for the test
        deadline = time.monotonic() + 60
        while not os.path.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    return data
"""


def slow_store(tmp_path: Path) -> tuple[Path, Path]:
    store = tmp_path / "store"
    store.mkdir()
    release = tmp_path / "release"
    handler = tmp_path / "slow_handler.py"
    handler.write_text(HANDLER.format(release=str(release)))
    build_archive(store, "slow", handler, config={"minWorkers": 1})
    return store, release


def command(tmp_path: Path, store: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "serve.cli",
        "start",
        "--model-store",
        str(store),
        "--models",
        "slow=slow.mar",
        "--pid-file",
        str(tmp_path / "server.json"),
        "--log-dir",
        str(tmp_path / "logs"),
        "--disable-token-auth",
        "--ncs",
        *PORTS,
    ]


def stop(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "serve.cli", "stop", "--pid-file", str(tmp_path / "server.json")],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )


def read_until(fd: int, wanted: bytes, limit: float = 120.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + limit
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_on_a_terminal_it_names_the_model_it_waits_for(tmp_path: Path) -> None:
    store, release = slow_store(tmp_path)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        command(tmp_path, store), cwd=tmp_path, stdout=follower, stderr=follower
    )
    os.close(follower)
    try:
        shown = read_until(leader, b"waiting for slow (1 worker(s) starting), ")
        assert b"waiting for slow (1 worker(s) starting), " in shown, shown.decode(errors="replace")
        release.touch()
        shown += read_until(leader, b"Lantern is running")
        assert proc.wait(120) == 0, shown.decode(errors="replace")
        assert b"Lantern is running" in shown
        assert b" s\r" in shown or b" s " in shown  # the seconds waited
    finally:
        release.touch()
        os.close(leader)
        stop(tmp_path)
        if proc.poll() is None:
            proc.kill()


def test_without_a_terminal_only_the_outcome_is_printed(tmp_path: Path) -> None:
    store, release = slow_store(tmp_path)
    release.touch()
    try:
        done = subprocess.run(
            command(tmp_path, store), cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "Lantern is running" in done.stdout
        assert "waiting for" not in done.stdout + done.stderr
        assert "\r" not in done.stdout + done.stderr
    finally:
        stop(tmp_path)
