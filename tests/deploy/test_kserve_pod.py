"""The KServe pod contract without a cluster: KServe's own storage code fills a /mnt/models-like
folder (symlinks from ``file://``, a tarball from ``http://127.0.0.1``), Lantern starts exactly as
the ServingRuntime's container command says, and KServe's Python SDK and tritonclient call it on
v1 and v2."""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.deploy.support import DEPLOY, load_manifests
from tests.protocols import models
from tests.support.server import LanternServer, pid_alive

# TorchServe's documented config.properties for KServe, as its users have them.
TS_KSERVE_CONFIG = """\
inference_address=http://0.0.0.0:8085
management_address=http://0.0.0.0:8085
metrics_address=http://0.0.0.0:8082
grpc_inference_port=7070
grpc_management_port=7071
enable_envvars_config=true
install_py_dep_per_model=true
enable_metrics_api=true
metrics_mode=prometheus
number_of_netty_threads=4
job_queue_size=10
model_store=/mnt/models/model-store
model_snapshot={"name":"startup.cfg","modelCount":1,"models":{"scale":{"1.0":\
{"defaultVersion":true,"marName":"scale.mar","minWorkers":1,"maxWorkers":1,"batchSize":4,\
"maxBatchDelay":20,"responseTimeout":120}}}}
"""
X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


def container() -> dict[str, Any]:
    (runtime,) = load_manifests(DEPLOY / "kserve" / "servingruntime.yaml")
    (kserve_container,) = runtime["spec"]["containers"]
    return kserve_container


class KServePod(LanternServer):
    """Lantern started with the runtime container's command, arguments and environment; only
    the ports (free ones, on loopback) and the folders differ from a pod."""

    def __init__(self, workdir: Path, model_dir: Path, isvc_name: str) -> None:
        spec = container()
        env = {e["name"]: e["value"] for e in spec["env"]}
        env.update(
            PORT="0",
            METRICS_PORT="0",
            MANAGEMENT_PORT="0",
            GRPC_PORT="0",
            LANTERN_GRPC_MANAGEMENT_PORT="0",  # the pod's is 7071 on loopback; tests share a host
            LANTERN_KSERVE_HOST="127.0.0.1",
            LANTERN_LOG_DIR=str(workdir / "logs"),
        )
        super().__init__(workdir, model_dir, env=env)
        args = [
            a.replace("{{.Name}}", isvc_name).replace("/mnt/models", str(model_dir))
            for a in spec["args"]
        ]
        assert spec["command"] == ["serve"]
        self.pod_command = [sys.executable, "-m", "serve.cli", *args]

    def command(self) -> list[str]:
        return [*self.pod_command, "--pid-file", str(self.state_file)]


# KServe's SDK and tritonclient.grpc each register protobuf messages named ``inference.*`` in the
# default descriptor pool, and one process cannot hold both (pytest imports tritonclient.grpc
# with tests/grpc): each client runs in a process of its own, as a user's script would.
KSERVE_CLIENT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

base, model, protocol = sys.argv[1:4]
x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)

async def call():
    async with InferenceRESTClient(RESTConfig(protocol=protocol, timeout=30)) as client:
        if protocol == "v1":
            return (await client.infer(base, {"instances": x.tolist()}, model_name=model))[
                "predictions"
            ]
        tensor = InferInput(name="x", shape=list(x.shape), datatype="FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        request = InferRequest(model_name=model, infer_inputs=[tensor])
        return (await client.infer(base, request, model_name=model)).outputs[0].as_numpy().tolist()

print(json.dumps(asyncio.run(call())))
"""
TRITON_GRPC_CLIENT = """
import json, sys
import numpy as np
import tritonclient.grpc as g

client = g.InferenceServerClient(sys.argv[1])
tensor = g.InferInput("x", [1, 4], "FP32")
tensor.set_data_from_numpy(np.array([[1, 2, 3, 4]], dtype=np.float32))
print(json.dumps(client.infer(sys.argv[2], [tensor]).as_numpy("y").tolist()))
"""


def run_client(code: str, *args: str) -> np.ndarray:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return np.array(json.loads(out.stdout))


def triton_infer(base: str, model: str) -> np.ndarray:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=base.removeprefix("http://"))
    tensor = triton.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X, binary_data=True)
    result = client.infer(model, [tensor])
    client.close()
    return result.as_numpy("y")


def assert_pod_serves(pod: LanternServer, model: str) -> None:
    base = pod.inference
    assert httpx.get(f"{base}/v2/health/live").status_code == 200
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200
    assert httpx.get(f"{base}/v2/models/{model}/ready").status_code == 200
    np.testing.assert_allclose(run_client(KSERVE_CLIENT, base, model, "v1"), X * 0.5)
    np.testing.assert_allclose(run_client(KSERVE_CLIENT, base, model, "v2"), X * 0.5)
    np.testing.assert_allclose(triton_infer(base, model), X * 0.5)
    # grpc-v2: the Open Inference Protocol over gRPC on the runtime's gRPC port.
    grpc_address = pod.state["addresses"]["grpc_inference"]
    assert grpc_address.startswith("127.0.0.1:")
    np.testing.assert_allclose(run_client(TRITON_GRPC_CLIENT, grpc_address, model), X * 0.5)
    assert httpx.get(f"{pod.metrics}/metrics").status_code == 200


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("kserve_archive")
    store = work / "built"
    store.mkdir()
    return models.base_archive(store, "scale", models.scale_onnx(work / "scale.onnx", 0.5))


@pytest.fixture(scope="module")
def torchserve_layout_pod(
    archive: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LanternServer, Path]]:
    from kserve_storage import Storage

    work = tmp_path_factory.mktemp("kserve_file")
    source = work / "bucket" / "scale"
    (source / "config").mkdir(parents=True)
    (source / "model-store").mkdir()
    (source / "config" / "config.properties").write_text(TS_KSERVE_CONFIG)
    (source / "model-store" / "scale.mar").write_bytes(archive.read_bytes())
    mnt = work / "mnt" / "models"
    Storage.download(f"file://{source}", out_dir=str(mnt))
    mnt.chmod(0o555)  # read-only, as the pod mounts it
    pod = KServePod(work, mnt, "scale")
    pod.start()
    yield pod, mnt
    pod.stop()
    mnt.chmod(0o755)


def test_storage_initializer_links_the_torchserve_layout(
    torchserve_layout_pod: tuple[LanternServer, Path],
) -> None:
    _, mnt = torchserve_layout_pod
    assert (mnt / "config").is_symlink() and (mnt / "model-store").is_symlink()


def test_torchserve_layout_serves_v1_and_v2(
    torchserve_layout_pod: tuple[LanternServer, Path],
) -> None:
    pod, _ = torchserve_layout_pod
    assert_pod_serves(pod, "scale")


def test_model_snapshot_settings_from_config_properties_apply(
    torchserve_layout_pod: tuple[LanternServer, Path],
) -> None:
    pod, _ = torchserve_layout_pod
    (described,) = pod.describe("scale")
    assert (described["batchSize"], described["maxBatchDelay"]) == (4, 20)
    assert described["minWorkers"] == 1


def test_management_stays_on_loopback_and_token_auth_is_off(
    torchserve_layout_pod: tuple[LanternServer, Path],
) -> None:
    pod, _ = torchserve_layout_pod
    assert pod.management.startswith("http://127.0.0.1:")
    assert pod.state["key_file"] is None


class _TarballHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def tarball_pod(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    from kserve_storage import Storage

    work = tmp_path_factory.mktemp("kserve_http")
    site = work / "site"
    site.mkdir()
    with tarfile.open(site / "model.tar.gz", "w:gz") as tar:
        tar.add(archive, arcname="scale.mar")
    handler = functools.partial(_TarballHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        mnt = work / "mnt" / "models"
        Storage.download(f"http://127.0.0.1:{httpd.server_port}/model.tar.gz", out_dir=str(mnt))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert sorted(p.name for p in mnt.iterdir()) == ["scale.mar"]
    pod = KServePod(work, mnt, "halver")
    pod.start()
    yield pod
    pod.stop()


def test_a_bare_archive_is_served_under_the_inference_service_name(
    tarball_pod: LanternServer,
) -> None:
    assert_pod_serves(tarball_pod, "halver")
    listed = httpx.get(f"{tarball_pod.management}/models").json()
    assert [m["modelName"] for m in listed["models"]] == ["halver"]


def test_v1_errors_come_back_as_kserve_errors(tarball_pod: LanternServer) -> None:
    resp = httpx.post(f"{tarball_pod.inference}/v1/models/nope:predict", json={"instances": []})
    assert resp.status_code == 404
    assert set(resp.json()) == {"error"}


def test_sigterm_ends_the_pod_cleanly(tarball_pod: LanternServer) -> None:
    children = tarball_pod.child_pids()
    assert children
    assert tarball_pod.stop(timeout=25) == 0  # within the runtime's LANTERN_DRAIN_TIMEOUT
    assert not any(pid_alive(pid) for pid in children)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{tarball_pod.inference}/v2/health/live")
