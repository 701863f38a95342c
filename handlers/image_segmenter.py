"""``ImageSegmenter``: TorchServe's ``image_segmenter`` default handler.

ImageNet preprocessing, then per image an ``[H][W][2]`` list of (class index, probability) of the
most likely class of every pixel. The model output may be a dict with ``"out"`` (torchvision
segmentation models), a tuple/list (its first element is used), or a plain tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from handlers.timer import timed
from handlers.vision_handler import VisionHandler, imagenet_transform


class ImageSegmenter(VisionHandler):
    """Takes images, returns the top class and its probability for each pixel."""

    image_processing = imagenet_transform()

    @timed
    def postprocess(self, data: Any) -> list:
        # The full per-class map is too big to return (> 24 MB); send the argmax and its score.
        if isinstance(data, dict):
            data = data["out"]
        elif isinstance(data, (tuple, list)):
            data = data[0]
        probs = torch.nn.functional.softmax(data, dim=1)
        best = torch.max(probs, dim=1)
        return torch.stack([best.indices.to(best.values.dtype), best.values], dim=3).tolist()
