"""Five TorchServe 0.12 examples, as stand-ins (tests/e2e/torchserve_examples/README.md), archived
with the real torch-model-archiver and served by one in-process Lantern as a TorchServe user would:
a config.properties with metrics_config and install_py_dep_per_model, the same curl-style calls.
The handlers run in inline workers (the worker runtime in this process).

No PyPI artifact carries TorchServe 0.12.0's examples/ (no sdist; the wheel holds only ts/), so
the handlers are our own code using TorchServe's handler API the way each example does.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from PIL import Image
from torchvision import transforms

from tests.app.test_torchserve_archives import real_archiver
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import ThreadedLantern, test_config
from tests.support.server import DATA

EXAMPLES = Path(__file__).resolve().parents[1] / "e2e" / "torchserve_examples"
SEED = 1234


def _wheel(folder: Path, name: str, version: str, source: str) -> Path:
    """A one-module pure-Python wheel, made by hand (no network, no build backend)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


TINY_LRU = '''
from collections import OrderedDict


class LRU:
    """The slice of lru-dict's LRU that TorchServe's stateful example uses."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._items = OrderedDict()

    def has_key(self, key):
        return key in self._items

    def __getitem__(self, key):
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key, value):
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
'''


def _weights(model_file: str, class_name: str, path: Path) -> torch.nn.Module:
    """The model class from a stand-in file, with weights from a fixed seed saved to ``path``."""
    namespace: dict = {}
    exec(compile((EXAMPLES / model_file).read_text(), model_file, "exec"), namespace)
    torch.manual_seed(SEED)
    model = namespace[class_name]()
    torch.save(model.state_dict(), path)
    return model.eval()


def grey_png(seed: int) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(28, 28, generator=generator) * 255).to(torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, "PNG")
    return buffer.getvalue()


class Built:
    """The archives and the in-process reference models."""

    def __init__(self, root: Path) -> None:
        self.store = root / "model_store"
        self.store.mkdir()
        src = root / "src"
        src.mkdir()
        for f in EXAMPLES.iterdir():
            (src / f.name).write_bytes(f.read_bytes())
        (src / "index_to_name.json").write_text('{"0": "a", "1": "b", "2": "c", "3": "d"}')
        self.mnist = _weights("mnist_model.py", "Net", src / "mnist_cnn.pt")
        self.vgg = _weights("vgg_model.py", "ImageClassifier", src / "vgg16.pt")
        _wheel(src, "lantern_tiny_lru", "0.1", TINY_LRU)
        (src / "requirements.txt").write_text("./lantern_tiny_lru-0.1-py3-none-any.whl\n")
        (src / "bad-requirements.txt").write_text("./not-there-0.1-py3-none-any.whl\n")
        # useJobTicket: not supported, refused (continuousBatching alone is supported since:
        # tests/e2e/test_continuous_batching.py).
        (src / "jobticket.yaml").write_text("useJobTicket: true\nbatchSize: 2\n")

        def archive(name: str, *flags: str) -> None:
            real_archiver(
                "--model-name", name, "--version", "1.0", "--export-path", str(self.store),
                *flags, cwd=src,
            )  # fmt: skip

        mnist = ["--model-file", "mnist_model.py", "--serialized-file", "mnist_cnn.pt"]
        archive("mnist", *mnist, "--handler", "mnist_handler.py")
        archive("vgg16", "--model-file", "vgg_model.py", "--serialized-file", "vgg16.pt",
                "--handler", "vgg_handler.py", "--extra-files", "index_to_name.json")  # fmt: skip
        archive("custom_metrics", *mnist, "--handler", "metrics_handler.py")
        archive("micro_batching", "--model-file", "vgg_model.py", "--serialized-file", "vgg16.pt",
                "--handler", "micro_batching_handler.py", "--extra-files", "index_to_name.json",
                "--config-file", "micro_batching.yaml")  # fmt: skip
        archive("stateful", *mnist, "--handler", "stateful_handler.py",
                "--requirements-file", "requirements.txt",
                "--extra-files", "lantern_tiny_lru-0.1-py3-none-any.whl",
                "--config-file", "stateful.yaml")  # fmt: skip
        archive("baddeps", *mnist, "--handler", "mnist_handler.py",
                "--requirements-file", "bad-requirements.txt")  # fmt: skip
        archive("jobticket", *mnist, "--handler", "stateful_handler.py",
                "--config-file", "jobticket.yaml")  # fmt: skip
        self.properties = root / "config.properties"
        self.properties.write_text(
            "metrics_mode=prometheus\n"
            f"metrics_config={src / 'metrics.yaml'}\n"
            "model_metrics_auto_detect=true\n"
            "install_py_dep_per_model=true\n"
            "enable_model_api=true\n"
        )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("ts_examples"))


@pytest.fixture(scope="module")
def server(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedLantern]:
    models = ["mnist", "vgg16", "custom_metrics", "micro_batching", "stateful"]
    config = test_config(
        tmp_path_factory.mktemp("ts_examples_server"),
        built.store,
        ts_config=built.properties,
        load_models=[f"{m}={m}.mar" for m in models],
    )
    with ThreadedLantern(config, InlineWorkers()) as srv:
        yield srv


def predict(
    server: ThreadedLantern, model: str, body: bytes, method: str = "POST", **headers: str
) -> httpx.Response:
    return server.client("inference").request(
        method, f"/predictions/{model}", content=body, headers=headers
    )


def describe(server: ThreadedLantern, model: str) -> list[dict]:
    return server.client("management").get(f"/models/{model}").json()


# ----- mnist: a grey PNG stays grey --------------------------------------------------------------


def test_mnist_grey_png_answers_the_digit_the_model_gives(built: Built, server: ThreadedLantern):
    grey = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    for seed in range(3):
        png = grey_png(seed)
        with torch.inference_mode():
            expected = built.mnist(grey(Image.open(io.BytesIO(png))).unsqueeze(0)).argmax(1).item()
        response = predict(server, "mnist", png, "PUT")  # curl -T, as the example's README
        assert response.status_code == 200, response.text
        assert response.json() == expected


def test_an_rgba_png_is_not_made_grey_for_a_grey_model(server: ThreadedLantern):
    """TorchServe keeps the image's mode: 4 channels reach a 1-channel model and fail (500)."""
    buffer = io.BytesIO()
    Image.new("RGBA", (28, 28), (1, 2, 3, 4)).save(buffer, "PNG")
    response = predict(server, "mnist", buffer.getvalue())
    assert response.status_code == 500
    assert "channels" in response.json()["message"]


# ----- vgg16: an overridden _load_pickled_model still ends in eval() -----------------------------


def test_overridden_loader_answers_the_same_every_call(built: Built, server: ThreadedLantern):
    kitten = (DATA / "kitten.jpg").read_bytes()
    answers = [predict(server, "vgg16", kitten).json() for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]
    stock = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    with torch.inference_mode():
        image = stock(Image.open(io.BytesIO(kitten)).convert("RGB")).unsqueeze(0)
        probabilities = torch.softmax(built.vgg(image), dim=1)[0]
    best = max(answers[0], key=answers[0].get)
    assert best == "abcd"[int(probabilities.argmax())]
    assert answers[0][best] == pytest.approx(float(probabilities.max()), abs=1e-5)


# ----- custom_metrics: metrics.yaml, get_metric, TorchServe's names ------------------------------


def test_custom_metrics_appear_under_torchserve_names(server: ThreadedLantern):
    response = predict(server, "custom_metrics", grey_png(7))
    assert response.status_code == 200, response.text  # get_metric("RequestBatchSize") worked
    text = server.client("metrics").get("/metrics").text
    counters = [
        "InferenceRequestCount",
        "InitializeCallCount",
        "PreprocessCallCount",
        "PostprocessCallCount",
    ]
    for name in counters:
        assert re.search(rf"^# TYPE {name} counter$", text, re.M), name
        assert re.search(rf"^{name}\{{.*\}} [1-9]", text, re.M), name
        assert f"{name}_total" not in text
    for name in ("RequestBatchSize", "SizeOfImage", "HandlerTime", "HandlerMethodTime"):
        assert re.search(rf"^# TYPE {name} gauge$", text, re.M), name
    assert re.search(r"^# TYPE ExamplePercentMetric histogram$", text, re.M)
    assert re.search(r'^ExamplePercentMetric_bucket\{.*le="\+Inf".*\} [1-9]', text, re.M)
    # Declared dimensions, plus Hostname; PreprocessCallCount has only ModelName.
    assert re.search(
        r'^PreprocessCallCount\{Hostname="[^"]+",ModelName="custom_metrics"\}', text, re.M
    )
    assert re.search(r'^InferenceRequestCount\{Hostname="[^"]+"\}', text, re.M)


# ----- micro_batching ----------------------------------------------------------------------------


def test_micro_batching_handler_answers_each_request_in_order(
    built: Built, server: ThreadedLantern
):
    kitten, coffee = (DATA / "kitten.jpg").read_bytes(), (DATA / "coffee.jpg").read_bytes()
    single = {
        name: predict(server, "micro_batching", body).json()
        for name, body in (("kitten", kitten), ("coffee", coffee))
    }
    assert single["kitten"] != single["coffee"]
    bodies = [kitten, coffee] * 5
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: predict(server, "micro_batching", b), bodies))
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.status_code == 200, answer.text
        expected = single["kitten" if body is kitten else "coffee"]
        assert list(answer.json()) == list(expected)  # the same classes, most likely first
        assert answer.json() == pytest.approx(expected, abs=1e-5)  # batched float rounding


# ----- stateful: sequences -----------------------------------------------------------------------

SEQ = "ts_request_sequence_id"


def test_two_clients_without_a_sequence_id_never_share_state(server: ThreadedLantern):
    first = predict(server, "stateful", b"1")
    second = predict(server, "stateful", b"10")
    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.json(), second.json()) == (1, 10)  # not 11: each got a sequence of its own
    a, b = first.headers[SEQ], second.headers[SEQ]
    assert a != b and a.startswith("ts-seq-")
    assert predict(server, "stateful", b"2", **{SEQ: a}).json() == 3
    assert predict(server, "stateful", b"20", **{SEQ: b}).json() == 30
    assert predict(server, "stateful", b"3", **{SEQ: a}).headers[SEQ] == a


def test_sequences_keep_order_on_one_worker_of_two(server: ThreadedLantern):
    described = describe(server, "stateful")[0]
    assert len(described["workers"]) == 2
    sequences = {"alpha": 1, "beta": 100}  # all at once, two sequences, pipelined requests

    def send(job: tuple[str, int]) -> int:
        seq, value = job
        response = predict(server, "stateful", str(value).encode(), **{SEQ: seq})
        assert response.status_code == 200, response.text
        assert response.headers[SEQ] == seq
        return response.json()

    jobs = [(seq, value) for _ in range(6) for seq, value in sequences.items()]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(send, jobs))
    for seq, value in sequences.items():
        got = sorted(a for (s, _), a in zip(jobs, answers, strict=True) if s == seq)
        # One at a time on one worker: every prefix sum exactly once. Two workers, or two requests
        # of a sequence at once, would repeat a partial sum or lose one.
        assert got == [value * i for i in range(1, 7)], (seq, got)


def test_describe_shows_sequence_settings(server: ThreadedLantern):
    stateful = describe(server, "stateful")[0]
    assert stateful["stateful"] is True
    assert stateful["maxNumSequence"] == 8  # max(4, batchSize 4 x maxWorkers 2), as TorchServe
    assert stateful["maxSequenceJobQueueSize"] == 10
    assert stateful["sequenceMaxIdleMSec"] == 60000
    plain = describe(server, "mnist")[0]
    assert (plain["stateful"], plain["maxNumSequence"], plain["maxSequenceJobQueueSize"]) == (
        False,
        0,
        0,
    )


# ----- registration: per-model dependencies and refused settings ---------------------------------


def test_per_model_dependencies_stay_out_of_the_server_environment(server: ThreadedLantern):
    # The stateful handler imports lantern_tiny_lru, which only its own requirements.txt brings.
    assert predict(server, "stateful", b"5").json() == 5
    found = subprocess.run(
        [sys.executable, "-c", "import lantern_tiny_lru"], capture_output=True, timeout=60
    )
    assert found.returncode != 0
    assert "pip: Successfully installed lantern-tiny-lru" in server.log_text()


def test_failing_dependencies_refuse_registration(server: ThreadedLantern):
    response = server.client("management", timeout=300).post("/models?url=baddeps.mar")
    assert response.status_code == 400, response.text
    assert "Failed to install the dependencies of model baddeps" in response.json()["message"]
    assert "not-there" in response.json()["message"]
    listed = server.client("management").get("/models").json()["models"]
    assert "baddeps" not in {m["modelName"] for m in listed}


def test_unsupported_settings_are_refused_at_registration(server: ThreadedLantern):
    response = server.client("management").post("/models?url=jobticket.mar")
    assert response.status_code == 400
    assert "useJobTicket" in response.json()["message"]
    assert "not supported by Lantern (job tickets)" in response.json()["message"]


@pytest.mark.parametrize(
    ("method", "query", "message"),
    [
        ("POST", "/models?url=mnist.mar&batch_size=dd", "batch_size"),
        ("PUT", "/models/mnist?min_worker=nan", "min_worker"),
        ("PUT", "/models/mnist?min_worker=-1", "min_worker cannot be negative"),
        ("POST", "/models?url=mnist.mar&startup_timeout=0", "startup_timeout"),
        ("POST", "/models?url=", "url is required"),
    ],
)
def test_junk_management_parameters_answer_400(
    server: ThreadedLantern, method: str, query: str, message: str
) -> None:
    """Deliberate differences (TorchServe: 200/202/404/500), listed in the migration doc."""
    response = server.client("management").request(method, query)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert len(describe(server, "mnist")[0]["workers"]) == 1  # nothing changed
