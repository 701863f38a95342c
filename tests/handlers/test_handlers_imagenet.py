"""Pretrained EfficientNet-Lite0 served by the built-in image_classifier: TorchScript and ONNX."""

from __future__ import annotations

import base64
import json

import pytest
from handler_helpers import COFFEE, IMAGENET_LABELS, KITTEN, set_batch

from handlers.output import encode_output

CAT_LABELS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}


def top1(result: dict[str, float]) -> str:
    return max(result, key=result.__getitem__)


def image_batch() -> list[dict]:
    # One raw body, one base64 string in a "data" field: both forms TorchServe accepts.
    return [
        {"body": KITTEN.read_bytes()},
        {"data": base64.b64encode(COFFEE.read_bytes()).decode("ascii")},
    ]


@pytest.fixture(scope="module")
def labels() -> dict:
    return json.loads(IMAGENET_LABELS.read_text())


def test_torchscript_image_classifier_batch(package, efficientnet_torchscript):
    service, ctx = package(
        model_name="efficientnet",
        handler="image_classifier",
        serialized_file=efficientnet_torchscript,
        extra_files=[IMAGENET_LABELS],
    )
    batch = image_batch()
    set_batch(ctx, batch)
    results = service.predict(batch, ctx)

    assert len(results) == 2
    kitten, coffee = results
    assert len(kitten) == 5 and len(coffee) == 5
    assert top1(kitten) in CAT_LABELS
    assert top1(coffee) == "espresso"
    assert list(kitten.values()) == sorted(kitten.values(), reverse=True)
    assert 0 < sum(kitten.values()) <= 1.0 + 1e-6

    assert set(ctx.handler_timings) == {"preprocess", "inference", "postprocess"}
    assert all(seconds >= 0 for seconds in ctx.handler_timings.values())
    [handler_time] = [m for m in ctx.metrics.drain() if m["name"] == "HandlerTime"]
    assert handler_time["unit"] == "Milliseconds" and handler_time["type"] == "gauge"
    assert handler_time["dimensions"]["ModelName"] == "efficientnet"

    body, content_type = encode_output(kitten)
    assert content_type == "application/json"
    assert json.loads(body) == kitten


def test_onnx_image_classifier_matches_torchscript(package, efficientnet_onnx):
    service, ctx = package(
        model_name="efficientnet_onnx",
        handler="image_classifier",
        serialized_file=efficientnet_onnx,
        extra_files=[IMAGENET_LABELS],
        num_threads=2,
    )
    batch = image_batch()
    set_batch(ctx, batch)
    kitten, coffee = service.predict(batch, ctx)
    assert top1(kitten) in CAT_LABELS
    assert top1(coffee) == "espresso"
    assert set(ctx.handler_timings) == {"preprocess", "inference", "postprocess"}


def test_topk_from_model_config(package, efficientnet_torchscript, tmp_path, labels):
    config = tmp_path / "model-config.yaml"
    config.write_text("batchSize: 4\nhandler:\n  topk: 2\n")
    service, ctx = package(
        model_name="efficientnet_top2",
        handler="image_classifier",
        serialized_file=efficientnet_torchscript,
        config_file=config,
    )
    batch = [{"data": COFFEE.read_bytes()}]
    set_batch(ctx, batch)
    [result] = service.predict(batch, ctx)
    # No index_to_name.json in this archive: labels are class indices.
    assert len(result) == 2
    assert labels[top1(result)][-1] == "espresso"
