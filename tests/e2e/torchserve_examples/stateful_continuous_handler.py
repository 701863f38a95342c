"""Stand-in for TorchServe's stateful/sequence_continuous_batching example handler.

It behaves as the example does: each sequence keeps a running sum in this worker; a new request
adds its number and answers the sum. An even number is answered at once; an odd one is answered in
parts (the sum again every ``step_delay_ms``, ``stream_steps`` times) through
``context.stopping_criteria``, while later requests of the sequence keep arriving in the same
batches. ``-1`` cancels the sequence's unfinished requests (they end at their next step) and
answers -1; ``0`` answers the sum and ends the sequence (the ``ts_request_sequence_end`` response
header). The first request of a sequence the server opened (``ts_request_sequence_start``) is
always answered at once. The example keeps the sums in an LRU cache; a dict is enough here.
"""

import logging
import time
from abc import ABC

from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StatefulContinuousHandler(BaseHandler, ABC):
    def __init__(self):
        super().__init__()
        self.context = None
        self.sums = {}  # sequence id -> running sum
        self.sequences = {}  # sequence id -> its flags and unfinished requests
        self.requests = {}  # request id -> its stopping criterion, whether it answers in parts

    def initialize(self, ctx):
        self.context = ctx
        config = (ctx.model_yaml_config or {}).get("handler") or {}
        self.steps = int(config.get("stream_steps", 10))
        self.delay = int(config.get("step_delay_ms", 20)) / 1000.0
        self.initialized = True

    def preprocess(self, data):
        ctx = self.context
        results = []
        for idx, row in enumerate(data):
            seq_id = ctx.get_sequence_id(idx)
            req_id = ctx.get_request_id(idx)
            ctx.set_response_header(idx, ctx.header_key_sequence_id, seq_id)
            if req_id in self.requests:  # a request carried on: its next part
                time.sleep(self.delay)
                results.append(self.sums.get(seq_id, 0))
                continue
            if ctx.get_request_header(idx, ctx.header_key_sequence_start):
                self.sums[seq_id] = 0
                self.sequences[seq_id] = {"start": True, "cancel": False, "end": False, "open": 0}
            seq = self.sequences.setdefault(
                seq_id, {"start": False, "cancel": False, "end": False, "open": 0}
            )
            body = row.get("data") or row.get("body")
            value = int(body.decode() if isinstance(body, (bytes, bytearray)) else body)
            request = {"stop": self.stopping_criterion(seq_id, req_id), "stream": False}
            self.requests[req_id] = request
            seq["open"] += 1
            if value == -1:
                seq["cancel"] = True
                results.append(-1)
                continue
            total = self.sums.get(seq_id, 0) + value
            self.sums[seq_id] = total
            if value == 0:
                seq["end"] = True
                ctx.set_response_header(idx, ctx.header_key_sequence_end, seq_id)
            elif value % 2:
                request["stream"] = True
            results.append(total)
        return results

    def inference(self, data, *args, **kwargs):
        return data

    def postprocess(self, data):
        ids = self.context.request_ids
        self.context.stopping_criteria = [self.requests[ids[i]]["stop"] for i in range(len(ids))]
        return data

    def stopping_criterion(self, seq_id, req_id):
        """Is the request's answer complete after this step? (None: it was never in parts.)

        A function, not a class: the handler module may hold only one class.
        """
        left = self.steps

        def stop(result):
            nonlocal left
            seq = self.sequences[seq_id]
            streaming = self.requests[req_id]["stream"]
            if seq["end"] or seq["cancel"]:
                self.forget(seq_id, req_id)
                return True if streaming else None  # a stream ends; a whole answer: no header
            if seq["start"] or not streaming:
                seq["start"] = False
                self.forget(seq_id, req_id)
                return None
            if left == 0:
                self.forget(seq_id, req_id)
                return True
            left -= 1
            return False

        return stop

    def forget(self, seq_id, req_id):
        """A request's answer is complete; a sequence with none left forgets a cancel or end."""
        self.requests.pop(req_id, None)
        seq = self.sequences[seq_id]
        seq["open"] -= 1
        if seq["open"] == 0:
            seq["cancel"] = False
            if seq["end"]:
                del self.sequences[seq_id]
                self.sums.pop(seq_id, None)
