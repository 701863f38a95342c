"""``service_envelope`` in config.properties: every model's handler wrapped, on every route.

The real handlers run in this process (`tests.support.inline_workers`): one written for
TorchServe's ``kservev2`` envelope, reached by ``/v2/.../infer`` and by ``/predictions`` with the
same JSON, as TorchServe's envelope serves both; and an ONNX model the base handler serves, which
keeps its tensor fast path on ``/v2``.
"""

from __future__ import annotations

from pathlib import Path

from tests.protocols import models
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import build_archive

HANDLER = Path(__file__).resolve().parents[1] / "e2e" / "fidelity" / "kservev2_handler.py"
BODY = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}


def test_a_server_wide_envelope_wraps_every_route(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "v2env", HANDLER)
    models.base_archive(store, "scale", models.scale_onnx(tmp_path / "scale.onnx", 0.5))
    props = tmp_path / "config.properties"
    props.write_text("service_envelope=kservev2\n")

    async def body() -> None:
        startup = ["v2env=v2env.mar", "scale=scale.mar"]
        config = test_config(tmp_path, store, ts_config=props, load_models=startup)
        async with in_process(config, InlineWorkers()) as lantern:
            await check(lantern)

    async def check(lantern: Lantern) -> None:
        for path in ("/v2/models/v2env/infer", "/predictions/v2env"):
            resp = await lantern.inference.post(path, json=BODY)
            assert resp.status_code == 200, (path, resp.text)
            answer = resp.json()
            assert answer["model_name"] == "v2env"
            assert [(o["name"], o["data"]) for o in answer["outputs"]] == [("x", [2, 4, 6])]
        x = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": list(range(8))}
        resp = await lantern.inference.post("/v2/models/scale/infer", json={"inputs": [x]})
        assert resp.status_code == 200, resp.text
        (output,) = resp.json()["outputs"]  # the model's own output, with its shape
        assert (output["name"], output["shape"]) == ("y", [2, 4])
        assert output["data"] == [v * 0.5 for v in range(8)]

    run(body, limit=120)
