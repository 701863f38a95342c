"""Open Inference Protocol v2 against one real server, driven by NVIDIA's tritonclient and httpx.

Models built at test time: a multi-input, multi-output ONNX model with batching (tokens INT64
[B,8] + image FP32 [B,3,16,16] -> features FP32 [B,4] + probabilities FP32 [B,3]), an ONNX
identity model per datatype, a torch.export program, and a torch-free custom handler registered
as two versions that behave differently.
"""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.protocols import models
from tests.support.server import LanternServer

DATATYPES = ["INT32", "INT64", "FP32", "FP64", "BOOL", "UINT8", "BYTES", "FP16"]
CUSTOM_METADATA = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "scaled", "datatype": "FP32", "shape": [-1, 4]}],
}


class OnnxServer(LanternServer):
    """The server, and the ONNX file its ``multi`` archive serves (to compute the answers)."""

    onnx_path: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnnxServer]:
    work = tmp_path_factory.mktemp("oip")
    store = work / "store"
    store.mkdir()
    multi = models.multi_io_onnx(work / "multi.onnx")
    models.base_archive(store, "multi", multi, config={"batchSize": 8, "maxBatchDelay": 50})
    models.base_archive(store, "dtypes", models.identity_onnx(work / "ids.onnx", DATATYPES))
    models.base_archive(store, "program", models.exported_pt2(work / "program.pt2"))
    for version, factor in (("1.0", 2), ("2.0", 3)):
        models.custom_archive(
            store,
            f"custom-{version}",
            version=version,
            config={"factor": factor, "metadata": CUSTOM_METADATA},
        )
    srv = OnnxServer(
        work,
        store,
        [
            "multi=multi.mar",
            "dtypes=dtypes.mar",
            "program=program.mar",
            "custom=custom-1.0.mar",
            "custom=custom-2.0.mar",
        ],
    )
    srv.start()
    srv.onnx_path = multi
    client = triton.InferenceServerClient(srv.inference.removeprefix("http://"))
    deadline = time.monotonic() + 60  # the second version is not the default: /ping ignores it
    while not client.is_model_ready("custom", "2.0") and time.monotonic() < deadline:
        time.sleep(0.1)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LanternServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.inference.removeprefix("http://"))


def multi_inputs(batch: int, seed: int, *, binary: bool) -> tuple[list, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {
        "tokens": rng.integers(0, 50, (batch, 8)).astype(np.int64),
        "image": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32),
    }
    inputs = []
    for name, datatype in (("tokens", "INT64"), ("image", "FP32")):
        entry = triton.InferInput(name, list(arrays[name].shape), datatype)
        entry.set_data_from_numpy(arrays[name], binary_data=binary)
        inputs.append(entry)
    return inputs, arrays


def assert_error(resp: httpx.Response, status: int, fragment: str = "") -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    assert fragment in body["error"]
    return body["error"]


def test_health_and_server_metadata(
    client: triton.InferenceServerClient, server: LanternServer
) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("multi")
    assert client.is_model_ready("custom", "1.0") and client.is_model_ready("custom", "2.0")
    assert not client.is_model_ready("custom", "9.0")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert meta["name"] == "lantern" and "binary_tensor_data" in meta["extensions"]
    assert httpx.get(f"{server.inference}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{server.inference}/v2/health/ready").json() == {"ready": True}
    ready = httpx.get(f"{server.inference}/v2/models/custom/versions/2.0/ready")
    assert ready.json() == {"name": "custom", "ready": True}


def test_model_metadata_is_read_from_the_model(client: triton.InferenceServerClient) -> None:
    assert client.get_model_metadata("multi") == {
        "name": "multi",
        "versions": ["1.0"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "tokens", "datatype": "INT64", "shape": [-1, 8]},
            {"name": "image", "datatype": "FP32", "shape": [-1, 3, 16, 16]},
        ],
        "outputs": [
            {"name": "features", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
    }
    program = client.get_model_metadata("program")
    assert program["platform"] == "pytorch_export"
    assert program["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "n", "datatype": "INT64", "shape": [-1, 1]},
    ]
    custom = client.get_model_metadata("custom", "2.0")
    assert custom["versions"] == ["1.0", "2.0"]
    assert custom["platform"] == "python"  # a custom handler: what its archive declares
    assert {k: custom[k] for k in ("inputs", "outputs")} == CUSTOM_METADATA


@pytest.mark.parametrize("binary", [False, True])
def test_multi_input_multi_output_model(
    client: triton.InferenceServerClient, server: OnnxServer, binary: bool
) -> None:
    inputs, arrays = multi_inputs(3, seed=int(binary), binary=binary)
    outputs = [
        triton.InferRequestedOutput("features", binary_data=binary),
        triton.InferRequestedOutput("probabilities", binary_data=not binary),
    ]
    result = client.infer("multi", inputs, outputs=outputs, request_id=f"req-{binary}")
    features, probabilities = models.run_onnx(server.onnx_path, arrays)
    response = result.get_response()
    assert response["id"] == f"req-{binary}"
    assert (response["model_name"], response["model_version"]) == ("multi", "1.0")
    assert result.as_numpy("features").shape == (3, 4)
    assert result.as_numpy("probabilities").shape == (3, 3)
    np.testing.assert_allclose(result.as_numpy("features"), features, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), probabilities, rtol=1e-5, atol=1e-6
    )
    only = client.infer("multi", inputs, outputs=[triton.InferRequestedOutput("probabilities")])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["probabilities"]


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"caf\xc3\xa9", b""], [b"x", b"tensor"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    dtype = triton_np(datatype)
    return (np.arange(4).reshape(2, 2) * (-1 if dtype().dtype.kind in "if" else 1)).astype(dtype)


def triton_np(datatype: str) -> type:
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips(client: triton.InferenceServerClient, binary: bool) -> None:
    inputs, outputs, samples = [], [], {}
    for dt in DATATYPES:
        samples[dt] = _sample(dt)
        entry = triton.InferInput(f"in_{dt}", [2, 2], dt)
        entry.set_data_from_numpy(samples[dt], binary_data=binary)
        inputs.append(entry)
        outputs.append(triton.InferRequestedOutput(f"out_{dt}", binary_data=binary))
    result = client.infer("dtypes", inputs, outputs=outputs)
    for dt in DATATYPES:
        got = result.as_numpy(f"out_{dt}")
        out = result.get_output(f"out_{dt}")
        assert out["datatype"] == dt and out["shape"] == [2, 2]
        if dt == "BYTES" and not binary:  # JSON carries text: tritonclient gives str back
            assert got.tolist() == [[v.decode() for v in row] for row in samples[dt].tolist()]
        else:
            np.testing.assert_array_equal(got, samples[dt])
            assert got.dtype == samples[dt].dtype


def test_default_outputs_are_binary_for_tritonclient(client: triton.InferenceServerClient) -> None:
    inputs, _ = multi_inputs(1, seed=5, binary=True)
    result = client.infer("multi", inputs)  # no outputs named: tritonclient asks for binary
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])


def test_plain_json_without_content_type(server: LanternServer) -> None:
    body = {
        "id": "plain",
        "inputs": [
            {"name": "in_FP32", "shape": [1, 2], "datatype": "FP32", "data": [[1.5, 2]]},
            {"name": "in_BOOL", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
            *[
                {
                    "name": f"in_{dt}",
                    "shape": [1, 2],
                    "datatype": dt,
                    "data": ["a", "b"] if dt == "BYTES" else [1, 2],
                }
                for dt in DATATYPES
                if dt not in ("FP32", "BOOL")
            ],
        ],
        "outputs": [{"name": "out_FP32"}, {"name": "out_BYTES"}],
    }
    resp = httpx.post(
        f"{server.inference}/v2/models/dtypes/infer",
        content=json.dumps(body).encode(),
        headers={"content-type": ""},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {
        "model_name": "dtypes",
        "model_version": "1.0",
        "id": "plain",
        "outputs": [
            {"name": "out_FP32", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]},
            {"name": "out_BYTES", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]},
        ],
    }


def test_exported_program_through_the_fast_path(client: triton.InferenceServerClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    n = np.array([[2], [3]], dtype=np.int64)
    inputs = [triton.InferInput("x", [2, 4], "FP32"), triton.InferInput("n", [2, 1], "INT64")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(n, binary_data=False)
    result = client.infer("program", inputs)
    np.testing.assert_array_equal(result.as_numpy("output0"), x * n)
    np.testing.assert_array_equal(result.as_numpy("output1"), x.sum(axis=1).astype(np.float64))


def test_compressed_request_and_classification(
    client: triton.InferenceServerClient, server: OnnxServer
) -> None:
    inputs, arrays = multi_inputs(2, seed=9, binary=True)
    outputs = [triton.InferRequestedOutput("probabilities", binary_data=False, class_count=2)]
    result = client.infer("multi", inputs, outputs=outputs, request_compression_algorithm="gzip")
    _, probabilities = models.run_onnx(server.onnx_path, arrays)
    top = result.as_numpy("probabilities")
    assert top.shape == (2, 2)
    for row, probs in zip(top, probabilities, strict=True):
        value, index = row[0].split(":")
        assert int(index) == int(np.argmax(probs))
        assert float(value) == pytest.approx(float(probs.max()), abs=1e-5)


def test_concurrent_requests_batch_and_each_caller_gets_its_rows(
    client: triton.InferenceServerClient, server: OnnxServer
) -> None:
    def call(seed: int) -> tuple[dict, dict]:
        inputs, arrays = multi_inputs(1 + seed % 3, seed=100 + seed, binary=seed % 2 == 0)
        result = triton.InferenceServerClient(server.inference.removeprefix("http://")).infer(
            "multi", inputs
        )
        return arrays, {n: result.as_numpy(n) for n in ("features", "probabilities")}

    before = models.batch_stats(server.metrics, "multi")
    with cf.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, range(48)))
    for arrays, got in answers:
        features, probabilities = models.run_onnx(server.onnx_path, arrays)
        np.testing.assert_allclose(got["features"], features, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
    after = models.batch_stats(server.metrics, "multi")
    batches, requests = after[0] - before[0], after[1] - before[1]
    assert requests == 48
    assert batches < requests, "no batch held more than one request"


def test_versioned_routes_reach_their_version(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    scaled = {}
    for version in ("", "1.0", "2.0"):
        entry = triton.InferInput("x", [1, 4], "FP32")
        entry.set_data_from_numpy(x)
        result = client.infer("custom", [entry], model_version=version)
        assert result.get_response()["model_version"] == (version or "1.0")
        scaled[version] = result.as_numpy("scaled")
    np.testing.assert_array_equal(scaled[""], x * 2)
    np.testing.assert_array_equal(scaled["1.0"], x * 2)
    np.testing.assert_array_equal(scaled["2.0"], x * 3)


def test_unknown_model_and_version_are_404(
    client: triton.InferenceServerClient, server: LanternServer
) -> None:
    base = server.inference
    assert_error(httpx.get(f"{base}/v2/models/nope"), 404, "nope")
    assert_error(httpx.get(f"{base}/v2/models/custom/versions/9.0"), 404, "9.0")
    assert_error(httpx.get(f"{base}/v2/models/custom/versions/9.0/ready"), 404)
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
    assert_error(httpx.post(f"{base}/v2/models/nope/infer", json=body), 404)
    assert_error(httpx.post(f"{base}/v2/models/custom/versions/9.0/infer", json=body), 404)
    assert_error(httpx.get(f"{base}/v2/no/such/route"), 404)
    assert_error(httpx.get(f"{base}/v2/models/multi/infer"), 405)
    entry = triton.InferInput("x", [1], "FP32")
    entry.set_data_from_numpy(np.ones(1, dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [entry])
    assert info.value.status() == "404"


def _infer_error(client: triton.InferenceServerClient, inputs: list, **kwargs) -> str:
    with pytest.raises(InferenceServerException) as info:
        client.infer("multi", inputs, **kwargs)
    assert info.value.status() == "400", info.value
    return info.value.message()


def test_bad_shapes_datatypes_and_names_are_400(
    client: triton.InferenceServerClient, server: LanternServer
) -> None:
    inputs, arrays = multi_inputs(1, seed=3, binary=True)
    wrong_type = triton.InferInput("image", [1, 3, 16, 16], "FP64")
    wrong_type.set_data_from_numpy(arrays["image"].astype(np.float64))
    assert "expecting FP32" in _infer_error(client, [inputs[0], wrong_type])
    wrong_shape = triton.InferInput("image", [1, 3, 8, 32], "FP32")
    wrong_shape.set_data_from_numpy(arrays["image"].reshape(1, 3, 8, 32))
    assert "unexpected shape for input 'image'" in _infer_error(client, [inputs[0], wrong_shape])
    wrong_name = triton.InferInput("picture", [1, 3, 16, 16], "FP32")
    wrong_name.set_data_from_numpy(arrays["image"])
    assert "unexpected inference input 'picture'" in _infer_error(client, [inputs[0], wrong_name])
    assert "missing: image" in _infer_error(client, [inputs[0]])
    assert "unexpected inference output 'logits'" in _infer_error(
        client, inputs, outputs=[triton.InferRequestedOutput("logits")]
    )
    base = f"{server.inference}/v2/models/multi/infer"
    assert_error(httpx.post(base, content=b"{oops"), 400, "failed to parse")
    bad_count = {
        "inputs": [{"name": "tokens", "shape": [1, 8], "datatype": "INT64", "data": [1, 2, 3]}]
    }
    assert_error(httpx.post(base, json=bad_count), 400, "do not match shape [1, 8]")
    bad_type = {"inputs": [{"name": "tokens", "shape": [1], "datatype": "INT65", "data": [1]}]}
    assert_error(httpx.post(base, json=bad_type), 400, "invalid datatype")
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "tokens",
                    "shape": [1, 8],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": 64},
                }
            ]
        }
    ).encode()
    resp = httpx.post(
        base,
        content=head + b"\x00" * 10,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert_error(resp, 400, "runs past the end")
    resp = httpx.post(base, content=gzip.compress(b"x")[:5], headers={"content-encoding": "gzip"})
    assert_error(resp, 400, "could not be decompressed")
    assert client.is_server_live()  # nothing above upset the server
