"""Triton's ``--model-control-mode poll`` on a Triton model folder: a version folder copied in is
loaded and served, the old one unloaded (``latest: 1``), and load/unload calls are refused."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.protocols import models
from tests.support.server import LanternServer
from tests.support.waiting import wait_for

CONFIG = """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _versions(client: thttp.InferenceServerClient) -> list[str] | None:
    try:
        versions: list[str] = client.get_model_metadata("m")["versions"]
        return versions
    except InferenceServerException:
        return None


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("poll")
    store = work / "models"
    (store / "m" / "1").mkdir(parents=True)
    models.scale_onnx(store / "m" / "1" / "model.onnx", 2.0)
    (store / "m" / "config.pbtxt").write_text(CONFIG)
    (work / "lantern.yaml").write_text("watch_interval: 0.3\n")
    srv = LanternServer(
        work,
        store,
        args=["--model-control-mode", "poll", "--config", str(work / "lantern.yaml")],
    )
    srv.start(healthy=False, timeout=180)
    yield srv
    srv.stop()


def test_a_new_version_folder_is_served(setup: LanternServer) -> None:
    client = thttp.InferenceServerClient(setup.inference.removeprefix("http://"))
    wait_for(lambda: _versions(client) == ["1"], 120, "version 1 served")
    staging = setup.model_store.parent / "staging"
    staging.mkdir()
    models.scale_onnx(staging / "model.onnx", 3.0)
    staging.rename(setup.model_store / "m" / "2")  # a complete folder appears at once
    wait_for(lambda: _versions(client) == ["2"], 120, "version 2 served, 1 unloaded")
    x = thttp.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    wait_for(partial(client.is_model_ready, "m", "2"), 60, "version 2 ready")
    np.testing.assert_array_equal(client.infer("m", [x]).as_numpy("y"), np.full((1, 4), 3.0))
    assert client.get_model_config("m")["max_batch_size"] == 4
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        client.load_model("m")
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        client.unload_model("m")
