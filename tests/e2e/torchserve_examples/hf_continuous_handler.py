"""Stand-in for TorchServe's inferentia2/llama/continuous_batching example handler, on CPU.

It uses the contract the example does (``continuousBatching: true``): every ``handle`` call is
one step over ``context.request_ids``; a request id not in ``context.cache`` is new, and its
prompt is prefilled; the others decode one token; ``postprocess`` sets
``context.stopping_criteria`` from the cache, one callable per row, which counts down
``max_new_tokens``, stops at the EOS token and cleans the request up; ids that left the batch
(a client that went away) are cleaned up when a new request needs a slot. The first answer of a
request is its prompt and first token, each later one the next token, as the example answers.

The example's Neuron model keeps a KV cache per slot; this one recomputes each sequence's whole
forward per step (a transformers causal LM from the archive, greedy), so its tokens equal
``generate``'s. Each row also says which requests shared the step (``batch``), for the test, and
``handler.step_delay_ms`` slows every step so that a late request surely joins a running one.
"""

import logging
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class HFContinuousBatchingHandler(BaseHandler):
    def __init__(self):
        super().__init__()
        self.tokenizer = None
        self.batch_size = 2
        self.max_new_tokens = 25
        self.stop_at_eos = True
        self.delay = 0.0
        self.empty_slots = []  # as the example's seq ids: one per batch row
        self.slot_to_req_id = {}

    def initialize(self, ctx):
        ctx.cache = {}
        model_dir = ctx.system_properties.get("model_dir")
        config = ctx.model_yaml_config.get("handler", {})
        self.max_new_tokens = int(config.get("max_new_tokens", self.max_new_tokens))
        self.batch_size = int(ctx.model_yaml_config.get("batchSize", self.batch_size))
        self.stop_at_eos = bool(config.get("stop_at_eos", True))
        self.delay = int(config.get("step_delay_ms", 0)) / 1000.0
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.empty_slots = list(reversed(range(self.batch_size)))
        logger.info("Model %s loaded successfully", ctx.model_name)
        self.initialized = True

    def preprocess(self, requests):
        new, running = [], []
        for req_id, req_data in zip(self.context.request_ids.values(), requests, strict=True):
            if req_id in self.context.cache:
                running.append(req_id)
                continue
            slot = self._get_empty_slot()
            self.slot_to_req_id[slot] = req_id
            data = req_data.get("data") or req_data.get("body")
            if isinstance(data, (bytes, bytearray)):
                data = data.decode("utf-8")
            max_new_tokens = int(data.get("max_new_tokens", self.max_new_tokens))
            self.context.cache[req_id] = {
                "slot": slot,
                "prompt": data["prompt"],
                "ids": self.tokenizer.encode(data["prompt"]),
                "stopping_criteria": self._create_stopping_criteria(req_id, slot, max_new_tokens),
            }
            new.append(req_id)
        return new, running

    def inference(self, inputs):
        new, _ = inputs
        time.sleep(self.delay)
        batch = list(self.context.request_ids.values())
        results = {}
        with torch.inference_mode():
            for req_id in batch:
                state = self.context.cache[req_id]
                logits = self.model(torch.tensor([state["ids"]])).logits
                token = int(logits[0, -1].argmax())
                state["ids"].append(token)
                text = self.tokenizer.decode([token])
                if req_id in new:  # the prefill step answers the prompt too
                    text = state["prompt"] + text
                results[req_id] = {"text": text, "tokens": [token], "batch": batch}
        return [results[req_id] for req_id in batch]

    def postprocess(self, inference_output):
        self.context.stopping_criteria = [
            self.context.cache[req_id]["stopping_criteria"]
            for req_id in self.context.request_ids.values()
        ]
        return inference_output

    def _get_empty_slot(self):
        if not self.empty_slots:
            self._clean_dead_reqs()
        assert self.empty_slots, "more requests than batchSize in one step"
        return self.empty_slots.pop()

    def _clean_dead_reqs(self):
        for slot, req_id in list(self.slot_to_req_id.items()):
            if req_id not in self.context.request_ids.values():
                self._clean_up(slot, req_id)

    def _clean_up(self, slot, req_id):
        del self.slot_to_req_id[slot]
        del self.context.cache[req_id]
        self.empty_slots.append(slot)

    def _create_stopping_criteria(self, req_id, slot, max_new_tokens):
        """A function, not a class: the handler module may hold only one class."""
        left = max_new_tokens
        eos = self.tokenizer.eos_token_id

        def stop(result):
            nonlocal left
            left -= 1
            if left == 0 or (self.stop_at_eos and result["tokens"][-1] == eos):
                self._clean_up(slot, req_id)
                return True
            return False

        return stop
