"""Lantern on a real two-node Ray cluster on loopback: ``ray start --head`` plus a second
``ray start --address=...`` on this machine, the model store deployed with ``lantern ray deploy``,
predictions and management routes through Ray's HTTP proxy, and a replica killed under load.

Ray runs from ``.venv-ray`` (``make test`` builds it beside ``.venv``, reusing its packages), so
that Ray's own ``serve`` script never replaces Lantern's in ``.venv``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.protocols import models
from tests.support.server import REPO, echo_archive

pytestmark = pytest.mark.ray

RAY_VENV = Path(os.environ.get("LANTERN_RAY_VENV", REPO / ".venv-ray"))
X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_cli() -> Path:
    ray = RAY_VENV / "bin" / "ray"
    if not ray.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{ray} is missing: `make test` builds {RAY_VENV}")
        pytest.skip(f"no Ray environment at {RAY_VENV} (make test builds it)")
    return ray


class Cluster:
    """Two Ray nodes on 127.0.0.1 and Lantern deployed on them."""

    def __init__(self, work: Path) -> None:
        self.ray = ray_cli()
        self.work = work
        self.gcs = free_port()
        self.dashboard = free_port()
        self.http = free_port()
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.ray), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    def start(self) -> None:
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0"]
        common += ["--object-store-memory=150000000", "--disable-usage-stats"]
        self.run(
            "start",
            "--head",
            f"--port={self.gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard}",
            f"--temp-dir={self.work / 'ray'}",
            *common,
        )
        self.run("start", f"--address=127.0.0.1:{self.gcs}", *common)

    def deploy(self, store: Path, models: str) -> str:
        cmd = [sys.executable, "-m", "serve.cli", "ray", "deploy"]
        cmd += [f"--address=http://127.0.0.1:{self.dashboard}", f"--model-store={store}"]
        cmd += [f"--models={models}", f"--http-port={self.http}", "--max-replicas-per-node=1"]
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def stop(self) -> None:
        subprocess.run([str(self.ray), "stop", "--force"], env=self.env, capture_output=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("ray")
    store = work / "store"
    store.mkdir()
    echo_archive(
        store, config={"minWorkers": 2, "maxWorkers": 2, "batchSize": 4, "maxBatchDelay": 200}
    )
    models.base_archive(store, "scale", models.scale_onnx(work / "scale.onnx", 0.5))
    ray = Cluster(work)
    try:
        ray.start()
        ray.deployed = ray.deploy(store, "echo=echo.mar,scale=scale.mar")  # type: ignore[attr-defined]
        yield ray
    finally:
        ray.stop()


def describe(cluster: Cluster, model: str) -> dict[str, Any]:
    (entry,) = httpx.get(f"{cluster.base}/models/{model}", timeout=30).json()
    return entry


def wait_for_ready_pids(cluster: Cluster, model: str, count: int) -> list[int]:
    """The pids of ``count`` READY replicas, once Ray reports them (bounded: 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        workers = describe(cluster, model)["workers"]
        pids = [w["pid"] for w in workers if w["status"] == "READY" and w["pid"] > 0]
        if len(pids) == count:
            return pids
        assert time.monotonic() < deadline, workers
        time.sleep(0.5)


def test_deploy_reports_where_it_serves(cluster: Cluster) -> None:
    assert f"Lantern is running on Ray: {cluster.base}" in cluster.deployed  # type: ignore[attr-defined]


def test_replicas_land_on_both_nodes(cluster: Cluster) -> None:
    wait_for_ready_pids(cluster, "echo", 2)
    workers = describe(cluster, "echo")["workers"]
    assert len(workers) == 2
    assert {w["status"] for w in workers} == {"READY"}
    assert len({w["nodeId"] for w in workers}) == 2


def test_predictions_and_management_through_rays_proxy(cluster: Cluster) -> None:
    assert httpx.get(f"{cluster.base}/ping").json() == {"status": "Healthy"}
    resp = httpx.post(f"{cluster.base}/predictions/echo", content=b"hello", timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json()["echo"] == "hello"
    assert resp.headers["x-request-id"] == resp.json()["request_id"]
    models_listed = httpx.get(f"{cluster.base}/models").json()["models"]
    assert sorted(m["modelName"] for m in models_listed) == ["echo", "scale"]
    echo = describe(cluster, "echo")
    assert (echo["batchSize"], echo["maxBatchDelay"], echo["minWorkers"]) == (4, 200, 2)


def test_errors_keep_lanterns_codes(cluster: Cluster) -> None:
    missing = httpx.post(f"{cluster.base}/predictions/nope", content=b"x")
    assert missing.status_code == 404 and missing.json()["code"] == 404
    bug = httpx.post(f"{cluster.base}/predictions/echo", content=b"boom", timeout=30)
    assert bug.status_code == 500
    assert bug.json()["type"] == "ValueError"
    assert (
        httpx.post(f"{cluster.base}/predictions/echo", content=b"ok", timeout=30).status_code == 200
    )
    v2_missing = httpx.post(f"{cluster.base}/v2/models/nope/infer", json={"inputs": []})
    assert v2_missing.status_code == 404 and set(v2_missing.json()) == {"error"}


def test_requests_are_batched_by_serve_batch(cluster: Cluster) -> None:
    def one(_: int) -> int:
        resp = httpx.post(f"{cluster.base}/predictions/echo", content=b"sleep 0.2", timeout=60)
        assert resp.status_code == 200, resp.text
        return resp.json()["batch"]

    with cf.ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(one, range(16)))
    assert max(batches) > 1, batches
    assert max(batches) <= 4


def test_kserve_v1_and_v2_through_rays_proxy(cluster: Cluster) -> None:
    import tritonclient.http as triton

    v1 = httpx.post(
        f"{cluster.base}/v1/models/scale:predict", json={"instances": X.tolist()}, timeout=60
    )
    assert v1.status_code == 200, v1.text
    np.testing.assert_allclose(v1.json()["predictions"], X * 0.5)
    client = triton.InferenceServerClient(url=cluster.base.removeprefix("http://"))
    tensor = triton.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X, binary_data=True)
    result = client.infer("scale", [tensor])
    client.close()
    np.testing.assert_allclose(result.as_numpy("y"), X * 0.5)


def test_scaling_through_rays_proxy(cluster: Cluster) -> None:
    """PUT /models/{m}?min_worker=N changes the deployment's replicas through Ray's config."""
    down = httpx.put(
        f"{cluster.base}/models/echo", params={"min_worker": 1, "synchronous": "true"}, timeout=180
    )
    assert down.status_code == 200, down.text
    assert down.json() == {"status": "Workers scaled to 1 for model: echo, version: 1.0"}
    assert len(describe(cluster, "echo")["workers"]) == 1
    one = httpx.post(f"{cluster.base}/predictions/echo", content=b"x", timeout=60)
    assert one.status_code == 200
    zero = httpx.put(f"{cluster.base}/models/echo", params={"min_worker": 0})
    assert zero.status_code == 400 and "at least one replica" in zero.json()["message"]
    up = httpx.put(
        f"{cluster.base}/models/echo", params={"min_worker": 2, "synchronous": "true"}, timeout=180
    )
    assert up.status_code == 200, up.text
    workers = describe(cluster, "echo")["workers"]
    assert len(workers) == 2 and len({w["nodeId"] for w in workers}) == 2


def test_killing_one_replica_under_load_loses_no_request(cluster: Cluster) -> None:
    """Requests in flight on the killed replica get Ray's ActorDiedError; the ingress retries each
    once on the other replica, so every accepted request is answered 200."""
    # A positive pid only: os.kill(0, ...) would signal this test's own process group.
    victim = wait_for_ready_pids(cluster, "echo", 2)[0]
    assert victim > 0
    stop = time.monotonic() + 15  # bounded: 4 clients for at most 15 s
    statuses: list[int] = []

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < stop:
                statuses.append(
                    http.post(f"{cluster.base}/predictions/echo", content=b"sleep 0.05").status_code
                )

    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client) for _ in range(4)]
        while len(statuses) < 20:
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        for future in futures:
            future.result()
    assert len(statuses) > 20
    assert [s for s in statuses if s != 200] == []
    deadline = time.monotonic() + 120  # Ray's controller replaces the replica
    while time.monotonic() < deadline:
        ready = [w["pid"] for w in describe(cluster, "echo")["workers"] if w["status"] == "READY"]
        if len(ready) == 2 and victim not in ready:
            break
        time.sleep(1)
    else:
        pytest.fail("the killed replica was not replaced")
