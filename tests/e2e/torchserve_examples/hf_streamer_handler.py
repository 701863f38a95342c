"""Stand-in for TorchServe's inferentia2/llama/streamer example handler, on CPU.

It streams as that example does: ``generate`` runs in a thread with a
``ts.handler_utils.hf_batch_streamer.TextIteratorStreamerBatch`` over the batch, and each new
piece of text per row goes to the client at once with
``ts.handler_utils.utils.send_intermediate_predict_response``; the final answer of every row is
empty, so the parts make the whole text. The model is a transformers causal LM from the archive
(greedy, ``max_new_tokens`` from model-config.yaml's ``handler`` section, EOS ignored).
"""

import logging
import threading

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from ts.handler_utils.hf_batch_streamer import TextIteratorStreamerBatch
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class HFStreamerHandler(BaseHandler):
    def __init__(self):
        super().__init__()
        self.tokenizer = None
        self.max_new_tokens = 25

    def initialize(self, ctx):
        model_dir = ctx.system_properties.get("model_dir")
        config = ctx.model_yaml_config.get("handler", {})
        self.max_new_tokens = int(config.get("max_new_tokens", self.max_new_tokens))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.initialized = True

    def preprocess(self, requests):
        prompts = []
        for req in requests:
            data = req.get("data") or req.get("body")
            if isinstance(data, (bytes, bytearray)):
                data = data.decode("utf-8")
            prompts.append(data)
        return self.tokenizer(prompts, return_tensors="pt", padding=True)

    def inference(self, inputs):
        streamer = TextIteratorStreamerBatch(
            self.tokenizer,
            batch_size=inputs["input_ids"].shape[0],
            skip_prompt=True,
            skip_special_tokens=True,
            timeout=60,
        )
        kwargs = dict(
            inputs,
            streamer=streamer,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            eos_token_id=None,
        )
        thread = threading.Thread(target=self._generate, kwargs=kwargs)
        thread.start()
        for new_text in streamer:
            send_intermediate_predict_response(
                new_text, self.context.request_ids, "Intermediate Prediction success", 200,
                self.context,
            )  # fmt: skip
        thread.join()
        return [""] * inputs["input_ids"].shape[0]

    def _generate(self, **kwargs):
        with torch.inference_mode():
            self.model.generate(**kwargs)

    def postprocess(self, inference_output):
        return inference_output
