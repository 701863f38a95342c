"""The pb_utils shim's BLS pieces in process: tensors to OIP JSON and back, the token read."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handlers.triton_python import SHIM_ROOT


@pytest.fixture
def pb_utils() -> Any:
    sys.path.insert(0, SHIM_ROOT)
    try:
        yield importlib.import_module("triton_python_backend_utils")
    finally:
        sys.path.remove(SHIM_ROOT)


@pytest.mark.parametrize(
    ("array", "datatype"),
    [
        (np.arange(6, dtype=np.float32).reshape(2, 3), "FP32"),
        (np.array([[1, 2]], dtype=np.int64), "INT64"),
        (np.array([True, False]), "BOOL"),
    ],
)
def test_tensors_round_trip_through_oip_json(pb_utils: Any, array: Any, datatype: str) -> None:
    entry = pb_utils._tensor_json(pb_utils.Tensor("t", array))
    assert entry["datatype"] == datatype and entry["shape"] == list(array.shape)
    back = pb_utils._tensor_of(json.loads(json.dumps(entry)))
    np.testing.assert_array_equal(back.as_numpy(), array)
    assert back.as_numpy().dtype == array.dtype


def test_bls_token_from_the_key_file(pb_utils: Any, tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": "secret"}}))
    pb_utils.configure_bls({"url": "http://127.0.0.1:1", "key_file": str(key_file)})
    assert pb_utils._inference_token() == "secret"
    pb_utils.configure_bls({"url": "http://127.0.0.1:1", "key_file": None})
    assert pb_utils._inference_token() is None


def test_bls_without_a_server_says_so(pb_utils: Any) -> None:
    pb_utils.configure_bls(None)
    request = pb_utils.InferenceRequest("m", [pb_utils.Tensor("x", np.zeros(2))], [])
    with pytest.raises(pb_utils.TritonModelException, match="inference address"):
        request.exec()
    pb_utils.configure_bls({"url": "http://127.0.0.1:1"})  # nothing listens there
    response = request.exec()
    assert response.has_error() and "BLS call failed" in response.error().message()
