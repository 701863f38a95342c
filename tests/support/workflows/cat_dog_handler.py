"""Cat or dog: an ImageClassifier on a base64 image, answering the label as text."""

import base64

from ts.torch_handler.image_classifier import ImageClassifier

LABELS = ["cat", "dog"]


class CatDogClassifier(ImageClassifier):
    def preprocess(self, data):
        images = [{"body": base64.b64decode(row.get("data") or row.get("body"))} for row in data]
        return ImageClassifier.preprocess(self, images)

    def postprocess(self, data):
        return [LABELS[int(row.argmax())] for row in data]
