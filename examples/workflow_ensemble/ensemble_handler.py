"""The workflow's function nodes. Each runs in its own worker process, like a model's handler.

``check_image`` is the start node: it refuses what is not an image before two models spend time
on it. ``average`` is the fan-in node: it gets one parameter per parent node, named after it.
"""

import io
import json

from PIL import Image

TOP = 5


def check_image(data, context):
    if data is None:  # TorchServe calls each function once with None when its worker starts
        return None
    images = []
    for row in data:
        raw = row.get("data") or row.get("body")
        try:
            Image.open(io.BytesIO(raw)).verify()
        except Exception as exc:
            raise ValueError(f"not an image: {exc}") from None
        images.append(raw)  # bytes go on to both classifiers unchanged
    return images


def average(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        script = json.loads(row["classifier_ts"])
        onnx = json.loads(row["classifier_onnx"])
        labels = set(script) | set(onnx)
        mean = {label: (script.get(label, 0.0) + onnx.get(label, 0.0)) / 2 for label in labels}
        best = sorted(mean.items(), key=lambda kv: kv[1], reverse=True)[:TOP]
        answers.append(dict(best))
    return answers
