"""TorchServe's view of protocol requests: the v2 JSON a handler gets, and its answer read back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from handlers.exceptions import HandlerLoadError
from handlers.request_envelope import KServev2Envelope, apply_envelope
from serve.wire import OIP_ID_HEADER, OUTPUTS_HEADER, PARAMETERS_HEADER
from serve.wire.errors import BadRequest, ServeError
from serve.wire.tensor_params import Tensor
from serve.worker import torchserve_rows


def test_v2_request_is_the_json_torchserve_builds() -> None:
    tensors = {
        "x": Tensor.from_array("x", np.arange(4, dtype=np.float32).reshape(2, 2), "FP32"),
        "text": Tensor.from_array(
            "text", np.array([b"caf\xc3\xa9", b"\xff"], dtype=object), "BYTES"
        ),
    }
    headers = {
        OIP_ID_HEADER: "r-1",
        PARAMETERS_HEADER: json.dumps({"top_k": 2}),
        OUTPUTS_HEADER: json.dumps(["y"]),
    }
    body = torchserve_rows.v2_request(tensors, headers, "m")
    assert body == {
        "id": "r-1",
        "model_name": "m",
        "inputs": [
            {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]},
            {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["café", {"b64": "/w=="}]},
        ],
        "parameters": {"top_k": 2},
        "outputs": [{"name": "y"}],
    }
    json.dumps(body)  # all of it is JSON
    # No id, parameters or outputs from the client: none in the body (TorchServe's HTTP body).
    assert set(torchserve_rows.v2_request(tensors, {}, "m")) == {"model_name", "inputs"}


def test_v1_request_and_v2_response_parsing() -> None:
    assert torchserve_rows.v1_request(b'{"instances": [1]}') == {"instances": [1]}
    with pytest.raises(BadRequest):
        torchserve_rows.v1_request(b"{not json")
    answer = {"outputs": [{"name": "y", "shape": [1], "datatype": "INT64", "data": [3]}]}
    assert torchserve_rows.v2_response(json.dumps(answer)) == answer
    assert torchserve_rows.v2_response(json.dumps(answer).encode()) == answer
    assert torchserve_rows.v2_response(answer) is answer


def test_who_gets_torchserve_rows() -> None:
    def context(config: dict) -> SimpleNamespace:
        return SimpleNamespace(model_yaml_config=config)

    plain = SimpleNamespace(envelope=None)
    assert not torchserve_rows.wants_torchserve_rows(plain, context({}))
    assert torchserve_rows.wants_torchserve_rows(plain, context({"protocol_inputs": "torchserve"}))
    assert not torchserve_rows.wants_torchserve_rows(plain, context({"protocol_inputs": "tensors"}))
    wrapped = SimpleNamespace(envelope="kservev2")
    assert torchserve_rows.wants_torchserve_rows(wrapped, context({}))
    with pytest.raises(ServeError, match="protocol_inputs"):
        torchserve_rows.wants_torchserve_rows(plain, context({"protocol_inputs": "json"}))


def test_apply_envelope_wraps_the_entry_point() -> None:
    def handle(data: list, context: object) -> list:
        return [[value * 2 for value in row["data"]] for row in data]

    service = SimpleNamespace(entry_point=handle, envelope=None)
    apply_envelope(service, "kservev2")
    assert service.envelope == "kservev2"
    assert isinstance(service.entry_point.__self__, KServev2Envelope)
    with pytest.raises(HandlerLoadError, match="unknown service_envelope"):
        apply_envelope(service, "soap")
