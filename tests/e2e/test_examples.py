"""Every example in ``examples/``: built by its own ``build.py``, served, asked, answer checked.

The build scripts run as a user runs them (``python examples/<x>/build.py``, from a folder whose
``model_store/`` they fill). One server then serves every archive at once, started with the
TorchServe migration example's ``config.properties``.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import io
import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.config import Config
from tests.support.server import DATA, REPO, LanternServer

EXAMPLES = REPO / "examples"
MIGRATION = EXAMPLES / "torchserve_migration"
# name served -> archive, for every archive the examples build
MODELS = {
    "efficientnet_lite0": "efficientnet_lite0.mar",
    "resnet18": "resnet18.mar",
    "efficientnet_lite0_onnx": "efficientnet_lite0_onnx.mar",
    "mimo": "mimo.mar",
    "top_class": "top_class.mar",
    "top_class_fn": "top_class_fn.mar",
    "classifier": "classifier.mar",
}
CAT_CLASSES = range(281, 286)  # tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat
ESPRESSO = 967


def _labels() -> dict[int, str]:
    raw = json.loads((DATA / "index_to_name.json").read_text())
    return {int(k): v[-1] for k, v in raw.items()}


LABELS = _labels()
CAT_LABELS = {LABELS[i] for i in CAT_CLASSES}


def build_examples(work: Path) -> Path:
    """Run every example's build.py from ``work`` (in parallel); returns ``work/model_store``."""
    store = work / "model_store"
    # workflow_ensemble builds a workflow: tests/e2e/test_workflow_example.py serves it; llm an
    # LLM: tests/e2e/test_llm_command.py serves it.
    others = ("workflow_ensemble", "llm")
    scripts = sorted(p for p in EXAMPLES.glob("*/build.py") if p.parent.name not in others)
    assert {p.parent.name for p in scripts} == {
        "image_classifier",
        "resnet18_eager",
        "onnx_classifier",
        "multi_input_output",
        "custom_handler",
        "torchserve_migration",
    }
    procs = []
    for script in scripts:
        # The default store (./model_store) for all but one, which names it explicitly.
        extra = ["--model-store", str(store)] if script.parent.name == "resnet18_eager" else []
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *extra],
                cwd=work,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    for script, proc in zip(scripts, procs, strict=True):
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{script} failed:\n{out.decode(errors='replace')}"
        assert b"Wrote " in out
    return store


def wait_models_ready(server: LanternServer, timeout: float = 240.0) -> None:
    """Wait until every model is registered and has its minimum number of workers ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = httpx.get(f"{server.management}/models", timeout=10).json()["models"]
        if {m["modelName"] for m in listed} == set(MODELS):
            described = [server.describe(name)[0] for name in MODELS]
            if all(
                sum(w["status"] == "READY" for w in d["workers"]) >= max(1, d["minWorkers"])
                for d in described
            ):
                return
        time.sleep(0.5)
    raise TimeoutError(f"models not ready:\n{server.console_text()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("examples")
    store = build_examples(work)
    assert sorted(p.name for p in store.iterdir()) == sorted(MODELS.values())
    srv = LanternServer(
        work,
        store,
        [f"{name}={archive}" for name, archive in MODELS.items()],
        args=["--ts-config", str(MIGRATION / "config.properties")],
    )
    srv.start()
    try:
        wait_models_ready(srv)
    except BaseException:
        srv.stop()
        raise
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LanternServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.inference, timeout=60) as c:
        yield c


def predict(client: httpx.Client, model: str, image: bytes) -> httpx.Response:
    """``curl -T image URL``: the image as the raw body of a PUT."""
    return client.put(f"/predictions/{model}", content=image)


def predict_form(client: httpx.Client, model: str, image: bytes) -> httpx.Response:
    """``curl -F data=@image URL``: the image as a multipart form file."""
    return client.post(f"/predictions/{model}", files={"data": ("image.jpg", image)})


def top(answer: dict[str, float]) -> str:
    assert list(answer.values()) == sorted(answer.values(), reverse=True)
    return next(iter(answer))


# ----- image_classifier: the embedded default ---------------------------------------------------


@pytest.mark.parametrize("send", [predict, predict_form], ids=["raw-body", "multipart"])
def test_default_classifier_sees_a_cat_and_an_espresso(
    client: httpx.Client, send, kitten: bytes, coffee: bytes
) -> None:
    cat = send(client, "efficientnet_lite0", kitten)
    assert cat.status_code == 200, cat.text
    assert cat.headers["content-type"].startswith("application/json")
    answer = cat.json()
    assert len(answer) == 5
    assert top(answer) in CAT_LABELS
    assert set(list(answer)[:2]) == {"Egyptian cat", "tabby"}  # what the README promises
    espresso = send(client, "efficientnet_lite0", coffee)
    assert top(espresso.json()) == LABELS[ESPRESSO]


def test_default_classifier_refuses_a_non_image(client: httpx.Client) -> None:
    resp = client.put("/predictions/efficientnet_lite0", content=b"not an image")
    assert resp.status_code == 400
    assert resp.json()["code"] == 400


# ----- onnx_classifier ----------------------------------------------------------------------------


def test_onnx_classifier_agrees_with_torchscript(
    client: httpx.Client, kitten: bytes, coffee: bytes
) -> None:
    for image in (kitten, coffee):
        onnx = predict(client, "efficientnet_lite0_onnx", image).json()
        script = predict(client, "efficientnet_lite0", image).json()
        assert list(onnx) == list(script)
        for label in onnx:
            assert onnx[label] == pytest.approx(script[label], abs=1e-4)
    assert top(predict(client, "efficientnet_lite0_onnx", kitten).json()) in CAT_LABELS


def test_onnx_archive_holds_a_dynamic_batch_graph(server: LanternServer) -> None:
    import onnxruntime as ort

    with zipfile.ZipFile(server.model_store / "efficientnet_lite0_onnx.mar") as mar:
        session = ort.InferenceSession(mar.read("efficientnet_lite0.onnx"))
    (image,) = session.get_inputs()
    (logits,) = session.get_outputs()
    assert (image.name, image.shape[1:]) == ("image", [3, 224, 224])
    assert isinstance(image.shape[0], str)  # symbolic: any batch size
    assert (logits.name, logits.shape[1:]) == ("logits", [1000])


# ----- resnet18_eager -----------------------------------------------------------------------------


def test_resnet18_eager_serves_its_seeded_weights(client: httpx.Client, kitten: bytes) -> None:
    import torch
    from PIL import Image

    from handlers.image_classifier import ImageClassifier
    from handlers.modules import import_file

    model_py = import_file(EXAMPLES / "resnet18_eager" / "model.py", "resnet18_example_model")
    torch.manual_seed(0)  # the seed build.py uses
    model = model_py.ImageClassifier().eval()
    tensor = ImageClassifier.image_processing(Image.open(io.BytesIO(kitten)).convert("RGB"))
    with torch.inference_mode():
        expected = int(model(tensor[None]).argmax(dim=1))

    answer = predict(client, "resnet18", kitten).json()
    assert len(answer) == 5
    assert top(answer) == LABELS[expected]
    assert predict(client, "resnet18", kitten).json() == answer  # deterministic


def test_resnet18_archive_has_the_classic_eager_layout(server: LanternServer) -> None:
    with zipfile.ZipFile(server.model_store / "resnet18.mar") as mar:
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))
        names = set(mar.namelist())
    assert manifest["model"]["modelFile"] == "model.py"
    assert manifest["model"]["serializedFile"] == "resnet18.pth"
    assert manifest["model"]["handler"] == "image_classifier"
    assert {"model.py", "resnet18.pth", "index_to_name.json"} <= names


# ----- custom_handler -----------------------------------------------------------------------------


def test_custom_handler_class_answers_with_its_own_shape(
    client: httpx.Client, kitten: bytes, coffee: bytes
) -> None:
    cat = predict(client, "top_class", kitten)
    assert cat.status_code == 200, cat.text
    body = cat.json()
    assert set(body) == {"label", "index", "score"}
    assert body["index"] in CAT_CLASSES and body["label"] == LABELS[body["index"]]
    assert cat.headers["x-batch-size"].isdigit()
    as_json = client.post(
        "/predictions/top_class", json={"image": base64.b64encode(coffee).decode()}
    )
    assert as_json.json()["index"] == ESPRESSO


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"not an image", {"content-type": "application/octet-stream"}),
        (b'{"picture": "x"}', {"content-type": "application/json"}),
        (b'{"image": "%%%"}', {"content-type": "application/json"}),
    ],
    ids=["garbage", "json-without-image", "bad-base64"],
)
def test_custom_handler_class_rejects_bad_input_with_400(
    client: httpx.Client, body: bytes, headers: dict[str, str]
) -> None:
    resp = client.post("/predictions/top_class", content=body, headers=headers)
    assert resp.status_code == 400, resp.text
    assert resp.json()["type"] == "PredictionException"


def test_custom_handler_model_config_applies(server: LanternServer) -> None:
    (described,) = server.describe("top_class")
    assert described["batchSize"] == 8
    assert described["maxBatchDelay"] == 20
    assert described["minWorkers"] == 2
    assert described["responseTimeout"] == 30
    assert sum(w["status"] == "READY" for w in described["workers"]) == 2


def test_custom_handler_batches_keep_each_answer_with_its_request(
    client: httpx.Client, kitten: bytes, coffee: bytes
) -> None:
    images = [kitten, coffee] * 8
    with cf.ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(lambda image: predict(client, "top_class", image), images))
    for image, resp in zip(images, answers, strict=True):
        assert resp.status_code == 200, resp.text
        if image is kitten:
            assert resp.json()["index"] in CAT_CLASSES
        else:
            assert resp.json()["index"] == ESPRESSO
        assert 1 <= int(resp.headers["x-batch-size"]) <= 8


def test_function_handler(client: httpx.Client, kitten: bytes, coffee: bytes) -> None:
    assert predict(client, "top_class_fn", kitten).json()["index"] in CAT_CLASSES
    assert predict_form(client, "top_class_fn", coffee).json()["label"] == "espresso"
    resp = client.post("/predictions/top_class_fn", json={"image": "x"})
    assert resp.status_code == 400


def test_function_handler_manifest_names_the_function(server: LanternServer) -> None:
    with zipfile.ZipFile(server.model_store / "top_class_fn.mar") as mar:
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))
    assert manifest["model"]["handler"] == "function_handler.py:classify"


# ----- torchserve_migration: a TorchServe user's handler, archive, config and curl lines --------


def test_migration_config_properties_is_read() -> None:
    config = Config.load(ts_config_file=MIGRATION / "config.properties", env={})
    assert config.inference_address == "http://127.0.0.1:8080"
    assert config.model_store == "model_store"
    assert config.load_models == ["classifier=classifier.mar"]
    assert config.default_workers_per_model == 1
    assert config.enable_model_api and config.disable_token_authorization


def test_migration_archive_was_made_by_torch_model_archiver(server: LanternServer) -> None:
    with zipfile.ZipFile(server.model_store / "classifier.mar") as mar:
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))
        handler_source = mar.read("ts_handler.py").decode()
    assert manifest["model"] == {
        "modelName": "classifier",
        "serializedFile": "classifier.pt",
        "handler": "ts_handler.py",
        "modelVersion": "1.0",
    }
    assert "from ts.torch_handler.base_handler import BaseHandler" in handler_source


def test_migration_curl_lines(server: LanternServer, kitten: bytes, coffee: bytes) -> None:
    inference, management = server.inference, server.management
    # curl http://127.0.0.1:8080/ping
    assert httpx.get(f"{inference}/ping").json() == {"status": "Healthy"}
    # curl http://127.0.0.1:8080/predictions/classifier -T kitten.jpg
    cat = httpx.put(f"{inference}/predictions/classifier", content=kitten, timeout=60).json()
    assert len(cat) == 3 and top(cat) in CAT_LABELS
    # curl -X POST http://127.0.0.1:8080/predictions/classifier -F "data=@coffee.jpg"
    cup = httpx.post(
        f"{inference}/predictions/classifier", files={"data": coffee}, timeout=60
    ).json()
    assert top(cup) == "espresso"
    # curl http://127.0.0.1:8081/models
    listed = httpx.get(f"{management}/models").json()["models"]
    assert {"modelName": "classifier", "modelUrl": "classifier.mar"} in listed
    # curl http://127.0.0.1:8081/models/classifier
    (described,) = httpx.get(f"{management}/models/classifier").json()
    assert described["modelVersion"] == "1.0" and described["workers"][0]["status"] == "READY"
    # curl -X POST "http://127.0.0.1:8081/models?url=classifier.mar&model_name=classifier_v2..."
    registered = httpx.post(
        f"{management}/models",
        params={"url": "classifier.mar", "model_name": "classifier_copy", "initial_workers": 0},
    )
    assert registered.status_code == 200, registered.text
    assert "registered with 0 initial workers" in registered.json()["status"]
    # curl -X DELETE http://127.0.0.1:8081/models/classifier_copy
    deleted = httpx.delete(f"{management}/models/classifier_copy")
    assert deleted.json() == {"status": 'Model "classifier_copy" unregistered'}
    # curl http://127.0.0.1:8082/metrics
    metrics = httpx.get(f"{server.metrics}/metrics").text
    assert "ts_inference_requests_total{hostname=" in metrics
    assert 'model_name="classifier"' in metrics


def test_migration_handler_errors_keep_torchserve_codes(client: httpx.Client) -> None:
    resp = client.put("/predictions/classifier", content=b"\x00 not a jpeg")
    assert resp.status_code == 400  # the handler's PredictionException(…, 400)
    assert "Cannot read the image" in resp.json()["message"]


# ----- multi_input_output -------------------------------------------------------------------------


def test_mimo_over_kserve_v2_with_tritonclient(server: LanternServer) -> None:
    """The README's tritonclient call: JSON tokens, a binary image, a JSON and a binary output."""
    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=server.inference.split("://", 1)[1])
    assert client.is_server_live() and client.is_model_ready("mimo")
    metadata = client.get_model_metadata("mimo")
    assert [(i["name"], i["datatype"]) for i in metadata["inputs"]] == [
        ("tokens", "INT64"),
        ("image", "FP32"),
    ]
    assert [(o["name"], o["shape"]) for o in metadata["outputs"]] == [
        ("features", [-1, 16]),
        ("probabilities", [-1, 5]),
    ]
    tokens = np.array([[12, 7, 431, 99, 5, 0], [3, 14, 15, 92, 65, 35]], dtype=np.int64)
    images = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)
    inputs = [
        httpclient.InferInput("tokens", list(tokens.shape), "INT64"),
        httpclient.InferInput("image", list(images.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(tokens)
    inputs[1].set_data_from_numpy(images, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput("features"),
        httpclient.InferRequestedOutput("probabilities", binary_data=True),
    ]
    result = client.infer("mimo", inputs, outputs=outputs)
    features = result.as_numpy("features")
    probabilities = result.as_numpy("probabilities")
    assert features.shape == (2, 16) and probabilities.shape == (2, 5)
    assert probabilities.sum(axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert np.all(np.abs(features) <= 1.0)  # tanh

    # Concurrent callers batched together each get their own row back.
    def one(i: int) -> np.ndarray:
        single = [
            httpclient.InferInput("tokens", [1, 6], "INT64"),
            httpclient.InferInput("image", [1, 3, 64, 64], "FP32"),
        ]
        single[0].set_data_from_numpy(tokens[i : i + 1])
        single[1].set_data_from_numpy(images[i : i + 1], binary_data=True)
        own = httpclient.InferenceServerClient(url=server.inference.split("://", 1)[1])
        return own.infer("mimo", single).as_numpy("features")[0]

    with cf.ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(one, [0, 1] * 4))
    for i, row in enumerate(rows):
        assert row == pytest.approx(features[i % 2], abs=1e-5)
    (described,) = server.describe("mimo")
    assert (described["batchSize"], described["maxBatchDelay"]) == (8, 10)  # model-config.yaml


def test_mimo_over_kserve_v2_with_curl_json(client: httpx.Client) -> None:
    """The README's curl body: a 2x2 image is fine, the model takes any image size."""
    body: dict[str, Any] = {
        "id": "42",
        "inputs": [
            {
                "name": "tokens",
                "datatype": "INT64",
                "shape": [1, 6],
                "data": [12, 7, 431, 99, 5, 0],
            },
            {
                "name": "image",
                "datatype": "FP32",
                "shape": [1, 3, 2, 2],
                "data": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.0, 0.5],
            },
        ],
    }
    resp = client.post("/v2/models/mimo/infer", json=body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert (answer["model_name"], answer["model_version"], answer["id"]) == ("mimo", "1.0", "42")
    shapes = {out["name"]: (out["datatype"], out["shape"]) for out in answer["outputs"]}
    assert shapes == {"features": ("FP32", [1, 16]), "probabilities": ("FP32", [1, 5])}
    wrong = {**body, "inputs": [{**body["inputs"][0], "name": "words"}, body["inputs"][1]]}
    refused = client.post("/v2/models/mimo/infer", json=wrong)
    assert refused.status_code == 400
    assert set(refused.json()) == {"error"}


def test_default_classifier_over_kserve_v1(client: httpx.Client, kitten: bytes) -> None:
    """docs/api.md's KServe v1 call: the image as a b64 instance."""
    body = {"instances": [{"b64": base64.b64encode(kitten).decode()}]}
    resp = client.post("/v1/models/efficientnet_lite0:predict", json=body)
    assert resp.status_code == 200, resp.text
    (prediction,) = resp.json()["predictions"]
    assert top(prediction) in CAT_LABELS


def test_resnet18_eager_command_line_build_leaves_only_the_archive(tmp_path: Path) -> None:
    """The README's model-archiver lines, run literally from a folder laid out like the
    repository's root: the archive appears in model_store/ and nothing else is left behind."""
    readme = (EXAMPLES / "resnet18_eager" / "README.md").read_text()
    block = readme.split("as a TorchServe user would build it")[1].split("```bash\n")[1]
    script = block.split("```")[0]
    (tmp_path / "examples").symlink_to(EXAMPLES)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (tmp_path / "model_store").mkdir()  # as the repository has it
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".venv", "examples", "model_store"]
    assert [p.name for p in (tmp_path / "model_store").iterdir()] == ["resnet18.mar"]
    with zipfile.ZipFile(tmp_path / "model_store" / "resnet18.mar") as mar:
        assert "resnet18.pth" in mar.namelist()
