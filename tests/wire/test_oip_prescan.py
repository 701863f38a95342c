"""`oip.declared_elements`: the shapes a JSON request declares, read without parsing its data
(issue 27, item 7). A body refused for them must be one the full parse refuses too."""

from __future__ import annotations

import json

import pytest

from serve.wire import oip
from serve.wire.errors import PayloadTooLarge


def doc(*inputs: dict, **fields: object) -> bytes:
    return json.dumps({**fields, "inputs": list(inputs)}).encode()


@pytest.mark.parametrize(
    ("body", "count"),
    [
        (doc({"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [0] * 6}), 6),
        (doc({"name": "x", "shape": [2, 3]}, {"name": "y", "shape": [4], "data": [1]}), 10),
        (doc({"name": "x", "shape": []}), 1),  # a scalar
        # a "shape" elsewhere: in an input's parameters, in the outputs, under another key
        (doc({"name": "x", "parameters": {"shape": "[9]"}, "shape": [5]}), 5),
        (doc({"name": "x", "shape": [5]}, outputs=[{"name": "shape", "shape": [99]}]), 5),
        (b'{"x": {"inputs": [{"shape": [999]}]}, "inputs": [{"shape": [3]}]}', 3),
        (b'{"inputs": [{"name": "x", "shape": [5], "shape": [7]}]}', 7),  # the last one counts
        (b'{"inputs": [{"shape": [99]}], "inputs": [{"shape": [2]}]}', 2),  # here too
        (b'{"inputs": [{"name": "{[", "data": [" shape ", "x"], "shape": [4]}]}', 4),
        # strings with escapes may hide quotes: nothing is certain, nothing is counted
        (b'{"inputs": [{"name": "\\"shape\\": [999]", "shape": [5]}]}', 0),
        (b'{"inputs": [{"data": ["\\"shape\\": [99]"], "shape": [2]}]}', 0),
        # "shape" inside a string (the head ends there): not counted
        (b'{"inputs": [{"name": "a", "data": ["is "shape": [9] here"]}]}', 0),
        (b'{"inputs": [{"shape": [12', 0),  # the head ends inside the shape
    ],
)
def test_declared_elements(body: bytes, count: int) -> None:
    assert oip.declared_elements(body) == count


def test_only_the_head_is_read() -> None:
    data = ["ab"] * 100_000
    first = doc({"name": "x", "shape": [100_000], "datatype": "BYTES", "data": data})
    last = doc({"name": "x", "datatype": "BYTES", "data": data, "shape": [100_000]})
    assert len(last) > oip.PRESCAN_BYTES
    assert oip.declared_elements(first) == 100_000
    assert oip.declared_elements(last) == 0  # the full parse counts that one


def test_refused_early_only_where_the_full_parse_refuses() -> None:
    body = doc({"name": "x", "shape": [11], "datatype": "FP32", "data": [0.5] * 11})
    for refuse in (oip.refuse_declared, lambda b, m: oip.parse_request(b, None, m)):
        with pytest.raises(PayloadTooLarge, match="11 tensor elements.*at most 10"):
            refuse(body, 10)
    oip.refuse_declared(body, 11)
    oip.refuse_declared(body, None)
    assert oip.parse_request(body, None, 11).inputs[0].shape == (11,)
