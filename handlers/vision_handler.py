"""``VisionHandler``: base for image handlers (``ts.torch_handler.vision_handler``).

Rows may hold image bytes, a base64 string, or an already-decoded list of floats (used as the
tensor directly). Images keep their own mode ("L", "RGBA", ...) as in TorchServe; the built-in
ImageNet handlers convert to RGB in their own ``image_processing`` (``handlers.images.ToRGB``).
Deviations from TorchServe: undecodable input is a 400 (``PredictionException``) rather than a
503, and explanations use Lantern's own Integrated Gradients instead of captum.
"""

from __future__ import annotations

from abc import ABC
from typing import Any

import torch
from PIL import Image
from torchvision import transforms

from handlers.base_handler import BaseHandler, _row_payload
from handlers.context import Context
from handlers.exceptions import PredictionException
from handlers.explain import integrated_gradients
from handlers.images import ToRGB, decode_image
from handlers.runtimes import OnnxModel
from handlers.timer import timed

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def imagenet_transform() -> transforms.Compose:
    """The ImageNet evaluation transform: RGB, resize to 256, centre crop 224, normalise."""
    return transforms.Compose(
        [
            ToRGB(),
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
        ]
    )


class VisionHandler(BaseHandler, ABC):
    """Decodes a batch of images with ``image_processing`` and stacks them."""

    image_processing: Any = transforms.ToTensor()
    ig_steps = 15  # TorchServe's n_steps for vision explanations

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        if not context.system_properties.get("limit_max_image_pixels"):
            # Process-wide, as in TorchServe; a worker serves a single model.
            Image.MAX_IMAGE_PIXELS = None

    def _image_tensor(self, row: Any) -> torch.Tensor:
        payload = _row_payload(row)
        if payload is None:
            raise PredictionException("request has no image (expected a 'data' or 'body')", 400)
        if isinstance(payload, (str, bytes, bytearray, memoryview)):
            return self.image_processing(decode_image(payload))
        try:
            return torch.as_tensor(payload, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise PredictionException(f"cannot read image input: {exc}", 400) from exc

    @timed
    def preprocess(self, data: list) -> Any:
        """Every row's image, transformed and stacked into one batch tensor (the form
        ``get_insights`` takes too; a subclass returning another form overrides it)."""
        images = [self._image_tensor(row) for row in data]
        try:
            return torch.stack(images).to(self.device)
        except RuntimeError as exc:
            shapes = [tuple(image.shape) for image in images]
            raise PredictionException(f"images in a batch differ in shape: {shapes}", 400) from exc

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> list:
        """Integrated Gradients attributions, one nested list per image."""
        if isinstance(self.model, OnnxModel):
            raise PredictionException("explanations need a PyTorch model (not ONNX)", 501)
        attributions = integrated_gradients(
            self.model, tensor_data.to(self.device), target=int(target), n_steps=self.ig_steps
        )
        return attributions.tolist()
