"""The running batch's key/value cache: one row per sequence, written in place.

Per layer one key and one value tensor of shape ``(rows, kv_heads, columns, head_dim)`` hold the
running sequences, row ``i`` for ``keys[i]``, its positions from column 0 up to its length (the
rest of the row is unused and masked out). A decode step writes each row's new key at its own
length (`write`), so nothing is copied per step; a joining sequence is written into the next free
row; a leaving one is replaced by the last row, so the rows stay compact. The tensors grow by
doubling rows and by half again the columns (up to the longest row) and are freed when the
batch empties or shrink when the longest row left or most rows did. ``padded_tokens`` counts the
positions attention reads: rows x the longest row.
"""

from __future__ import annotations

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), ``(b, h, n, d)``


def _more(columns: int) -> int:
    """Columns to grow to from ``columns``: half as many again, at least 64 more (a copy every
    few dozen steps at most, and at most a third of the columns unused)."""
    return columns + max(64, columns // 2)


def _grown(t: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    bigger = t.new_zeros((rows, t.shape[1], columns, t.shape[3]))
    bigger[: t.shape[0], :, : t.shape[2]] = t
    return bigger


class BatchCache:
    """Rows of running sequences sharing one cache, addressed by sequence key."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.layers: Layers = []
        self.lengths: list[int] = []  # positions held by each row
        self._rows = self._columns = torch.zeros(0, dtype=torch.long)  # this step's writes
        self._width = 0  # and the columns attention reads (`begin_step`)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def width(self) -> int:
        """Columns attention reads this step: the longest row plus the one being written."""
        return max(self.lengths) + 1 if self.lengths else 0

    @property
    def padded_tokens(self) -> int:
        """Cache positions attention reads (rows x the longest row)."""
        return len(self.keys) * (max(self.lengths) if self.lengths else 0)

    def positions(self) -> torch.Tensor:
        """Each row's next position id, shape ``(rows,)``."""
        return torch.tensor(self.lengths, dtype=torch.long)

    def step_mask(self) -> torch.Tensor | None:
        """Which columns each row's new token attends to (its own and the ones before), shape
        ``(rows, 1, 1, width)``, for one more token per row; None when every row attends to
        every column (rows of one length: a single sequence, or a batch that started together),
        which lets attention run without a mask."""
        if not self.lengths or min(self.lengths) == max(self.lengths):
            return None
        columns = torch.arange(self.width)
        return (columns[None, :] <= self.positions()[:, None])[:, None, None, :]

    def begin_step(self) -> None:
        """Make room for one more column in every row, before a decode step writes it."""
        self._rows = torch.arange(len(self.keys))
        self._columns = self.positions()
        self._width = self.width
        if self.layers and self._width > self.layers[0][0].shape[2]:
            rows, columns = self.layers[0][0].shape[0], self.layers[0][0].shape[2]
            self._resize(rows, max(self._width, _more(columns)))

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store each row's new key/value ``(rows, kv_heads, head_dim)`` at its length; returns the
        layer's cache as attention reads it, ``(rows, kv_heads, width, head_dim)`` views."""
        k, v = self.layers[layer]
        k[self._rows, :, self._columns] = keys
        v[self._rows, :, self._columns] = values
        n = len(self.keys)
        return k[:n, :, : self._width], v[:n, :, : self._width]

    def advanced(self) -> None:
        """Record that a decode step wrote one position into every row."""
        self.lengths = [n + 1 for n in self.lengths]

    def join(self, key: str, layers: Layers, length: int) -> None:
        """Add a sequence whose own cache (batch of one per layer) holds ``length`` positions."""
        row = len(self.keys)
        if not self.layers:
            self.layers = [
                (_grown(k[:0], 4, _more(length)), _grown(v[:0], 4, _more(length)))
                for k, v in layers
            ]
        rows, columns = self.layers[0][0].shape[0], self.layers[0][0].shape[2]
        if row >= rows or length + 1 > columns:
            self._resize(2 * rows if row >= rows else rows, max(columns, _more(length)))
        for (k, v), (jk, jv) in zip(self.layers, layers, strict=True):
            k[row, :, :length] = jk[0, :, :length]
            v[row, :, :length] = jv[0, :, :length]
        self.keys.append(key)
        self.lengths.append(length)

    def leave(self, keys: set[str]) -> None:
        """Drop the rows of ``keys``; the last rows move into the holes."""
        for key in [k for k in self.keys if k in keys]:
            row, last = self.keys.index(key), len(self.keys) - 1
            if row != last:
                n = self.lengths[last]
                for k, v in self.layers:
                    k[row, :, :n] = k[last, :, :n]
                    v[row, :, :n] = v[last, :, :n]
                self.keys[row], self.lengths[row] = self.keys[last], self.lengths[last]
            self.keys.pop()
            self.lengths.pop()
        if not self.keys:
            self.layers = []
            return
        rows, columns = self.layers[0][0].shape[0], self.layers[0][0].shape[2]
        longest = max(self.lengths)
        if columns > 3 * _more(longest) or rows > 4 * len(self.keys) >= 4:
            # a long sequence left (or most rows did): give the memory back
            self._resize(max(4, 2 * len(self.keys)), _more(longest))

    def _resize(self, rows: int, columns: int) -> None:
        n, width = len(self.keys), max(self.lengths, default=0)
        self.layers = [
            (_grown(k[:n, :, :width], rows, columns), _grown(v[:n, :, :width], rows, columns))
            for k, v in self.layers
        ]
