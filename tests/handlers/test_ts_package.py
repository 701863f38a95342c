"""The ``ts`` shim, module by module: what TorchServe handlers import behaves as TorchServe's."""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import threading

import pytest
import torch
from handler_helpers import REPO_ROOT, make_context, set_batch, write
from PIL import Image

from archiver import build, open_archive
from handlers.compat import SHIM_ROOT, install_ts_alias
from handlers.context import Context, RequestProcessor
from handlers.images import ToRGB, decode_image
from handlers.service import load_service

install_ts_alias()

# Every module of TorchServe 0.12's ts/ that the shim provides (the rest are listed as absent,
# with the reason, in docs/migrating-from-torchserve.md).
SHIM_MODULES = {
    "ts",
    "ts.context",
    "ts.version",
    "ts.handler_utils",
    "ts.handler_utils.hf_batch_streamer",
    "ts.handler_utils.micro_batching",
    "ts.handler_utils.text_utils",
    "ts.handler_utils.timer",
    "ts.handler_utils.utils",
    "ts.metrics",
    "ts.metrics.caching_metric",
    "ts.metrics.dimension",
    "ts.metrics.metric",
    "ts.metrics.metric_abstract",
    "ts.metrics.metric_cache_abstract",
    "ts.metrics.metric_cache_errors",
    "ts.metrics.metric_cache_yaml_impl",
    "ts.metrics.metric_encoder",
    "ts.metrics.metric_type_enum",
    "ts.metrics.metrics_store",
    "ts.metrics.unit",
    "ts.protocol",
    "ts.protocol.otf_message_handler",
    "ts.torch_handler",
    "ts.torch_handler.base_handler",
    "ts.torch_handler.image_classifier",
    "ts.torch_handler.image_segmenter",
    "ts.torch_handler.object_detector",
    "ts.torch_handler.request_envelope",
    "ts.torch_handler.request_envelope.base",
    "ts.torch_handler.request_envelope.body",
    "ts.torch_handler.request_envelope.json",
    "ts.torch_handler.request_envelope.kserve",
    "ts.torch_handler.request_envelope.kservev2",
    "ts.torch_handler.text_classifier",
    "ts.torch_handler.text_handler",
    "ts.torch_handler.vision_handler",
    "ts.utils",
    "ts.utils.timeit_decorator",
    "ts.utils.util",
}


def test_every_shim_module_imports_and_is_listed() -> None:
    found = {"ts"}
    for info in pkgutil.walk_packages([f"{SHIM_ROOT}/ts"], prefix="ts."):
        found.add(info.name)
    assert found == SHIM_MODULES
    for name in sorted(SHIM_MODULES):
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.startswith(SHIM_ROOT), name
        for public in getattr(module, "__all__", []):
            assert hasattr(module, public), f"{name}.{public}"


# Every module of TorchServe 0.12.0's ts/ package (git ls-tree v0.12.0 ts/, tests left out).
TS_012_MODULES = """
ts.arg_parser ts.async_service ts.context ts.handler_utils.distributed.deepspeed
ts.handler_utils.distributed.pt_pippy ts.handler_utils.hf_batch_streamer
ts.handler_utils.micro_batching ts.handler_utils.preprocess.dali ts.handler_utils.text_utils
ts.handler_utils.timer ts.handler_utils.utils ts.launcher ts.llm_launcher ts.metrics.caching_metric
ts.metrics.dimension ts.metrics.metric ts.metrics.metric_abstract ts.metrics.metric_cache_abstract
ts.metrics.metric_cache_errors ts.metrics.metric_cache_yaml_impl ts.metrics.metric_collector
ts.metrics.metric_encoder ts.metrics.metric_type_enum ts.metrics.metrics_store
ts.metrics.process_memory_metric ts.metrics.system_metrics ts.metrics.unit ts.model_loader
ts.model_server ts.model_service.model_service ts.model_service_worker
ts.protocol.otf_message_handler ts.service ts.torch_handler.base_handler
ts.torch_handler.contractions ts.torch_handler.dali_handler ts.torch_handler.dali_image_classifier
ts.torch_handler.densenet_handler ts.torch_handler.distributed.base_deepspeed_handler
ts.torch_handler.distributed.base_pippy_handler ts.torch_handler.image_classifier
ts.torch_handler.image_segmenter ts.torch_handler.object_detector
ts.torch_handler.request_envelope.base ts.torch_handler.request_envelope.body
ts.torch_handler.request_envelope.json ts.torch_handler.request_envelope.kserve
ts.torch_handler.request_envelope.kservev2 ts.torch_handler.text_classifier
ts.torch_handler.text_handler ts.torch_handler.trt_llm_handler ts.torch_handler.vision_handler
ts.torch_handler.vllm_handler ts.utils.hf_utils ts.utils.setup_model_venv
ts.utils.timeit_decorator ts.utils.util ts.version
""".split()


def test_the_migration_doc_table_names_every_torchserve_module() -> None:
    doc = (REPO_ROOT / "docs" / "migrating-from-torchserve.md").read_text()
    table = doc.split("## The `ts` package, module by module", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split(" | ")[0]: line.split(" | ")[1] for line in table.splitlines() if "| `ts" in line
    }
    for name in TS_012_MODULES:
        named: list[str | None] = [status for cell, status in rows.items() if f"`{name}`" in cell]
        [status] = named or [None]
        assert status is not None, f"{name} is not in the table"
        shipped = name in SHIM_MODULES
        assert status.startswith("absent") != shipped, f"{name}: {status[:30]}"
    assert SHIM_MODULES - {"ts"} - set(TS_012_MODULES) == {
        "ts.handler_utils",
        "ts.metrics",
        "ts.protocol",
        "ts.torch_handler",
        "ts.torch_handler.request_envelope",
        "ts.utils",
    }  # packages only: the shim invents no module


# ----- BaseHandler: eval() after any loader ------------------------------------------------------

MODEL_PY = """
    from torch import nn


    class Dropper(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(self.drop(x))
"""

OVERRIDING_HANDLER = """
    import importlib

    import torch
    from ts.torch_handler.base_handler import BaseHandler
    from ts.utils.util import list_classes_from_module


    class Overriding(BaseHandler):
        def _load_pickled_model(self, model_dir, model_file, model_pt_path):
            module = importlib.import_module(model_file.split(".")[0])
            model = list_classes_from_module(module)[0]()
            model.load_state_dict(torch.load(model_pt_path))
            return model  # no eval(), no to(device): BaseHandler does both
"""


def test_an_overridden_pickled_loader_still_ends_in_eval(tmp_path) -> None:
    model_py = write(tmp_path / "src" / "dropper_model.py", MODEL_PY)  # a unique module name
    handler = write(tmp_path / "src" / "overriding.py", OVERRIDING_HANDLER)
    namespace: dict = {}
    exec(model_py.read_text(), namespace)
    torch.manual_seed(0)
    torch.save(namespace["Dropper"]().state_dict(), tmp_path / "src" / "w.pt")
    mar = build(
        model_name="dropper",
        version="1",
        handler=str(handler),
        model_file=str(model_py),
        serialized_file=str(tmp_path / "src" / "w.pt"),
        export_path=str(tmp_path),
    )
    archive = open_archive(mar, tmp_path / "x")
    ctx = make_context(archive)
    service = load_service(archive.model_dir, archive.manifest, ctx)
    assert service.handler.model.training is False
    assert service.handler.model.lin.weight.device == service.handler.device
    batch = [{"body": [1.0] * 8}]
    set_batch(ctx, batch)
    assert service.predict(batch, ctx) == service.predict(batch, ctx)


# ----- images keep their mode --------------------------------------------------------------------


def _png(mode: str) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (4, 4)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("mode", ["L", "RGBA", "RGB", "P", "LA"])
def test_decoded_images_keep_their_mode(mode: str) -> None:
    assert decode_image(_png(mode)).mode == mode
    assert ToRGB()(decode_image(_png(mode))).mode == "RGB"  # only the stock pipelines convert


def test_a_custom_image_processing_gets_the_image_as_stored() -> None:
    from ts.torch_handler.image_classifier import ImageClassifier
    from ts.torch_handler.vision_handler import VisionHandler

    class Channels(VisionHandler):
        image_processing = staticmethod(lambda image: torch.zeros(len(image.getbands()), 2, 2))

    handler = Channels()
    handler.device = torch.device("cpu")
    shapes = [tuple(handler.preprocess([{"body": _png(m)}]).shape) for m in ("L", "RGBA")]
    assert shapes == [(1, 1, 2, 2), (1, 4, 2, 2)]
    stock = ImageClassifier()
    stock.device = torch.device("cpu")
    assert stock.preprocess([{"body": _png("RGBA")}]).shape == (1, 3, 224, 224)


# ----- context -----------------------------------------------------------------------------------


def test_context_reads_torchserve_style_headers_and_sequence_keys() -> None:
    ctx = Context("m", "/tmp", {}, 1, None, "x")
    ctx.request_processor = [RequestProcessor({"ts_request_sequence_id": "s-1"})]
    assert ctx.get_sequence_id(0) == "s-1"
    assert ctx.header_key_sequence_id == "ts_request_sequence_id"
    assert ctx.header_key_sequence_start == "ts_request_sequence_start"
    assert ctx.header_key_sequence_end == "ts_request_sequence_end"
    ctx.set_response_header(0, "Content-Type", "image/png")  # how TorchServe handlers write it
    assert ctx.get_response_content_type(0) == "image/png"
    ctx.set_response_status(201, "Made", idx=0)
    assert ctx.get_response_status(0) == (201, "Made")


# ----- micro-batching ----------------------------------------------------------------------------


class _Phases:
    """A handler whose phases record which thread ran them."""

    def __init__(self) -> None:
        self.context = None
        self.threads: dict[str, set[str]] = {"preprocess": set(), "postprocess": set()}

    def preprocess(self, data):
        self.threads["preprocess"].add(threading.current_thread().name)
        return [x * 10 for x in data]

    def inference(self, data):
        if -10 in data:
            raise ValueError("bad row")
        return [x + 1 for x in data]

    def postprocess(self, data):
        self.threads["postprocess"].add(threading.current_thread().name)
        return [str(x) for x in data]


def test_micro_batching_keeps_order_and_runs_phases_in_threads() -> None:
    from ts.handler_utils.micro_batching import MicroBatching

    handler = _Phases()
    mb = MicroBatching(handler, micro_batch_size=3)
    mb.parallelism = {"preprocess": 2, "postprocess": 3}
    try:
        assert mb.parallelism == {"preprocess": 2, "postprocess": 3}
        assert [len(mb.thread_groups[p]) for p in ("preprocess", "inference", "postprocess")] == [
            2,
            1,
            3,
        ]
        data = list(range(20))
        assert mb.handle(data) == [str(x * 10 + 1) for x in data]
        assert all(name.startswith("micro-batching-") for name in handler.threads["preprocess"])
        with pytest.raises(ValueError, match="bad row"):  # a failing phase fails the batch
            mb.handle([1, -1, 2])
        assert mb.handle([4]) == ["41"]  # and the pipeline still works afterwards
        with pytest.raises(ValueError):
            mb.parallelism = {"training": 1}
    finally:
        mb.shutdown()
    assert all(not w.thread.is_alive() for g in mb.thread_groups.values() for w in g)


# ----- request envelopes -------------------------------------------------------------------------


def test_request_envelopes_reshape_batches_as_torchserve() -> None:
    from ts.torch_handler.request_envelope.body import BodyEnvelope
    from ts.torch_handler.request_envelope.json import JSONEnvelope
    from ts.torch_handler.request_envelope.kserve import KServeEnvelope
    from ts.torch_handler.request_envelope.kservev2 import KServev2Envelope

    ctx = Context("m", "/tmp", {"model": {"modelName": "m", "modelVersion": "2"}}, 2, None, "x")
    set_batch(ctx, [{}, {}])
    seen = []

    def echo(data, context):
        seen.append(data)
        return data

    assert BodyEnvelope(echo).handle([{"body": b"a"}, {"data": 2}], ctx) == [b"a", 2]
    rows = [{"body": json.dumps({"instances": [1, 2]}).encode()}, {"body": {"instances": [3]}}]
    out = JSONEnvelope(echo).handle(rows, ctx)
    assert seen[-1] == [1, 2, 3]
    assert [json.loads(o) for o in out] == [{"predictions": [1, 2]}, {"predictions": [3]}]
    b64 = JSONEnvelope(lambda d, c: [d[0].decode()])  # {"b64": ...} arrives as bytes
    assert b64.handle([{"body": {"instances": [{"b64": "aGk="}]}}], ctx) == [
        '{"predictions": ["hi"]}'
    ]
    assert KServeEnvelope(echo).handle([{"body": b'{"instances": [[1]]}'}], ctx) == [
        {"predictions": [[1]]}
    ]
    v2 = {"id": "r9", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32",
                                  "data": [1, 2, 3, 4]}]}  # fmt: skip
    [response] = KServev2Envelope(lambda d, c: [[[0.5, 1.5]]]).handle([{"body": v2}], ctx)
    assert response == {
        "id": "r9",
        "model_name": "m",
        "model_version": "2",
        "outputs": [{"name": "x", "shape": [2], "datatype": "FP64", "data": [0.5, 1.5]}],
    }


# ----- metrics -----------------------------------------------------------------------------------


def test_metrics_yaml_declares_model_metrics_for_get_metric(tmp_path) -> None:
    from ts.metrics.metric_cache_errors import MetricsCacheKeyError
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.metrics.metric_type_enum import MetricTypes

    path = write(
        tmp_path / "metrics.yaml",
        """
        model_metrics:
          gauge:
            - name: RequestBatchSize
              unit: count
              dimensions: ["ModelName"]
        """,
    )
    store = MetricsCacheYamlImpl(str(path))
    with pytest.raises(MetricsCacheKeyError):
        store.get_metric("RequestBatchSize", MetricTypes.GAUGE)
    store.initialize_cache()
    store.get_metric("RequestBatchSize", MetricTypes.GAUGE).add_or_update(4, ["m"])
    [record] = store.drain()
    assert record == {
        "name": "RequestBatchSize",
        "unit": "Count",  # TorchServe's unit name for "count"
        "type": "gauge",
        "value": 4,
        "dimensions": {"ModelName": "m"},
    }


def test_utils_and_version() -> None:
    from ts.handler_utils.text_utils import get_tokenizer, ngrams_iterator
    from ts.handler_utils.utils import import_class
    from ts.utils.util import CLEANUP_REGEX
    from ts.version import __version__

    assert __version__ == "0.12.0"
    assert get_tokenizer(None)("a b") == ["a", "b"]
    assert get_tokenizer("basic_english")("You can't!")[:2] == ["you", "can"]
    assert list(ngrams_iterator(["a", "b"], 2)) == ["a", "b", "a b"]
    assert import_class("collections.OrderedDict").__name__ == "OrderedDict"
    assert import_class("OrderedDict", module_prefix="collections").__name__ == "OrderedDict"
    with pytest.raises(ImportError):
        import_class("NoModule")
    assert CLEANUP_REGEX.sub("", "<b>x</b>&amp;") == "x"
