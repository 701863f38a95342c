"""The running batch's key/value cache: one row per sequence, written in place.

Per layer one key and one value tensor of shape ``(rows, kv_heads, columns, head_dim)`` hold the
running sequences, row ``i`` for ``keys[i]``, its positions from column 0 up to its length (the
rest of the row is unused and masked out). A decode step writes each row's new key at its own
length (`write`), so nothing is copied per step; a joining sequence is written into the next free
row; a leaving one is replaced by the last row, so the rows stay compact. The tensors grow by
doubling rows and by half again the columns (up to the longest row) and are freed when the
batch empties or shrink when the longest row left or most rows did. ``padded_tokens`` counts the
positions attention reads: rows x the longest row.

A cache made with ``keep_memory`` (the engine's on a GPU with CUDA graphs, which read the
tensors where they were captured: `handlers.generation.graphs`) grows by at least 256 columns at
a time and never gives memory back, so that its tensors, and the graphs over them, stay put once
the load has been seen.
"""

from __future__ import annotations

import torch

from handlers.generation.transfers import to_device

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), ``(b, h, n, d)``


def _more(columns: int, least: int = 64) -> int:
    """Columns to grow to from ``columns``: half as many again, at least ``least`` more (a copy
    every few dozen steps at most, and at most a third of the columns unused)."""
    return columns + max(least, columns // 2)


def _grown(t: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    bigger = t.new_zeros((rows, t.shape[1], columns, t.shape[3]))
    bigger[: t.shape[0], :, : t.shape[2]] = t
    return bigger


class BatchCache:
    """Rows of running sequences sharing one cache, addressed by sequence key."""

    def __init__(self, keep_memory: bool = False) -> None:
        self.keep_memory = keep_memory
        self._least = 256 if keep_memory else 64  # columns added at a time, at least
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

    @property
    def device(self) -> torch.device:
        return self.layers[0][0].device if self.layers else torch.device("cpu")

    def step_mask(self, positions: torch.Tensor | None = None) -> torch.Tensor | None:
        """Which columns each row's new token attends to (its own and the ones before), shape
        ``(rows, 1, 1, width)``, for one more token per row, on the device of ``positions``
        (each row's next position; default `positions`): with this step's (`begin_step`'s
        ``write_positions``) it is built on the cache's device, with no copy. None when every
        row attends to every column (rows of one length: a single sequence, or a batch that
        started together), which lets attention run without a mask."""
        if not self.lengths or min(self.lengths) == max(self.lengths):
            return None
        positions = self.positions() if positions is None else positions
        columns = torch.arange(self.width, device=positions.device)
        return (columns[None, :] <= positions[:, None])[:, None, None, :]

    def begin_step(self) -> None:
        """Make room for one more column in every row, before a decode step writes it. The
        rows' write positions go to the cache's device here, once a step and without waiting on
        it (``non_blocking``): indexing a GPU tensor with host indices in every layer's `write`
        made the host wait on the device twice a layer."""
        device = self.device
        self._rows = torch.arange(len(self.keys), device=device)
        self._columns = self.positions().to(device, non_blocking=True)
        self._width = self.width
        if self.layers and self._width > self.layers[0][0].shape[2]:
            rows, columns = self.layers[0][0].shape[0], self.layers[0][0].shape[2]
            self._resize(rows, max(self._width, _more(columns, self._least)))

    @property
    def write_positions(self) -> torch.Tensor:
        """Where this step writes each row's new key (`begin_step`), on the cache's device."""
        return self._columns

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store each row's new key/value ``(rows, kv_heads, head_dim)`` at its length; returns the
        layer's cache as attention reads it, ``(rows, kv_heads, width, head_dim)`` views."""
        k, v = self.put(layer, self._rows, self._columns, keys, values)
        n = len(self.keys)
        return k[:n, :, : self._width], v[:n, :, : self._width]

    def put(
        self,
        layer: int,
        rows: torch.Tensor,
        columns: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``keys``/``values`` ``(n, kv_heads, head_dim)`` at ``(rows[i], columns[i])``
        of a layer; returns the layer's whole key and value tensors."""
        k, v = self.layers[layer]
        k[rows, :, columns] = keys
        v[rows, :, columns] = values
        return k, v

    def advanced(self) -> None:
        """Record that a decode step wrote one position into every row."""
        self.lengths = [n + 1 for n in self.lengths]

    def join(self, key: str, layers: Layers, length: int) -> None:
        """Add a sequence whose own cache (batch of one per layer) holds ``length`` positions."""
        self.join_packed([key], [length], [0], layers)

    def join_packed(
        self, keys: list[str], lengths: list[int], offsets: list[int], packed: Layers
    ) -> None:
        """Add sequences whose positions lie side by side in ``packed`` (per layer a batch of one,
        ``(1, kv_heads, tokens, head_dim)``): sequence ``i`` holds ``lengths[i]`` positions from
        ``offsets[i]``. One indexed copy per layer, however many join."""
        if not keys:
            return
        first, longest = len(self.keys), max(lengths)
        if not self.layers:
            self.layers = [
                (
                    _grown(k[:0, :, :0], 4, _more(longest, self._least)),
                    _grown(v[:0, :, :0], 4, _more(longest, self._least)),
                )
                for k, v in packed
            ]
        rows, columns = self.layers[0][0].shape[0], self.layers[0][0].shape[2]
        needed_rows = first + len(keys)
        if needed_rows > rows or longest + 1 > columns:
            while rows < needed_rows:
                rows *= 2
            self._resize(rows, max(columns, _more(longest, self._least)))
        counts = torch.tensor(lengths)
        row_index = torch.repeat_interleave(torch.arange(first, needed_rows), counts)
        column_index = torch.cat([torch.arange(n) for n in lengths])
        token_index = torch.cat(
            [torch.arange(o, o + n) for o, n in zip(offsets, lengths, strict=True)]
        )
        row_index, column_index, token_index = to_device(
            self.device, row_index, column_index, token_index
        )
        for (k, v), (pk, pv) in zip(self.layers, packed, strict=True):
            k[row_index, :, column_index] = pk[0][:, token_index].transpose(0, 1)
            v[row_index, :, column_index] = pv[0][:, token_index].transpose(0, 1)
        self.keys.extend(keys)
        self.lengths.extend(lengths)

    def reserve(self, rows: int, columns: int) -> None:
        """Grow the tensors to at least ``rows`` x ``columns`` now (once a sequence has shown
        their shapes), rather than as sequences come."""
        if self.layers:
            have = self.layers[0][0]
            if rows > have.shape[0] or columns > have.shape[2]:
                self._resize(max(rows, have.shape[0]), max(columns, have.shape[2]))

    def leave(self, keys: set[str]) -> None:
        """Drop the rows of ``keys``; the last rows move into the holes (one indexed copy per
        layer, however many leave)."""
        gone = {row for row, key in enumerate(self.keys) if key in keys}
        stay = len(self.keys) - len(gone)
        holes = sorted(row for row in gone if row < stay)
        movers = [row for row in range(stay, len(self.keys)) if row not in gone]
        if holes:
            n = max(self.lengths[row] for row in movers)
            to, source = to_device(self.device, torch.tensor(holes), torch.tensor(movers))
            for k, v in self.layers:
                k[to, :, :n] = k[source, :, :n]
                v[to, :, :n] = v[source, :, :n]
            for hole, mover in zip(holes, movers, strict=True):
                self.keys[hole], self.lengths[hole] = self.keys[mover], self.lengths[mover]
        del self.keys[stay:], self.lengths[stay:]
        if self.keep_memory:
            return
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
