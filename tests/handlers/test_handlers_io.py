"""decode_value, encode_output, the metrics store and the Context without any model."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from handler_helpers import REPO_ROOT  # noqa: F401  (puts the repo on sys.path)

from handlers.context import Context, RequestProcessor
from handlers.exceptions import UnsupportedOutputType
from handlers.inputs import decode_value
from handlers.metrics import (
    Dimension,
    MetricsCacheKeyError,
    MetricsCacheValueError,
    MetricsStore,
    MetricTypes,
)
from handlers.output import encode_output


@pytest.mark.parametrize(
    ("raw", "content_type", "expected"),
    [
        (b'{"a": [1, 2]}', "application/json", {"a": [1, 2]}),
        (b"[1, 2]", "Application/JSON; charset=utf-8", [1, 2]),
        (b'{"x": 1}', "application/vnd.api+json", {"x": 1}),
        (b"{not json", "application/json", b"{not json"),
        (b"caf\xc3\xa9", "text/plain", "caf\u00e9"),
        (b"caf\xe9", "text/plain; charset=latin-1", "caf\u00e9"),
        (b"\xff\xfe\xfa", "text/plain", b"\xff\xfe\xfa"),
        (b"\x89PNG", "image/png", b"\x89PNG"),
        (b"raw", None, b"raw"),
    ],
)
def test_decode_value(raw, content_type, expected):
    assert decode_value(raw, content_type) == expected


def test_decode_value_can_be_switched_off():
    assert decode_value(b"[1]", "application/json", decode=False) == b"[1]"


def test_encode_output():
    assert encode_output(b"\x00raw") == (b"\x00raw", None)
    assert encode_output(bytearray(b"ab")) == (b"ab", None)
    assert encode_output("h\u00e9") == ("h\u00e9".encode(), "text/plain")
    body, content_type = encode_output({"tabby": 0.5, "n": [1, 2]})
    assert content_type == "application/json"
    assert body.decode() == json.dumps({"tabby": 0.5, "n": [1, 2]}, indent=2)
    assert json.loads(encode_output(np.arange(3))[0]) == [0, 1, 2]
    assert json.loads(encode_output({"p": np.float32(0.5)})[0]) == {"p": 0.5}

    tensor = torch.arange(4.0)
    body, content_type = encode_output(tensor)
    assert content_type == "application/octet-stream"
    assert torch.equal(torch.load(io.BytesIO(body), weights_only=True), tensor)

    with pytest.raises(UnsupportedOutputType, match="object"):
        encode_output(object())


def test_metrics_store_api_and_drain():
    store = MetricsStore("resnet")
    store.set_request_ids({0: "r0"})
    store.add_counter("Hits", 2, None, [Dimension("Route", "a")])
    store.add_counter("Hits", 1, None, {"Route": "b"})
    store.add_time("Pre", 1.5, None, "ms")
    store.add_size("Payload", 3, None, "kB", [{"name": "Kind", "value": "img"}])
    store.add_percent("Busy", 50.0)
    store.add_metric("Sizes", 7, "B", None, None, MetricTypes.HISTOGRAM)
    store.add_counter("Hits", -1)  # negative counter increments are dropped, as in TorchServe
    declared = store.add_metric_to_cache("Custom", "ms", ["Stage"], "gauge")
    declared.add_or_update(4.0, ["decode"])
    assert store.get_metric("Custom", MetricTypes.GAUGE) is declared
    with pytest.raises(MetricsCacheKeyError):
        store.get_metric("Nope")
    with pytest.raises(MetricsCacheValueError):
        store.add_time("Bad", 1, None, "minutes")

    records = store.drain()
    assert store.drain() == []
    assert [(r["name"], r["type"], r["unit"], r["value"]) for r in records] == [
        ("Hits", "counter", "Count", 2),
        ("Hits", "counter", "Count", 1),
        ("Pre", "gauge", "Milliseconds", 1.5),
        ("Payload", "gauge", "Kilobytes", 3),
        ("Busy", "gauge", "Percent", 50.0),
        ("Sizes", "histogram", "Bytes", 7),
        ("Custom", "gauge", "Milliseconds", 4.0),
    ]
    assert records[0]["dimensions"] == {"Route": "a", "ModelName": "resnet", "Level": "Model"}
    assert records[1]["dimensions"]["Route"] == "b"
    assert records[3]["dimensions"]["Kind"] == "img"
    assert records[-1]["dimensions"] == {"Stage": "decode"}
    assert store.cache_keys()[0] == "counter:Hits"


def test_context_surface():
    ctx = Context("m", "/models/m", {"model": {"modelName": "m"}}, 4, None, "0.1", num_threads=3)
    assert ctx.system_properties == {
        "model_dir": "/models/m",
        "gpu_id": None,
        "batch_size": 4,
        "server_name": "MMS",
        "server_version": "0.1",
        "limit_max_image_pixels": True,
        "num_threads": 3,
    }
    assert ctx.model_yaml_config == {} and isinstance(ctx.metrics, MetricsStore)
    assert ctx.get_request_id(0) is None

    ctx.request_ids = {0: "a", 1: "b"}
    ctx.request_processor = [
        RequestProcessor({"Content-Type": "image/png", "ts_request_sequence_id": "seq-1"}),
        RequestProcessor({}),
    ]
    assert ctx.metrics.request_ids == {0: "a", 1: "b"}
    assert ctx.get_request_id(1) == "b"
    assert ctx.get_request_header(0, "content-type") == "image/png"
    assert ctx.get_all_request_header(0)["Content-Type"] == "image/png"
    assert ctx.get_sequence_id(0) == "seq-1"

    ctx.set_response_content_type(1, "text/csv")
    ctx.set_response_header(1, "x-a", "1")
    assert ctx.get_response_content_type(1) == "text/csv"
    assert ctx.get_response_headers(1) == {"content-type": "text/csv", "x-a": "1"}
    assert ctx.request_processor[1].get_response_header("x-a") == "1"

    ctx.set_all_response_status(202, "Accepted")
    ctx.set_response_status(404, "Missing", idx=1)
    assert ctx.get_response_status(0) == (202, "Accepted")
    assert ctx.request_processor[1].get_response_status_code() == 404
    assert ctx.request_processor[1].get_response_status_phrase() == "Missing"
    assert ctx.handler_timings == {} and ctx.intermediate_responses == []
