"""A stand-in for TorchServe's NMT transformer handlers: a phrase book instead of fairseq.

Same contract: a batch of texts in, one ``{"input": text, "<lang>_output": translation}`` each.
``handler.output_key`` and ``handler.phrases`` come from model-config.yaml. Each answer also says
which request ids shared its batch (``batch``), so a test can see workflow and direct requests
batched together. A text ``SLOW <path>`` touches ``<path>`` and holds the worker for 1.5 s.
"""

import time


class PhraseBook:
    def initialize(self, context):
        config = (context.model_yaml_config or {}).get("handler", {})
        self.key = config["output_key"]
        self.phrases = config["phrases"]

    def translate(self, text):
        text = text.strip()
        return self.phrases.get(text, f"<{text}>")

    def handle(self, data, context):
        if data is None:
            return None
        ids = [context.request_ids[i] for i in range(len(data))]
        out = []
        for row in data:
            text = row.get("data") or row.get("body")
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            if text.startswith("SLOW "):
                with open(text[5:].strip(), "w") as marker:
                    marker.write("busy")
                time.sleep(1.5)
            out.append({"input": text, self.key: self.translate(text), "batch": ids})
        return out
