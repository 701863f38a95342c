"""The Dockerfile's entry command, run directly as the image runs it (no Docker engine here).

The final stage's ENTRYPOINT + CMD run in a folder standing in for its WORKDIR, with its ENV (the
ports swapped for free ones), and the server is checked as a container user meets it: bound to
0.0.0.0, serving the model store volume, tokens on, ``/ping`` and the HEALTHCHECK open.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.server import REPO, echo_archive

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    """The instructions of a Dockerfile's final stage that decide how the container runs."""

    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = ""
    volumes: list[str] = field(default_factory=list)
    expose: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
        if not stripped.endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            out.append((keyword.upper(), args.strip()))
            pending = ""
    return out


def final_stage(text: str) -> Stage:
    stage = Stage()
    for keyword, args in instructions(text):
        if keyword == "FROM":
            stage = Stage(base=args.split()[0])
        elif keyword == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                stage.env[key] = value
        elif keyword == "USER":
            stage.user = args
        elif keyword == "WORKDIR":
            stage.workdir = args
        elif keyword == "VOLUME":
            stage.volumes += json.loads(args) if args.startswith("[") else args.split()
        elif keyword == "EXPOSE":
            stage.expose += args.split()
        elif keyword == "HEALTHCHECK":
            stage.healthcheck = json.loads(args.split(" CMD ", 1)[1])
        elif keyword == "ENTRYPOINT":
            stage.entrypoint = json.loads(args)
        elif keyword == "CMD":
            stage.cmd = json.loads(args)
    return stage


STAGE = final_stage(DOCKERFILE.read_text())


def free_port_env(env: dict[str, str]) -> dict[str, str]:
    """The image's LANTERN_* settings, with every listening port made 0 (a free one)."""
    return {
        key: re.sub(r":\d+$", ":0", value) if key.endswith("_ADDRESS") else value
        for key, value in env.items()
        if key.startswith("LANTERN_") or key == "PYTHONUNBUFFERED"
    }


def executable(name: str) -> str:
    """A command the image finds on PATH (/opt/venv/bin), found in this test's environment."""
    if name == "python":
        return sys.executable
    return str(Path(sys.executable).parent / name)


class Container:
    """The entry command running in ``workdir`` as the container's process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.state_file = workdir / "server.json"
        self.env = {
            **os.environ,
            **free_port_env(STAGE.env),
            "LANTERN_PID_FILE": str(self.state_file),
        }
        self.command = [executable(STAGE.entrypoint[0]), *STAGE.entrypoint[1:], *STAGE.cmd]
        self.console = open(workdir / "console.log", "wb")
        self.proc = subprocess.Popen(
            self.command, cwd=workdir, env=self.env, stdout=self.console, stderr=subprocess.STDOUT
        )
        self.state: dict = {}

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.console_text()
            if self.state_file.exists():
                self.state = json.loads(self.state_file.read_text())
                if self._echo_ready():
                    return
            time.sleep(0.2)
        raise TimeoutError(self.console_text())

    def _echo_ready(self) -> bool:
        try:
            resp = httpx.get(
                f"{self.local('management')}/models/echo", headers=self.auth("management")
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200 and resp.json()[0]["workers"][0]["status"] == "READY"

    def port(self, api: str) -> int:
        return int(self.state["addresses"][api].rsplit(":", 1)[1])

    def local(self, api: str) -> str:
        return f"http://127.0.0.1:{self.port(api)}"

    def keys(self) -> dict:
        return json.loads((self.workdir / "key_file.json").read_text())

    def auth(self, kind: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys()[kind]['key']}"}

    def healthcheck(self) -> subprocess.CompletedProcess[bytes]:
        """The image's HEALTHCHECK command, given the inference address the server really got."""
        address = STAGE.env["LANTERN_INFERENCE_ADDRESS"].rsplit(":", 1)[0]
        env = {**self.env, "LANTERN_INFERENCE_ADDRESS": f"{address}:{self.port('inference')}"}
        command = [executable(STAGE.healthcheck[0]), *STAGE.healthcheck[1:]]
        return subprocess.run(command, env=env, capture_output=True, timeout=30)

    def stop(self) -> int:
        """What ``docker stop`` does: SIGTERM, then SIGKILL after a grace period."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self.console.closed:
            self.console.close()
        return self.proc.returncode

    def console_text(self) -> str:
        return (self.workdir / "console.log").read_text(errors="replace")[-5000:]


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    workdir = tmp_path_factory.mktemp("home-lantern")
    store = workdir / "model_store"  # the volume, where the CMD's relative --model-store points
    store.mkdir()
    echo_archive(store, "echo")
    running = Container(workdir)
    try:
        running.wait_ready()
    except BaseException:
        running.stop()
        raise
    yield running
    running.stop()


def test_image_is_slim_python_run_by_a_non_root_user() -> None:
    assert re.fullmatch(r"python:\$\{PYTHON_VERSION\}-slim|python:3\.\d+-slim", STAGE.base)
    assert STAGE.user and STAGE.user.split(":")[0] not in ("root", "0")
    assert f"{STAGE.workdir}/model_store" in STAGE.volumes
    assert STAGE.expose == ["8080", "8081", "8082", "7070", "7071"]
    for api in ("INFERENCE", "MANAGEMENT"):  # gRPC, on every interface too
        assert STAGE.env[f"LANTERN_GRPC_{api}_ADDRESS"] == "0.0.0.0"
    assert STAGE.entrypoint[:3] == ["serve", "start", "--foreground"]
    assert "/ping" in " ".join(STAGE.healthcheck)
    for api in ("INFERENCE", "MANAGEMENT", "METRICS"):
        assert STAGE.env[f"LANTERN_{api}_ADDRESS"].startswith("http://0.0.0.0:")


def test_binds_every_interface(container: Container) -> None:
    for api in ("inference", "management", "metrics"):
        assert container.state["addresses"][api].startswith("http://0.0.0.0:")
    for api in ("grpc_inference", "grpc_management"):
        assert container.state["addresses"][api].startswith("0.0.0.0:")


def test_ping_needs_no_token(container: Container) -> None:
    resp = httpx.get(f"{container.local('inference')}/ping")
    assert resp.status_code == 200
    assert resp.json() == {"status": "Healthy"}


def test_serves_the_model_store_volume_with_tokens(container: Container) -> None:
    url = f"{container.local('inference')}/predictions/echo"
    refused = httpx.post(url, content=b"hi", headers={"content-type": "text/plain"})
    assert refused.status_code == 401
    assert refused.json()["type"] == "InvalidKeyException"
    resp = httpx.post(
        url, content=b"hi", headers={"content-type": "text/plain", **container.auth("inference")}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["echo"] == "hi"


def test_management_needs_its_own_token(container: Container) -> None:
    url = f"{container.local('management')}/models"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers=container.auth("inference")).status_code == 401
    models = httpx.get(url, headers=container.auth("management")).json()["models"]
    assert [m["modelName"] for m in models] == ["echo"]


def test_metrics_are_served(container: Container) -> None:
    resp = httpx.get(f"{container.local('metrics')}/metrics")
    assert resp.status_code == 200
    assert "ts_inference_requests_total" in resp.text


def test_healthcheck_passes_on_a_healthy_server(container: Container) -> None:
    result = container.healthcheck()
    assert result.returncode == 0, result.stderr.decode(errors="replace")


def test_sigterm_stops_cleanly_and_the_healthcheck_then_fails(container: Container) -> None:
    """Last in the module: it stops the module's server, as ``docker stop`` would."""
    assert container.stop() == 0, container.console_text()
    assert not (container.workdir / "key_file.json").exists()
    assert container.healthcheck().returncode != 0
