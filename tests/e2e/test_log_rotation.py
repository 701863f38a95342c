"""A handler printing megabytes cannot fill the disk: model_log.log and console.log rotate at a cap.

The cap here is 200 kB with 2 old copies (the defaults are TorchServe's: 100 MB, 5 copies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.server import HANDLERS, REPO, build_archive

CAP = 200_000
BACKUPS = 2


def serve(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serve.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **env},
    )


def assert_rotated(folder: Path, name: str) -> None:
    files = sorted(p.name for p in folder.iterdir() if p.name.startswith(name))
    assert files == [name, f"{name}.1", f"{name}.2"], files
    for path in folder.glob(f"{name}*"):
        assert path.stat().st_size <= CAP + 64 * 1024, (path, path.stat().st_size)


def test_a_handler_printing_megabytes_leaves_capped_rotated_model_logs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "faulty", HANDLERS / "faulty_handler.py", config={"minWorkers": 1})
    state = tmp_path / "server.json"
    logs = tmp_path / "logs"
    env = {"LANTERN_LOG_MAX_BYTES": str(CAP), "LANTERN_LOG_BACKUP_COUNT": str(BACKUPS)}
    started = serve(
        "start",
        "--model-store",
        str(store),
        "--models",
        "faulty.mar",
        "--pid-file",
        str(state),
        "--log-dir",
        str(logs),
        "--disable-token-auth",
        "--inference-address",
        "http://127.0.0.1:0",
        "--management-address",
        "http://127.0.0.1:0",
        "--metrics-address",
        "http://127.0.0.1:0",
        cwd=tmp_path,
        env=env,
    )
    assert started.returncode == 0, started.stderr
    try:
        inference = json.loads(state.read_text())["addresses"]["inference"]
        for _ in range(3):  # 3 x 1,500 lines of 1 KiB: 4.5 MB printed
            resp = httpx.post(f"{inference}/predictions/faulty", content=b"spam 1500", timeout=120)
            assert resp.status_code == 200
        resp = httpx.post(f"{inference}/predictions/faulty", content=b"last", timeout=60)
        assert resp.status_code == 200
    finally:
        stopped = serve("stop", "--pid-file", str(state), cwd=tmp_path, env=env)
        assert stopped.returncode == 0, stopped.stderr
    assert_rotated(logs, "model_log.log")
    total = sum(p.stat().st_size for p in logs.iterdir())
    assert total < (BACKUPS + 1) * (CAP + 64 * 1024) + 4 * CAP  # all logs together: bounded


def test_console_log_rotates(tmp_path: Path) -> None:
    # A detached server's stdout and stderr (what no logger formats) go through the same cap.
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from serve.cli.console import capture_console\n"
        f"capture_console(Path({str(tmp_path / 'console.log')!r}), {CAP}, {BACKUPS})\n"
        "for i in range(2000):\n"
        "    print('o' * 511, flush=True)\n"
        "    os.write(2, b'e' * 511 + b'\\n')\n"
        "print('the end', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=env)
    assert_rotated(tmp_path, "console.log")
    assert (tmp_path / "console.log").read_text().rstrip().endswith("the end")
