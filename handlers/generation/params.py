"""A generation request's sampling parameters, parsed and checked from a JSON object.

Field names follow OpenAI's completions API (and vLLM's extensions): ``max_tokens``,
``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``,
``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``min_tokens``,
``ignore_eos``, ``logprobs``.
``max_new_tokens`` (TorchServe's examples) is accepted as another name for ``max_tokens``.
A chat request gives ``messages`` (``[{"role", "content"}]``) instead of a ``prompt``: the
handler renders them into the prompt with the tokenizer's chat template.
An unknown field is an error, not silently ignored: a typo would otherwise change nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handlers.exceptions import PredictionException

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256  # characters of one stop string (the matcher holds back up to this much)
MAX_STOP_TOKEN_IDS = 1024  # ids in ``stop_token_ids`` (each token's check is a set lookup)
# A seed seeds ``torch.Generator``, which takes an unsigned 64-bit integer.
MAX_SEED = 2**64 - 1
# A temperature below this samples as greedy (vLLM's rule): dividing logits by a denormal such as
# 1e-45 makes them infinite, and nothing is left to sample from.
GREEDY_BELOW = 1e-5
# Fields of a request body that are not sampling parameters but are allowed beside them.
REQUEST_FIELDS = frozenset({"prompt", "messages", "stream", "model"})
CHAT_ROLES = frozenset({"system", "user", "assistant"})
# Renders chat messages into a prompt (the tokenizer's chat template).
ChatRenderer = Callable[[list[dict[str, str]]], str]


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence chooses its tokens and when it stops."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()  # a set: each token's check is one lookup
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; N: the chosen token's plus the N most likely

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalised(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt and its sampling parameters; ``stream`` asks for each step's tokens as they come."""

    prompt: str
    params: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False


def _bad(message: str) -> PredictionException:
    return PredictionException(message, 400)


def _shown(value: int | float) -> str:
    """A number for an error message, short whatever its size (an int's repr may be refused)."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _number(body: dict, name: str, low: float, high: float, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"{name} must be a number, got {type(value).__name__}")
    # Compared before any float(): an integer too big for a float raises OverflowError there.
    if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        raise _bad(f"{name} must be between {low} and {high}, got {_shown(value)}")
    return float(value)


def _integer(body: dict, name: str, low: int, high: int | None, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _bad(f"{name} must be {bound}, got {_shown(value)}")
    return value


def _temperature(body: dict) -> float:
    value = _number(body, "temperature", 0.0, 100.0, 1.0)
    return 0.0 if value < GREEDY_BELOW else value


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise _bad(f"seed must be an integer between 0 and {MAX_SEED} (2**64 - 1)")
    return value


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if isinstance(stops, list) and len(stops) > MAX_STOP_STRINGS:
        raise _bad(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop must be a non-empty string or a list of non-empty strings")
    if any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise _bad(f"a stop string may have at most {MAX_STOP_LENGTH} characters")
    return tuple(stops)


def _token_ids(value: Any, vocab_size: int) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, list) and len(value) > MAX_STOP_TOKEN_IDS:
        raise _bad(f"stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} ids, got {len(value)}")
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in value
    ):
        raise _bad(f"stop_token_ids must be a list of token ids in [0, {vocab_size})")
    return frozenset(value)


def _logprobs(value: Any) -> int | None:
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LOGPROBS:
        return value
    raise _bad(f"logprobs must be a boolean or an integer between 0 and {MAX_LOGPROBS}")


def parse_params(body: dict, max_tokens_limit: int, vocab_size: int) -> SamplingParams:
    """Sampling parameters from a request body; a ``PredictionException`` (400) names a bad one."""
    known = set(SamplingParams.__dataclass_fields__) | REQUEST_FIELDS | {"max_new_tokens"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise _bad(f"unknown field(s): {', '.join(unknown)}")
    if "max_tokens" in body and "max_new_tokens" in body:
        raise _bad("give max_tokens or max_new_tokens, not both")
    body = dict(body)
    if "max_new_tokens" in body:
        body["max_tokens"] = body.pop("max_new_tokens")
    default_max = min(SamplingParams.max_tokens, max_tokens_limit)
    max_tokens = _integer(body, "max_tokens", 1, max_tokens_limit, default_max)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos must be a boolean")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_temperature(body),
        top_p=_number(body, "top_p", 1e-6, 1.0, 1.0),
        top_k=_integer(body, "top_k", 0, vocab_size, 0),
        seed=_seed(body.get("seed")),
        stop=_stop_strings(body.get("stop")),
        stop_token_ids=_token_ids(body.get("stop_token_ids"), vocab_size),
        repetition_penalty=_number(body, "repetition_penalty", 1e-2, 100.0, 1.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        min_tokens=_integer(body, "min_tokens", 0, max_tokens, 0),
        ignore_eos=ignore_eos,
        logprobs=_logprobs(body.get("logprobs")),
    )


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _bad("messages must be a non-empty list")
    for message in value:
        if (
            not isinstance(message, dict)
            or set(message) - {"role", "content", "name"}
            or message.get("role") not in CHAT_ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise _bad(
                f"each message must be {{'role': one of {sorted(CHAT_ROLES)}, 'content': a string}}"
            )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def parse_request(
    payload: Any, max_tokens_limit: int, vocab_size: int, render: ChatRenderer | None = None
) -> GenerationRequest:
    """A request row's payload as a `GenerationRequest`.

    A JSON object (decoded already, or as text/bytes starting with ``{``) is a request; any other
    UTF-8 text is the prompt itself, with default sampling. ``messages`` become the prompt
    through ``render`` (a 400 without one).
    """
    if isinstance(payload, (bytes, bytearray)):
        try:
            payload = bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            message = f"the request body is not UTF-8 text: {exc.reason} at byte {exc.start}"
            raise _bad(message) from None
    if isinstance(payload, str) and payload.lstrip().startswith("{"):
        try:  # a JSON body that arrived undecoded (no JSON content type)
            payload = json.loads(payload)
        except RecursionError:
            raise _bad("the JSON body is nested too deeply") from None
        except ValueError as exc:
            raise _bad(f"the request body starts like JSON but is not: {exc}") from None
    if isinstance(payload, str):
        payload = {"prompt": payload}
    if not isinstance(payload, dict):
        raise _bad(f"expected a JSON object with a prompt, got {type(payload).__name__}")
    if "messages" in payload:
        if "prompt" in payload:
            raise _bad("give a prompt or messages, not both")
        if render is None:
            raise _bad("this model takes a prompt, not messages")
        payload = dict(payload)
        payload["prompt"] = render(_messages(payload.pop("messages")))
    prompt = payload.get("prompt")
    if not isinstance(prompt, str):
        raise _bad("prompt must be a string")
    if not prompt:
        raise _bad("prompt is empty")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be a boolean")
    params = parse_params(payload, max_tokens_limit, vocab_size)
    return GenerationRequest(prompt=prompt, params=params, stream=stream)
