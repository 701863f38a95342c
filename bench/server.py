"""Processes under test: Lantern (``serve start --foreground``) and the bare ASGI ceiling.

Both bind free loopback ports and are stopped by PID; their console output goes to a file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench import procstat

REPO = Path(__file__).resolve().parent.parent


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and (lower-cased) headers of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}
    except (urllib.error.URLError, OSError):
        return 0, b"", {}


_P = TypeVar("_P", bound="_Process")

_GRPC_FREE_PORTS = {"LANTERN_GRPC_INFERENCE_PORT": "0", "LANTERN_GRPC_MANAGEMENT_PORT": "0"}


class _Process:
    """A subprocess whose console goes to ``<work>/<name>.log``."""

    def __init__(self, work: Path, name: str) -> None:
        self.work = work
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = work / f"{name}.log"
        self.cwd = REPO  # another tree's root runs that tree's code (bench.ab)

    def _spawn(self, cmd: list[str]) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # gRPC on free ports (read back from the state file), never TorchServe's 7070/7071.
            env = {**_GRPC_FREE_PORTS, **os.environ}
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        kids = procstat.children(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for pid in kids:  # workers outliving a killed frontend
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class BareServer(_Process):
    """``python -m bench.bare``: the HTTP ceiling of one server kind."""

    def __init__(self, work: Path, http_server: str) -> None:
        super().__init__(work, f"bare-{http_server}")
        self.http_server = http_server
        self.port_file = work / f"bare-{http_server}.port"
        self.url = ""

    def start(self, timeout: float = 30.0) -> BareServer:
        self.port_file.unlink(missing_ok=True)
        self._spawn(
            [
                sys.executable,
                "-m",
                "bench.bare",
                "--server",
                self.http_server,
                "--port-file",
                str(self.port_file),
            ]
        )
        deadline = time.monotonic() + timeout
        while not self.port_file.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port_file.read_text().strip()}/"
        return self

    def worker_pids(self) -> list[int]:
        return []


class LanternProcess(_Process):
    """``serve start --foreground`` with the given models, on free ports."""

    def __init__(
        self,
        work: Path,
        store: Path,
        models: Sequence[str],
        http_server: str,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(work, f"lantern-{http_server}")
        self.store = store
        self.models = list(models)
        self.http_server = http_server
        self.extra_args = list(extra_args)
        self.state_file = work / f"lantern-{http_server}.json"
        self.addresses: dict[str, str] = {}
        self.server_header = ""  # what the HTTP server calls itself: proof of which one runs

    def start(self, timeout: float = 300.0) -> LanternProcess:
        self.state_file.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "serve.cli",
            "start",
            "--foreground",
            "--model-store",
            str(self.store),
            "--models",
            ",".join(self.models),
            "--pid-file",
            str(self.state_file),
            "--log-dir",
            str(self.work / "logs"),
            "--inference-address",
            "http://127.0.0.1:0",
            "--management-address",
            "http://127.0.0.1:0",
            "--metrics-address",
            "http://127.0.0.1:0",
            "--disable-token-auth",
            "--ncs",
            "--http-server",
            self.http_server,
            *self.extra_args,
        ]
        self._spawn(cmd)
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name}: models not ready in {timeout:g} s")
            if self.state_file.exists():
                self.addresses = json.loads(self.state_file.read_text())["addresses"]
                status, _, headers = _get(f"{self.addresses['inference']}/ping")
                if status == 200:
                    self.server_header = headers.get("server", "")
                    return self
            time.sleep(0.2)

    def url(self, model: str) -> str:
        return f"{self.addresses['inference']}/predictions/{model}"

    def worker_pids(self) -> list[int]:
        return procstat.children(self.pid)

    def batch_histogram(self, model: str) -> dict[str, float]:
        """Cumulative ``serve_batch_size`` buckets of ``model``, plus ``_sum`` and ``_count``."""
        status, body, _ = _get(f"{self.addresses['metrics']}/metrics?name[]=serve_batch_size")
        if status != 200:
            return {}
        return parse_batch_histogram(body.decode(), model)


_SAMPLE = re.compile(r"^serve_batch_size_(bucket|sum|count)\{([^}]*)\}\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_batch_histogram(text: str, model: str) -> dict[str, float]:
    """``{"le=1.0": n, ..., "sum": s, "count": c}`` for one model from Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        if labels.get("model") != model:
            continue
        kind, value = match.group(1), float(match.group(3))
        key = f"le={labels.get('le')}" if kind == "bucket" else kind
        out[key] = out.get(key, 0.0) + value
    return out


def batch_sizes(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The batches that formed between two histogram reads: count, mean and per-bucket counts."""
    count = after.get("count", 0.0) - before.get("count", 0.0)
    total = after.get("sum", 0.0) - before.get("sum", 0.0)
    buckets: dict[str, int] = {}
    previous = 0.0
    bounds = sorted(
        (k for k in after if k.startswith("le=") and k != "le=+Inf"),
        key=lambda k: float(k[3:]),
    )
    for key in bounds:
        cumulative = after[key] - before.get(key, 0.0)
        in_bucket = int(round(cumulative - previous))
        if in_bucket:
            buckets[f"<={float(key[3:]):g}"] = in_bucket
        previous = cumulative
    return {
        "batches": int(count),
        "mean": round(total / count, 2) if count else None,
        "histogram": buckets,
    }
