"""A model-free TorchServe-style handler for the observability tests.

It goes through ``BaseHandler.handle`` (so the worker reports preprocess / inference / postprocess
timings), sleeps ``SLEEP`` seconds per batch in inference so that concurrent requests form
batches, and reports custom metrics through ``context.metrics``. Body ``boom`` raises in
inference; ``say TEXT`` prints TEXT and logs it at WARNING.
"""

import logging
import time

from ts.metrics.dimension import Dimension
from ts.torch_handler.base_handler import BaseHandler

SLEEP = 0.05
logger = logging.getLogger(__name__)


class MetricsHandler(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True

    def preprocess(self, data):
        rows = []
        for row in data:
            body = row.get("body", row.get("data"))
            rows.append(body.decode() if isinstance(body, (bytes, bytearray)) else str(body))
        self.context.metrics.add_counter("RowsSeen", len(rows), None, [Dimension("Kind", "rows")])
        return rows

    def inference(self, rows):
        time.sleep(SLEEP)
        for text in rows:
            if text == "boom":
                raise ValueError("boom in inference")
            if text.startswith("say "):
                print(text[4:], flush=True)
                logger.warning("handler says %s", text[4:])
        return rows

    def postprocess(self, rows):
        metrics = self.context.metrics
        metrics.add_time("EchoTime", 1.5, None, "ms")
        metrics.add_size("EchoSize", 2.0, None, "kB")
        metrics.add_percent("EchoPercent", 42.0)
        metrics.add_metric("Echo-Batch.rows", len(rows), "count", None, {"odd-dim": "x y"})
        return [{"echo": text, "batch": len(rows)} for text in rows]
