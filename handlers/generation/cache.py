"""The running batch's key/value cache: one left-padded tensor pair per layer.

Rows are sequences; columns are cache positions, aligned on the right (the newest token of every
row is in the last column), so one decode step appends one column for the whole batch. A joining
sequence's cache (prefilled alone) is left-padded to the batch's length, or the batch is padded
to it; a leaving row is dropped and columns that hold padding for every row are trimmed away.
The attention mask marks real positions; a row's next position id is its count of real ones.
Padding costs memory (``padded_tokens`` counts it) but never changes a row's attention result:
padded keys are masked out.
"""

from __future__ import annotations

from typing import Any

import torch


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def new_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """A transformers ``DynamicCache`` (empty, or holding ``layers``)."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    pad = t.new_zeros((*t.shape[:2], n, *t.shape[3:]))
    return torch.cat([pad, t], dim=2)


class BatchCache:
    """Rows of sequences sharing one padded cache, addressed by sequence key."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.cache: Any = None  # DynamicCache, None while empty
        self.mask = torch.zeros((0, 0), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def padded_tokens(self) -> int:
        """Cache slots in use, padding included (rows x columns)."""
        return int(self.mask.numel())

    def positions(self) -> torch.Tensor:
        """Each row's next position id, shape ``(rows, 1)``."""
        return self.mask.sum(dim=1, keepdim=True)

    def step_mask(self) -> torch.Tensor:
        """The attention mask for one more token per row."""
        return torch.cat([self.mask, self.mask.new_ones((len(self.keys), 1))], dim=1)

    def advanced(self, cache: Any) -> None:
        """Record that a forward pass appended one position to every row of ``cache``."""
        self.cache = cache
        self.mask = self.step_mask()

    def join(self, key: str, cache: Any, length: int) -> None:
        """Add a sequence whose own cache (batch of one) holds ``length`` positions."""
        joining = _layers(cache)
        width = self.mask.shape[1]
        total = max(width, length)
        row_mask = torch.ones((1, total), dtype=torch.long)
        row_mask[:, : total - length] = 0
        if not self.keys:
            layers = joining
            self.mask = row_mask
        else:
            layers = [
                (
                    torch.cat([_pad_left(k, total - width), _pad_left(jk, total - length)]),
                    torch.cat([_pad_left(v, total - width), _pad_left(jv, total - length)]),
                )
                for (k, v), (jk, jv) in zip(_layers(self.cache), joining, strict=True)
            ]
            pad = self.mask.new_zeros((len(self.keys), total - width))
            self.mask = torch.cat([torch.cat([pad, self.mask], dim=1), row_mask])
        self.keys.append(key)
        self.cache = new_cache(layers)

    def leave(self, keys: set[str]) -> None:
        """Drop the rows of ``keys`` and any columns left holding padding only."""
        keep = [i for i, k in enumerate(self.keys) if k not in keys]
        if len(keep) == len(self.keys):
            return
        self.keys = [self.keys[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.zeros((0, 0), dtype=torch.long)
            return
        index = torch.tensor(keep, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        first = int(torch.nonzero(mask.any(dim=0))[0])  # leading all-padding columns
        self.mask = mask[:, first:]
        layers = []
        for k, v in _layers(self.cache):
            rows = index.to(k.device)
            layers.append(
                (k.index_select(0, rows)[:, :, first:], v.index_select(0, rows)[:, :, first:])
            )
        self.cache = new_cache(layers)
