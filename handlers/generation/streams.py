"""The engine as a worker drives it when requests arrive one by one (`serve.worker.concurrent`).

Each request (one PREDICT item) is opened as it arrives and joins the engine's next step; every
step yields `Event`s: a streamed part for a request that asked for ``"stream": true``, and the
final answer (or error) of each request that ended. A streamed request's final answer holds only
the last part, so its parts concatenate to the whole text, as in the handler's batch mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from handlers.exceptions import PredictionException, report_failure
from handlers.generation.engine import FINISH_CANCELLED, Engine, StepOutput
from handlers.generation.params import GenerationRequest

logger = logging.getLogger(__name__)


@dataclass
class Event:
    """What one request produced in one step: a ``part`` to stream, or its ``result``/``error``."""

    request_id: str
    part: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: PredictionException | None = None
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class _Open:
    stream: bool
    texts: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)


def logprobs_rows(out: StepOutput, tokenizer: Any) -> list[dict] | None:
    """The step's log-probabilities as JSON rows (None when the request did not ask): per token
    ``{"token_id", "token", "logprob", "top": [[token_id, logprob, token], ...]}``, ``token``
    the token's own text (what OpenAI's logprobs name it by)."""
    if out.logprobs is None:
        return None

    def text(token_id: int) -> str:
        return str(tokenizer.decode([token_id]))

    return [
        {
            "token_id": lp.token_id,
            "token": text(lp.token_id),
            "logprob": lp.logprob,
            "top": [[i, logprob, text(i)] for i, logprob in lp.top],
        }
        for lp in out.logprobs
    ]


def usage(out: StepOutput) -> dict[str, int]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
    }


class RequestStreams:
    """Open requests on one engine, each with its text so far."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._open: dict[str, _Open] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._open

    def open(
        self,
        request_id: str,
        request: GenerationRequest,
        checked: tuple[list[int], int] | None = None,
    ) -> None:
        """Add a parsed request to the engine (``checked``: `Engine.check`'s answer for it, if
        it ran already); raises `PredictionException` (400/507)."""
        self.engine.add(request_id, request, checked)
        self._open[request_id] = _Open(request.stream)

    def cancel(self, request_id: str) -> bool:
        """Drop a request before the next step's forward; its cancelled event comes then."""
        return request_id in self._open and self.engine.cancel(request_id)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> list[Event]:
        """One engine step: the events of the requests that produced something or ended."""
        events = []
        for out in self.engine.step():
            state = self._open.get(out.request_id)
            if state is None:  # added to the engine by someone else
                continue
            try:
                event = self._event(out, state)
            except Exception as exc:  # e.g. a tokenizer that cannot decode: this request fails
                code, _, message = report_failure(exc, [out.request_id], logger)
                self.engine.cancel(out.request_id)  # its cancelled output, if any, is ignored
                event = Event(out.request_id, error=PredictionException(message, code))
            if event is not None and event.finished:
                del self._open[out.request_id]
            if event is not None:
                events.append(event)
        return events

    def _event(self, out: StepOutput, state: _Open) -> Event | None:
        state.texts.append(out.text)
        state.tokens.extend(out.token_ids)
        rows = logprobs_rows(out, self.engine.tokenizer)
        state.logprobs.extend(rows or [])
        if not out.finished:
            if state.stream and (out.text or out.token_ids):
                return Event(out.request_id, part=self._part(out, rows))
            return None
        return self._final(out, state, rows)

    @staticmethod
    def _part(out: StepOutput, rows: list[dict] | None) -> dict[str, Any]:
        part: dict[str, Any] = {"text": out.text, "tokens": out.token_ids}
        if rows is not None:
            part["logprobs"] = rows
        return part

    @staticmethod
    def _final(out: StepOutput, state: _Open, rows: list[dict] | None) -> Event:
        """``rows``: this step's logprobs rows (`logprobs_rows`), the whole answer's for a
        stream's final part."""
        counts = usage(out)
        if out.error is not None:
            return Event(out.request_id, error=out.error, usage=counts)
        if out.finish_reason == FINISH_CANCELLED:
            error = PredictionException("the request was cancelled", 499)
            return Event(out.request_id, error=error, usage=counts)
        result: dict[str, Any] = {
            "text": out.text if state.stream else "".join(state.texts),
            "tokens": out.token_ids if state.stream else state.tokens,
            "finish_reason": out.finish_reason,
            "usage": counts,
        }
        if state.logprobs:
            result["logprobs"] = rows if state.stream else state.logprobs
        return Event(out.request_id, result=result, usage=counts)
