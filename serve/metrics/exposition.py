"""The Prometheus text format (0.0.4) we serve, TorchServe's counters without ``_total``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

# The text format we serve (TorchServe serves 0.0.4 too); Requests2XX-style counters need it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class BareCounter(Metric):
    """A counter exposed under its own name, without ``_total`` (TorchServe's older names)."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "counter")


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def render(families: Iterable[Metric]) -> bytes:
    """Text format 0.0.4. `BareCounter` families (TorchServe's ``Requests2XX``) are written by
    hand: prometheus_client would add ``_total`` to their HELP and TYPE lines."""
    standard: list[Metric] = []
    bare: list[str] = []
    for family in families:
        if isinstance(family, BareCounter):
            doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            bare.append(f"# HELP {family.name} {doc}\n# TYPE {family.name} counter\n")
            for s in family.samples:
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                bare.append(f"{s.name}{{{labels}}} {float(s.value)!r}\n")
        else:
            standard.append(family)
    return generate_latest(_Families(standard)) + "".join(bare).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
