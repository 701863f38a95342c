"""Workflows in process: .war files from the real torch-workflow-archiver, served by Lantern.

The DAGs and handlers in ``tests/support/workflows`` reproduce TorchServe 0.12's workflow
examples (see its README there for why they are not TorchServe's own files). One in-process
server serves every workflow; each node's handler runs in an inline worker (the worker runtime in
this process, `tests.support.inline_workers`). That the nodes are worker processes is
`tests/e2e/test_workflows.py`.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import ThreadedLantern, test_config
from tests.support.server import build_archive

WORKFLOWS = Path(__file__).resolve().parents[1] / "support" / "workflows"
_REAL = (
    "import sys; from workflow_archiver.workflow_packaging import generate_workflow_archive; "
    "sys.argv[0] = 'torch-workflow-archiver'; generate_workflow_archive()"
)
PHRASES = {
    "en2de": ("german_output", {"Hello World !!!": "Hallo Welt!!!", "Good night": "Gute Nacht"}),
    "en2fr": ("french_output", {"Hello World !!!": "Bonjour le monde ! ! !"}),
    "de2en": ("english_output", {"Hallo Welt!!!": "Hello world!!!"}),
}
BREEDS = [
    "Kuvasz",
    "Briard",
    "Plott",
    "Icelandic_sheepdog",
    "Cardigan_welsh_corgi",
    "Tibetan_mastiff",
]
# Per-class weights on the mean of each normalised colour channel (R, G, B).
CAT_DOG_WEIGHTS = [[-1.0, 1.0], [0.0, 0.0], [1.0, -1.0]]  # bluer: cat; redder: dog
BREED_WEIGHTS = [
    [1.0, 0.0, 0.0, 0.5, 0.25, 0.0],
    [0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
    [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
]


def real_workflow_archiver(name: str, spec: str, handler: str, out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-c",
            _REAL,
            "--workflow-name",
            name,
            "--spec-file",
            str(WORKFLOWS / spec),
            "--handler",
            str(WORKFLOWS / handler),
            "--export-path",
            str(out),
            "-f",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out / f"{name}.war"


def colour_model(weights: list[list[float]], path: Path) -> Path:
    """A TorchScript classifier on the mean colour of the image: weights made in code."""
    import torch

    class MeanColour(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(weights))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=(2, 3)) @ self.weight

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notice
        torch.jit.script(MeanColour().eval()).save(str(path))
    return path


def image(colour: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    work = tmp_path_factory.mktemp("workflows")
    models, wars, src = work / "model_store", work / "wf_store", work / "src"
    for d in (models, wars, src):
        d.mkdir()
    for name, (key, phrases) in PHRASES.items():
        build_archive(
            models,
            name,
            WORKFLOWS / "phrasebook_handler.py",
            config={"handler": {"output_key": key, "phrases": phrases}},
        )
    labels = src / "index_to_name.json"
    labels.write_text(json.dumps({str(i): b for i, b in enumerate(BREEDS)}))
    build_archive(
        models,
        "cat_dog_classification",
        WORKFLOWS / "cat_dog_handler.py",
        serialized_file=colour_model(CAT_DOG_WEIGHTS, src / "cat_dog.pt"),
    )
    build_archive(
        models,
        "dog_breed_classification",
        WORKFLOWS / "breed_handler.py",
        serialized_file=colour_model(BREED_WEIGHTS, src / "breed.pt"),
        extra_files=[labels],
    )
    for name in ("a", "b"):
        build_archive(
            models,
            f"slow_{name}",
            WORKFLOWS / "sleep_handler.py",
            config={"handler": {"seconds": BRANCH_SECONDS, "name": name}},
        )
    real_workflow_archiver("nmt_wf_dual", "nmt_dual.yaml", "nmt_dual_handler.py", wars)
    real_workflow_archiver("nmt_wf_re", "nmt_re.yaml", "nmt_re_handler.py", wars)
    real_workflow_archiver("dog_breed_wf", "dog_breed.yaml", "dog_breed_handler.py", wars)
    real_workflow_archiver("parallel_wf", "parallel.yaml", "parallel_handler.py", wars)
    return work, models, wars


BRANCH_SECONDS = 1.5  # each parallel branch's sleep
REGISTERED = ("dog_breed_wf", "nmt_wf_dual", "nmt_wf_re", "parallel_wf")


@pytest.fixture(scope="module")
def server(stores: tuple[Path, Path, Path]) -> Iterator[ThreadedLantern]:
    work, models, wars = stores
    config = test_config(
        work / "run",
        models,
        enable_model_api=True,
        workflow_store=str(wars),
        allowed_urls=[r"http://127\.0\.0\.1:9/.*"],
    )
    with ThreadedLantern(config, InlineWorkers()) as srv:
        with cf.ThreadPoolExecutor(4) as pool:
            api = srv.client("management", timeout=300)
            answers = list(
                pool.map(lambda n: api.post("/workflows", params={"url": f"{n}.war"}), REGISTERED)
            )
        srv.registered = dict(zip(REGISTERED, answers, strict=True))  # type: ignore[attr-defined]
        yield srv


@pytest.fixture(scope="module")
def client(server: ThreadedLantern) -> httpx.Client:
    return server.client("inference")


@pytest.fixture(scope="module")
def mgmt(server: ThreadedLantern) -> httpx.Client:
    return server.client("management", timeout=300)


# ----- management -------------------------------------------------------------------------------


def test_register_answers_as_torchserve(server: ThreadedLantern) -> None:
    for name, resp in server.registered.items():  # type: ignore[attr-defined]
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "status": f"Workflow {name} has been registered and scaled successfully."
        }


def test_list_pages_sorted_by_name(mgmt: httpx.Client) -> None:
    listed = mgmt.get("/workflows").json()
    assert listed == {
        "workflows": [{"workflowName": n, "workflowUrl": f"{n}.war"} for n in sorted(REGISTERED)]
    }
    first = mgmt.get("/workflows", params={"limit": 2}).json()
    assert first["nextPageToken"] == "2"
    assert [w["workflowName"] for w in first["workflows"]] == ["dog_breed_wf", "nmt_wf_dual"]
    rest = mgmt.get("/workflows", params={"limit": 2, "next_page_token": 2}).json()
    assert "nextPageToken" not in rest
    assert [w["workflowName"] for w in rest["workflows"]] == ["nmt_wf_re", "parallel_wf"]


def test_describe_shows_the_dag_and_the_nodes_workers(mgmt: httpx.Client) -> None:
    resp = mgmt.get("/workflows/nmt_wf_dual")
    assert resp.status_code == 200
    (described,) = resp.json()
    assert {k: described[k] for k in list(described)[:7]} == {
        "workflowName": "nmt_wf_dual",
        "workflowUrl": "nmt_wf_dual.war",
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": 4,
        "maxBatchDelay": 100,
        "workflowDag": (
            "{pre_processing=[nmt_en_de, nmt_en_fr], nmt_en_de=[aggregate_func], "
            "nmt_en_fr=[aggregate_func]}"
        ),
    }
    assert described["dag"] == {
        "pre_processing": ["nmt_en_de", "nmt_en_fr"],
        "nmt_en_de": ["aggregate_func"],
        "nmt_en_fr": ["aggregate_func"],
        "aggregate_func": [],
    }
    nodes = {n["name"]: n for n in described["nodes"]}
    assert nodes["aggregate_func"]["type"] == "function"
    assert nodes["nmt_en_de"]["type"] == "model"
    assert nodes["nmt_en_de"]["modelName"] == "nmt_wf_dual__nmt_en_de"
    assert (nodes["nmt_en_de"]["retryAttempts"], nodes["nmt_en_de"]["timeoutMs"]) == (5, 300000)
    for node in nodes.values():
        assert [w["status"] for w in node["model"]["workers"]] == ["READY"]


def test_nodes_are_models_named_workflow__node(mgmt: httpx.Client) -> None:
    # GET /models lists the model nodes only, as TorchServe does; function nodes are models too
    # (described, scaled, counted) but not listed.
    names = {m["modelName"] for m in mgmt.get("/models").json()["models"]}
    for node in ("nmt_en_de", "nmt_en_fr"):
        assert f"nmt_wf_dual__{node}" in names
    for node in ("pre_processing", "aggregate_func"):
        assert f"nmt_wf_dual__{node}" not in names
        assert mgmt.get(f"/models/nmt_wf_dual__{node}").status_code == 200
    (model,) = mgmt.get("/models/nmt_wf_dual__nmt_en_de").json()
    assert (model["batchSize"], model["maxBatchDelay"], model["maxWorkers"]) == (4, 100, 1)
    (function,) = mgmt.get("/models/nmt_wf_dual__aggregate_func").json()
    assert (function["batchSize"], function["maxBatchDelay"]) == (1, 0)
    assert function["modelVersion"] == "1.0"


@pytest.mark.parametrize(
    ("params", "status", "kind", "message"),
    [
        ({}, 400, "BadRequestException", "Parameter url is required."),
        (
            {"url": "missing.war"},
            404,
            "WorkflowNotFoundException",
            "Workflow not found in workflow store: missing.war",
        ),
        (
            {"url": "nmt_wf_dual.war"},
            409,
            "ConflictStatusException",
            "Workflow nmt_wf_dual is already registered.",
        ),
        (
            {"url": "http://127.0.0.1:9/x.mar"},
            400,
            "InvalidModelUrl",
            "does not end in a workflow archive file name (.war)",
        ),
        (
            {"url": "http://example.com/x.war"},
            400,
            "InvalidModelUrl",
            "does not match any allowed URL",
        ),
        ({"url": "../x.war"}, 400, "InvalidModelUrl", "path traversal"),
    ],
    ids=["no-url", "not-found", "duplicate", "not-a-war", "not-allowed", "traversal"],
)
def test_register_errors(mgmt: httpx.Client, params, status, kind, message) -> None:
    resp = mgmt.post("/workflows", params=params)
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert (body["code"], body["type"]) == (status, kind)
    assert message in body["message"]


def test_an_invalid_dag_is_refused(
    mgmt: httpx.Client, stores: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, wars = stores
    spec = tmp_path / "two_starts.yaml"
    spec.write_text("models:\n  m:\n    url: en2de.mar\ndag:\n  a: [m]\n  b: [m]\n")
    handler = tmp_path / "h.py"
    handler.write_text("def a(data, context):\n    return data\n")
    subprocess.run(
        [sys.executable, "-c", _REAL, "--workflow-name", "two_starts", "--spec-file", str(spec)]
        + ["--handler", str(handler), "--export-path", str(wars), "-f"],
        check=True,
        timeout=60,
    )
    resp = mgmt.post("/workflows", params={"url": "two_starts.war"})
    assert resp.status_code == 400
    assert resp.json()["type"] == "InvalidDAGException"
    assert "only one start node" in resp.json()["message"]


def test_a_node_that_cannot_register_rolls_the_workflow_back(
    mgmt: httpx.Client, stores: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, wars = stores
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        "models:\n  good:\n    url: en2de.mar\n  bad:\n    url: nowhere.mar\ndag:\n  good: [bad]\n"
    )
    handler = tmp_path / "h.py"
    handler.write_text("")
    subprocess.run(
        [sys.executable, "-c", _REAL, "--workflow-name", "broken", "--spec-file", str(spec)]
        + ["--handler", str(handler), "--export-path", str(wars), "-f"],
        check=True,
        timeout=60,
    )
    resp = mgmt.post("/workflows", params={"url": "broken.war"})
    assert resp.status_code == 500
    body = resp.json()
    assert body["type"] == "WorkflowException"
    assert body["message"].startswith("Workflow broken has failed to register. Failures: [")
    assert "Workflow Node broken__bad failed to register" in body["message"]
    names = {m["modelName"] for m in mgmt.get("/models").json()["models"]}
    assert not {n for n in names if n.startswith("broken__")}
    assert mgmt.get("/workflows/broken").status_code == 404


def test_a_function_missing_from_the_handler_fails_registration(
    mgmt: httpx.Client, stores: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, wars = stores
    spec = tmp_path / "nofn.yaml"
    spec.write_text("dag:\n  missing_fn: []\n")
    handler = tmp_path / "nofn_handler.py"
    handler.write_text("def other(data, context):\n    return data\n")
    subprocess.run(
        [sys.executable, "-c", _REAL, "--workflow-name", "nofn", "--spec-file", str(spec)]
        + ["--handler", str(handler), "--export-path", str(wars), "-f"],
        check=True,
        timeout=60,
    )
    resp = mgmt.post("/workflows", params={"url": "nofn.war"})
    assert resp.status_code == 500
    message = resp.json()["message"]
    assert "Workflow Node nofn__missing_fn failed to register" in message
    assert "has no function 'missing_fn'" in message
    names = {m["modelName"] for m in mgmt.get("/models").json()["models"]}
    assert "nofn__missing_fn" not in names


def test_unknown_workflow_is_404_everywhere(mgmt: httpx.Client, client: httpx.Client) -> None:
    for resp in (
        mgmt.get("/workflows/nope"),
        mgmt.delete("/workflows/nope"),
        client.post("/wfpredict/nope", content=b"x"),
    ):
        assert resp.status_code == 404
        assert resp.json() == {
            "code": 404,
            "type": "WorkflowNotFoundException",
            "message": "Workflow not found: nope",
        }


def test_unregister_removes_the_workflow_and_its_models(
    mgmt: httpx.Client, client: httpx.Client
) -> None:
    # A JSON body works as query parameters do; workflow_name renames the workflow.
    resp = mgmt.post("/workflows", json={"url": "nmt_wf_re.war", "workflow_name": "re_copy"})
    assert resp.json() == {
        "status": "Workflow re_copy has been registered and scaled successfully."
    }
    assert client.post("/wfpredict/re_copy", content=b"Hello World !!!").status_code == 200
    gone = mgmt.delete("/workflows/re_copy")
    assert gone.status_code == 200
    assert gone.json() == {"status": 'Workflow "re_copy" unregistered'}
    names = {m["modelName"] for m in mgmt.get("/models").json()["models"]}
    assert not {n for n in names if n.startswith("re_copy__")}
    assert client.post("/wfpredict/re_copy", content=b"x").status_code == 404


# ----- inference: TorchServe's example flows -----------------------------------------------------


def test_dual_translation_parallel_fan_in(client: httpx.Client) -> None:
    resp = client.put("/wfpredict/nmt_wf_dual", content=b"Hello World !!!\n")  # curl -T
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {
        "english_input": "Hello World !!!\n",
        "german_translation": "Hallo Welt!!!",
        "french_translation": "Bonjour le monde ! ! !",
    }


def test_dual_translation_concurrent_requests_keep_their_answers(client: httpx.Client) -> None:
    texts = ["Hello World !!!", "Good night", "nothing known", "Hello World !!!"]
    with cf.ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda t: client.post("/wfpredict/nmt_wf_dual", content=t.encode()), texts)
        )
    for text, resp in zip(texts, answers, strict=True):
        assert resp.status_code == 200
        assert resp.json()["english_input"] == text
    assert answers[1].json()["german_translation"] == "Gute Nacht"
    assert answers[2].json()["french_translation"] == "<nothing known>"


def test_back_translation_sequential(client: httpx.Client) -> None:
    resp = client.post("/wfpredict/nmt_wf_re", content=b"Hello World !!!\n")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "german_translation": "Hallo Welt!!!",
        "english_re_translation": "Hello world!!!",
    }


def test_dog_breed_skip_edge_fan_in(client: httpx.Client) -> None:
    import torch

    cat = client.put("/wfpredict/dog_breed_wf", content=image((20, 40, 230)))
    assert cat.status_code == 200, cat.text
    assert cat.content == b"It's a cat!"  # the leaf's bytes, as TorchServe answers them
    dog = client.put("/wfpredict/dog_breed_wf", content=image((230, 30, 20)))
    assert dog.status_code == 200, dog.text
    answer = dog.json()
    # What the breed model gives for that colour after ImageClassifier's normalisation.
    mean = torch.tensor([230, 30, 20]) / 255.0
    channel = (mean - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    probs = torch.softmax(channel @ torch.tensor(BREED_WEIGHTS), dim=0)
    top = torch.topk(probs, 5)
    expected = {BREEDS[int(i)]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    assert list(answer) == list(expected)
    for breed, p in expected.items():
        assert answer[breed] == pytest.approx(p, abs=1e-4)


def test_parallel_branches_run_concurrently(client: httpx.Client) -> None:
    assert client.post("/wfpredict/parallel_wf", content=b"warm").status_code == 200
    started = time.perf_counter()
    resp = client.post("/wfpredict/parallel_wf", content=b"go")
    elapsed = time.perf_counter() - started
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["a"] == {"branch": "a", "got": "go"}
    assert answer["b"] == {"branch": "b", "got": "go"}
    assert sorted(answer["order"]) == ["slow_a", "slow_b"]  # fan-in: parameters by parent name
    # One branch after the other would take at least 3 s; at once, 1.5 s plus the hops.
    assert BRANCH_SECONDS <= elapsed < 2 * BRANCH_SECONDS - 0.4, elapsed


def test_a_failing_function_node_answers_500_naming_it(
    server: ThreadedLantern, client: httpx.Client
) -> None:
    resp = client.post(
        "/wfpredict/parallel_wf", content=b"boom", headers={"x-request-id": "wf-boom-1"}
    )
    assert resp.status_code == 500
    body = resp.json()
    assert (body["code"], body["type"]) == (500, "InternalServerException")
    assert body["message"].startswith("Error executing start: failed after 2 attempt(s)")
    assert "wf-boom-1" in body["message"]
    assert resp.headers["x-request-id"] == "wf-boom-1"
    # The server, and the workflow, keep serving.
    assert client.post("/wfpredict/parallel_wf", content=b"fine").status_code == 200
    assert client.get("/ping").json() == {"status": "Healthy"}
    log = server.log_text()
    assert "wf-boom-1" in log and "start node refuses 'boom'" in log


def test_workflow_and_direct_requests_share_a_batch(
    server: ThreadedLantern, client: httpx.Client, tmp_path: Path
) -> None:
    marker = tmp_path / "busy"
    direct = "/predictions/nmt_wf_dual__nmt_en_de"
    with cf.ThreadPoolExecutor(3) as pool:
        blocker = pool.submit(client.post, direct, content=f"SLOW {marker}".encode())
        deadline = time.monotonic() + 30
        while not marker.exists():  # the worker is now busy for 1.5 s
            assert time.monotonic() < deadline, "the blocking request never reached its worker"
            time.sleep(0.01)
        workflow = pool.submit(
            client.post,
            "/wfpredict/nmt_wf_dual",
            content=b"Hello World !!!",
            headers={"x-request-id": "wf-batch"},
        )
        # Both wait in the model's queue while the worker is busy, whichever arrives first.
        alone = pool.submit(client.post, direct, content=b"Good night")
        assert blocker.result().status_code == 200
        assert workflow.result().status_code == 200
        answer = alone.result().json()
    assert answer["german_output"] == "Gute Nacht"
    assert "wf-batch:nmt_en_de" in answer["batch"]


def test_metrics_and_access_log_per_workflow_and_node(
    server: ThreadedLantern, client: httpx.Client
) -> None:
    assert client.post("/wfpredict/nmt_wf_re", content=b"Hello World !!!").status_code == 200
    text = server.client("metrics").get("/metrics").text
    assert 'serve_workflow_requests_total{status="200",workflow="nmt_wf_re"}' in text
    assert 'serve_workflow_node_duration_seconds_count{node="nmt_de_en",workflow="nmt_wf_re"}' in (
        text
    )
    assert 'serve_workflow_node_calls_total{node="post_processing",outcome="ok",' in text
    assert "workflow=nmt_wf_re node=post_processing status=200" in server.log_text()


def test_a_node_past_its_timeout_ms_is_retried_then_fails(
    mgmt: httpx.Client, client: httpx.Client, stores: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, wars = stores
    spec = tmp_path / "impatient.yaml"
    spec.write_text(
        "models:\n  retry-attempts: 1\n  slow:\n    url: slow_a.mar\n    timeout-ms: 300\n"
        "dag:\n  slow: []\n"
    )
    handler = tmp_path / "h.py"
    handler.write_text("")
    subprocess.run(
        [sys.executable, "-c", _REAL, "--workflow-name", "impatient", "--spec-file", str(spec)]
        + ["--handler", str(handler), "--export-path", str(wars), "-f"],
        check=True,
        timeout=60,
    )
    assert mgmt.post("/workflows", params={"url": "impatient.war"}).status_code == 200
    try:
        resp = client.post("/wfpredict/impatient", content=b"x")
        assert resp.status_code == 500
        message = resp.json()["message"]
        assert message.startswith("Error executing slow: failed after 2 attempt(s)")
        assert "no answer within timeout-ms (300 ms)" in message
    finally:
        assert mgmt.delete("/workflows/impatient").status_code == 200
