"""MAR-INF/MANIFEST.json: creating it exactly as torch-model-archiver 0.12 does, and parsing it."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from typing import Any

from archiver.errors import ManifestError

MANIFEST_DIR = "MAR-INF"
MANIFEST_NAME = "MANIFEST.json"
MANIFEST_PATH = f"{MANIFEST_DIR}/{MANIFEST_NAME}"
ARCHIVER_VERSION = "0.12.0"
CREATED_ON_FORMAT = "%d/%m/%Y %H:%M:%S"
RUNTIMES = ("python", "python3", "LSP")
# Handler names resolved by the server itself, so no handler file goes into the archive.
BUILTIN_HANDLERS = frozenset(
    {
        "base_handler",
        "image_classifier",
        "image_segmenter",
        "object_detector",
        "text_classifier",
        "text_generation",
        "triton_python",
        "dali_image_classifier",
        "vllm_handler",
        "trt_llm_handler",
    }
)
BUILTIN_LSP_HANDLERS = frozenset({"BaseHandler", "TorchScriptHandler"})
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
# TorchServe's frontend treats archives without a version as version 1.0.
DEFAULT_VERSION = "1.0"
# Real manifests are a few hundred bytes; the cap keeps a hostile archive from filling memory.
MAX_MANIFEST_BYTES = 1024 * 1024


def validate_model_name(name: str) -> None:
    """Raise ManifestError unless ``name`` is a valid TorchServe model name."""
    if not MODEL_NAME_RE.match(name):
        raise ManifestError(
            f"invalid model name {name!r}: it must match {MODEL_NAME_RE.pattern} "
            "(letters, digits, '_', '-', '.'; starting with a letter or digit)"
        )


def make_manifest(
    *,
    model_name: str,
    version: str,
    handler: str,
    serialized_file: str | None = None,
    model_file: str | None = None,
    runtime: str = "python",
    requirements_file: str | None = None,
    config_file: str | None = None,
    created_on: datetime | None = None,
) -> dict[str, Any]:
    """Return the manifest dict, keys in the order torch-model-archiver 0.12 writes them."""
    validate_model_name(model_name)
    if runtime not in RUNTIMES:
        raise ManifestError(f"invalid runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    model: dict[str, Any] = {"modelName": model_name}
    if serialized_file:
        model["serializedFile"] = os.path.basename(serialized_file)
    model["handler"] = os.path.basename(handler)
    if model_file:
        model["modelFile"] = os.path.basename(model_file)
    if version:
        model["modelVersion"] = version
    if requirements_file:
        model["requirementsFile"] = os.path.basename(requirements_file)
    if config_file:
        model["configFile"] = os.path.basename(config_file)
    return {
        "createdOn": (created_on or datetime.now()).strftime(CREATED_ON_FORMAT),
        "runtime": runtime,
        "model": model,
        "archiverVersion": ARCHIVER_VERSION,
    }


def dump_manifest(manifest: dict[str, Any]) -> str:
    """Serialize like torch-model-archiver (``json.dumps(..., indent=2)``)."""
    return json.dumps(manifest, indent=2)


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Parse and check manifest bytes; ``where`` names the source in error messages."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: {MANIFEST_PATH} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: {MANIFEST_PATH} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: {MANIFEST_PATH} must hold a JSON object")
    model = manifest.get("model")
    if not isinstance(model, dict):
        raise ManifestError(f"{where}: {MANIFEST_PATH} has no 'model' object")
    # The checks TorchServe's ModelArchive.validate makes (its runtime check is an enum).
    for key in ("modelName", "handler"):
        value = model.get(key)
        if not isinstance(value, str) or not value:
            raise ManifestError(f"{where}: {MANIFEST_PATH} has no model.{key}")
    version = model.get("modelVersion")
    if version is not None and not isinstance(version, (str, int, float)):
        raise ManifestError(f"{where}: {MANIFEST_PATH} model.modelVersion must be a string")
    runtime = manifest.get("runtime", "python")
    if not isinstance(runtime, str):
        raise ManifestError(f"{where}: {MANIFEST_PATH} runtime must be a string")
    return manifest
