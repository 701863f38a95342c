"""A TF Serving-style start: ``--model_config_file`` over versioned trees, polled and re-read.

``models/models.config`` lists ``scale`` (policy ``all``, a version label) from
``models/scale/<version>/model.onnx``; the test adds a version folder, breaks the config and fixes
it with a moved label, and checks what is served after each step (no fixed sleeps: each step waits
for the server to show it).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.protocols import models
from tests.support.server import LanternServer
from tests.support.waiting import wait_for

CONFIG = """
model_config_list {{
  config {{
    name: "scale"
    base_path: "{base}"
    model_platform: "onnx"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "stable" value: {stable} }}
  }}
}}
"""


def write_warmup(folder: Path) -> None:
    """TF Serving's warm-up file: two PredictLogs for input x [1, 4]."""
    from serve.grpc.gen.tensorflow_serving.apis import prediction_log_pb2
    from serve.grpc.tfs_warmup import WARMUP_FILE, write_records

    records = []
    for value in (1.0, 2.0):
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = "scale"
        tensor = request.inputs["x"]
        tensor.dtype = 1  # type: ignore[assignment]  # DT_FLOAT
        tensor.tensor_shape.dim.add(size=1)
        tensor.tensor_shape.dim.add(size=4)
        tensor.float_val.extend([value] * 4)
        records.append(log.SerializeToString())
    (folder / WARMUP_FILE).parent.mkdir(parents=True)
    (folder / WARMUP_FILE).write_bytes(write_records(records))


class StartServer(LanternServer):
    tree: Path
    config: Path
    onnx: dict[int, Path]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServer]:
    work = tmp_path_factory.mktemp("tfs-start")
    store = work / "models"
    tree = store / "scale"
    onnx = {}
    for version in (1, 2, 3):
        onnx[version] = models.scale_onnx(work / f"scale{version}.onnx", float(version + 1))
    for version in (1, 2):
        (tree / str(version)).mkdir(parents=True)
        shutil.copy(onnx[version], tree / str(version) / "model.onnx")
    write_warmup(tree / "2")
    config = store / "models.config"
    config.write_text(CONFIG.format(base=tree, stable=1))
    srv = StartServer(
        work,
        store,
        [],
        args=["--model_config_file", str(config), "--model_config_file_poll_wait_seconds", "0.2"],
        env={"LANTERN_WATCH_INTERVAL": "0.2"},
    )
    srv.start()
    srv.tree, srv.config, srv.onnx = tree, config, onnx
    wait_for(lambda: served(srv) == {"1": "AVAILABLE", "2": "AVAILABLE"}, 90, "versions 1 and 2")
    yield srv
    srv.stop()


def served(server: LanternServer, model: str = "scale") -> dict[str, str]:
    resp = httpx.get(f"{server.inference}/v1/models/{model}", timeout=10)
    if resp.status_code != 200:
        return {}
    return {s["version"]: s["state"] for s in resp.json()["model_version_status"]}


def predict(server: LanternServer, path: str, x: np.ndarray) -> Any:
    resp = httpx.post(f"{server.inference}{path}", json={"instances": x.tolist()}, timeout=30)
    assert resp.status_code == 200, resp.text
    return np.asarray(resp.json()["predictions"], dtype=np.float32)


def test_models_config_start_labels_new_versions_and_rereads(server: StartServer) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    # Version 2's warm-up records were replayed before it took traffic.
    wait_for(
        lambda: (
            "replayed 2 warm-up requests" in server.log_text("ts_log.log") + server.console_text()
        ),
        30,
        "the warm-up replayed",
    )
    # The label from models.config, and the default: the highest served version.
    np.testing.assert_array_equal(
        predict(server, "/v1/models/scale/labels/stable:predict", x), x * 2
    )
    np.testing.assert_array_equal(predict(server, "/v1/models/scale:predict", x), x * 3)

    # A new version folder is polled in and becomes the default, under load: no request fails.
    stop = threading.Event()
    answers: list[float] = []
    failures: list[str] = []

    def load() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                resp = client.post(
                    f"{server.inference}/v1/models/scale:predict", json={"instances": x.tolist()}
                )
                if resp.status_code == 200:
                    answers.append(resp.json()["predictions"][0][0])
                else:
                    failures.append(f"{resp.status_code} {resp.text}")

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        (server.tree / "3").mkdir()
        shutil.copy(server.onnx[3], server.tree / "3" / "model.onnx")
        wait_for(lambda: served(server).get("3") == "AVAILABLE", 90, "version 3")
        wait_for(lambda: answers and answers[-1] == 4.0, 60, "version 3 as the default")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert set(answers) <= {3.0, 4.0} and 3.0 in answers  # version 2, then version 3

    # A broken config is said and changes nothing.
    server.config.write_text("model_config_list { config { name: ")
    wait_for(
        lambda: (
            "Keeping the models served as they are" in server.log_text("ts_log.log")
            or "Keeping the models served as they are" in server.console_text()
        ),
        30,
        "the syntax error logged",
    )
    assert served(server) == {"1": "AVAILABLE", "2": "AVAILABLE", "3": "AVAILABLE"}

    # A fixed config moves the label.
    server.config.write_text(CONFIG.format(base=server.tree, stable=3))
    wait_for(
        lambda: float(predict(server, "/v1/models/scale/labels/stable:predict", x)[0, 0]) == 4.0,
        30,
        "the label moved to version 3",
    )


def test_model_name_and_base_path_start(
    server: StartServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """TF Serving's single-model flags over a versioned tree, with a batching parameters file."""
    work = tmp_path_factory.mktemp("tfs-single")
    batching = work / "batching.txt"
    batching.write_text(
        "max_batch_size { value: 4 } batch_timeout_micros { value: 50000 } "
        "num_batch_threads { value: 1 } max_enqueued_batches { value: 5 }"
    )
    tree = work / "models" / "half"
    for version in (1, 2):
        (tree / str(version)).mkdir(parents=True)
        shutil.copy(server.onnx[version], tree / str(version) / "model.onnx")
    single = LanternServer(
        work,
        tree.parent,
        [],
        args=[
            "--model_name",
            "half",
            "--model_base_path",
            str(tree),
            "--batching_parameters_file",
            str(batching),
        ],
        env={"LANTERN_WATCH_INTERVAL": "0.2"},
    )
    single.start()
    try:
        wait_for(lambda: served(single, "half").get("2") == "AVAILABLE", 90, "model half")
        status = httpx.get(f"{single.inference}/v1/models/half", timeout=10).json()
        # TF Serving's default policy: the latest version only.
        assert [s["version"] for s in status["model_version_status"]] == ["2"]
        x = np.ones((1, 4), dtype=np.float32)
        np.testing.assert_array_equal(predict(single, "/v1/models/half:predict", x), x * 3)
        (described,) = single.describe("half")
        assert (described["batchSize"], described["maxBatchDelay"]) == (4, 50)
        assert (described["minWorkers"], described["maxWorkers"]) == (1, 1)
    finally:
        single.stop()
