"""KServe v1 and TF Serving REST in process, with plain JSON the way their docs show.

The real handlers run in this process (`tests.support.inline_workers`). Models: the multi-input,
multi-output ONNX model (batching on), a one-input ONNX model (TF Serving's ``half_plus_two`` shape
of request), and a torch-free custom handler as two versions.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.protocols import models
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import Lantern, in_process, run, test_config

STARTUP = ["multi=multi.mar", "scale=scale.mar", "custom=custom-1.0.mar", "custom=custom-2.0.mar"]
ONNX: dict[Path, Path] = {}  # store -> the multi-input model's ONNX file


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("kserve_v1")
    store = work / "store"
    store.mkdir()
    multi = models.multi_io_onnx(work / "multi.onnx")
    models.base_archive(store, "multi", multi, config={"batchSize": 8, "maxBatchDelay": 50})
    models.base_archive(store, "scale", models.scale_onnx(work / "scale.onnx", 0.5))
    for version, factor in (("1.0", 2), ("2.0", 3)):
        models.custom_archive(
            store, f"custom-{version}", version=version, config={"factor": factor}
        )
    ONNX[store] = multi
    return store


def serve(store: Path, test: Callable[[Lantern], Awaitable[None]]) -> None:
    async def body() -> None:
        config = test_config(store.parent / "run", store, load_models=STARTUP)
        async with in_process(config, InlineWorkers()) as lantern:
            await test(lantern)

    run(body, limit=120)


async def post(lantern: Lantern, path: str, body: object) -> httpx.Response:
    return await lantern.inference.post(path, json=body)


async def batch_stats(lantern: Lantern, model: str) -> tuple[float, float]:
    """(batches, requests) the server sent to ``model``'s workers, from ``serve_batch_size``."""
    text = (await lantern.metrics.get("/metrics")).text
    batches = requests = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples if family.name == "serve_batch_size" else ():
            if sample.labels.get("model") == model and sample.name.endswith("_count"):
                batches = sample.value
            elif sample.labels.get("model") == model and sample.name.endswith("_sum"):
                requests = sample.value
    return batches, requests


def assert_error(resp: httpx.Response, status: int, fragment: str = "") -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    assert fragment in body["error"]
    return body["error"]


def test_model_list_and_status(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        base = "/v1/models"
        assert (await lantern.inference.get(base)).json() == {
            "models": ["custom", "multi", "scale"]
        }
        ok = {"error_code": "OK", "error_message": ""}
        assert (await lantern.inference.get(f"{base}/custom")).json() == {
            "name": "custom",
            "ready": True,
            "model_version_status": [
                {"version": "1.0", "state": "AVAILABLE", "status": ok},
                {"version": "2.0", "state": "AVAILABLE", "status": ok},
            ],
        }
        one = (await lantern.inference.get(f"{base}/custom/versions/2.0")).json()
        assert [s["version"] for s in one["model_version_status"]] == ["2.0"]
        assert_error(await lantern.inference.get(f"{base}/nope"), 404, "nope")
        assert_error(await lantern.inference.get(f"{base}/custom/versions/9.0"), 404, "9.0")
        assert_error(await lantern.inference.get(f"{base}/multi:predict"), 405)

    serve(store, test)


def test_tf_serving_row_format_single_input(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        resp = await post(
            lantern,
            "/v1/models/scale:predict",
            {"signature_name": "serving_default", "instances": [[1, 2, 3, 4], [5, 6, 7, 8]]},
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "application/json"
        assert resp.json() == {"predictions": [[0.5, 1.0, 1.5, 2.0], [2.5, 3.0, 3.5, 4.0]]}
        named = await post(
            lantern, "/v1/models/scale:predict", {"instances": [{"x": [2, 2, 2, 2]}]}
        )
        assert named.json() == {"predictions": [[1.0, 1.0, 1.0, 1.0]]}

    serve(store, test)


def test_tf_serving_columnar_format(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        resp = await post(lantern, "/v1/models/scale:predict", {"inputs": [[4, 4, 4, 4]]})
        assert resp.json() == {"outputs": [[2.0, 2.0, 2.0, 2.0]]}

    serve(store, test)


def _multi_arrays(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 50, (batch, 8)).astype(np.int64),
        "image": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32),
    }


def test_multi_input_multi_output_rows_and_columns(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        arrays = _multi_arrays(2, seed=1)
        features, probabilities = models.run_onnx(ONNX[store], arrays)
        rows = {
            "instances": [
                {"tokens": arrays["tokens"][i].tolist(), "image": arrays["image"][i].tolist()}
                for i in range(2)
            ]
        }
        predictions = (await post(lantern, "/v1/models/multi:predict", rows)).json()["predictions"]
        assert [set(p) for p in predictions] == [{"features", "probabilities"}] * 2
        np.testing.assert_allclose(
            [p["features"] for p in predictions], features, rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            [p["probabilities"] for p in predictions], probabilities, rtol=1e-5, atol=1e-6
        )
        columns = {"inputs": {k: v.tolist() for k, v in arrays.items()}}
        outputs = (await post(lantern, "/v1/models/multi:predict", columns)).json()["outputs"]
        np.testing.assert_allclose(outputs["features"], features, rtol=1e-5, atol=1e-6)
        assert np.asarray(outputs["probabilities"]).shape == (2, 3)

    serve(store, test)


def test_b64_values_reach_a_custom_handler_as_bytes(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        png = b"\x89PNG\r\n\x1a\n" + bytes(range(8))
        encoded = base64.b64encode(png).decode()
        resp = await post(
            lantern, "/v1/models/custom:predict", {"instances": [{"b64": encoded}, "a sentence", 7]}
        )
        assert resp.json() == {
            "predictions": [
                {"data": {"bytes": 16, "head": "89504e47"}},
                {"data": {"type": "str", "value": "a sentence", "factor": 2.0}},
                {"data": {"type": "int", "value": 7, "factor": 2.0}},
            ]
        }
        named = await post(
            lantern,
            "/v1/models/custom:predict",
            {"instances": [{"image": {"b64": encoded}, "caption": "cat"}]},
        )
        assert named.json()["predictions"][0]["image"] == {"bytes": 16, "head": "89504e47"}

    serve(store, test)


def test_versions_reach_their_version(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        body = {"instances": [1]}
        factors = {}
        for path in (
            "/v1/models/custom:predict",
            "/v1/models/custom/versions/1.0:predict",
            "/v1/models/custom/versions/2.0:predict",
        ):
            factors[path] = (await post(lantern, path, body)).json()["predictions"][0]["data"][
                "factor"
            ]
        assert list(factors.values()) == [2.0, 2.0, 3.0]

    serve(store, test)


def test_explain(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        resp = await post(lantern, "/v1/models/custom:explain", {"instances": [{"a": 1, "b": 2}]})
        assert resp.json() == {"explanations": [{"explained": ["a", "b"]}]}
        # The base handler has no explainer: 501, in the protocol's error form.
        assert_error(
            await post(lantern, "/v1/models/scale:explain", {"instances": [[1, 2, 3, 4]]}),
            501,
            "does not support explanations",
        )

    serve(store, test)


def test_errors(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        assert_error(
            await post(lantern, "/v1/models/nope:predict", {"instances": [1]}), 404, "nope"
        )
        assert_error(
            await post(lantern, "/v1/models/custom/versions/9.0:predict", {"instances": [1]}), 404
        )
        assert_error(
            await post(lantern, "/v1/models/scale:bogus", {"instances": [1]}), 404, ":bogus"
        )
        assert_error(await post(lantern, "/v1/models/scale", {"instances": [1]}), 404)
        raw = await lantern.inference.post("/v1/models/scale:predict", content=b"{nope")
        assert_error(raw, 400, "failed to parse")
        assert_error(
            await post(lantern, "/v1/models/scale:predict", {"instances": []}), 400, "non-empty"
        )
        assert_error(
            await post(lantern, "/v1/models/scale:predict", {"instances": [1], "inputs": [1]}),
            400,
            "exactly one of",
        )
        assert_error(
            await post(lantern, "/v1/models/scale:predict", {"instances": [[1, 2]]}),
            400,
            "unexpected shape for input 'x'",
        )
        assert_error(
            await post(lantern, "/v1/models/scale:predict", {"instances": [[1, 2], [1]]}),
            400,
            "not a regular",
        )
        assert_error(
            await post(lantern, "/v1/models/multi:predict", {"instances": [{"words": [1]}]}),
            400,
            "unexpected inference input 'words'",
        )
        assert_error(
            await post(lantern, "/v1/models/multi:predict", {"instances": [[1]]}),
            400,
            "has 2 inputs; name them in each instance (tokens, image)",
        )
        assert_error(
            await post(lantern, "/v1/models/scale:predict", {"instances": [["a", "b", "c", "d"]]}),
            400,
            "not strings",
        )
        assert_error(
            await post(lantern, "/v1/models/custom:predict", {"instances": [{"b64": "!!"}]}),
            400,
            "invalid base64",
        )

    serve(store, test)


def test_instances_from_concurrent_requests_batch_together(store: Path) -> None:
    async def test(lantern: Lantern) -> None:
        async def call(seed: int) -> tuple[dict[str, np.ndarray], list]:
            arrays = _multi_arrays(1 + seed % 2, seed=200 + seed)
            body = {
                "instances": [
                    {"tokens": t.tolist(), "image": i.tolist()}
                    for t, i in zip(arrays["tokens"], arrays["image"], strict=True)
                ]
            }
            answer = await post(lantern, "/v1/models/multi:predict", body)
            return arrays, answer.json()["predictions"]

        before = await batch_stats(lantern, "multi")
        answers = await asyncio.gather(*(call(seed) for seed in range(36)))
        for arrays, predictions in answers:
            features, _ = models.run_onnx(ONNX[store], arrays)
            assert len(predictions) == len(features)
            np.testing.assert_allclose(
                [p["features"] for p in predictions], features, rtol=1e-5, atol=1e-6
            )
        after = await batch_stats(lantern, "multi")
        assert after[1] - before[1] == 36
        assert after[0] - before[0] < 36, "no batch held more than one request"

    serve(store, test)


def test_the_torchserve_route_still_serves_the_model(store: Path) -> None:
    """The protocol routes sit beside /predictions, which still serves the same model."""

    async def test(lantern: Lantern) -> None:
        resp = await lantern.inference.post("/predictions/scale", json=[2, 4, 6, 8])
        assert resp.status_code == 200
        assert resp.json() == [1.0, 2.0, 3.0, 4.0]

    serve(store, test)
