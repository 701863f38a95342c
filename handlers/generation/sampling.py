"""Choosing a sequence's next token from its logits: penalties, temperature, top-k, top-p, seed.

Greedy (``temperature == 0``) is ``argmax`` over the raw logits, exactly what transformers'
``generate`` does without logits processors, so greedy output matches it token for token.
Penalties follow their usual definitions: ``repetition_penalty`` (CTRL, as in transformers) over
prompt and output tokens; ``presence_penalty``/``frequency_penalty`` (OpenAI) over output tokens.
Log-probabilities are those of the model's own distribution (raw logits), as vLLM reports them.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from handlers.generation.params import SamplingParams


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's log-probability and the ``n`` most likely tokens with theirs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """One sequence's token chooser; it keeps the counts its penalties need."""

    def __init__(
        self, params: SamplingParams, prompt_ids: Iterable[int], eos_token_ids: Iterable[int]
    ) -> None:
        self.params = params
        self._eos = tuple(eos_token_ids)
        self._banned_early = tuple(sorted(set(self._eos) | set(params.stop_token_ids)))
        self._seen: set[int] = set(prompt_ids) if params.repetition_penalty != 1.0 else set()
        self._counts: Counter[int] = Counter()
        self._generated = 0
        self._generator: torch.Generator | None = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else secrets.randbits(63)
            self._generator = torch.Generator().manual_seed(seed)

    def is_stop_token(self, token_id: int) -> bool:
        """True when ``token_id`` ends the sequence (EOS unless ``ignore_eos``, or a stop id)."""
        if token_id in self.params.stop_token_ids:
            return True
        return not self.params.ignore_eos and token_id in self._eos

    def choose(self, logits: torch.Tensor) -> tuple[int, TokenLogprobs | None]:
        """The next token for a 1-D row of logits, plus its log-probabilities when asked for."""
        raw = logits
        logits = self._penalise(logits.float())
        if self._generated < self.params.min_tokens and self._banned_early:
            logits = logits.clone() if logits is raw else logits
            logits[list(self._banned_early)] = float("-inf")
        token = int(torch.argmax(logits)) if self._generator is None else self._sample(logits)
        self._counts[token] += 1
        self._generated += 1
        if self.params.repetition_penalty != 1.0:
            self._seen.add(token)
        return token, self._logprobs(raw, token)

    def _penalise(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        if not p.penalised:
            return logits
        logits = logits.clone()
        if p.repetition_penalty != 1.0 and self._seen:
            ids = torch.tensor(sorted(self._seen), dtype=torch.long)
            picked = logits[ids]
            logits[ids] = torch.where(
                picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty
            )
        if self._counts and (p.presence_penalty or p.frequency_penalty):
            ids = torch.tensor(list(self._counts), dtype=torch.long)
            counts = torch.tensor(list(self._counts.values()), dtype=logits.dtype)
            logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
        return logits

    def _sample(self, logits: torch.Tensor) -> int:
        p = self.params
        logits = logits / p.temperature
        if 0 < p.top_k < logits.numel():
            cutoff = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < cutoff, float("-inf"))
        if p.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
            drop = cumulative - torch.softmax(ordered, dim=-1) >= p.top_p  # keep the first over
            logits = logits.clone()
            logits[order[drop]] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator))

    def _logprobs(self, raw: torch.Tensor, token: int) -> TokenLogprobs | None:
        n = self.params.logprobs
        if n is None:
            return None
        logp = torch.log_softmax(raw.float(), dim=-1)
        top: tuple[tuple[int, float], ...] = ()
        if n:
            values, ids = torch.topk(logp, n)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        return TokenLogprobs(token, float(logp[token]), top)
