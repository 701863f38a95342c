"""The worker's protocol path, in process: the real ``run_batch`` on frames like the frontend's.

Models are built in code and loaded through the worker's own ``load`` from archives made by our
archiver; no server is started, so each case is fast and sees exactly one batch.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from archiver import open_archive
from serve.wire import KSERVE_V1, METADATA, OIP, OUTPUTS_HEADER, PROTOCOL_HEADER
from serve.wire.frames import Frame, MsgType
from serve.wire.messages import WorkerSpec
from serve.wire.tensor_params import decode_bundle, tensor_content_type
from serve.wire.tensors import raw_from_array
from serve.worker.main import load, run_batch
from tests.protocols import models
from tests.support.server import build_archive

Request = tuple[dict[str, Any], list[bytes]]


class SeesBatch(torch.nn.Module):
    """Doubles ``a`` and reports how many rows it was called with; refuses negative input."""

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if bool((a < 0).any()):
            raise ValueError("negative input")
        return a * 2, torch.full((a.shape[0], 1), a.shape[0], dtype=torch.int64)


EAGER_MODEL = """
import torch


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, features, offset):
        return self.linear(features) + offset
"""


def load_model(tmp: Path, name: str, handler: str | Path, **kwargs: Any) -> tuple[Any, Any]:
    store = tmp / f"store-{name}"
    store.mkdir()
    mar = build_archive(store, name, handler, **kwargs)
    archive = open_archive(mar, tmp / f"model-{name}")
    spec = WorkerSpec(
        name,
        "1.0",
        str(archive.model_dir),
        archive.manifest,
        batch_size=8,
        num_threads=1,
        model_yaml_config=archive.model_config,
    )
    return load(spec)


def oip(
    rid: str, tensors: dict[str, tuple[np.ndarray, str]], outputs: list[str] | None = None
) -> Request:
    headers = {PROTOCOL_HEADER: OIP}
    if outputs is not None:
        headers[OUTPUTS_HEADER] = json.dumps(outputs)
    params = [[n, tensor_content_type(dt, a.shape)] for n, (a, dt) in tensors.items()]
    payloads = [raw_from_array(a, dt) for a, dt in tensors.values()]
    return {"id": rid, "headers": headers, "params": params}, payloads


def v1(rid: str, doc: Any, *, explain: bool = False) -> Request:
    headers = {PROTOCOL_HEADER: KSERVE_V1}
    if explain:
        headers["explain"] = "True"
    return (
        {"id": rid, "headers": headers, "params": [["body", "application/json"]]},
        [json.dumps(doc).encode()],
    )


def metadata(rid: str = "md") -> Request:
    return {"id": rid, "headers": {PROTOCOL_HEADER: METADATA}, "params": []}, []


def regular(rid: str, body: bytes, content_type: str = "application/json") -> Request:
    return {"id": rid, "headers": {}, "params": [["body", content_type]]}, [body]


def run(service: Any, context: Any, *requests: Request) -> list[tuple[dict[str, Any], bytes]]:
    frame = Frame(
        MsgType.PREDICT,
        7,
        {"requests": [r for r, _ in requests]},
        tuple(p for _, ps in requests for p in ps),
    )
    result = run_batch(service, context, frame, True)
    assert result.type == MsgType.RESULT and result.seq == 7
    assert len(result.meta["items"]) == len(requests)
    return list(zip(result.meta["items"], result.payloads, strict=True))


def tensors_of(answer: tuple[dict[str, Any], bytes]) -> dict[str, np.ndarray]:
    item, body = answer
    assert "error" not in item, item
    return {t.name: t.array() for t in decode_bundle(body, item["ct"])}


def error_of(answer: tuple[dict[str, Any], bytes]) -> dict[str, Any]:
    assert "error" in answer[0], answer
    return answer[0]["error"]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tensor_path")


@pytest.fixture(scope="module")
def sees_batch(tmp: Path) -> tuple[Any, Any]:
    path = tmp / "sees_batch.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(SeesBatch()).save(str(path))
    return load_model(tmp, "sees_batch", "base_handler", serialized_file=path)


@pytest.fixture(scope="module")
def multi(tmp: Path) -> tuple[Any, Any, Path]:
    path = models.multi_io_onnx(tmp / "multi.onnx")
    return (*load_model(tmp, "multi", "base_handler", serialized_file=path), path)


def test_requests_are_concatenated_run_once_and_split_back(sees_batch) -> None:
    rows = [np.full((n, 3), n, dtype=np.float32) for n in (1, 2, 3)]
    answers = run(*sees_batch, *(oip(f"r{i}", {"a": (r, "FP32")}) for i, r in enumerate(rows)))
    for r, answer in zip(rows, answers, strict=True):
        out = tensors_of(answer)
        np.testing.assert_array_equal(out["output0"], r * 2)  # each caller gets its own rows
        assert out["output1"].reshape(-1).tolist() == [6] * len(r)  # all six rows ran together


def test_requests_that_cannot_share_a_run_are_run_apart(sees_batch) -> None:
    wide = np.ones((1, 5), dtype=np.float32)
    narrow = np.ones((2, 3), dtype=np.float32)
    ints = np.ones((1, 3), dtype=np.int64)
    answers = run(
        *sees_batch,
        oip("w", {"a": (wide, "FP32")}),
        oip("n", {"a": (narrow, "FP32")}),
        oip("i", {"a": (ints, "INT64")}),
    )
    seen = [tensors_of(a)["output1"].reshape(-1)[0] for a in answers]
    assert seen == [1, 2, 1]
    assert tensors_of(answers[2])["output0"].dtype == np.int64


def test_a_failing_request_does_not_fail_the_others_in_its_batch(sees_batch) -> None:
    good = np.ones((2, 3), dtype=np.float32)
    bad = -np.ones((1, 3), dtype=np.float32)
    answers = run(*sees_batch, oip("good", {"a": (good, "FP32")}), oip("bad", {"a": (bad, "FP32")}))
    np.testing.assert_array_equal(tensors_of(answers[0])["output0"], good * 2)
    err = error_of(answers[1])
    assert err["code"] == 500 and err["request_id"] == "bad" and "negative input" in err["message"]


def test_torchscript_metadata_names_inputs_from_the_signature(sees_batch) -> None:
    ((item, body),) = run(*sees_batch, metadata())
    assert item["ct"] == "application/json"
    assert json.loads(body) == {
        "platform": "pytorch_libtorch",
        "inputs": [{"name": "a", "datatype": "", "shape": []}],
        "outputs": [],
        "tensor_path": True,
    }


def test_onnx_metadata_comes_from_the_graph(multi) -> None:
    service, context, _ = multi
    ((_, body),) = run(service, context, metadata())
    assert json.loads(body) == {
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "tokens", "datatype": "INT64", "shape": [-1, 8]},
            {"name": "image", "datatype": "FP32", "shape": [-1, 3, 16, 16]},
        ],
        "outputs": [
            {"name": "features", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
        "tensor_path": True,
    }


def test_onnx_requests_are_checked_one_by_one_against_the_graph(multi) -> None:
    service, context, path = multi
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 50, (2, 8)).astype(np.int64)
    image = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    good: dict[str, tuple[np.ndarray, str]] = {
        "tokens": (tokens, "INT64"),
        "image": (image, "FP32"),
    }
    answers = run(
        service,
        context,
        oip("ok", good),
        oip("dtype", {"tokens": (tokens.astype(np.int32), "INT32"), "image": (image, "FP32")}),
        oip("shape", {"tokens": (tokens[:, :4], "INT64"), "image": (image, "FP32")}),
        oip("name", {**good, "extra": (tokens, "INT64")}),
        oip("missing", {"tokens": (tokens, "INT64")}),
        oip("output", good, outputs=["nope"]),
        oip("subset", good, outputs=["probabilities"]),
    )
    features, probabilities = models.run_onnx(path, {"tokens": tokens, "image": image})
    out = tensors_of(answers[0])
    np.testing.assert_allclose(out["features"], features, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
    expected = {
        1: "unexpected datatype INT32 for inference input 'tokens', expecting INT64",
        2: "unexpected shape for input 'tokens' for model 'multi'. Expected [-1, 8], got [2, 4]",
        3: "unexpected inference input 'extra' for model 'multi'",
        4: "expected 2 inputs but got 1 inputs for model 'multi'; missing: image",
        5: "unexpected inference output 'nope' for model 'multi'",
    }
    for index, message in expected.items():
        err = error_of(answers[index])
        assert err["code"] == 400 and err["message"] == message
    assert list(tensors_of(answers[6])) == ["probabilities"]


def test_kserve_v1_rows_and_columns_on_the_fast_path(multi) -> None:
    service, context, path = multi
    tokens = np.arange(16).reshape(2, 8) % 50
    image = np.linspace(-1, 1, 2 * 3 * 16 * 16).reshape(2, 3, 16, 16)
    rows = v1(
        "rows",
        {
            "instances": [
                {"tokens": tokens[i].tolist(), "image": image[i].tolist()} for i in range(2)
            ]
        },
    )
    cols = v1("cols", {"inputs": {"tokens": tokens.tolist(), "image": image.tolist()}})
    bad = v1("bad", {"instances": [{"tokens": [1, 2], "image": image[0].tolist()}]})
    answers = run(service, context, rows, cols, bad)
    features, probabilities = models.run_onnx(
        path, {"tokens": tokens.astype(np.int64), "image": image.astype(np.float32)}
    )
    predictions = json.loads(answers[0][1])["predictions"]
    assert len(predictions) == 2 and set(predictions[0]) == {"features", "probabilities"}
    np.testing.assert_allclose([p["features"] for p in predictions], features, rtol=1e-5, atol=1e-6)
    outputs = json.loads(answers[1][1])["outputs"]
    np.testing.assert_allclose(outputs["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
    assert error_of(answers[2])["code"] == 400


def test_mixed_batch_regular_protocol_and_metadata(tmp: Path) -> None:
    path = models.scale_onnx(tmp / "scale.onnx", 2.0)
    service, context = load_model(tmp, "scale", "base_handler", serialized_file=path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    answers = run(
        service,
        context,
        regular("plain", b"[1, 2, 3, 4]"),
        oip("tensor", {"x": (x, "FP32")}),
        metadata(),
        v1("v1", {"instances": [[1, 1, 1, 1]]}),
        v1("broken", {"instances": []}),
    )
    assert json.loads(answers[0][1]) == [2.0, 4.0, 6.0, 8.0]  # the base handler's own path
    np.testing.assert_array_equal(tensors_of(answers[1])["y"], x * 2)
    assert json.loads(answers[2][1])["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 4]}
    ]
    assert json.loads(answers[3][1]) == {"predictions": [[2.0, 2.0, 2.0, 2.0]]}
    assert error_of(answers[4])["message"] == "'instances' must be a non-empty list"


def test_exported_program_metadata_and_typed_v1_values(tmp: Path) -> None:
    path = models.exported_pt2(tmp / "program.pt2")
    service, context = load_model(tmp, "program", "base_handler", serialized_file=path)
    answers = run(
        service,
        context,
        metadata(),
        v1("v1", {"instances": [{"x": [1, 2, 3, 4], "n": [2]}, {"x": [0.5, 0, 0, 0], "n": [3]}]}),
        oip("strict", {"x": (np.ones((1, 4)), "FP64"), "n": (np.ones((1, 1), np.int64), "INT64")}),
    )
    assert json.loads(answers[0][1]) == {
        "platform": "pytorch_export",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "n", "datatype": "INT64", "shape": [-1, 1]},
        ],
        "outputs": [
            {"name": "output0", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "output1", "datatype": "FP64", "shape": [-1]},
        ],
        "tensor_path": True,
    }
    assert json.loads(answers[1][1])["predictions"] == [
        {"output0": [2.0, 4.0, 6.0, 8.0], "output1": 10.0},
        {"output0": [1.5, 0.0, 0.0, 0.0], "output1": 0.5},
    ]
    assert "expecting FP32" in error_of(answers[2])["message"]


def test_eager_model_and_declared_metadata(tmp: Path) -> None:
    model_file = tmp / "affine.py"
    model_file.write_text(EAGER_MODEL)
    namespace: dict[str, Any] = {}
    exec(EAGER_MODEL, namespace)
    torch.manual_seed(3)
    weights = tmp / "affine.pt"
    torch.save(namespace["Affine"]().state_dict(), weights)
    declared = {"metadata": {"outputs": [{"name": "score", "datatype": "FP32", "shape": [-1, 1]}]}}
    service, context = load_model(
        tmp,
        "affine",
        "base_handler",
        model_file=model_file,
        serialized_file=weights,
        config=declared,
    )
    features = np.array([[1, 2], [3, 4]], dtype=np.float32)
    offset = np.array([[10], [20]], dtype=np.float32)
    answers = run(
        service,
        context,
        metadata(),
        oip("e", {"features": (features, "FP32"), "offset": (offset, "FP32")}),
    )
    meta = json.loads(answers[0][1])
    assert meta["platform"] == "pytorch_eager"
    assert [i["name"] for i in meta["inputs"]] == ["features", "offset"]
    assert meta["outputs"] == declared["metadata"]["outputs"]
    model = namespace["Affine"]()
    model.load_state_dict(torch.load(weights, weights_only=True))
    expected = model(torch.from_numpy(features), torch.from_numpy(offset)).detach().numpy()
    np.testing.assert_allclose(tensors_of(answers[1])["score"], expected, rtol=1e-6)


def test_fixed_batch_onnx_model_runs_each_request_alone(tmp: Path) -> None:
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(tmp / "fixed.onnx"))
    service, context = load_model(tmp, "fixed", "base_handler", serialized_file=tmp / "fixed.onnx")
    answers = run(
        service,
        context,
        *(oip(str(i), {"x": (np.array([[i, -i]], np.int32), "INT32")}) for i in range(3)),
    )
    assert [tensors_of(a)["y"].tolist() for a in answers] == [[[0, 0]], [[1, -1]], [[2, -2]]]


def test_custom_handler_receives_decoded_requests(tmp: Path) -> None:
    config: dict[str, Any] = {
        "factor": 3,
        "metadata": {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
            "outputs": [{"name": "scaled", "datatype": "FP32", "shape": [-1, 2]}],
        },
    }
    service, context = load_model(
        tmp, "custom", models.HANDLERS / "tensor_handler.py", config=config
    )
    x = np.array([[1, 2]], dtype=np.float32)
    answers = run(
        service,
        context,
        metadata(),
        oip("t", {"x": (x, "FP32")}),
        v1("rows", {"instances": [{"b64": "AAEC"}, "text"]}),
        v1("named", {"instances": [{"a": 1, "b": {"b64": "/w=="}}]}),
        v1("explain", {"inputs": {"q": 1}}, explain=True),
        regular("plain", b"hello", "text/plain"),
    )
    assert json.loads(answers[0][1]) == {
        "platform": "python",
        **config["metadata"],
        "tensor_path": False,
    }
    out = tensors_of(answers[1])
    np.testing.assert_array_equal(out["scaled"], x * 3)
    assert out["dtype"].tolist() == [b"float32"]
    # One handle() call for the OIP row and the three v1 rows; explain requests get their own.
    assert out["batch"].tolist() == [4]
    assert json.loads(answers[2][1]) == {
        "predictions": [
            {"data": {"bytes": 3, "head": "000102"}},
            {"data": {"type": "str", "value": "text", "factor": 3.0}},
        ]
    }
    assert json.loads(answers[3][1]) == {
        "predictions": [
            {"a": {"type": "int", "value": 1, "factor": 3.0}, "b": {"bytes": 1, "head": "ff"}}
        ]
    }
    assert json.loads(answers[4][1]) == {"explanations": {"explained": ["q"]}}
    assert answers[5][0]["status"] == 200  # the regular request took the normal path


def test_custom_handler_errors_reach_every_protocol_request(tmp: Path) -> None:
    handler = tmp / "failing.py"
    handler.write_text(
        "from handlers.exceptions import PredictionException\n"
        "def handle(data, context):\n"
        "    if data is None:\n"
        "        return None\n"
        "    raise PredictionException('no thanks', 422)\n"
    )
    service, context = load_model(tmp, "failing", handler)
    answers = run(
        service,
        context,
        oip("a", {"x": (np.ones(1, np.float32), "FP32")}),
        v1("b", {"instances": [1]}),
        metadata(),
    )
    for answer, rid in zip(answers[:2], ("a", "b"), strict=True):
        err = error_of(answer)
        assert (err["code"], err["message"], err["request_id"]) == (422, "no thanks", rid)
    assert json.loads(answers[2][1])["tensor_path"] is False


def test_bf16_tensors_reach_torch_as_bfloat16(sees_batch) -> None:
    from serve.wire.tensors import bf16_to_float32, float32_to_bf16

    values = np.array([[1.0, 2.5, 3.140625]], dtype=np.float32)  # the model refuses negatives
    (answer,) = run(*sees_batch, oip("bf16", {"a": (float32_to_bf16(values), "BF16")}))
    item, body = answer
    (doubled, _) = decode_bundle(body, item["ct"])
    assert doubled.datatype == "BF16"
    np.testing.assert_array_equal(bf16_to_float32(doubled.array()), values * 2)


def test_undeclared_integer_inputs_refused_by_torch_are_tried_as_fp32() -> None:
    import numpy as np
    import torch

    from handlers.tensor_models import TorchAdapter, values_to_feeds

    torch.manual_seed(0)
    linear = torch.jit.script(torch.nn.Linear(3, 2).eval())
    adapter = TorchAdapter(linear, torch.device("cpu"), "pytorch_torchscript")
    feeds = values_to_feeds(adapter, [{"data": [1, 2, 3]}], columnar=False, model="m")
    assert feeds["input"][1] == "INT64"  # JSON integers are guessed as INT64
    ((_, got, datatype),) = adapter.run(feeds)
    with torch.no_grad():
        want = linear(torch.tensor([[1.0, 2.0, 3.0]])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert datatype == "FP32" and adapter.learned == {"input": "FP32"}
    assert adapter.metadata()["inputs"][0]["datatype"] == "FP32"
    again = values_to_feeds(adapter, [{"data": [4, 5, 6]}], columnar=False, model="m")
    assert again["input"][1] == "FP32"  # now cast to what was learned

    doubler = torch.jit.script(torch.nn.Identity())
    ints = TorchAdapter(doubler, torch.device("cpu"), "pytorch_torchscript")
    ints.run(values_to_feeds(ints, [{"data": [1, 2]}], columnar=False, model="m"))
    assert ints.learned == {}  # a module that takes integers learns nothing
