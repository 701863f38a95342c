"""The same classifier as a plain function: the handler is ``function_handler.py:classify``.

TorchServe's function style: the server calls ``classify(None, context)`` once when the worker
starts (load the model then), and ``classify(batch, context)`` for every batch, which must
return one result per request. No class, no ``BaseHandler``.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torchvision import transforms

from handlers.exceptions import PredictionException

_TRANSFORM = transforms.Compose(
    [
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ]
)
_state: dict[str, Any] = {}  # one model per worker process


def classify(data: list[dict[str, Any]] | None, context: Any) -> list[dict[str, Any]] | None:
    """Load the model on the first call; then answer each image with its top class."""
    if data is None:
        _load(context.system_properties["model_dir"], context.manifest)
        return None
    images = torch.stack([_TRANSFORM(_image(row)) for row in data])
    with torch.inference_mode():
        scores, indices = torch.softmax(_state["model"](images), dim=1).max(dim=1)
    return [
        {"label": _label(index), "index": index, "score": round(score, 4)}
        for score, index in zip(scores.tolist(), indices.tolist(), strict=True)
    ]


def _label(index: int) -> str:
    # index_to_name.json maps "967" to "espresso" or, ImageNet style, to ["n07920052", "espresso"].
    label = _state["labels"].get(str(index), str(index))
    return label[-1] if isinstance(label, list) else label


def _load(model_dir: str, manifest: dict[str, Any]) -> None:
    weights = os.path.join(model_dir, manifest["model"]["serializedFile"])
    _state["model"] = torch.jit.load(weights, map_location="cpu").eval()
    with open(os.path.join(model_dir, "index_to_name.json"), encoding="utf-8") as fh:
        _state["labels"] = json.load(fh)


def _image(row: dict[str, Any]) -> Image.Image:
    payload = row.get("data") or row.get("body")
    if not isinstance(payload, (bytes, bytearray)):
        raise PredictionException("send the image as the request body or a form file", 400)
    try:
        return Image.open(io.BytesIO(payload)).convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise PredictionException(f"cannot decode the image: {exc}", 400) from exc
