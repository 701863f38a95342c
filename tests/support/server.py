"""Start a real Lantern server process on free loopback ports, and stop it by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from archiver import build

REPO = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent
HANDLERS = SUPPORT / "handlers"
DATA = REPO / "examples" / "data"


def build_archive(
    store: Path,
    name: str,
    handler: str | Path,
    *,
    version: str = "1.0",
    config: dict[str, Any] | None = None,
    extra_files: Sequence[str | Path] = (),
    serialized_file: str | Path | None = None,
    model_file: str | Path | None = None,
    archive_format: str = "default",
) -> Path:
    """Build an archive into ``store`` with our own archiver."""
    config_file = None
    if config is not None:
        import yaml

        config_file = store.parent / f"{name}-{version}-model-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
    return build(
        model_name=name,
        version=version,
        handler=str(handler),
        serialized_file=str(serialized_file) if serialized_file else None,
        model_file=str(model_file) if model_file else None,
        extra_files=[str(f) for f in extra_files],
        export_path=str(store),
        archive_format=archive_format,
        force=True,
        config_file=str(config_file) if config_file else None,
    )


def echo_archive(store: Path, name: str = "echo", **kwargs: Any) -> Path:
    return build_archive(store, name, HANDLERS / "echo_handler.py", **kwargs)


class LanternServer:
    """``serve start --foreground`` in a subprocess; ports are read back from its state file."""

    def __init__(
        self,
        workdir: Path,
        model_store: Path,
        models: Sequence[str] = (),
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        token_auth: bool = False,
        snapshots: bool = False,
        http_server: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.model_store = model_store
        self.models = list(models)
        self.args = list(args)
        self.env = env
        self.token_auth = token_auth
        self.snapshots = snapshots
        self.http_server = http_server or os.environ.get("LANTERN_TEST_HTTP_SERVER")
        self.state_file = workdir / "server.json"
        self.log_dir = workdir / "logs"
        self.proc: subprocess.Popen[bytes] | None = None
        self.state: dict[str, Any] = {}

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "serve.cli",
            "start",
            "--foreground",
            "--model-store",
            str(self.model_store),
            "--pid-file",
            str(self.state_file),
            "--log-dir",
            str(self.log_dir),
            "--inference-address",
            "http://127.0.0.1:0",
            "--management-address",
            "http://127.0.0.1:0",
            "--metrics-address",
            "http://127.0.0.1:0",
        ]
        if self.models:
            cmd += ["--models", ",".join(self.models)]
        if not self.token_auth:
            cmd.append("--disable-token-auth")
        if not self.snapshots:
            cmd.append("--ncs")
        if self.http_server:
            cmd += ["--http-server", self.http_server]
        return cmd + self.args

    def start(self, *, healthy: bool = True, timeout: float = 120.0) -> LanternServer:
        if self._running():  # a second Popen would orphan the first server (its pid forgotten)
            raise RuntimeError("this LanternServer is already running; stop it first")
        self.state_file.unlink(missing_ok=True)
        env = dict(os.environ, **(self.env or {}))
        self.console = open(self.workdir / "console.log", "ab")
        self.proc = subprocess.Popen(
            self.command(), cwd=self.workdir, env=env, stdout=self.console, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.console_text()}"
                )
            if self.state_file.exists():
                self.state = json.loads(self.state_file.read_text())
                if not healthy or self.ping() == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.console_text()}")

    @property
    def runs_uvicorn(self) -> bool:
        """Whether uvicorn serves HTTP: named, or picked by ``auto`` (the default) unless
        HTTP/2 is asked for (then hypercorn)."""
        if self.http_server in ("hypercorn", "uvicorn"):
            return self.http_server == "uvicorn"
        http2 = (self.env or {}).get("LANTERN_HTTP2", os.environ.get("LANTERN_HTTP2", ""))
        return http2.strip().lower() not in ("1", "true", "yes", "on")

    def console_text(self) -> str:
        path = self.workdir / "console.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def log_text(self, name: str) -> str:
        path = self.log_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def inference(self) -> str:
        return self.state["addresses"]["inference"]

    @property
    def management(self) -> str:
        return self.state["addresses"]["management"]

    @property
    def metrics(self) -> str:
        return self.state["addresses"]["metrics"]

    @property
    def grpc_inference(self) -> str:
        """``host:port`` of the gRPC inference listener."""
        return self.state["addresses"]["grpc_inference"]

    @property
    def grpc_management(self) -> str:
        return self.state["addresses"]["grpc_management"]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def keys(self) -> dict[str, Any]:
        return json.loads(Path(self.state["key_file"]).read_text())

    def ping(self) -> int | None:
        try:
            return httpx.get(f"{self.inference}/ping", timeout=5).status_code
        except httpx.HTTPError:
            return None

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ping() == 200:
                return
            time.sleep(0.1)
        raise TimeoutError("server did not become healthy")

    def describe(self, model: str, version: str | None = None) -> list[dict[str, Any]]:
        url = f"{self.management}/models/{model}" + (f"/{version}" if version else "")
        return httpx.get(url, timeout=10).json()

    def worker_pids(self, model: str) -> list[int]:
        return [w["pid"] for w in self.describe(model)[0]["workers"] if w["status"] == "READY"]

    def child_pids(self) -> list[int]:
        """Every live process whose parent is the server (its workers)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.pid:
                found.append(int(entry.name))
        return found

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, wait; SIGKILL the server and its workers if they outstay ``timeout``."""
        if self.proc is None:
            return None
        children = self.child_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.console.close()
        return self.proc.returncode

    def _running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> LanternServer:
        """Start the server unless it runs already (``with server.start(timeout=...):``)."""
        return self if self._running() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
