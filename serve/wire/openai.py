"""The OpenAI-compatible API's request and response shapes, and its server-sent events (sans-IO).

Requests are checked here and turned into the JSON body the ``text_generation`` handler reads
(docs/generation.md, "The request"): ``prompt`` or ``messages`` plus the sampling fields, which
the handler checks further (types, ranges) and answers 400 for. Fields OpenAI defines that the
engine cannot honour (``n`` > 1, ``echo``, ``logit_bias`` ...) are refused with a 400 naming them
rather than ignored; fields nobody defines are refused too.

``model`` names a registered Lantern model: ``name`` is its default version, ``name/version``
a given one (a model name never holds a ``/``).
"""

from __future__ import annotations

import base64
import json
import re
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from serve.wire.errors import BadRequest, ServeError
from serve.wire.json_input import ListBounds, check_lists, long_list, parse_json

# Paths of the OpenAI routes; ``/openai/v1/...`` (KServe's huggingfaceserver prefix) is always
# OpenAI's, ``/v1/...`` too except where KServe v1 owns it (``GET /v1/models[/{m}]``).
PREFIXES = ("/v1", "/openai/v1")
GENERATION_PATHS = ("/completions", "/chat/completions", "/embeddings")
CHAT_ROLES = frozenset({"system", "user", "assistant"})
SSE_DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"

# Sampling fields passed through to the handler, which checks their values.
_SAMPLING = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stop_token_ids",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "min_tokens",
        "ignore_eos",
    }
)
# Lists bounded before the body is parsed (`serve.wire.json_input.long_list`) and after: a body
# of millions of ids is a 400 in milliseconds. ``stop``: OpenAI's "up to 4 sequences"; embedding
# ``input``: OpenAI's 2,048 inputs a request; the others are far above any real request.
MAX_STOP = 4
MAX_STOP_TOKEN_IDS = 1024
MAX_MESSAGES = 16_384
MAX_EMBEDDING_INPUTS = 2048
MAX_GENERATE_STOP = 16  # OIP generate's parameters go to the handler as they are: its own bound
_SAMPLING_LISTS: ListBounds = {("stop",): MAX_STOP, ("stop_token_ids",): MAX_STOP_TOKEN_IDS}
COMPLETION_LISTS: ListBounds = dict(_SAMPLING_LISTS)
CHAT_LISTS: ListBounds = {**_SAMPLING_LISTS, ("messages",): MAX_MESSAGES}
EMBEDDING_LISTS: ListBounds = {("input",): MAX_EMBEDDING_INPUTS}
GENERATE_LISTS: ListBounds = {
    ("parameters", "stop"): MAX_GENERATE_STOP,
    ("parameters", "stop_token_ids"): MAX_STOP_TOKEN_IDS,
}
# Fields OpenAI defines that change nothing here (identification, caching and routing hints),
# accepted and ignored as OpenAI's own server and vLLM's do; a field nobody defines is a 400.
_IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "prompt_cache_key",
        "safety_identifier",
    }
)
# Fields accepted only at the value that means "nothing special".
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}
# OpenAI's documented ranges, checked here so that the 400 names the field (``param``):
# name -> (low, high, integers only); None for no bound on that side.
_RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    "temperature": (0, 2, False),
    "top_p": (0, 1, False),
    "presence_penalty": (-2, 2, False),
    "frequency_penalty": (-2, 2, False),
    "max_tokens": (1, None, True),
    "max_completion_tokens": (1, None, True),
    "seed": (0, 2**64 - 1, True),
    "top_logprobs": (0, 20, True),
}
# stream_options: OpenAI's include_usage and include_obfuscation (there is no obfuscation to
# turn off here), vLLM's continuous_usage_stats (usage in every chunk).
_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation", "continuous_usage_stats"})


class OpenAIError(BadRequest):
    """A 400 that names the request field at fault (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:  # pickled back from the decoding process
        return (type(self), (self.message, self.param))


def not_generative(model: str) -> OpenAIError:
    """The 400 for a generation request to a model whose answers are not generated text."""
    return OpenAIError(
        f"Model {model} does not generate text: its answer has no finish_reason "
        "(serve it with a text-generation handler).",
        "model",
    )


@dataclass(frozen=True)
class GenerationCall:
    """A checked completions or chat request: the model asked for and the handler's body."""

    model: str
    chat: bool
    stream: bool
    include_usage: bool
    body: dict[str, Any] = field(default_factory=dict)
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage in every chunk

    def worker_body(self) -> bytes:
        return json.dumps(self.body).encode()


@dataclass(frozen=True)
class EmbeddingsCall:
    model: str
    inputs: list[str]
    base64: bool = False  # float32 little-endian, base64-encoded (the openai client's default)


def split_model(model: str) -> tuple[str, str | None]:
    """``name`` or ``name/version`` as ``(name, version or None)``."""
    name, _, version = model.partition("/")
    return name, version or None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def is_openai_path(path: str) -> bool:
    """Whether ``path`` is one of the OpenAI routes whatever the client (no ``/v1/models``)."""
    if path.startswith("/openai/v1/"):
        return True
    return path in {f"/v1{p}" for p in GENERATION_PATHS}


def is_openai_client(headers: dict[bytes, bytes] | list[tuple[bytes, bytes]]) -> bool:
    """Whether the request comes from one of OpenAI's SDKs (they all send ``X-Stainless-Lang``)."""
    names = headers.keys() if isinstance(headers, dict) else (k for k, _ in headers)
    return any(k.lower() == b"x-stainless-lang" for k in names)


# ----- requests -------------------------------------------------------------------------------


def _object(raw: bytes, bounds: ListBounds) -> dict[str, Any]:
    """The body's JSON object; 400 for a list over its bound (read before the parse when it
    can be), for malformed JSON and for JSON nested too deep."""
    _refuse_long(long_list(raw, bounds), bounds)
    data = parse_json(raw, "the body")
    if not isinstance(data, dict):
        raise OpenAIError(f"The body must be a JSON object, got {type(data).__name__}.")
    _refuse_long(check_lists(data, bounds), bounds)
    return data


def _refuse_long(path: tuple[str, ...] | None, bounds: ListBounds) -> None:
    if path is not None:
        name = ".".join(path)
        raise OpenAIError(f"'{name}' takes at most {bounds[path]} items.", name)


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("'model' must be the name of a registered model.", "model")
    return model


def _bool(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise OpenAIError(f"'{name}' must be a boolean, got {type(value).__name__}.", name)
    return value


def _check_fields(data: dict[str, Any], allowed: frozenset[str]) -> None:
    for name in sorted(data):
        if name in _NEUTRAL:
            if data[name] not in _NEUTRAL[name]:
                raise OpenAIError(
                    f"'{name}' is not supported with a value of {data[name]!r}.", name
                )
        elif name not in allowed and name not in _IGNORED:
            raise OpenAIError(f"Unrecognized request argument supplied: {name}", name)


def _include_usage(data: dict[str, Any], stream: bool) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or set(options) - _STREAM_OPTIONS:
        names = ", ".join(sorted(_STREAM_OPTIONS))
        raise OpenAIError(f"'stream_options' takes {names} (booleans).", "stream_options")
    if not stream:
        raise OpenAIError("'stream_options' is only allowed with 'stream': true.", "stream_options")
    for name in _STREAM_OPTIONS:
        _bool(options, name)
    return _bool(options, "include_usage")


def _continuous_usage(data: dict[str, Any], stream: bool) -> bool:
    """vLLM's ``stream_options.continuous_usage_stats``: with ``include_usage``, usage in every
    chunk (checked by `_include_usage`)."""
    options = data.get("stream_options") or {}
    return _include_usage(data, stream) and options.get("continuous_usage_stats") is True


def _check_ranges(data: dict[str, Any]) -> None:
    """OpenAI's documented ranges (`_RANGES`), as a 400 naming the field."""
    for name, (low, high, integer) in _RANGES.items():
        value = data.get(name)
        if value is None:
            continue
        kind = "an integer" if integer else "a number"
        wrong_type = isinstance(value, bool) or not isinstance(
            value, int if integer else (int, float)
        )
        if wrong_type or (low is not None and value < low) or (high is not None and value > high):
            bounds = f" from {low}" + (f" to {high}" if high is not None else "")
            shown = json.dumps(value)[:40]
            raise OpenAIError(f"'{name}' must be {kind}{bounds}, got {shown}.", name)
    if data.get("top_p") == 0:
        raise OpenAIError("'top_p' must be greater than 0.", "top_p")


def parse_completion(raw: bytes) -> GenerationCall:
    """``POST /v1/completions``: one prompt (a string, or a list of one string)."""
    data = _object(raw, COMPLETION_LISTS)
    allowed = _SAMPLING | {"model", "prompt", "stream", "stream_options", "logprobs"}
    _check_fields(data, allowed)
    _check_ranges(data)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise OpenAIError("Give one prompt per request (a string).", "prompt")
    if not isinstance(prompt, str):
        raise OpenAIError("'prompt' must be a string.", "prompt")
    stream = _bool(data, "stream")
    body = {k: v for k, v in data.items() if k in _SAMPLING and v is not None}
    body.update(prompt=prompt, stream=stream)
    if data.get("logprobs") is not None:
        body["logprobs"] = data["logprobs"]
    include, continuous = _include_usage(data, stream), _continuous_usage(data, stream)
    return GenerationCall(_model(data), False, stream, include, body, continuous)


def _message(index: int, message: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise OpenAIError(f"'{where}' must be an object.", where)
    role, content = message.get("role"), message.get("content")
    if role not in CHAT_ROLES:
        raise OpenAIError(f"'{where}.role' must be one of {sorted(CHAT_ROLES)}.", f"{where}.role")
    if set(message) - {"role", "content", "name"}:
        extra = sorted(set(message) - {"role", "content", "name"})
        raise OpenAIError(f"Unrecognized field(s) in {where}: {', '.join(extra)}", where)
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise OpenAIError(f"'{where}.content' parts must be text.", f"{where}.content")
            texts.append(part.get("text"))
        content = "".join(t for t in texts if isinstance(t, str))
    if not isinstance(content, str):
        raise OpenAIError(f"'{where}.content' must be a string.", f"{where}.content")
    return {"role": role, "content": content}


def parse_chat(raw: bytes) -> GenerationCall:
    """``POST /v1/chat/completions``: messages rendered by the worker's chat template."""
    data = _object(raw, CHAT_LISTS)
    allowed = _SAMPLING | {
        "model",
        "messages",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "max_completion_tokens",
    }
    _check_fields(data, allowed)
    _check_ranges(data)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("'messages' must be a non-empty list.", "messages")
    stream = _bool(data, "stream")
    body: dict[str, Any] = {k: v for k, v in data.items() if k in _SAMPLING and v is not None}
    if data.get("max_completion_tokens") is not None:
        if "max_tokens" in body:
            raise OpenAIError("Give max_tokens or max_completion_tokens, not both.", "max_tokens")
        body["max_tokens"] = data["max_completion_tokens"]
    body.update(messages=[_message(i, m) for i, m in enumerate(messages)], stream=stream)
    if _bool(data, "logprobs"):
        top = data.get("top_logprobs") or 0
        body["logprobs"] = top
    elif data.get("top_logprobs") is not None:
        raise OpenAIError("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    include, continuous = _include_usage(data, stream), _continuous_usage(data, stream)
    return GenerationCall(_model(data), True, stream, include, body, continuous)


def parse_embeddings(raw: bytes) -> EmbeddingsCall:
    """``POST /v1/embeddings``: a string or a list of strings; ``float`` or ``base64`` vectors."""
    data = _object(raw, EMBEDDING_LISTS)
    _check_fields(data, frozenset({"model", "input", "encoding_format", "dimensions"}))
    encoding = data.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise OpenAIError("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    if data.get("dimensions") is not None:
        raise OpenAIError("'dimensions' is not supported.", "dimensions")
    inputs = data.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        raise OpenAIError("'input' must be a string or a non-empty list of strings.", "input")
    return EmbeddingsCall(_model(data), inputs, encoding == "base64")


# ----- responses ------------------------------------------------------------------------------


def usage(answer: dict[str, Any]) -> dict[str, int]:
    found = answer.get("usage") or {}
    prompt = int(found.get("prompt_tokens", 0))
    completion = int(found.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def running_usage(part: dict[str, Any], completion_tokens: int) -> dict[str, int | None]:
    """A streamed chunk's usage (``continuous_usage_stats``): the part's own if the handler
    gives one, else the tokens streamed so far, the prompt's count being known only at the end
    (``null`` until then)."""
    if isinstance(part.get("usage"), dict):
        return dict(usage(part))
    return {"prompt_tokens": None, "completion_tokens": completion_tokens, "total_tokens": None}


def finish_reason(answer: dict[str, Any]) -> str | None:
    reason = answer.get("finish_reason")
    return reason if reason in ("stop", "length") else None if reason is None else "stop"


def logprobs_body(call: GenerationCall, rows: Any, offset: int = 0) -> dict[str, Any] | None:
    """A choice's ``logprobs`` in OpenAI's shape from the handler's rows (``{"token", "logprob",
    "top": [[id, logprob, token], ...]}`` per token, `handlers.generation.streams.logprobs_rows`):
    chat's ``{"content": [...]}``, or the completions API's ``tokens`` / ``token_logprobs`` /
    ``top_logprobs`` / ``text_offset``, counted from ``offset`` (the text of the tokens before
    these). None when the request did not ask, or the rows are not that shape."""
    if not isinstance(rows, list):
        return None
    try:
        if call.chat:
            return {"content": [_chat_logprob(row) for row in rows]}
        offsets = []
        for row in rows:
            offsets.append(offset)
            offset += len(row["token"])
        return {
            "tokens": [str(row["token"]) for row in rows],
            "token_logprobs": [float(row["logprob"]) for row in rows],
            "top_logprobs": [{str(t): float(lp) for _, lp, t in row["top"]} for row in rows],
            "text_offset": offsets,
        }
    except (KeyError, TypeError, ValueError):  # another handler's shape: none rather than a 500
        return None


def _chat_logprob(row: dict[str, Any]) -> dict[str, Any]:
    def entry(token: Any, logprob: Any) -> dict[str, Any]:
        text = str(token)
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode())}

    top = [entry(t, lp) for _, lp, t in row["top"]]
    return {**entry(row["token"], row["logprob"]), "top_logprobs": top}


def completion_body(call: GenerationCall, cid: str, created: int, answer: dict[str, Any]) -> dict:
    """The whole answer, from the handler's ``{"text", "finish_reason", "usage", "logprobs"?}``."""
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": finish_reason(answer),
        "logprobs": logprobs_body(call, answer.get("logprobs")),
    }
    if call.chat:
        choice["message"] = {"role": "assistant", "content": answer.get("text", "")}
    else:
        choice["text"] = answer.get("text", "")
    return {
        "id": cid,
        "object": "chat.completion" if call.chat else "text_completion",
        "created": created,
        "model": call.model,
        "choices": [choice],
        "usage": usage(answer),
    }


def chunk_body(
    call: GenerationCall,
    cid: str,
    created: int,
    *,
    text: str | None = None,
    role: bool = False,
    reason: str | None = None,
    usage_: dict[str, int] | None = None,
    logprobs: dict[str, Any] | None = None,
    running: dict[str, int | None] | None = None,
) -> dict:
    """One streamed chunk: a piece of text (with its tokens' ``logprobs``), the chat role, the
    finish reason, or the usage; ``running``: the usage so far (``continuous_usage_stats``)."""
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk" if call.chat else "text_completion",
        "created": created,
        "model": call.model,
    }
    if usage_ is not None:
        body["choices"] = []
        body["usage"] = usage_
        return body
    if call.chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": text or ""}
    choice.update(finish_reason=reason, logprobs=logprobs)
    body["choices"] = [choice]
    if call.include_usage:
        body["usage"] = running if call.continuous_usage else None
    return body


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embeddings_body(call: EmbeddingsCall, vectors: list[list[float]], prompt_tokens: int) -> dict:
    return {
        "object": "list",
        "model": call.model,
        "data": [
            {"object": "embedding", "index": i, "embedding": _base64(v) if call.base64 else v}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_body(name: str, created: float | None = None) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": int(created if created is not None else time.time()),
        "owned_by": "lantern",
    }


def models_body(models: list[dict]) -> dict:
    return {"object": "list", "data": models}


def sse(data: dict) -> bytes:
    """One server-sent event: ``data: {json}`` and a blank line."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


# ----- errors ---------------------------------------------------------------------------------

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


def error_dict(err: ServeError) -> dict[str, Any]:
    """OpenAI's ``{"error": {"message", "type", "param", "code"}}`` for ``err``."""
    status = err.status_code
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = _CODES.get(status)
    if status == 404 and "model" not in err.message.lower():
        code = "not_found"
    if status == 503:
        code = "service_unavailable"
    param = getattr(err, "param", None)
    if param is None and status == 400:
        param = _named_field(err.message)
    return {"error": {"message": err.message, "type": kind, "param": param, "code": code}}


_HANDLER_FIELD = re.compile(r"^'?([a-z_]+)'? (?:must|takes) ")


def _named_field(message: str) -> str | None:
    """The request field a handler's 400 names ("max_tokens must be ..."), for ``param``."""
    match = _HANDLER_FIELD.match(message)
    known = _SAMPLING | set(_RANGES) | {"logprobs", "prompt", "messages"}
    return match.group(1) if match and match.group(1) in known else None


def error_body(err: ServeError) -> bytes:
    return json.dumps(error_dict(err)).encode() + b"\n"


# ----- the Open Inference Protocol's generate extension -----------------------------------------


def parse_generate(raw: bytes, stream: bool) -> dict[str, Any]:
    """``POST /v2/models/{m}/generate[_stream]``: ``text_input`` and ``parameters`` (Triton's
    generate extension) as the handler's body; the sampling fields are the handler's."""
    data = _object(raw, GENERATE_LISTS)
    text = data.get("text_input")
    if not isinstance(text, str):
        raise OpenAIError("'text_input' must be a string.", "text_input")
    parameters = data.get("parameters", {})
    if not isinstance(parameters, dict):
        raise OpenAIError("'parameters' must be an object.", "parameters")
    extra = sorted(set(data) - {"text_input", "parameters", "id"})
    if extra:
        raise OpenAIError(f"Unrecognized request argument supplied: {extra[0]}", extra[0])
    body = {k: v for k, v in parameters.items() if k != "stream"}
    body.update(prompt=text, stream=stream)
    return body


def generate_body(model: str, version: str, text: str, reason: str | None = None) -> dict:
    body: dict[str, Any] = {"model_name": model, "model_version": version, "text_output": text}
    if reason is not None:
        body["finish_reason"] = reason
    return body
