"""Decoding one image payload as the vision handlers receive it."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

from PIL import Image, UnidentifiedImageError

from handlers.exceptions import PredictionException


class ToRGB:
    """A transform that converts a PIL image to RGB (grey, palette, RGBA, CMYK...); others pass.

    The built-in ImageNet handlers start their ``image_processing`` with it, because their
    normalisation has three channels. A handler that sets its own ``image_processing`` gets the
    image in the mode it was stored in, as in TorchServe (an MNIST handler needs its grey "L").
    """

    def __call__(self, image: Any) -> Any:
        if isinstance(image, Image.Image) and image.mode != "RGB":
            return image.convert("RGB")
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def decode_image(payload: Any) -> Image.Image:
    """bytes/bytearray, or a base64 str (a ``data:`` URI prefix is allowed), -> a PIL image.

    The image keeps the mode it was stored in ("L", "RGBA", "P", ...), exactly as TorchServe's
    ``VisionHandler`` passes ``Image.open(...)`` on: no conversion here.

    Bad input raises ``PredictionException`` with 400 rather than a generic 503, and images over
    PIL's pixel limit (kept unless ``limit_max_image_pixels`` is false) are refused with 413.
    """
    if isinstance(payload, str):
        encoded = payload.split(",", 1)[1] if payload.startswith("data:") else payload
        try:
            payload = base64.b64decode(encoded, validate=False)
        except (binascii.Error, ValueError) as exc:
            raise PredictionException(f"image is not valid base64: {exc}", 400) from exc
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise PredictionException(f"expected image bytes, got {type(payload).__name__}", 400)
    try:
        with warnings.catch_warnings():
            # Past MAX_IMAGE_PIXELS PIL only warns (it errors past twice that); refuse it here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(payload))
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise PredictionException(f"image too large: {exc}", 413) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise PredictionException(f"cannot decode image: {exc}", 400) from exc
    return image
