"""``Context`` and ``RequestProcessor``: TorchServe's per-worker handler context (``ts.context``).

Differences from TorchServe, all additive:

* ``system_properties`` also carries ``num_threads`` (the worker's intra-op thread budget).
* ``request_processor`` starts as an empty list, and an index past its end gets a fresh, empty
  ``RequestProcessor`` instead of an ``IndexError``, so handlers can be driven outside a server.
* Request-header lookups fall back to a case-insensitive match (HTTP header names are).
* ``handler_timings`` (phase -> seconds, filled by ``BaseHandler.handle``) and
  ``intermediate_responses`` (chunks from ``send_intermediate_predict_response``) are new.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from handlers.metrics import MetricsStore

# The request properties TorchServe's frontend uses for a sequence (stateful session): its id, a
# flag on the first request of a sequence the server named, and the end a handler may declare.
# Workers read TorchServe's environment overrides (TS_REQUEST_SEQUENCE_ID, ...), as ts.context does.
SEQUENCE_ID_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
SEQUENCE_START_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start")
SEQUENCE_END_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end")


class RequestProcessor:
    """Request headers of one request in a batch, plus the response status/headers it gets."""

    def __init__(self, request_header: dict) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header if request_header is not None else {}

    def get_request_property(self, key: str) -> Any:
        """One request header (exact name first, then case-insensitively), or None."""
        if key in self._request_header:
            return self._request_header[key]
        lowered = key.lower()
        for name, value in self._request_header.items():
            if isinstance(name, str) and name.lower() == lowered:
                return value
        return None

    def get_request_properties(self) -> dict:
        """All request headers."""
        return self._request_header

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        """Set this request's response status."""
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        """Set a response header."""
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)


class Context:
    """Model and worker facts for a handler, plus per-batch request/response metadata."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict,
        batch_size: int,
        gpu_id: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: MetricsStore | None = None,
        model_yaml_config: dict | None = None,
        num_threads: int | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties = {
            "model_dir": model_dir,
            "gpu_id": gpu_id,
            "batch_size": batch_size,
            "server_name": "MMS",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
            "num_threads": num_threads,
        }
        self.model_yaml_config: dict = model_yaml_config if model_yaml_config is not None else {}
        self._metrics = metrics if metrics is not None else MetricsStore(model_name)
        self._request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] = []
        self.handler_timings: dict[str, float] = {}
        self.intermediate_responses: list[dict] = []
        # When set (by a streaming-capable worker), intermediate chunks go here, not to the list.
        self.intermediate_sink: Callable[[dict], None] | None = None
        # TorchServe handlers occasionally poke at the worker socket; there is none to reach here.
        self.cl_socket = None
        self.stopping_criteria: list | None = None
        # Per-request state a continuous-batching handler keeps across steps (TorchServe's habit).
        self.cache: dict = {}
        self.header_key_sequence_id = SEQUENCE_ID_HEADER
        self.header_key_sequence_start = SEQUENCE_START_HEADER
        self.header_key_sequence_end = SEQUENCE_END_HEADER

    @property
    def system_properties(self) -> dict:
        return self._system_properties

    @property
    def metrics(self) -> MetricsStore:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: MetricsStore) -> None:
        self._metrics = metrics
        if metrics is not None and hasattr(metrics, "set_request_ids"):
            metrics.set_request_ids(self._request_ids)

    @property
    def request_ids(self) -> dict[int, str] | None:
        return self._request_ids

    @request_ids.setter
    def request_ids(self, request_ids: dict[int, str] | None) -> None:
        self._request_ids = request_ids
        # Metrics carry the request id of the batch they were recorded in, as in TorchServe.
        if self._metrics is not None and hasattr(self._metrics, "set_request_ids"):
            self._metrics.set_request_ids(request_ids)

    @property
    def request_processor(self) -> list[RequestProcessor]:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, request_processor: list[RequestProcessor] | None) -> None:
        self._request_processor = list(request_processor) if request_processor else []

    def _processor(self, idx: int) -> RequestProcessor:
        while len(self._request_processor) <= idx:
            self._request_processor.append(RequestProcessor({}))
        return self._request_processor[idx]

    def get_request_id(self, idx: int = 0) -> str | None:
        """Request id of batch row ``idx``."""
        if self._request_ids is None:
            return None
        return self._request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        """One request header of batch row ``idx``, or None."""
        return self._processor(idx).get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict:
        """All request headers of batch row ``idx``."""
        return self._processor(idx).get_request_properties()

    def get_sequence_id(self, idx: int) -> str | None:
        """Sequence (session) id of batch row ``idx`` for stateful models, or None."""
        return self._processor(idx).get_request_property(self.header_key_sequence_id)

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._processor(idx).add_response_property(key, value)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._processor(idx).get_response_headers()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        """The Content-Type set for row ``idx`` (TorchServe's handlers write "Content-Type")."""
        for name, value in self.get_response_headers(idx).items():
            if isinstance(name, str) and name.lower() == "content-type":
                return value
        return None

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._processor(idx)
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        """Set the HTTP status of batch row ``idx``'s response."""
        self._processor(idx).report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        """Set the HTTP status of every response in the batch."""
        for processor in self._request_processor:
            processor.report_status(code, reason_phrase=phrase)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self.__dict__ == other.__dict__
