"""The prefix cache on its own: which stored prompt a new one reuses, how much, and eviction."""

from __future__ import annotations

import pytest
import torch

from handlers.generation import prefix
from handlers.generation.prefix import PrefixCache


def layers_of(tokens: list[int], n_layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values whose every position holds its token id, so a slice shows what it covers."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    return [(t.clone(), -t.clone()) for _ in range(n_layers)]


def covered(hit: prefix.PrefixHit) -> list[int]:
    return hit.layers[0][0].view(-1).int().tolist()


LONG = list(range(100, 140))  # 40 tokens


@pytest.mark.parametrize(
    ("stored", "prompt", "length", "whole"),
    [
        (LONG, LONG, 39, True),  # the same prompt: all but its last token, which is computed
        (LONG, LONG + [7, 8], 40, False),  # a continuation (the next chat turn): all of it
        (LONG, LONG[:35] + [1, 2], 32, False),  # diverges at 35: the last whole block of 16
        (LONG, LONG[:20], 16, False),  # a shorter prompt: found at the last block boundary
        (LONG, LONG[:32], 31, True),  # ... ending on one: all of it is stored already
        (LONG, [1, *LONG], None, False),  # the same tokens one position on: not a prefix
        (LONG, LONG[:15] + [1], None, False),  # shares less than one block
    ],
)
def test_lookup_reuses_the_longest_stored_prefix(stored, prompt, length, whole):
    cache = PrefixCache(capacity=1000, block=16)
    cache.store(stored, layers_of(stored))
    hit = cache.lookup(prompt)
    if length is None:
        assert hit is None
        return
    assert hit is not None
    assert (hit.length, hit.whole) == (length, whole)
    assert covered(hit) == prompt[:length]
    assert all(k.shape[2] == length and v.shape[2] == length for k, v in hit.layers)
    assert cache.hit_tokens == length and cache.queried_tokens == len(prompt)


def test_a_hash_collision_is_checked_against_the_tokens(monkeypatch):
    cache = PrefixCache(capacity=1000, block=4)
    monkeypatch.setattr(prefix, "_chain", lambda tokens: [0] * len(tokens))  # all collide
    cache.store([1, 2, 3, 4], layers_of([1, 2, 3, 4]))
    assert cache.lookup([9, 9, 9, 9]) is None
    hit = cache.lookup([1, 2, 3, 4])
    assert hit is not None and covered(hit) == [1, 2, 3]


def test_least_recently_used_entries_go_first_within_the_capacity():
    cache = PrefixCache(capacity=30, block=16)
    a, b, c = [1] * 10, [2] * 10, [3] * 10
    for tokens in (a, b, c):
        cache.store(tokens, layers_of(tokens))
    assert cache.tokens == 30 and len(cache) == 3
    assert cache.lookup(a) is not None  # a is now the most recent
    d = [4] * 10
    cache.store(d, layers_of(d))  # evicts b, the least recent
    assert cache.tokens == 30
    assert cache.lookup(b) is None
    assert all(cache.lookup(t) is not None for t in (a, c, d))


def test_an_evicted_entry_leaves_the_keys_a_newer_entry_took_over():
    cache = PrefixCache(capacity=40, block=4)
    old, new = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9]  # share the first block
    cache.store(old, layers_of(old))
    cache.store(new, layers_of(new))
    cache.store([7] * 30, layers_of([7] * 30))  # evicts old only
    hit = cache.lookup([1, 2, 3, 4, 8])
    assert hit is not None and covered(hit) == [1, 2, 3, 4]  # through new's key


def test_off_too_long_or_too_short_stores_nothing():
    off = PrefixCache(capacity=0)
    off.store([1, 2, 3], layers_of([1, 2, 3]))
    assert off.lookup([1, 2, 3]) is None and off.queried_tokens == 0
    small = PrefixCache(capacity=8)
    small.store(list(range(9)), layers_of(list(range(9))))
    small.store([5], layers_of([5]))
    assert small.tokens == 0 and len(small) == 0
    assert small.lookup([5]) is None  # one token: nothing could be reused


def test_clear_empties_it():
    cache = PrefixCache(capacity=100)
    cache.store(LONG, layers_of(LONG))
    cache.clear()
    assert cache.tokens == 0 and cache.lookup(LONG) is None
