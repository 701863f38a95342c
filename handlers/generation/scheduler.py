"""Which sequences run at each engine step: admission under a KV budget, chunked prefill.

Pure bookkeeping (no tensors), so it is table-tested on its own. A sequence reserves
``prompt + max_tokens`` cache positions when admitted, so an admitted sequence never runs out of
cache mid-generation and nothing is ever pre-empted; admission is first come, first served (the
oldest waiting sequence is never overtaken by a smaller one). Each step prefills at most
``prefill_chunk_tokens`` prompt tokens (oldest prefill first, a long prompt over several steps),
which bounds how long a step of the running streams can be held up by newcomers. A prompt
being prefilled is prefilled once: admitted sequences with the same prompt (``prompt_key``) ride
on the oldest one's chunks, take none of the budget, and join the batch when its last chunk runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Schedulable(Protocol):
    """What the scheduler reads of a sequence (``prefilled`` is the one field it writes)."""

    @property
    def request_id(self) -> str: ...

    @property
    def prompt_len(self) -> int: ...

    @property
    def reserved(self) -> int: ...  # cache positions held while admitted: prompt + max_tokens

    @property
    def prompt_key(self) -> Hashable: ...  # equal for equal prompts

    prefilled: int  # prompt tokens already in its cache


S = TypeVar("S", bound=Schedulable)


@dataclass(frozen=True)
class EngineLimits:
    """One worker's generation budget (``limits()``, for the dispatcher and ``describe``)."""

    max_running_sequences: int
    max_cached_tokens: int
    max_model_len: int
    prefill_chunk_tokens: int
    prefix_cache_tokens: int = 0  # prompts' keys and values kept for reuse (0: no prefix cache)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PrefillChunk(Generic[S]):
    """Prompt tokens ``[start, end)`` of one sequence to run through the model this step."""

    sequence: S
    start: int
    end: int
    riders: tuple[S, ...] = ()  # admitted later with the same prompt: they join when it ends

    @property
    def last(self) -> bool:
        return self.end == self.sequence.prompt_len


class Scheduler(Generic[S]):
    """Waiting, prefilling and running sequences of one engine, within its limits."""

    def __init__(self, limits: EngineLimits) -> None:
        self.limits = limits
        self.waiting: deque[S] = deque()
        self.prefilling: list[S] = []
        self.running: list[S] = []
        self.reserved_tokens = 0

    @property
    def admitted(self) -> int:
        return len(self.prefilling) + len(self.running)

    def __len__(self) -> int:
        return len(self.waiting) + self.admitted

    def add(self, sequence: S) -> None:
        self.waiting.append(sequence)

    def admit(self) -> list[S]:
        """Move waiting sequences to prefill while the budget allows; returns those moved."""
        moved: list[S] = []
        while self.waiting and self.admitted < self.limits.max_running_sequences:
            head = self.waiting[0]
            if self.reserved_tokens + head.reserved > self.limits.max_cached_tokens:
                break
            self.waiting.popleft()
            self.reserved_tokens += head.reserved
            self.prefilling.append(head)
            moved.append(head)
        return moved

    def plan_prefill(self) -> list[PrefillChunk[S]]:
        """This step's prefill work: up to ``prefill_chunk_tokens`` prompt tokens, oldest first;
        a sequence whose prompt an older one is prefilling waits for it (a rider of its last
        chunk when that runs this step)."""
        budget = self.limits.prefill_chunk_tokens
        first: dict[Hashable, S] = {}  # the oldest prefilling sequence of each prompt
        riders: dict[Hashable, list[S]] = {}
        planned: list[tuple[S, int]] = []
        for seq in self.prefilling:
            key = seq.prompt_key
            if key in first:
                riders.setdefault(key, []).append(seq)
                continue
            first[key] = seq
            if budget > 0:
                n = min(seq.prompt_len - seq.prefilled, budget)
                planned.append((seq, n))
                budget -= n
        chunks: list[PrefillChunk[S]] = []
        for seq, n in planned:
            end = seq.prefilled + n
            waiting = riders.get(seq.prompt_key, []) if end == seq.prompt_len else []
            chunks.append(PrefillChunk(seq, seq.prefilled, end, tuple(waiting)))
        return chunks

    def prefilled(self, chunk: PrefillChunk[S]) -> None:
        """Record a chunk as done; the last chunk moves its sequence and its riders to the
        running batch."""
        chunk.sequence.prefilled = chunk.end
        if chunk.last:
            for seq in (chunk.sequence, *chunk.riders):
                seq.prefilled = seq.prompt_len
                self.prefilling.remove(seq)
                self.running.append(seq)

    def remove(self, sequence: S) -> None:
        """Take a sequence out wherever it is (finished, cancelled or failed); frees its budget."""
        for group in (self.prefilling, self.running):
            if sequence in group:
                group.remove(sequence)
                self.reserved_tokens -= sequence.reserved
                return
        if sequence in self.waiting:
            self.waiting.remove(sequence)

    def find(self, request_id: str) -> S | None:
        for group in (self.running, self.prefilling, self.waiting):
            for seq in group:
                if seq.request_id == request_id:
                    return seq
        return None
