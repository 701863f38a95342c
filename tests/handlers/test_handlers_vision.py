"""Vision handlers with small real models: segmenter, detector, explanations, input errors."""

from __future__ import annotations

import base64
import io
import warnings

import pytest
import torch
from handler_helpers import set_batch, write, write_json
from PIL import Image

from handlers.exceptions import PredictionException

SEGMENTER_PY = """
    import torch
    from torch import nn


    class TinySegmenter(nn.Module):
        def __init__(self):
            super().__init__()
            self.classifier = nn.Conv2d(3, 4, kernel_size=1)

        def forward(self, x):
            return {"out": self.classifier(x), "aux": x}
    """

DETECTOR_PY = """
    import torch
    from torch import nn


    class FixedDetector(nn.Module):
        \"\"\"Finds the whole image (a person, sure) and a small car it is unsure about.\"\"\"

        def forward(self, images):
            results = []
            for image in images:
                height, width = image.shape[-2:]
                results.append({
                    "boxes": torch.tensor([[0.0, 0.0, float(width), float(height)],
                                           [1.0, 1.0, 2.0, 2.0]]),
                    "labels": torch.tensor([1, 2]),
                    "scores": torch.tensor([0.9, 0.3]),
                })
            return results
    """


def png(width: int, height: int, mode: str = "RGB", color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color if mode == "RGB" else 128).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def tiny_classifier(package, tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 3),
    ).eval()
    path = tmp_path / "tiny.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation notice
        torch.jit.trace(model, torch.zeros(1, 3, 224, 224)).save(str(path))
    labels = write_json(tmp_path / "index_to_name.json", {"0": "red", "1": "green", "2": "blue"})
    return package(
        model_name="tiny", handler="image_classifier", serialized_file=path, extra_files=[labels]
    )


def test_segmenter_returns_a_class_map_per_image(package, tmp_path):
    service, ctx = package(
        model_name="segmenter",
        handler="image_segmenter",
        model_file=write(tmp_path / "model.py", SEGMENTER_PY),
    )
    batch = [{"body": png(300, 260)}, {"data": png(64, 64, mode="L")}]  # grey becomes RGB
    set_batch(ctx, batch)
    results = service.predict(batch, ctx)
    assert len(results) == 2
    for result in results:
        assert len(result) == 224 and len(result[0]) == 224
        class_index, probability = result[100][100]
        assert class_index in {0.0, 1.0, 2.0, 3.0} and 0.25 <= probability <= 1.0


def test_detector_handles_a_batch_of_different_sizes(package, tmp_path):
    names = write_json(
        tmp_path / "index_to_name.json", {"object_type_names": ["__background__", "person", "car"]}
    )
    service, ctx = package(
        model_name="detector",
        handler="object_detector",
        model_file=write(tmp_path / "model.py", DETECTOR_PY),
        extra_files=[names],
    )
    batch = [{"body": png(40, 30)}, {"body": png(17, 50)}]
    set_batch(ctx, batch)
    assert service.predict(batch, ctx) == [
        [{"person": [0.0, 0.0, 40.0, 30.0], "score": pytest.approx(0.9)}],
        [{"person": [0.0, 0.0, 17.0, 50.0], "score": pytest.approx(0.9)}],
    ]


def test_image_classifier_inputs_and_topk_cap(tiny_classifier):
    service, ctx = tiny_classifier
    data_uri = "data:image/png;base64," + base64.b64encode(png(50, 80)).decode()
    as_list = torch.zeros(3, 224, 224).tolist()  # an already-decoded image tensor as JSON
    batch = [{"body": png(320, 240)}, {"data": data_uri}, {"body": as_list}]
    set_batch(ctx, batch)
    results = service.predict(batch, ctx)
    assert [sorted(r) for r in results] == [["blue", "green", "red"]] * 3  # 3 classes < topk 5


@pytest.mark.parametrize(
    ("payload", "code"),
    [(b"definitely not an image", 400), ("***not base64***", 400), (None, 400)],
)
def test_bad_images_are_client_errors(tiny_classifier, payload, code):
    service, ctx = tiny_classifier
    batch = [{"body": payload}]
    set_batch(ctx, batch)
    with pytest.raises(PredictionException) as info:
        service.predict(batch, ctx)
    assert info.value.error_code == code


def test_pixel_limit_guard(tiny_classifier, monkeypatch):
    service, ctx = tiny_classifier
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    batch = [{"body": png(40, 40)}]  # 1600 pixels: PIL would only warn
    set_batch(ctx, batch)
    with pytest.raises(PredictionException) as info:
        service.predict(batch, ctx)
    assert info.value.error_code == 413


def test_explain_and_describe(tiny_classifier):
    service, ctx = tiny_classifier
    batch = [{"body": png(224, 224), "target": 2}, {"body": png(224, 224, color=(0, 0, 255))}]
    set_batch(ctx, batch, headers=[{"explain": "True"}, {}])
    attributions = service.predict(batch, ctx)
    assert len(attributions) == 2
    assert torch.tensor(attributions).shape == (2, 3, 224, 224)
    assert set(ctx.handler_timings) == {"preprocess", "explain"}

    set_batch(ctx, batch[:1], headers=[{"describe": "True"}])
    assert service.predict(batch[:1], ctx) == [None]


def test_detector_explanations_are_not_supported(package, tmp_path):
    # Its preprocess gives a list of images; VisionHandler's attributions need one stacked batch.
    service, ctx = package(
        model_name="detector",
        handler="object_detector",
        model_file=write(tmp_path / "model.py", DETECTOR_PY),
    )
    batch = [{"body": png(40, 30)}]
    set_batch(ctx, batch, headers=[{"explain": "True"}])
    with pytest.raises(PredictionException) as info:
        service.predict(batch, ctx)
    assert info.value.error_code == 501
