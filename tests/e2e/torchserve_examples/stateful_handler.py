"""Stand-in for TorchServe's stateful (sequence batching) example handler.

Like the example it keeps each sequence's running sum in an LRU cache from a package that its
requirements.txt brings (installed per model; here a tiny local wheel instead of lru-dict).
"""

import logging
from abc import ABC

from lantern_tiny_lru import LRU
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StatefulHandler(BaseHandler, ABC):
    DEFAULT_CAPACITY = 10

    def __init__(self):
        super().__init__()
        self.cache = None
        self.context = None

    def initialize(self, ctx):
        super().initialize(ctx)
        self.context = ctx
        capacity = ctx.model_yaml_config["handler"]["cache"].get("capacity", self.DEFAULT_CAPACITY)
        self.cache = LRU(int(capacity))
        self.initialized = True

    def preprocess(self, data):
        results = []
        for idx, row in enumerate(data):
            sequence_id = self.context.get_sequence_id(idx)
            prev = int(self.cache[sequence_id]) if self.cache.has_key(sequence_id) else 0
            request = row.get("data") or row.get("body")
            if isinstance(request, (bytes, bytearray)):
                request = request.decode("utf-8")
            val = prev + int(request)
            self.cache[sequence_id] = val
            results.append(val)
        return results

    def inference(self, data, *args, **kwargs):
        return data

    def postprocess(self, data):
        return data
