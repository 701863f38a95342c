"""``ObjectDetector``: TorchServe's ``object_detector`` default handler.

ToTensor only; per image, ``[{label: [x1, y1, x2, y2], "score": s}, ...]`` for detections scoring
at least ``threshold`` (0.5). The model gets a list of image tensors (torchvision detection
models take one), so a batch may mix image sizes, which TorchServe's stacked batch cannot.
Explanations are not supported (501).
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision import transforms

from handlers.exceptions import PredictionException
from handlers.images import ToRGB
from handlers.labels import map_class_to_label
from handlers.runtimes import OnnxModel
from handlers.timer import timed
from handlers.vision_handler import VisionHandler


class ObjectDetector(VisionHandler):
    """Takes images, returns the labelled boxes found in each."""

    image_processing = transforms.Compose([ToRGB(), transforms.ToTensor()])
    threshold = 0.5

    @timed
    def preprocess(self, data: list) -> list[torch.Tensor]:
        """Every row's image as a CHW float tensor on the handler's device."""
        return [self._image_tensor(row).to(self.device) for row in data]

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            if isinstance(self.model, OnnxModel):
                return self.model(data, *args, **kwargs)
            return self.model([image.to(self.device) for image in data], *args, **kwargs)

    @timed
    def postprocess(self, data: list[dict[str, torch.Tensor]]) -> list[list[dict[str, Any]]]:
        result = []
        for row in data:
            keep = row["scores"] >= self.threshold
            boxes = row["boxes"][keep].tolist()
            labels = row["labels"][keep].tolist()
            scores = row["scores"][keep].tolist()
            detections = []
            for label, box, score in zip(labels, boxes, scores, strict=True):
                detection = map_class_to_label([[box]], self.mapping, [[label]])[0]
                detection["score"] = score
                detections.append(detection)
            result.append(detections)
        return result

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        """No explanations (501): ``preprocess`` gives a list of images, not the stacked batch
        that ``VisionHandler``'s Integrated Gradients attributes to a class score."""
        raise PredictionException(f"{type(self).__name__} does not support explanations", 501)
