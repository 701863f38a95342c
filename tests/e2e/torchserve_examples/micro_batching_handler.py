"""Stand-in for TorchServe's micro_batching example handler."""

import logging

from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.image_classifier import ImageClassifier

logger = logging.getLogger(__name__)


class MicroBatchingHandler(ImageClassifier):
    def __init__(self):  # no super().__init__(), exactly like the example
        mb_handle = MicroBatching(self)
        self.handle = mb_handle

    def initialize(self, ctx):
        super().initialize(ctx)
        config = ctx.model_yaml_config.get("micro_batching", {})
        parallelism = config.get("parallelism", None)
        if parallelism:
            self.handle.parallelism = parallelism
        self.handle.micro_batch_size = config.get("micro_batch_size", 1)
