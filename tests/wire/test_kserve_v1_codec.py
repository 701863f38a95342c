"""KServe v1 / TF Serving bodies: row and columnar requests, b64 values, answers, status."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serve.wire import kserve_v1
from serve.wire.errors import BadRequest


def parse(doc: object) -> kserve_v1.V1Request:
    return kserve_v1.parse_predict(json.dumps(doc).encode())


def test_row_format_plain_and_named_instances() -> None:
    plain = parse({"signature_name": "serving_default", "instances": [[1, 2], [3, 4]]})
    assert not plain.columnar
    assert plain.rows == [{"data": [1, 2]}, {"data": [3, 4]}]
    named = parse({"instances": [{"tokens": [1], "image": [0.5]}, {"tokens": [2], "image": [1]}]})
    assert named.rows == [{"tokens": [1], "image": [0.5]}, {"tokens": [2], "image": [1]}]


def test_columnar_format_is_one_row() -> None:
    assert parse({"inputs": [[1, 2], [3, 4]]}).rows == [{"data": [[1, 2], [3, 4]]}]
    cols = parse({"inputs": {"a": [1, 2], "b": [[3], [4]]}})
    assert cols.columnar and cols.rows == [{"a": [1, 2], "b": [[3], [4]]}]


def test_b64_values_become_bytes_anywhere() -> None:
    req = parse({"instances": [{"b64": "aGVsbG8="}, {"b64": "AAE="}]})
    assert req.rows == [{"data": b"hello"}, {"data": b"\x00\x01"}]
    named = parse({"instances": [{"img": {"b64": "AAE="}, "tags": [{"b64": "eA=="}, "y"]}]})
    assert named.rows == [{"img": b"\x00\x01", "tags": [b"x", "y"]}]
    # An object with keys besides b64 is named inputs, not a binary value.
    assert parse({"instances": [{"b64": "AAE=", "x": 1}]}).rows == [{"b64": "AAE=", "x": 1}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "failed to parse"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "exactly one of"),
        (b'{"instances": [1], "inputs": [1]}', "exactly one of"),
        (b'{"instances": []}', "non-empty list"),
        (b'{"instances": 5}', "non-empty list"),
        (b'{"instances": [{"a": 1}, {"b": 2}]}', "same inputs"),
        (b'{"instances": [{"b64": "@@@"}]}', "invalid base64"),
        (b'{"instances": [{"b64": 5}]}', "must be a string"),
        (b'{"instances": [{}]}', "at least one input"),
    ],
)
def test_bad_bodies_are_400(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        kserve_v1.parse_predict(body)


def test_answers() -> None:
    preds = json.loads(
        kserve_v1.answer(
            [np.array([1.5, 2.0], dtype=np.float32), b"\x00"], columnar=False, explain=False
        )
    )
    assert preds == {"predictions": [[1.5, 2.0], {"b64": "AA=="}]}
    assert json.loads(kserve_v1.answer({"y": [1]}, columnar=True, explain=False)) == {
        "outputs": {"y": [1]}
    }
    assert json.loads(kserve_v1.answer([1], columnar=False, explain=True)) == {"explanations": [1]}


def test_targets_and_status() -> None:
    assert kserve_v1.split_target("mnist:predict") == ("mnist", "predict")
    assert kserve_v1.split_target("a:b:explain") == ("a:b", "explain")
    assert kserve_v1.split_target("mnist") == ("mnist", None)
    status = kserve_v1.status_body("m", [("1.0", "AVAILABLE", ""), ("2.0", "END", "boom")])
    assert status["name"] == "m" and status["ready"] is True
    assert status["model_version_status"][1] == {
        "version": "2.0",
        "state": "END",
        "status": {"error_code": "UNAVAILABLE", "error_message": "boom"},
    }
