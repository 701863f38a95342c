"""A handler class written on Lantern's ``BaseHandler``, with its own pre- and postprocessing.

Input, per request: an image as the raw body (``curl -T``), as a form file (``-F data=@...``), or
as JSON ``{"image": "<base64>"}``. Output: the single most likely class,
``{"label": "espresso", "index": 967, "score": 0.83}``; a top score under ``handler.min_score``
from model-config.yaml is answered with the label ``"unknown"``. Each response also carries
``X-Batch-Size``, the number of requests that shared its batch.

``BaseHandler.initialize`` loads the archive's TorchScript file and ``index_to_name.json``; this
class adds what is specific to the model's inputs and outputs.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torchvision import transforms

from handlers.base_handler import BaseHandler
from handlers.context import Context
from handlers.exceptions import PredictionException


class TopClassHandler(BaseHandler):
    """ImageNet classification that answers with the top class only."""

    transform = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        # Keys other than TorchServe's own in model-config.yaml belong to the handler.
        options = self.model_yaml_config.get("handler") or {}
        self.min_score = float(options.get("min_score", 0.0))

    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        """One tensor for the whole batch; a request that is not an image fails with 400."""
        return torch.stack([self.transform(self._image(row)) for row in data]).to(self.device)

    def _image(self, row: dict[str, Any]) -> Image.Image:
        payload = row.get("data") or row.get("body")
        if isinstance(payload, dict):  # a JSON body arrives decoded
            payload = payload.get("image")
            if not isinstance(payload, str):
                raise PredictionException('JSON input needs an "image" field (base64)', 400)
            try:
                payload = base64.b64decode(payload, validate=True)
            except binascii.Error as exc:
                raise PredictionException(f'"image" is not valid base64: {exc}', 400) from exc
        if not isinstance(payload, (bytes, bytearray)):
            raise PredictionException("send an image (raw body, form file or JSON)", 400)
        try:
            return Image.open(io.BytesIO(payload)).convert("RGB")
        except (UnidentifiedImageError, OSError) as exc:
            raise PredictionException(f"cannot decode the image: {exc}", 400) from exc

    def postprocess(self, data: torch.Tensor) -> list[dict[str, Any]]:
        """Per request, the top class with its label and probability."""
        scores, indices = torch.softmax(data, dim=1).max(dim=1)
        results = []
        for i, (score, index) in enumerate(zip(scores.tolist(), indices.tolist(), strict=True)):
            label = (self.mapping or {}).get(str(index), str(index))
            if score < self.min_score:
                label = "unknown"
            results.append({"label": label, "index": index, "score": round(score, 4)})
            # Response headers are set per request, by its position in the batch.
            self.context.set_response_header(i, "X-Batch-Size", str(len(indices)))
        return results
