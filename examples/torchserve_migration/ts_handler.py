"""A custom handler written for TorchServe, served by Lantern without a change.

It imports TorchServe's modules (``ts.torch_handler.base_handler``, ``ts.utils.util``); Lantern's
workers map every ``ts.*`` import to Lantern's own implementation of the same API.
"""

import base64
import io

import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException, map_class_to_label


class ImageNetClassifier(BaseHandler):
    """Top-3 ImageNet classes per image, counted in a custom metric."""

    topk = 3
    image_processing = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )

    def preprocess(self, data):
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, str):  # base64 from a JSON or form field
                image = base64.b64decode(image)
            try:
                image = Image.open(io.BytesIO(image)).convert("RGB")
            except Exception as exc:
                raise PredictionException(f"Cannot read the image: {exc}", 400) from exc
            images.append(self.image_processing(image))
        self.context.metrics.add_counter("ImagesClassified", len(images))
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        probabilities, classes = torch.topk(F.softmax(data, dim=1), self.topk, dim=1)
        return map_class_to_label(probabilities.tolist(), self.mapping, classes.tolist())
