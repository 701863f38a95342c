"""A torch-free handler that answers like ``text_generation`` (for the OpenAI API's tests).

It parses requests with the real ``handlers.generation.params`` (so bad fields get the real
400s), renders chat ``messages`` with a fixed template, and "generates" ``w0 w1 ...``: one word
per token up to ``max_tokens`` (``finish_reason: length``), or up to the first ``stop`` string
(``stop``). Rows that ask for ``"stream": true`` get each word as an intermediate response,
their final answer holding the last part only, as ``text_generation`` does. With
``url_path: v1/embeddings`` it answers ``{"input": [texts]}`` with ``[len(text), words]``
vectors. A prompt of ``slow`` waits on the marker file ``release`` in the model directory
before its last word, so a test can drop a stream mid-way.
"""

from __future__ import annotations

import json
from typing import Any

from handlers.exceptions import PredictionException
from handlers.generation.params import parse_request
from handlers.streaming import send_intermediate_predict_response


def _template(messages: list[dict[str, str]]) -> str:
    return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def _payload(row: Any) -> Any:
    value = row.get("data") if isinstance(row, dict) else row
    return row.get("body") if value is None and isinstance(row, dict) else value


class FakeLLMHandler:
    def initialize(self, context: Any) -> None:
        self.initialized = True

    def _words(self, prompt: str, params: Any) -> tuple[list[str], str]:
        words: list[str] = []
        for i in range(params.max_tokens):
            word = f" w{i}" if i else "w0"
            if any(stop in "".join(words) + word for stop in params.stop):
                return words, "stop"
            words.append(word)
        return words, "length"

    def handle(self, data: list, context: Any) -> list:
        if context.get_request_header(0, "url_path") == "v1/embeddings":
            return [self._embed(row) for row in data]
        results: list[Any] = [None] * len(data)
        plans = {}
        for i, row in enumerate(data):
            try:
                request = parse_request(_payload(row), 64, 320, _template)
            except PredictionException as exc:
                context.set_response_status(exc.error_code, exc.message, idx=i)
                results[i] = {"code": exc.error_code, "message": exc.message}
                continue
            words, reason = self._words(request.prompt, request.params)
            plans[i] = (request, words, reason)
        streaming = [i for i, (r, _, _) in plans.items() if r.stream]
        longest = max((len(w) for _, w, _ in plans.values()), default=0)
        for step in range(longest - 1):
            if streaming:
                chunk: list[Any] = [""] * len(data)
                for i in streaming:
                    words = plans[i][1]
                    if step < len(words) - 1:
                        chunk[i] = {"text": words[step], "tokens": [step]}
                send_intermediate_predict_response(chunk, context.request_ids, "part", 200, context)
        for i, (request, words, reason) in plans.items():
            prompt_tokens = len(request.prompt.split())
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(words),
                "total_tokens": prompt_tokens + len(words),
            }
            text = (words[-1] if words else "") if request.stream else "".join(words)
            results[i] = {
                "text": text,
                "finish_reason": reason,
                "usage": usage,
                "prompt": request.prompt,
            }
        return results

    @staticmethod
    def _embed(row: Any) -> dict:
        payload = _payload(row)
        texts = (
            json.loads(payload)["input"] if isinstance(payload, (bytes, str)) else payload["input"]
        )
        vectors = [[float(len(t)), float(len(t.split()))] for t in texts]
        return {"data": vectors, "usage": {"prompt_tokens": sum(len(t.split()) for t in texts)}}
