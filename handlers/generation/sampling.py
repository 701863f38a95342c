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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from handlers.exceptions import PredictionException
from handlers.generation.params import SamplingParams
from handlers.generation.transfers import to_device, to_host


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
        self._seed = 0
        if not params.greedy:
            self._seed = params.seed if params.seed is not None else secrets.randbits(63)
            self._generator = torch.Generator().manual_seed(self._seed)
        self._on_device: torch.Generator | None = None  # the same seed, where the logits are

    def is_stop_token(self, token_id: int) -> bool:
        """True when ``token_id`` ends the sequence (EOS unless ``ignore_eos``, or a stop id)."""
        if token_id in self.params.stop_token_ids:
            return True
        return not self.params.ignore_eos and token_id in self._eos

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalties and no log-probabilities: its token is the row's argmax once
        `banned` tokens are masked, which `choose_greedy` finds for many rows at once."""
        p = self.params
        return self._generator is None and not p.penalised and p.logprobs is None

    @property
    def plain_sampled(self) -> bool:
        """Sampled with no penalties and no log-probabilities: chosen with the other such rows
        of a step on the logits' device (`sample_rows`)."""
        p = self.params
        return self._generator is not None and not p.penalised and p.logprobs is None

    def generator_on(self, device: torch.device) -> torch.Generator:
        """Its random stream on ``device`` (seeded once, from the request's seed)."""
        if device.type == "cpu":
            assert self._generator is not None
            return self._generator
        if self._on_device is None:
            self._on_device = torch.Generator(device=device).manual_seed(self._seed)
        return self._on_device

    def banned(self) -> tuple[int, ...]:
        """Token ids it may not choose now (EOS and stop ids until ``min_tokens`` are out)."""
        return self._banned_early if self._generated < self.params.min_tokens else ()

    def choose(self, logits: torch.Tensor) -> tuple[int, TokenLogprobs | None]:
        """The next token for a 1-D row of logits, plus its log-probabilities when asked for."""
        raw = logits
        logits = self._penalise(logits.float())
        if banned := self.banned():
            logits = logits.clone() if logits is raw else logits
            logits[list(banned)] = float("-inf")
            if not bool(torch.isfinite(logits).any()):
                raise PredictionException(BANNED_ALL, 400)
        token = int(torch.argmax(logits)) if self._generator is None else self._sample(logits)
        self.record(token)
        return token, self._logprobs(raw, token)

    def record(self, token: int) -> None:
        """Count ``token`` as chosen (what penalties and ``min_tokens`` go by)."""
        self._counts[token] += 1
        self._generated += 1
        if self.params.repetition_penalty != 1.0:
            self._seen.add(token)

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


Choice = tuple[int, TokenLogprobs | None]  # a row's token and its log-probabilities


NO_TOKEN = -1
BANNED_ALL = "stop_token_ids and EOS ban every token while min_tokens are not out"


def sample_rows(samplers: Sequence[Sampler], logits: torch.Tensor) -> torch.Tensor:
    """One token for each row of ``logits (rows, vocab)``, every row sampled by its own
    sampler's temperature, top-k, top-p, banned tokens and random stream, together on the
    logits' device; the tokens stay there (``(rows,)``), `NO_TOKEN` for a row that has none
    to choose (its stop ids and EOS ban every token while ``min_tokens`` are not out).

    Each row is sampled as ``argmax(p / e)`` with ``e`` drawn from Exp(1) per token from the row's
    own generator: the token with the least "arrival time" ``e / p`` wins with probability ``p``,
    the same distribution as drawing from ``p``, and a seed gives the same tokens whatever else
    runs beside it (the row's noise comes from its own stream)."""
    device = logits.device
    params = [sampler.params for sampler in samplers]
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    temperature, top_p = to_device(device, temperature, top_p)
    x = logits.float() / temperature[:, None]
    banned_rows: list[int] = []
    banned_columns: list[int] = []
    for i, sampler in enumerate(samplers):
        banned = sampler.banned()
        banned_rows += [i] * len(banned)
        banned_columns += banned
    vocab = x.shape[-1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    if banned_rows or min(top_k) < vocab:
        index = torch.tensor([*banned_rows, *banned_columns, *(k - 1 for k in top_k)])
        r, c, kth = to_device(
            device, index[: len(banned_rows)], index[len(banned_rows) : 2 * len(banned_rows)],
            index[2 * len(banned_rows) :],
        )  # fmt: skip
        if banned_rows:
            x[r, c] = float("-inf")
        if min(top_k) < vocab:
            values = torch.topk(x, max(k for k in top_k if k < vocab), dim=-1).values
            cutoff = values.gather(-1, kth.clamp(max=values.shape[-1] - 1)[:, None])
            cutoff = torch.where(kth[:, None] < vocab - 1, cutoff, float("-inf"))
            x = x.masked_fill(x < cutoff, float("-inf"))
    alive = torch.isfinite(x).any(dim=-1)  # a row whose banned ids are every token has none
    if any(p.top_p < 1.0 for p in params):
        ordered, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = (probs.cumsum(-1) - probs >= top_p[:, None]) & (top_p < 1.0)[:, None]
        x = x.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = torch.softmax(x, dim=-1)
    noise = torch.empty_like(probs)
    for i, sampler in enumerate(samplers):
        noise[i].exponential_(generator=sampler.generator_on(device))
    # A draw of exactly 0 (about once in 2**24) would make 0 / 0 of a token cut above.
    tokens = torch.argmax(probs / noise.clamp_(min=torch.finfo(noise.dtype).tiny), dim=-1)
    return torch.where(alive, tokens, NO_TOKEN)


def _index(rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def choose_tokens(samplers: Sequence[Sampler], logits: torch.Tensor) -> list[Choice | Exception]:
    """Every row's next token from ``logits (rows, vocab)``, on the model's device.

    The plain greedy rows (`Sampler.plain_greedy`) take one argmax over them all on that device
    (their banned entries set to ``-inf`` in ``logits`` first), and the plain sampled rows
    (`Sampler.plain_sampled`) are sampled together there (`sample_rows`); only the other rows
    (penalties, log-probabilities) are copied to the host, as float, for their own samplers. All
    of it reaches the host in one wait (`to_host`), the step's only one. One argmax for 32 rows
    of a 49k vocabulary takes a fraction of 32 argmaxes of one row each (1.9 ms a step on two CPU
    threads), and on a GPU the logits (rows x vocab) stay there. A row whose sampler raises gets
    the exception, the others their tokens.
    """
    device = logits.device
    plain = [i for i, sampler in enumerate(samplers) if sampler.plain_greedy]
    drawn = [i for i, sampler in enumerate(samplers) if sampler.plain_sampled]
    others = [
        i for i, s in enumerate(samplers) if not (s.plain_greedy or s.plain_sampled)
    ]  # fmt: skip
    greedy: torch.Tensor | None = None
    if plain:
        rows: list[int] = []
        columns: list[int] = []
        for i in plain:
            banned = samplers[i].banned()
            rows += [i] * len(banned)
            columns += banned
        if rows:
            row_index, column_index = to_device(
                device,
                torch.tensor(rows, dtype=torch.long),
                torch.tensor(columns, dtype=torch.long),
            )
            logits[row_index, column_index] = float("-inf")
        whole = len(plain) == len(samplers)
        block = logits if whole else logits[to_device(device, _index(plain))[0]]
        greedy = torch.argmax(block, dim=-1)
        if rows:  # banned ids that are every token leave a row nothing to choose
            greedy = torch.where(torch.isfinite(block).any(dim=-1), greedy, NO_TOKEN)
    choices: list[Choice | Exception] = [ValueError("no token chosen")] * len(samplers)
    ready = []
    for i in drawn:  # a row whose random stream cannot be had fails alone
        try:
            samplers[i].generator_on(device)
            ready.append(i)
        except Exception as exc:
            choices[i] = exc
    drawn = ready
    sampled_tokens: torch.Tensor | None = None
    failed: Exception | None = None
    if drawn:
        try:
            rows_of = logits[to_device(device, _index(drawn))[0]]
            sampled_tokens = sample_rows([samplers[i] for i in drawn], rows_of)
        except Exception as exc:  # the sampled rows of this step fail; greedy ones go on
            failed = exc
    host_rows = logits[to_device(device, _index(others))[0]].float() if others else None
    chosen = [t for t in (greedy, sampled_tokens) if t is not None]
    tokens, host_rows = to_host(torch.cat(chosen) if chosen else None, host_rows)
    order = plain + (drawn if sampled_tokens is not None else [])
    for i, token in zip(order, tokens.tolist() if tokens is not None else [], strict=True):
        if token == NO_TOKEN:
            choices[i] = PredictionException(BANNED_ALL, 400)
            continue
        samplers[i].record(token)
        choices[i] = (token, None)
    if failed is not None:
        for i in drawn:
            choices[i] = failed
    if host_rows is not None:
        for row, i in zip(host_rows, others, strict=True):
            try:
                choices[i] = samplers[i].choose(row)
            except Exception as exc:  # this row's sampler fails this row alone
                choices[i] = exc
    return choices
