"""``ImageClassifier``: TorchServe's ``image_classifier`` default handler.

ImageNet preprocessing (Resize 256, CenterCrop 224, ToTensor, Normalize) and, per image, the
top-``topk`` classes as ``{label: probability}`` after a softmax. ``topk`` is 5, or
``handler.topk`` from model-config.yaml, or ``set_max_result_classes``; it is capped at the number
of classes (TorchServe fails on models with fewer than ``topk`` classes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from handlers.context import Context
from handlers.labels import map_class_to_label
from handlers.timer import timed
from handlers.vision_handler import VisionHandler, imagenet_transform


class ImageClassifier(VisionHandler):
    """Takes images, returns the most likely classes of each with their probabilities."""

    topk = 5
    image_processing = imagenet_transform()

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        handler_config = self.model_yaml_config.get("handler")
        if isinstance(handler_config, dict) and handler_config.get("topk") is not None:
            self.set_max_result_classes(int(handler_config["topk"]))

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    @timed
    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        """Per image, ``{label: probability}`` for the top classes, most likely first."""
        ps = F.softmax(data, dim=1)
        probs, classes = torch.topk(ps, min(self.topk, ps.shape[1]), dim=1)
        return map_class_to_label(probs.tolist(), self.mapping, classes.tolist())
