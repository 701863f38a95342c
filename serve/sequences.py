"""Sequence batching for stateful models (TorchServe 0.11+): the settings and their checks.

A model with ``sequenceBatching: true`` in its model-config.yaml serves *sequences*: requests that
carry the same sequence id (the ``ts_request_sequence_id`` header; a request without one starts a
new sequence under a fresh id) are run one at a time, in arrival order, on the one worker the
sequence was given, so a handler can keep the sequence's state in that worker's memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serve.errors import BadRequest

# Settings of TorchServe 0.12 that Lantern does not implement: refused at registration, never
# silently ignored. (sequenceBatching + continuousBatching is TorchServe's "sequence continuous
# batching", whose handler keeps requests open across batches with stopping criteria.)
_UNSUPPORTED = {
    "continuousBatching": "continuous batching (and sequence continuous batching)",
    "useJobTicket": "job tickets",
}


def _flag(values: Mapping[str, Any], key: str) -> bool:
    value = values.get(key)
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return value is True


def _count(values: Mapping[str, Any], key: str) -> int:
    raw = values.get(key, 0)
    if raw is None:
        return 0
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise BadRequest(f"{key} must be a whole number, not {raw!r}.")
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise BadRequest(f"{key} must be a whole number, not {raw!r}.") from None
    if value < 0:
        raise BadRequest(f"{key} cannot be negative.")
    return value


@dataclass(frozen=True)
class SequenceSettings:
    """A model's sequence-batching settings (all 0 for a model without sequences)."""

    enabled: bool = False
    max_num_sequence: int = 0  # open sequences at once: max(yaml, batchSize x maxWorkers)
    max_sequence_job_queue_size: int = 0  # queued requests per sequence
    sequence_max_idle_msec: int = 0  # a sequence with no request for this long is closed
    sequence_timeout_msec: int = 0  # a sequence older than this takes no more requests; 0: never

    @classmethod
    def from_config(
        cls, values: Mapping[str, Any], batch_size: int, max_workers: int
    ) -> SequenceSettings:
        """The settings in a model-config.yaml mapping, with TorchServe's rules applied."""
        check_supported_settings(values)
        if not _flag(values, "sequenceBatching"):
            return cls()
        return cls(
            enabled=True,
            # TorchServe: at least one sequence per batch slot of every worker.
            max_num_sequence=max(
                _count(values, "maxNumSequence"), batch_size * max(1, max_workers)
            ),
            max_sequence_job_queue_size=max(1, _count(values, "maxSequenceJobQueueSize")),
            sequence_max_idle_msec=_count(values, "sequenceMaxIdleMSec"),
            sequence_timeout_msec=_count(values, "sequenceTimeoutMSec"),
        )


def check_supported_settings(values: Mapping[str, Any]) -> None:
    """Raise `BadRequest` for a model-config setting Lantern would otherwise have to ignore."""
    for key, what in _UNSUPPORTED.items():
        if _flag(values, key):
            raise BadRequest(
                f"{key}: true is not supported by Lantern ({what}); remove it from the model's "
                "configuration (sequenceBatching alone is supported)."
            )
    for key in (
        "maxNumSequence",
        "maxSequenceJobQueueSize",
        "sequenceMaxIdleMSec",
        "sequenceTimeoutMSec",
    ):
        _count(values, key)
    if _flag(values, "sequenceBatching") and _count(values, "sequenceMaxIdleMSec") <= 0:
        # TorchServe sets up no sequence table then, and drops every request of the model.
        raise BadRequest(
            "sequenceBatching needs sequenceMaxIdleMSec > 0 (how long an idle sequence is kept)."
        )
