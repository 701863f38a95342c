"""A Triton / OVMS model repository served as it is, driven by Triton's own clients.

One server on one store, laid out as Triton and OVMS users lay theirs out (models built in code):

- ``scale/``: config.pbtxt (max_batch_size 8, dynamic batching, all versions, a field Lantern does
  not honour) and ``1/model.onnx`` (×2), ``2/model.onnx`` (×3);
- ``multi/1/model.onnx``: no config.pbtxt, the ONNX graph describes itself;
- ``script/``: config.pbtxt (``pytorch_libtorch``) and ``1/model.pt`` (TorchScript);
- ``ovms/1/resnet-ish.onnx``: OVMS's free file names;
- ``bare.onnx``: a bare model file;
- ``ir/1/model.xml`` + ``model.bin``: OpenVINO IR (the ``openvino`` extra);
- ``pre/``: Triton's Python backend (``model.py`` with ``pb_utils``, a module beside it);
  ``badinit/``: a ``model.py`` whose ``initialize`` raises;
- ``broken/``: a malformed config.pbtxt; ``noweights/1/model.xml`` without its ``.bin``;
  ``junk/``: no model at all. The rest must serve regardless.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.protocols import models
from tests.support.server import LanternServer
from tests.support.waiting import wait_for

SCALE_CONFIG = """
name: "scale"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
version_policy: { all { } }
instance_group [ { count: 1 kind: KIND_CPU } ]
response_cache { enable: true }
"""
SCRIPT_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
model_warmup [ { name: "w" batch_size: 2 count: 2 inputs { key: "INPUT__0" value: {
  data_type: TYPE_FP32 dims: [ 3 ] random_data: true } } } ]
"""
READY = ["scale", "multi", "script", "ovms", "bare", "ir", "pre", "bls"]
# BLS: a Python backend model that asks another model of the server (bare: x * 7).
BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x")
            target = "nope" if (x.as_numpy() < 0).any() else "bare"
            inner = pb_utils.InferenceRequest(
                model_name=target, inputs=[x], requested_output_names=["y"]
            ).exec()
            if inner.has_error():
                responses.append(pb_utils.InferenceResponse(error=inner.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(inner, "y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y + 1)]))
        return responses
"""
PYTHON_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
# A Python backend model as Triton users write them, with a module beside it.
PYTHON_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from helper import OFFSET


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "y")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative input")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            y = pb_utils.Tensor("y", (x + OFFSET).astype(self.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses

    def finalize(self):
        pass
"""


def _ir(onnx: Path, xml: Path) -> Path:
    """The ONNX model converted to OpenVINO's IR (model.xml + model.bin), as OVMS users have it."""
    import openvino as ov

    ov.save_model(ov.convert_model(str(onnx)), str(xml))
    return xml


def _torchscript(path: Path) -> Path:
    import torch

    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(Affine()).save(str(path))
    return path


def _store(root: Path) -> Path:
    store = root / "models"
    for version, factor in (("1", 2.0), ("2", 3.0)):
        (store / "scale" / version).mkdir(parents=True)
        models.scale_onnx(store / "scale" / version / "model.onnx", factor)
    (store / "scale" / "config.pbtxt").write_text(SCALE_CONFIG)
    (store / "scale" / "labels.txt").write_text("alpha\nbeta\ngamma\ndelta\n")
    (store / "multi" / "1").mkdir(parents=True)
    models.multi_io_onnx(store / "multi" / "1" / "model.onnx")
    (store / "script" / "1").mkdir(parents=True)
    _torchscript(store / "script" / "1" / "model.pt")
    (store / "script" / "config.pbtxt").write_text(SCRIPT_CONFIG)
    (store / "ovms" / "1").mkdir(parents=True)
    models.scale_onnx(store / "ovms" / "1" / "resnet-ish.onnx", 5.0)
    models.scale_onnx(store / "bare.onnx", 7.0)
    (store / "ir" / "1").mkdir(parents=True)
    _ir(models.scale_onnx(root / "ir.onnx", 11.0), store / "ir" / "1" / "model.xml")
    (store / "broken" / "1").mkdir(parents=True)
    models.scale_onnx(store / "broken" / "1" / "model.onnx", 1.0)
    (store / "broken" / "config.pbtxt").write_text("max_batch_size: [[\n")
    (store / "noweights" / "1").mkdir(parents=True)
    (store / "noweights" / "1" / "model.xml").write_text("<net/>")
    (store / "pre" / "1").mkdir(parents=True)
    (store / "pre" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (store / "pre" / "1" / "model.py").write_text(PYTHON_MODEL)
    (store / "pre" / "1" / "helper.py").write_text("OFFSET = 100\n")
    (store / "bls" / "1").mkdir(parents=True)
    (store / "bls" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (store / "bls" / "1" / "model.py").write_text(BLS_MODEL)
    (store / "badinit" / "1").mkdir(parents=True)
    (store / "badinit" / "config.pbtxt").write_text('backend: "python"')
    (store / "badinit" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        raise RuntimeError('no weights here')\n"
    )
    (store / "junk").mkdir()
    (store / "junk" / "README.txt").write_text("not a model")
    return store


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("triton-repo")
    store = _store(work)
    srv = LanternServer(work, store, ["all"], args=["--model-control-mode", "explicit"])
    srv.start(healthy=False, timeout=180)
    client = thttp.InferenceServerClient(srv.inference.removeprefix("http://"))
    for name, version in [(n, "") for n in READY] + [("scale", "1")]:
        wait_for(partial(client.is_model_ready, name, version), 120, f"{name} {version} ready")
    wait_for(lambda: _started(srv), 120, "the startup report")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server: LanternServer) -> thttp.InferenceServerClient:
    return thttp.InferenceServerClient(server.inference.removeprefix("http://"))


@pytest.fixture(scope="module")
def grpc(server: LanternServer) -> tgrpc.InferenceServerClient:
    return tgrpc.InferenceServerClient(server.grpc_inference)


def _started(srv: LanternServer) -> dict[str, Any] | None:
    """The server record once the startup models are loaded (it holds the startup report)."""
    data: dict[str, Any] = json.loads(srv.state_file.read_text())
    return data if data.get("started") else None


def _http_input(x: np.ndarray, binary: bool, name: str = "x") -> thttp.InferInput:
    entry = thttp.InferInput(name, list(x.shape), "FP32")
    entry.set_data_from_numpy(x, binary_data=binary)
    return entry


def _grpc_input(x: np.ndarray, name: str = "x") -> tgrpc.InferInput:
    entry = tgrpc.InferInput(name, list(x.shape), "FP32")
    entry.set_data_from_numpy(x)
    return entry


# ----- startup -----------------------------------------------------------------------------------


def test_startup_reports_what_it_skipped_and_why(server: LanternServer) -> None:
    record = _started(server)
    assert record is not None
    report = record["startup"]
    skipped = dict(report["skipped"])
    assert list(skipped) == ["junk"], skipped
    assert "not a model folder" in skipped["junk"]
    failed = dict(report["failed"])
    assert "config.pbtxt: malformed model configuration" in failed["broken"]
    assert "model.xml: its weights file model.bin is missing" in failed["noweights"]
    badinit = next(reason for model, reason in failed.items() if model.startswith("badinit"))
    assert "model.py: initialize raised RuntimeError('no weights here')" in badinit
    assert any("scale" in n and "response_cache" in n for n in report["notes"]), report["notes"]


# ----- metadata and configuration ----------------------------------------------------------------


def test_metadata_from_config_and_from_the_file(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    meta = http.get_model_metadata("scale")
    assert meta == {
        "name": "scale",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert http.get_model_metadata("multi")["inputs"][0] == {
        "name": "tokens",
        "datatype": "INT64",
        "shape": [-1, 8],
    }
    assert http.get_model_metadata("script")["platform"] == "pytorch_libtorch"
    assert http.get_model_metadata("bare")["platform"] == "onnxruntime_onnx"
    assert grpc.get_model_metadata("ovms", as_json=True)["platform"] == "onnxruntime_onnx"


def test_model_config_http_and_grpc(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    config = http.get_model_config("scale")
    assert config["name"] == "scale" and config["max_batch_size"] == 8
    assert config["platform"] == "onnxruntime_onnx"
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}]
    assert config["output"][0]["label_filename"] == "labels.txt"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "1000"
    assert config["version_policy"] == {"all": {}}
    by_version = http.get_model_config("scale", "1")
    assert by_version["name"] == "scale"
    over_grpc = grpc.get_model_config("scale", as_json=True)["config"]
    assert over_grpc["max_batch_size"] == 8
    assert over_grpc["input"][0]["name"] == "x"
    # No config.pbtxt: completed from the model, as Triton's auto-complete does.
    multi = http.get_model_config("multi")
    assert multi["max_batch_size"] == 1  # batched up to Lantern's batch size (1)
    assert [t["name"] for t in multi["input"]] == ["tokens", "image"]
    assert multi["input"][1]["dims"] == ["3", "16", "16"]
    with pytest.raises(InferenceServerException):
        http.get_model_config("nope")


# ----- inference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
def test_infer_equals_onnxruntime(
    server: LanternServer, http: thttp.InferenceServerClient, binary: bool
) -> None:
    store = server.model_store
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for name, version, path in (
        ("scale", "", store / "scale" / "2" / "model.onnx"),
        ("scale", "1", store / "scale" / "1" / "model.onnx"),
        ("ovms", "", store / "ovms" / "1" / "resnet-ish.onnx"),
        ("bare", "", store / "bare.onnx"),
    ):
        result = http.infer(name, [_http_input(x, binary)], model_version=version)
        (expected,) = models.run_onnx(path, {"x": x})
        np.testing.assert_array_equal(result.as_numpy("y"), expected)


def test_class_count_names_labels(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    """Triton's classification extension with config.pbtxt's label_filename."""
    x = np.array([[0, 1, 2, 3], [3, 2, 1, 0]], dtype=np.float32)  # version 2 multiplies by 3
    wanted = [thttp.InferRequestedOutput("y", class_count=2)]
    result = http.infer("scale", [_http_input(x, False)], outputs=wanted).as_numpy("y")
    expected = [
        [b"9.000000:3:delta", b"6.000000:2:gamma"],
        [b"9.000000:0:alpha", b"6.000000:1:beta"],
    ]
    assert result.tolist() == expected
    over_grpc = grpc.infer(
        "scale", [_grpc_input(x)], outputs=[tgrpc.InferRequestedOutput("y", class_count=2)]
    )
    assert over_grpc.as_numpy("y").tolist() == expected


def test_infer_multi_io_without_config(
    server: LanternServer, grpc: tgrpc.InferenceServerClient
) -> None:
    tokens = np.arange(16, dtype=np.int64).reshape(2, 8) % 50
    image = np.linspace(0, 1, 2 * 3 * 16 * 16, dtype=np.float32).reshape(2, 3, 16, 16)
    inputs = [tgrpc.InferInput("tokens", [2, 8], "INT64"), _grpc_input(image, "image")]
    inputs[0].set_data_from_numpy(tokens)
    result = grpc.infer("multi", inputs)
    path = server.model_store / "multi" / "1" / "model.onnx"
    features, probabilities = models.run_onnx(path, {"tokens": tokens, "image": image})
    np.testing.assert_allclose(result.as_numpy("features"), features, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-6)


def test_openvino_ir_equals_openvino(
    server: LanternServer, http: thttp.InferenceServerClient
) -> None:
    import openvino as ov

    meta = http.get_model_metadata("ir")
    assert meta["platform"] == "openvino"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = http.infer("ir", [_http_input(x, True)])
    compiled = ov.Core().compile_model(str(server.model_store / "ir" / "1" / "model.xml"), "CPU")
    expected = compiled({"x": x})[compiled.outputs[0]]
    np.testing.assert_array_equal(result.as_numpy("y"), expected)


def test_python_backend_model_runs_unchanged(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    meta = http.get_model_metadata("pre")
    assert meta["platform"] == "python"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(http.infer("pre", [_http_input(x, True)]).as_numpy("y"), x + 100)
    np.testing.assert_array_equal(grpc.infer("pre", [_grpc_input(x)]).as_numpy("y"), x + 100)
    with pytest.raises(InferenceServerException, match="negative input"):
        http.infer("pre", [_http_input(-x, False)])


def test_python_backend_bls_calls_another_model(http: thttp.InferenceServerClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = http.infer("bls", [_http_input(x, True)]).as_numpy("y")
    np.testing.assert_array_equal(result, x * 7 + 1)
    with pytest.raises(InferenceServerException, match="Model not found: nope"):
        http.infer("bls", [_http_input(-x - 1, True)])


def test_stream_infer_over_grpc(server: LanternServer) -> None:
    """ModelStreamInfer (tritonclient's streaming API): one answer per request, in order; an
    error answered in band while the stream goes on."""
    import queue

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tgrpc.InferenceServerClient(server.grpc_inference)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = np.ones((1, 4), dtype=np.float32)
        client.async_stream_infer("bare", [_grpc_input(x)], request_id="1")
        client.async_stream_infer("nope", [_grpc_input(x)], request_id="2")
        client.async_stream_infer("scale", [_grpc_input(x)], model_version="1", request_id="3")
        first, second, third = (answers.get(timeout=60) for _ in range(3))
    finally:
        client.stop_stream()
        client.close()
    np.testing.assert_array_equal(first[0].as_numpy("y"), x * 7)
    assert first[0].get_response().id == "1"
    assert second[0] is None and "Model not found: nope" in str(second[1])
    np.testing.assert_array_equal(third[0].as_numpy("y"), x * 2)


def test_torchscript_model(server: LanternServer, http: thttp.InferenceServerClient) -> None:
    # config.pbtxt's model_warmup ran through the worker before it took traffic
    console = (server.workdir / "console.log").read_text(errors="replace")
    assert "[script 1 script_1-w0] Warm-up: 2 requests in 2 batches" in console
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    result = http.infer("script", [_http_input(x, True, "INPUT__0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2 + 1)


def test_batch_over_max_batch_size_refused(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    x = np.zeros((9, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as caught:
        http.infer("scale", [_http_input(x, True)])
    assert "inference request batch-size must be <= 8 for 'scale'" in str(caught.value)
    with pytest.raises(InferenceServerException) as over_grpc:
        grpc.infer("scale", [_grpc_input(x)])
    assert "batch-size must be <= 8" in str(over_grpc.value)
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"
    # eight rows pass
    http.infer("scale", [_http_input(np.zeros((8, 4), dtype=np.float32), True)])


# ----- repository and statistics ----------------------------------------------------------------


def test_repository_index(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    index = http.get_model_repository_index()
    states = {(row["name"], row.get("version", "")): row["state"] for row in index}
    assert states[("scale", "1")] == "READY" and states[("scale", "2")] == "READY"
    assert states[("bare", "1")] == "READY"
    assert states[("broken", "")] == "UNAVAILABLE"
    over_grpc = grpc.get_model_repository_index(as_json=True)["models"]
    assert {"name": "ovms", "version": "1", "state": "READY"} in over_grpc


def test_statistics_count_requests(
    http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    def success(stats: dict[str, Any], version: str) -> int:
        rows = [r for r in stats["model_stats"] if r["version"] == version]
        return int(rows[0]["inference_stats"]["success"]["count"])

    before = success(http.get_inference_statistics("bare"), "1")
    x = np.ones((1, 4), dtype=np.float32)
    for _ in range(3):
        http.infer("bare", [_http_input(x, True)])
    after = http.get_inference_statistics("bare", "1")
    assert success(after, "1") == before + 3
    row = after["model_stats"][0]
    assert row["name"] == "bare" and int(row["inference_stats"]["success"]["ns"]) > 0
    assert int(row["execution_count"]) >= 3 and int(row["last_inference"]) > 0
    over_grpc = grpc.get_inference_statistics("bare", as_json=True)
    assert success(over_grpc, "1") == before + 3
    everything = http.get_inference_statistics()
    assert {r["name"] for r in everything["model_stats"]} >= set(READY)


def test_unload_and_load(
    server: LanternServer, http: thttp.InferenceServerClient, grpc: tgrpc.InferenceServerClient
) -> None:
    http.unload_model("ovms")
    assert not http.is_model_ready("ovms")
    index = {r["name"]: r for r in http.get_model_repository_index()}
    assert index["ovms"]["state"] == "UNAVAILABLE" and index["ovms"]["reason"] == "unloaded"
    grpc.load_model("ovms")
    assert http.is_model_ready("ovms")
    grpc.unload_model("ovms")
    assert not http.is_model_ready("ovms")
    http.load_model("ovms")
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(http.infer("ovms", [_http_input(x, True)]).as_numpy("y"), x * 5)
    with pytest.raises(InferenceServerException, match="failed to load 'nowhere'"):
        http.load_model("nowhere")


def test_load_with_a_config_override(http: thttp.InferenceServerClient) -> None:
    override = {
        "name": "scale",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 2,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    http.load_model("scale", config=json.dumps(override))
    assert http.get_model_config("scale")["max_batch_size"] == 2
    # the override's default policy serves the latest version only
    assert http.get_model_metadata("scale")["versions"] == ["2"]
    with pytest.raises(InferenceServerException, match="batch-size must be <= 2"):
        http.infer("scale", [_http_input(np.zeros((3, 4), dtype=np.float32), True)])
    http.load_model("scale")  # back to config.pbtxt
    assert http.get_model_config("scale")["max_batch_size"] == 8


def test_serve_start_says_what_it_skipped_and_that_nothing_loaded(tmp_path: Path) -> None:
    """Detached ``serve start --models all`` on a store of no models: it starts, and says why."""
    import subprocess
    import sys

    store = tmp_path / "store"
    (store / "junk").mkdir(parents=True)
    (store / "notes.txt").write_text("hello")
    ports = [f"--{kind}-address=http://127.0.0.1:0" for kind in ("inference", "management")]
    ports.append("--metrics-address=http://127.0.0.1:0")

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "serve.cli", *args]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    for holding, line in ((True, "--models all loaded no model"), (False, "holds no models")):
        if not holding:
            for entry in ("junk", "notes.txt"):
                path = store / entry
                path.rmdir() if path.is_dir() else path.unlink()
        state = tmp_path / "server.json"
        started = serve(
            "start", "--model-store", str(store), "--models", "all", "--pid-file", str(state),
            "--ncs", "--disable-token-auth", "--no-grpc", *ports,
        )  # fmt: skip
        try:
            assert started.returncode == 0, started.stderr
            assert line in started.stdout, started.stdout
            if holding:
                assert "Skipped junk in the model store: not a model folder" in started.stdout
                assert "Skipped notes.txt in the model store: not a model archive" in (
                    started.stdout
                )
        finally:
            assert serve("stop", "--pid-file", str(state)).returncode == 0


def test_register_a_bare_model_file_over_the_management_api(
    server: LanternServer, http: thttp.InferenceServerClient
) -> None:
    """``POST /models?url=`` takes a bare model file as it takes an archive."""
    import httpx

    answer = httpx.post(
        f"{server.management}/models",
        params={"url": "bare.onnx", "model_name": "bare2", "initial_workers": 1},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(http.infer("bare2", [_http_input(x, True)]).as_numpy("y"), x * 7)
    junk = httpx.post(f"{server.management}/models", params={"url": "junk"}, timeout=60)
    assert junk.status_code == 400 and "not a model folder" in junk.json()["message"]
    assert httpx.delete(f"{server.management}/models/bare2", timeout=60).status_code == 200
