"""Warm-up: sample requests a worker runs through its real handler before it takes traffic.

Samples come from the archive: every file in its ``warmup/`` folder (the content type from the
file's extension), and the ``warmup`` list of ``model-config.yaml``, whose entries are
``{file: warmup/cat.jpg, contentType: image/jpeg}`` or ``{body: ..., contentType: ...}`` (a
mapping or list body is sent as JSON). They are sent at every batch size from 1 to the model's
``batchSize`` (or the sizes in ``warmupBatchSizes``), each sample leading one batch per size.
Any error answer fails the warm-up, and with it the worker's start. Triton's ``model_warmup``
(config.pbtxt, mapped to ``tritonWarmup``) adds tensor requests of zeros or random data.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.wire.frames import Frame
from serve.wire.messages import ErrorItem, PredictItem, WorkerSpec, decode_result, encode_predict

logger = logging.getLogger("serve.worker")

WARMUP_DIR = "warmup"
_TYPES = {".json": "application/json", ".txt": "text/plain", ".bin": "application/octet-stream"}


class WarmupFailed(Exception):
    """A warm-up sample was answered with an error, or the samples could not be read."""


@dataclass(frozen=True)
class Sample:
    name: str
    content_type: str | None
    body: bytes


def load_samples(model_dir: str | Path, model_config: dict[str, Any]) -> list[Sample]:
    """The archive's warm-up samples: the ``warmup`` list first, then the ``warmup/`` folder."""
    root = Path(model_dir)
    samples: list[Sample] = []
    listed = model_config.get("warmup") or []
    if not isinstance(listed, list):
        raise WarmupFailed("model-config.yaml 'warmup' must be a list of samples")
    for i, entry in enumerate(listed):
        samples.append(_listed_sample(root, entry, i))
    folder = root / WARMUP_DIR
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                samples.append(Sample(path.name, _content_type(path), path.read_bytes()))
    return samples


def _listed_sample(root: Path, entry: Any, index: int) -> Sample:
    if not isinstance(entry, dict):
        raise WarmupFailed(f"warmup[{index}] must be a mapping with 'file' or 'body'")
    content_type = entry.get("contentType") or entry.get("content_type")
    if "file" in entry:
        path = (root / str(entry["file"])).resolve()
        if not path.is_relative_to(root.resolve()) or not path.is_file():
            raise WarmupFailed(f"warmup[{index}]: no file {entry['file']!r} in the archive")
        return Sample(str(entry["file"]), content_type or _content_type(path), path.read_bytes())
    if "body" not in entry:
        raise WarmupFailed(f"warmup[{index}] must have 'file' or 'body'")
    body, name = entry["body"], f"warmup[{index}]"
    if isinstance(body, (dict, list)):
        return Sample(name, content_type or "application/json", json.dumps(body).encode())
    if isinstance(body, bytes):
        return Sample(name, content_type, body)
    return Sample(name, content_type or "text/plain", str(body).encode())


def _content_type(path: Path) -> str | None:
    return _TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0]


def batch_sizes(batch_size: int, override: Any = None) -> list[int]:
    """Every batch size the batcher can form (1..batch_size), or the configured ones."""
    if override:
        sizes = override if isinstance(override, list) else [override]
        try:
            chosen = sorted({int(s) for s in sizes if 1 <= int(s) <= max(batch_size, 1)})
        except (TypeError, ValueError):
            raise WarmupFailed(f"warmupBatchSizes must be numbers; got {override!r}") from None
        if chosen:
            return chosen
    return list(range(1, max(batch_size, 1) + 1))


def warmup_frames(samples: Sequence[Sample], sizes: Sequence[int]) -> list[Frame]:
    """One PREDICT frame per (batch size, leading sample); requests cycle through the samples."""
    frames = []
    n = 0
    for size in sizes:
        for lead in range(len(samples)):
            requests = []
            for k in range(size):
                sample = samples[(lead + k) % len(samples)]
                n += 1
                ct = sample.content_type
                headers = {"content-type": ct} if ct else {}
                requests.append(PredictItem(f"warmup-{n}", headers, [("body", ct, sample.body)]))
            frames.append(encode_predict(0, requests))
    return frames


def triton_frames(entries: Sequence[dict[str, Any]]) -> list[Frame]:
    """config.pbtxt's ``model_warmup`` (as ``tritonWarmup``): each sample ``count`` times, one
    request a batch, as tensors on the Open Inference Protocol path."""
    import numpy as np

    from serve.wire import OIP, PROTOCOL_HEADER
    from serve.wire.tensor_params import tensor_content_type
    from serve.wire.tensors import NUMPY_DTYPES

    frames = []
    rng = np.random.default_rng(0)
    for index, entry in enumerate(entries):
        params: list[tuple[str, str | None, bytes]] = []
        for name, spec in (entry.get("inputs") or {}).items():
            datatype, shape = str(spec["datatype"]), [int(d) for d in spec["shape"]]
            if datatype == "BYTES":
                raw = b"".join(len(b"").to_bytes(4, "little") for _ in range(int(np.prod(shape))))
            else:
                dtype = NUMPY_DTYPES[datatype]
                array = (
                    rng.random(shape).astype(dtype)
                    if spec.get("random")
                    else np.zeros(shape, dtype)
                )
                raw = array.tobytes()
            params.append((name, tensor_content_type(datatype, shape), raw))
        for n in range(int(entry.get("count", 1))):
            headers = {PROTOCOL_HEADER: OIP}
            item = PredictItem(f"warmup-{entry.get('name') or index}-{n}", headers, params)
            frames.append(encode_predict(0, [item]))
    return frames


def run_warmup(
    service: Any,
    context: Any,
    spec: WorkerSpec,
    run_batch: Callable[[Any, Any, Frame, bool], Frame],
) -> dict[str, Any]:
    """Send the archive's samples through the handler; returns what was run and how long it took.

    Raises `WarmupFailed` on the first error answer.
    """
    model_config = spec.model_yaml_config
    samples = load_samples(spec.model_dir, model_config)
    tensor_frames = triton_frames(model_config.get("tritonWarmup") or [])
    if not samples and not tensor_frames:
        return {"requests": 0, "batches": 0, "seconds": 0.0}
    sizes = batch_sizes(spec.batch_size or 1, model_config.get("warmupBatchSizes"))
    decode = spec.decode_input_request
    started = time.perf_counter()
    frames = (warmup_frames(samples, sizes) if samples else []) + tensor_frames
    requests = 0
    for frame in frames:
        result = decode_result(run_batch(service, context, frame, decode))
        requests += len(frame.meta["requests"])
        for item in result.items:
            if isinstance(item, ErrorItem):
                code, detail = item.code, item.message
            elif item.status >= 400:
                code, detail = item.status, bytes(item.body[:200]).decode(errors="replace")
            else:
                continue
            raise WarmupFailed(
                f"warm-up request failed at batch size {len(frame.meta['requests'])} "
                f"({code}): {detail}"
            )
    seconds = time.perf_counter() - started
    logger.info(
        "Warm-up: %d requests in %d batches (sizes %s) took %.3f s",
        requests,
        len(frames),
        ",".join(map(str, sizes)),
        seconds,
    )
    return {"requests": requests, "batches": len(frames), "seconds": seconds}
