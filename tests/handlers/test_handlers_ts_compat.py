"""Unmodified TorchServe handlers (``import ts...``) through install_ts_alias and load_service."""

from __future__ import annotations

import importlib
import json
import sys
import warnings

import pytest
import torch
from handler_helpers import set_batch, write

from handlers import exceptions
from handlers.compat import SHIM_ROOT, install_ts_alias

TS_HANDLER = """
    import json

    import torch
    from ts.metrics.dimension import Dimension
    from ts.torch_handler.base_handler import BaseHandler
    from ts.utils.util import PredictionException


    class ScaledHandler(BaseHandler):
        \"\"\"Scales each row by its x-scale header; written against TorchServe's API only.\"\"\"

        def preprocess(self, data):
            rows = []
            for idx, row in enumerate(data):
                values = row.get("data") or row.get("body")
                if values is None:
                    raise PredictionException("missing input", 422)
                if isinstance(values, (bytes, bytearray)):
                    values = json.loads(values)
                scale = float(self.context.get_request_header(idx, "x-scale") or 1)
                rows.append([float(v) * scale for v in values])
            return torch.tensor(rows)

        def postprocess(self, data):
            for idx in range(len(data)):
                self.context.set_response_content_type(idx, "application/json")
                self.context.set_response_header(idx, "x-request", self.context.get_request_id(idx))
            self.context.set_response_status(201, "Created", idx=len(data) - 1)
            self.context.metrics.add_counter(
                "ScaledRows", len(data), None, [Dimension("Kind", "rows")]
            )
            return data.tolist()
    """

STREAMING_HANDLER = """
    from ts.handler_utils.utils import send_intermediate_predict_response


    def handle(data, context):
        if data is None:
            return None
        for step in range(2):
            partial = [f"{row['body']}-{step}" for row in data]
            send_intermediate_predict_response(partial, context.request_ids, "Intermediate", 200,
                                               context)
        return [f"{row['body']}-done" for row in data]
    """


@pytest.fixture
def doubling_model(tmp_path):
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2) * 2)
    path = tmp_path / "double.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notice
        torch.jit.trace(model, torch.ones(1, 2)).save(str(path))
    return path


def test_torchserve_custom_handler_runs_unmodified(package, tmp_path, doubling_model):
    install_ts_alias()
    handler = write(tmp_path / "scaled_handler.py", TS_HANDLER)
    service, ctx = package(model_name="scaled", handler=handler, serialized_file=doubling_model)

    batch = [{"body": [1.0, 2.0]}, {"data": bytearray(b"[3, 4]")}]
    set_batch(ctx, batch, headers=[{"X-Scale": "10"}, {}])  # header case is not significant
    assert service.predict(batch, ctx) == [[20.0, 40.0], [6.0, 8.0]]

    assert ctx.get_response_content_type(0) == "application/json"
    assert ctx.get_response_headers(1)["x-request"] == "req-1"
    assert ctx.get_response_status(0) == (200, None)
    assert ctx.get_response_status(1) == (201, "Created")
    [counter] = [m for m in ctx.metrics.drain() if m["name"] == "ScaledRows"]
    assert counter == {
        "name": "ScaledRows",
        "unit": "Count",
        "type": "counter",
        "value": 2,
        "dimensions": {"Kind": "rows", "ModelName": "scaled", "Level": "Model"},
    }

    missing = [{"other": 1}]
    set_batch(ctx, missing)
    with pytest.raises(exceptions.PredictionException) as info:
        service.predict(missing, ctx)
    assert info.value.error_code == 422
    # The ts shim's exception is Lantern's, so the worker's except clause sees the code.
    assert type(info.value) is exceptions.PredictionException


def test_intermediate_responses_are_recorded(package, tmp_path, doubling_model):
    install_ts_alias()
    handler = write(tmp_path / "streamer.py", STREAMING_HANDLER)
    service, ctx = package(model_name="streamer", handler=handler, serialized_file=doubling_model)
    batch = [{"body": "a"}, {"body": "b"}]
    set_batch(ctx, batch)
    assert service.predict(batch, ctx) == ["a-done", "b-done"]
    assert [chunk["results"] for chunk in ctx.intermediate_responses] == [
        ["a-0", "b-0"],
        ["a-1", "b-1"],
    ]
    assert ctx.intermediate_responses[0]["request_ids"] == {0: "req-0", 1: "req-1"}
    assert ctx.intermediate_responses[0]["code"] == 200

    sent: list[dict] = []
    ctx.intermediate_sink = sent.append  # a streaming worker forwards chunks immediately
    ctx.intermediate_responses.clear()
    service.predict(batch, ctx)
    assert len(sent) == 2 and ctx.intermediate_responses == []


def test_alias_wins_over_an_installed_ts(tmp_path, monkeypatch):
    fake_root = tmp_path / "site"
    write(fake_root / "ts" / "__init__.py", "REAL_TORCHSERVE = True\n")
    write(fake_root / "ts" / "context.py", "class Context:\n    pass\n")
    monkeypatch.syspath_prepend(str(fake_root))
    saved = {n: m for n, m in sys.modules.items() if n == "ts" or n.startswith("ts.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    try:
        assert importlib.import_module("ts").REAL_TORCHSERVE
        importlib.import_module("ts.context")

        install_ts_alias()
        install_ts_alias()  # idempotent
        assert sys.path[0] == SHIM_ROOT and sys.path.count(SHIM_ROOT) == 1

        from handlers.context import Context

        assert importlib.import_module("ts.context").Context is Context
        assert importlib.import_module("ts").LANTERN_SHIM
    finally:
        for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_ts_utility_modules(tmp_path):
    install_ts_alias()
    from ts.context import RequestProcessor
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_type_enum import MetricTypes
    from ts.torch_handler.image_classifier import ImageClassifier
    from ts.utils.util import list_classes_from_module, load_label_mapping, map_class_to_label

    from handlers.image_classifier import ImageClassifier as LanternImageClassifier

    assert ImageClassifier is LanternImageClassifier
    assert str(Dimension("Level", "Model")) == "Level:Model"
    assert MetricTypes("histogram") is MetricTypes.HISTOGRAM
    assert RequestProcessor({"a": "1"}).get_request_property("A") == "1"

    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"0": "cat", "1": "dog"}))
    imagenet = tmp_path / "imagenet.json"
    imagenet.write_text(json.dumps({"0": ["n0", "cat"], "1": ["n1", "dog"]}))
    objects = tmp_path / "objects.json"
    objects.write_text(json.dumps({"object_type_names": ["cat", "dog"]}))
    for path in (plain, imagenet, objects):
        assert load_label_mapping(str(path)) == {"0": "cat", "1": "dog"}
    assert load_label_mapping(str(tmp_path / "missing.json")) is None

    mapping = {"0": "cat", "1": "dog"}
    assert map_class_to_label([[0.25, 0.75]], mapping) == [{"cat": 0.25, "dog": 0.75}]
    assert map_class_to_label([[0.9]], None, [[7]]) == [{"7": 0.9}]

    module = importlib.import_module("ts.torch_handler.image_classifier")
    assert list_classes_from_module(module) == []  # re-exported, not defined there
