"""TF Serving's warm-up: ``assets.extra/tf_serving_warmup_requests`` replayed before traffic.

The file is a TFRecord file of ``PredictionLog`` messages (TF Serving's format): each record is
an 8-byte little-endian length, a 4-byte checksum of it, the bytes and a 4-byte checksum of them
(the checksums are not verified here; a truncated file is an error). Each ``predict_log``,
``classify_log`` and ``regress_log`` request is sent once to the new version, through the same
path as a client's (`TfServingService.predict_on` and its Classify/Regress), before the version
is made the default. TF Serving's limit of 1000 records holds. A record of another kind is
skipped and said.
"""

from __future__ import annotations

import logging
import struct
import uuid
from pathlib import Path
from typing import Any

from serve.core.model import ModelVersion
from serve.grpc.gen.tensorflow_serving.apis import prediction_log_pb2
from serve.grpc.tfserving import Origin, TfServingService

logger = logging.getLogger(__name__)

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_RECORDS = 1000
_HEADER = struct.Struct("<QI")


class WarmupError(ValueError):
    """A warm-up file that cannot be read; the message names it."""


def read_records(data: bytes, where: str) -> list[bytes]:
    """The records of a TFRecord file's bytes."""
    records = []
    offset = 0
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            raise WarmupError(f"{where}: truncated record header at byte {offset}")
        (length, _) = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        end = start + length
        if end + 4 > len(data):
            raise WarmupError(f"{where}: truncated record at byte {offset}")
        records.append(data[start:end])
        offset = end + 4
        if len(records) > MAX_RECORDS:
            raise WarmupError(f"{where}: more than {MAX_RECORDS} warm-up records")
    return records


def write_records(records: list[bytes]) -> bytes:
    """TFRecord framing for ``records`` (zero checksums: for tests and tools)."""
    return b"".join(_HEADER.pack(len(r), 0) + r + b"\0\0\0\0" for r in records)


def read_warmup(path: Path) -> list[Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WarmupError(f"{path}: cannot be read: {exc}") from None
    logs = []
    for i, record in enumerate(read_records(data, str(path))):
        log = prediction_log_pb2.PredictionLog()
        try:
            log.ParseFromString(record)
        except Exception as exc:
            raise WarmupError(f"{path}: record {i} is not a PredictionLog ({exc})") from None
        logs.append(log)
    return logs


class Warmup:
    """Replays a version folder's warm-up records on the version just loaded."""

    def __init__(self, service: TfServingService) -> None:
        self.service = service

    async def replay(self, model: ModelVersion, folder: Path) -> int:
        """The number of requests replayed; raises ``WarmupError`` or the request's error."""
        path = folder / WARMUP_FILE
        if not path.is_file():
            return 0
        logs = read_warmup(path)
        done = 0
        for log in logs:
            kind = log.WhichOneof("log_type")
            origin = Origin(f"warmup-{uuid.uuid4().hex[:12]}", {})
            if kind == "predict_log":
                await self.service.predict_on(model, log.predict_log.request, origin)
            elif kind == "classify_log":
                await self.service.classify_on(model, log.classify_log.request.input, origin)
            elif kind == "regress_log":
                await self.service.regress_on(model, log.regress_log.request.input, origin)
            else:
                logger.warning("Model %s: skipping a %s warm-up record", model.name, kind)
                continue
            done += 1
        logger.info(
            "Model %s version %s: replayed %d warm-up requests from %s",
            model.name,
            model.version,
            done,
            path,
        )
        return done
