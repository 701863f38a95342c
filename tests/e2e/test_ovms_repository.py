"""An OpenVINO Model Server setup served as it is: its tree and its config.json, followed live.

The store holds ``ir/1/model.xml`` + ``model.bin`` (OpenVINO IR, converted from an ONNX model built
in code) and ``onnx/1/whatever.onnx``; ``config.json`` lists them with OVMS's keys. The server is
started with ``--ovms-config`` alone, then the file is rewritten while it runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.protocols import models
from tests.support.server import LanternServer
from tests.support.waiting import wait_for


def _ir(onnx: Path, xml: Path) -> Path:
    import openvino as ov

    xml.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.convert_model(str(onnx)), str(xml))
    return xml


def _entry(name: str, base: Path, **more: Any) -> dict[str, Any]:
    return {"config": {"name": name, "base_path": str(base), **more}}


def _write(path: Path, entries: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"model_config_list": entries}))
    tmp.replace(path)  # OVMS users replace the file too; a half-written one is never read


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LanternServer, Path]]:
    work = tmp_path_factory.mktemp("ovms")
    store = work / "models"
    _ir(models.scale_onnx(work / "ir.onnx", 3.0), store / "ir" / "1" / "model.xml")
    (store / "onnx" / "1").mkdir(parents=True)
    models.scale_onnx(store / "onnx" / "1" / "whatever.onnx", 4.0)
    config = work / "config.json"
    _write(
        config,
        [
            _entry(
                "ir",
                store / "ir",
                target_device="CPU",
                plugin_config={"PERFORMANCE_HINT": "LATENCY"},
                nireq=2,
            ),
            _entry("onnx", store / "onnx", model_version_policy={"latest": {"num_versions": 1}}),
        ],
    )
    srv = LanternServer(work, store, args=["--ovms-config", str(config)])
    srv.start(healthy=False, timeout=180)
    client = thttp.InferenceServerClient(srv.inference.removeprefix("http://"))
    for name in ("ir", "onnx"):
        wait_for(partial(_ready, client, name), 120, f"{name} ready")
    yield srv, config
    srv.stop()


def _ready(client: thttp.InferenceServerClient, name: str) -> bool:
    try:
        return bool(client.is_model_ready(name))
    except InferenceServerException:
        return False


def _input_shape(client: thttp.InferenceServerClient, name: str) -> list[int] | None:
    """The first input's shape, or None while the model is away (being reloaded)."""
    try:
        shape: list[int] = client.get_model_metadata(name)["inputs"][0]["shape"]
        return shape if _ready(client, name) else None
    except InferenceServerException:
        return None


@pytest.fixture(scope="module")
def http(setup: tuple[LanternServer, Path]) -> thttp.InferenceServerClient:
    return thttp.InferenceServerClient(setup[0].inference.removeprefix("http://"))


def test_config_json_models_answer_as_openvino(
    setup: tuple[LanternServer, Path], http: thttp.InferenceServerClient
) -> None:
    import openvino as ov

    server, _ = setup
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    entry = thttp.InferInput("x", [2, 4], "FP32")
    entry.set_data_from_numpy(x)
    compiled = ov.Core().compile_model(str(server.model_store / "ir" / "1" / "model.xml"), "CPU")
    expected = compiled({"x": x})[compiled.outputs[0]]
    np.testing.assert_array_equal(http.infer("ir", [entry]).as_numpy("y"), expected)
    assert http.get_model_metadata("ir")["platform"] == "openvino"
    np.testing.assert_array_equal(http.infer("onnx", [entry]).as_numpy("y"), x * 4)
    # KServe v1 (TF Serving's REST form) reaches the same model
    body = httpx.post(
        f"{server.inference}/v1/models/ir:predict", json={"instances": [[1, 1, 1, 1]]}
    ).json()
    assert body == {"predictions": [[3.0, 3.0, 3.0, 3.0]]}
    notes = json.loads(server.state_file.read_text())["startup"]["notes"]
    assert any("ir" in n and "nireq" in n for n in notes), notes


def test_changes_to_config_json_are_followed(
    setup: tuple[LanternServer, Path], http: thttp.InferenceServerClient
) -> None:
    server, config = setup
    store = server.model_store
    # onnx removed; ir reloaded with a fixed batch of 3; a second name on the same IR added
    _write(config, [_entry("ir", store / "ir", batch_size="3"), _entry("ir2", store / "ir")])
    wait_for(lambda: _ready(http, "ir2") and not _ready(http, "onnx"), 120, "the new config")
    wait_for(lambda: _input_shape(http, "ir") == [3, 4], 120, "ir reloaded")
    two = thttp.InferInput("x", [2, 4], "FP32")
    two.set_data_from_numpy(np.ones((2, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="Expected \\[3, 4\\], got \\[2, 4\\]"):
        http.infer("ir", [two])
    np.testing.assert_array_equal(http.infer("ir2", [two]).as_numpy("y"), np.full((2, 4), 3.0))
    # a broken file changes nothing: the models keep serving
    config.write_text("{broken")
    wait_for(lambda: "OVMS configuration not applied" in server.console_text(), 60, "the error")
    assert _ready(http, "ir") and _ready(http, "ir2")
