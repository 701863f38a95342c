"""Prompts' keys and values kept for the next prompt that starts the same way (prefix caching).

Chat requests repeat their system prompt and their earlier turns; a benchmark or an agent repeats
whole prompts. When a prompt's prefill completes, the engine stores its keys and values here
(`store`); a newcomer whose prompt starts with a stored one (`lookup`) starts its prefill after
the shared part, so only the rest runs through the model. At least the prompt's last token is
always computed: its logits choose the first output token.

An entry is found by a hash of its tokens at every ``block`` tokens and at its own end, so a
prompt that shares the first 40 tokens of a stored one reuses 32 of them (``block`` 16), and a
repeated prompt reuses all but its last token. A hash that matches is checked against the
entry's tokens, so a collision costs a comparison, never a wrong answer. Entries are evicted
least recently used first to stay within ``capacity`` token positions; an entry is one set of
tensors, and its prefixes are views of it.

The keys hold the model's positional encoding (RoPE is applied before attention), which is why
only a prefix can be reused: the same tokens at the same positions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from handlers.generation.cache import Layers

DEFAULT_BLOCK = 16


@dataclass(eq=False)
class _Entry:
    tokens: tuple[int, ...]
    layers: Layers  # per layer (keys, values), ``(1, kv_heads, len(tokens), head_dim)``
    hashes: list[int]  # the keys it is found under


@dataclass(frozen=True)
class PrefixHit:
    """``length`` leading prompt tokens whose keys and values are ``layers``."""

    length: int
    layers: Layers
    whole: bool  # the entry holds every token of this prompt (nothing new to store)


def _chain(tokens: Sequence[int]) -> list[int]:
    """``out[i]``: a hash of ``tokens[: i + 1]``."""
    out, h = [], 0
    for token in tokens:
        h = hash((h, token))
        out.append(h)
    return out


class PrefixCache:
    """Stored prompts' keys and values within ``capacity`` token positions (0: off)."""

    def __init__(self, capacity: int, block: int = DEFAULT_BLOCK) -> None:
        self.capacity = capacity
        self.block = block
        self.tokens = 0  # positions held
        self.queried_tokens = 0  # prompt tokens looked up, as vLLM's prefix_cache_queries
        self.hit_tokens = 0  # of those, found here
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # by id, least recent first
        self._index: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest stored prefix of ``prompt``, at most all but its last token."""
        if not self.capacity or len(prompt) < 2:
            return None
        self.queried_tokens += len(prompt)
        hashes = _chain(prompt)
        for end in range(len(prompt), 0, -1):
            entry = self._index.get(hashes[end - 1])
            if entry is None or tuple(prompt[:end]) != entry.tokens[:end]:
                continue  # nothing stored ends here, or a hash collision
            self._entries.move_to_end(id(entry))
            length = min(end, len(prompt) - 1)
            self.hit_tokens += length
            layers = [(k[:, :, :length], v[:, :, :length]) for k, v in entry.layers]
            return PrefixHit(length, layers, whole=end == len(prompt))
        return None

    def store(self, prompt: Sequence[int], layers: Layers) -> None:
        """Keep ``layers`` (the whole prompt's keys and values, which nothing else may write) for
        prompts that start like ``prompt``; evicts the least recently used to make room."""
        if len(prompt) < 2 or len(prompt) > self.capacity:
            return
        while self.tokens + len(prompt) > self.capacity:
            self._evict()
        chain = _chain(prompt)
        ends = {*range(self.block, len(prompt) + 1, self.block), len(prompt)}
        entry = _Entry(tuple(prompt), layers, [chain[end - 1] for end in sorted(ends)])
        for h in entry.hashes:
            self._index[h] = entry  # a newer entry with the same prefix takes its keys over
        self._entries[id(entry)] = entry
        self.tokens += len(prompt)

    def _evict(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.tokens -= len(entry.tokens)
        for h in entry.hashes:
            if self._index.get(h) is entry:
                del self._index[h]

    def clear(self) -> None:
        while self._entries:
            self._evict()
