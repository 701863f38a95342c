"""``ts.metrics.metric_encoder``: JSON for metric objects (anything with ``to_dict``)."""

from __future__ import annotations

import json
from typing import Any


class MetricEncoder(json.JSONEncoder):
    """Encodes objects that have ``to_dict()`` (``Dimension``, ``Metric``) as that dict."""

    def default(self, obj: Any) -> Any:
        if callable(getattr(obj, "to_dict", None)):
            return obj.to_dict()
        return super().default(obj)


__all__ = ["MetricEncoder"]
