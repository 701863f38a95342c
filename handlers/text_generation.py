"""``TextGenerationHandler``: the built-in generative handler for Hugging Face causal LMs.

The archive holds a ``save_pretrained`` folder (safetensors + tokenizer files) or one ``.gguf``
file (see `handlers.generation.loading`). A request is a JSON object with a ``prompt`` and
OpenAI-style sampling fields (`handlers.generation.params`), or plain UTF-8 text as the prompt.

Two ways to drive it, one engine (`handlers.generation.engine.Engine`) under both:

* ``continuousBatching: true`` in model-config.yaml: TorchServe 0.12's contract. Every ``handle``
  call is one engine step over ``context.request_ids``; new ids are added, ids that disappeared
  are cancelled, each row gets ``{"text", "tokens", "finished", "finish_reason"}`` for this step
  and ``context.stopping_criteria`` says which rows are done. Per-request state is in
  ``context.cache`` as TorchServe's handlers keep it.
* otherwise, one ``handle`` call runs its batch to completion; rows that asked for
  ``"stream": true`` get each step's text through ``send_intermediate_predict_response``.

A worker that runs many requests at once (`serve.worker.concurrent`, the default for this handler
without ``continuousBatching``) drives the engine directly through ``request_streams()``: each
request joins the engine's next step as it arrives and streams its tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from handlers import runtimes
from handlers.context import Context
from handlers.exceptions import HandlerLoadError, PredictionException, report_failure
from handlers.generation.deadline import TimeLimitExceeded, time_limit
from handlers.generation.engine import Engine, StepOutput
from handlers.generation.loading import cuda_graphs, engine_limits, load_model
from handlers.generation.params import GenerationRequest, parse_request
from handlers.generation.streams import RequestStreams
from handlers.generation.streams import logprobs_rows as _logprobs
from handlers.generation.streams import usage as _usage
from handlers.streaming import send_intermediate_predict_response

logger = logging.getLogger(__name__)

# Seconds a chat template may take to render (``handler.chat_template_timeout``).
TEMPLATE_TIMEOUT = 5.0
# The most bytes one prompt character takes in a JSON body (a character outside the BMP written
# as two ``\uXXXX`` escapes), and room for every other field (chat messages' roles and
# separators, 16 stop strings of 256 characters, 1,024 stop token ids, ...).
MAX_ESCAPED_CHAR = 12
OTHER_FIELDS_BYTES = 1 << 20


def _max_prompt_chars(config: dict, tokenizer: Any, max_model_len: int) -> int:
    """The fewest prompt characters that cannot fit in ``max_model_len`` tokens, whatever they
    are: ``max_model_len`` x the most UTF-8 bytes one vocabulary entry spells. A character is at
    least a byte and a token covers at most that many, so a prompt this long has at least
    ``max_model_len`` tokens and is refused without tokenizing it (a 6 MB prompt took 5.6 s and
    ~900 MB of the worker's memory to tokenize before its 400). The entries over-count (a
    byte-level ``Ġ`` is two bytes for one); a tokenizer that folds a long run of text into one
    token (an unknown token fused over a whole word, a normalizer that deletes text) could fit
    a longer prompt: ``handler.max_prompt_chars`` sets the bound then."""
    value = config.get("max_prompt_chars")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HandlerLoadError(
                "text_generation: handler.max_prompt_chars must be an integer > 0"
            )
        return value
    vocab = tokenizer.get_vocab()
    widest = max((len(token.encode("utf-8", "surrogatepass")) for token in vocab), default=1)
    return max_model_len * max(widest, 1)


def _seconds(config: dict, name: str, default: float) -> float:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HandlerLoadError(f"text_generation: handler.{name} must be a number of seconds > 0")
    return float(value)


def _payload(row: Any) -> Any:
    if isinstance(row, dict) and ("data" in row or "body" in row):
        value = row.get("data")
        return value if value is not None else row.get("body")
    return row


class TextGenerationHandler:
    """Generates text for prompts with continuous batching inside the worker."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.context: Context | None = None
        self.continuous = False
        self.initialized = False
        self.template_timeout = TEMPLATE_TIMEOUT
        self.max_prompt_chars = 0  # set from the tokenizer once loaded
        self.max_request_bytes = 0

    def initialize(self, context: Context) -> None:
        """Load the model and tokenizer and build the engine from model-config.yaml's limits."""
        self.context = context
        properties = context.system_properties
        runtimes.set_num_threads(properties.get("num_threads"))
        device = runtimes.select_device(properties.get("gpu_id"))
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        config = yaml_config.get("handler") or {}
        model, tokenizer = load_model(properties["model_dir"], config, device)
        limits = engine_limits(config, model, properties.get("batch_size"))
        self.engine = Engine(model, tokenizer, limits, cuda_graphs=cuda_graphs(config))
        self.engine.warm_up()
        self.template_timeout = _seconds(config, "chat_template_timeout", TEMPLATE_TIMEOUT)
        self.max_prompt_chars = _max_prompt_chars(config, tokenizer, limits.max_model_len)
        # A body larger than this cannot hold a prompt that fits: the worker loop refuses it
        # before parsing its JSON (`serve.worker.concurrent`).
        self.max_request_bytes = MAX_ESCAPED_CHAR * self.max_prompt_chars + OTHER_FIELDS_BYTES
        self.continuous = bool(yaml_config.get("continuousBatching", False))
        context.cache = {}
        self.initialized = True
        logger.info("text_generation: %s loaded, limits %s", context.model_name, limits.as_dict())

    def parse(self, row: Any) -> GenerationRequest:
        """A request from its row; a prompt too long to fit whatever its tokens is refused here,
        before anything tokenizes it (`_max_prompt_chars`)."""
        assert self.engine is not None
        limit = self.engine.limits().max_model_len
        request = parse_request(_payload(row), limit, self.engine.vocab_size, self._chat_prompt)
        if self.max_prompt_chars and len(request.prompt) >= self.max_prompt_chars:
            raise PredictionException(
                f"the prompt has {len(request.prompt)} characters; this model takes at most "
                f"{limit - 1} tokens, which spell fewer than {self.max_prompt_chars} characters",
                400,
            )
        return request

    def _chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Chat messages as the prompt, by the tokenizer's chat template."""
        assert self.engine is not None
        tokenizer = self.engine.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise PredictionException("this model's tokenizer has no chat template", 400)
        try:
            with time_limit(self.template_timeout, "the chat template"):
                text = tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
        except TimeLimitExceeded as exc:  # a template that loops (near) forever
            message = f"{exc} (handler.chat_template_timeout); the request is refused"
            raise PredictionException(message, 500) from None
        except Exception as exc:  # a template that raises on these messages
            raise PredictionException(f"the chat template failed: {exc}", 400) from None
        return str(text)

    def request_streams(self) -> RequestStreams | None:
        """The engine for a worker to drive request by request; None in continuous-batching mode
        (TorchServe's one-``handle``-per-step contract)."""
        if self.engine is None or self.continuous:
            return None
        return RequestStreams(self.engine)

    def describe(self) -> dict[str, Any]:
        """The engine's limits and live counts (for ``describe``)."""
        assert self.engine is not None
        return {"limits": self.engine.limits().as_dict(), "stats": self.engine.stats()}

    def handle(self, data: list, context: Context) -> list:
        if self.continuous:
            return self._step(data, context)
        return self._run(data, context)

    def _add(self, request_id: str, row: Any) -> GenerationRequest:
        """Parse a row and add it to the engine; anything that fails (seeding included) is a
        `PredictionException` for that row alone, never an error of the whole batch."""
        assert self.engine is not None
        try:
            request = self.parse(row)
            self.engine.add(request_id, request)
        except PredictionException:
            raise
        except Exception as exc:
            code, _, message = report_failure(exc, [request_id], logger)
            raise PredictionException(message, code) from exc
        return request

    # -- one call per step (TorchServe continuous batching) ------------------------------------

    def _step(self, data: list, context: Context) -> list:
        engine = self.engine
        assert engine is not None
        cache: dict[str, Any] = context.cache
        ids = [context.get_request_id(i) or str(i) for i in range(len(data))]
        for request_id in set(cache) - set(ids):  # gone from the batch: the client left
            engine.cancel(request_id)
            cache.pop(request_id, None)
        results: dict[str, Any] = {}
        for i, (request_id, row) in enumerate(zip(ids, data, strict=True)):
            if request_id in cache:
                continue
            try:
                self._add(request_id, row)
                cache[request_id] = {"finished": False}
            except PredictionException as exc:
                context.set_response_status(exc.error_code, exc.message, idx=i)
                results[request_id] = {"finished": True, "error": exc.message}
        outputs = {out.request_id: out for out in engine.step()}
        rows = []
        for i, request_id in enumerate(ids):
            if request_id in results:
                rows.append(results[request_id])
                continue
            out = outputs.get(request_id)
            row = self._step_row(out, engine.tokenizer)
            if out is not None and out.error is not None:
                context.set_response_status(out.error.error_code, out.error.message, idx=i)
            if row["finished"]:
                cache.pop(request_id, None)
            rows.append(row)
        context.stopping_criteria = [lambda result: bool(result.get("finished")) for _ in rows]
        return rows

    @staticmethod
    def _step_row(out: StepOutput | None, tokenizer: Any) -> dict[str, Any]:
        if out is None:  # waiting, or prefilling a long prompt
            return {"text": "", "tokens": [], "finished": False, "finish_reason": None}
        row: dict[str, Any] = {
            "text": out.text,
            "tokens": out.token_ids,
            "finished": out.finished,
            "finish_reason": out.finish_reason,
        }
        if out.error is not None:
            row["error"] = out.error.message
        if out.logprobs is not None:
            row["logprobs"] = _logprobs(out, tokenizer)
        if out.finished:
            row["usage"] = _usage(out)
        return row

    # -- one call per batch, run to completion -------------------------------------------------

    def _run(self, data: list, context: Context) -> list:
        engine = self.engine
        assert engine is not None
        ids = [f"{context.get_request_id(i) or i}" for i in range(len(data))]
        results: list[Any] = [None] * len(data)
        texts: dict[str, list[str]] = {}
        tokens: dict[str, list[int]] = {}
        logprobs: dict[str, list[dict]] = {}
        streaming: dict[str, bool] = {}
        index = {request_id: i for i, request_id in enumerate(ids)}
        for i, (request_id, row) in enumerate(zip(ids, data, strict=True)):
            try:
                request = self._add(request_id, row)
            except PredictionException as exc:
                context.set_response_status(exc.error_code, exc.message, idx=i)
                results[i] = {
                    "code": exc.error_code,
                    "type": "PredictionException",
                    "message": exc.message,
                }
                continue
            texts[request_id], tokens[request_id], logprobs[request_id] = [], [], []
            streaming[request_id] = request.stream
        pending = set(texts)
        try:
            while pending:
                step = [out for out in engine.step() if out.request_id in pending]
                self._stream(step, streaming, ids, context)
                for out in step:
                    i = index[out.request_id]
                    texts[out.request_id].append(out.text)
                    tokens[out.request_id].extend(out.token_ids)
                    logprobs[out.request_id].extend(_logprobs(out, engine.tokenizer) or [])
                    if not out.finished:
                        continue
                    pending.discard(out.request_id)
                    if out.error is not None:
                        context.set_response_status(out.error.error_code, out.error.message, idx=i)
                        results[i] = {
                            "code": out.error.error_code,
                            "type": "PredictionException",
                            "message": out.error.message,
                        }
                        continue
                    # A streamed row's parts carried the earlier text: its answer is the last part.
                    whole = not streaming[out.request_id]
                    result: dict[str, Any] = {
                        "text": "".join(texts[out.request_id]) if whole else out.text,
                        "tokens": tokens[out.request_id] if whole else out.token_ids,
                        "finish_reason": out.finish_reason,
                        "usage": _usage(out),
                    }
                    if out.logprobs is not None or logprobs[out.request_id]:
                        result["logprobs"] = logprobs[out.request_id]
                    results[i] = result
        finally:
            for request_id in pending:  # left early (a handler bug): free their slots
                engine.cancel(request_id)
        return results

    @staticmethod
    def _stream(
        step: list[StepOutput], streaming: dict[str, bool], ids: list[str], context: Context
    ) -> None:
        """Send this step's text of the rows that stream (other rows get an empty part)."""
        parts = {
            out.request_id: out
            for out in step
            if streaming.get(out.request_id) and not out.finished
        }
        if not parts:
            return
        chunk = [
            {"text": parts[r].text, "tokens": parts[r].token_ids} if r in parts else "" for r in ids
        ]
        send_intermediate_predict_response(
            chunk, context.request_ids or {}, "Intermediate Prediction success", 200, context
        )
