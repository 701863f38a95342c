"""CUDA graphs for the engine's decode steps: the whole forward replayed in one launch.

At one stream a step of a 1 B model on an H200 is bound by the host, not the GPU: transformers'
forward launches some 550 kernels from Python, 12 ms a step (docs/performance.md, GPU run 2),
where the GPU needs 2-3. A CUDA graph records those launches once and replays them with one.

A graph fixes every shape and every address it touches, so a step runs through one only when it
decodes (no prompt chunk) and its rows fit a captured size (`BUCKETS`): the rows' inputs are
copied into static buffers, padded to the size (padding rows write their keys at column 0 of
rows no sequence holds, and their logits are dropped), and attention reads every column the
batch's cache has allocated, under a mask built inside the graph from the rows' positions (the
eager step reads only up to the longest row). Every size is captured at load (`capture_all`,
from `Engine.warm_up`, over a cache reserved for the KV budget). A graph reads the cache's
tensors where they were when it was captured: when the cache grows (a sequence longer than its
columns), the graphs are dropped and captured again as steps need them. Each capture runs the
step eagerly first and
checks that the graph's replay gives the same logits; a capture that fails or differs turns the
graphs off for this engine (logged) and the engine runs eagerly, as on a CPU, where none of
this applies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from handlers.generation.cache import BatchCache
from handlers.generation.ragged import StepPlan, planned

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class Recorded:
    """A captured step: ``replay`` runs it again from the static inputs into ``logits``."""

    replay: Callable[[], None]
    logits: torch.Tensor  # (size, vocab), written by each replay


class FixedWrites:
    """The cache as a captured step sees it: each row's new key written at its position, and
    attention over every allocated column of the first ``size`` rows."""

    def __init__(self, batch: BatchCache, rows: torch.Tensor, columns: torch.Tensor) -> None:
        self.batch = batch
        self.rows = rows
        self.columns = columns

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.batch.put(layer, self.rows, self.columns, keys, values)
        size = len(self.rows)
        return k[:size], v[:size]


class DecodeGraphs:
    """Captured decode steps of one model over one `BatchCache`, by padded row count."""

    def __init__(self, model: Any, device: torch.device, most_rows: int) -> None:
        self.model = model
        self.device = device
        self.sizes = [b for b in BUCKETS if b < most_rows] + [
            next((b for b in BUCKETS if b >= most_rows), most_rows)
        ]
        largest = self.sizes[-1]
        self._ids = torch.zeros(largest, dtype=torch.long, device=device)
        self._positions = torch.zeros(largest, dtype=torch.long, device=device)
        self._rows = torch.arange(largest, device=device)
        self._graphs: dict[int, Recorded] = {}
        self._cache: tuple[int, tuple[int, ...]] | None = None  # what the graphs were taken over
        self._pool: Any = None
        self.enabled = True
        self.hits = 0
        self.captures = 0

    def size_for(self, rows: int, batch: BatchCache) -> int | None:
        """The captured size a step of ``rows`` rows runs at (None: it runs eagerly)."""
        if not self.enabled or not rows or not batch.layers:
            return None
        size = next((s for s in self.sizes if s >= rows), None)
        if size is None or size > batch.layers[0][0].shape[0]:
            return None
        return size

    def run(self, batch: BatchCache, ids: list[int]) -> torch.Tensor | None:
        """The logits ``(rows, vocab)`` of a decode step of ``batch`` (after its
        ``begin_step``), fed ``ids``, through a graph; None when none fits and the step is
        to run eagerly."""
        size = self.size_for(len(ids), batch)
        if size is None:
            return None
        self._over(batch)
        self.stage(batch, ids, size)
        graph = self._graphs.get(size)
        if graph is None:
            graph = self._capture(batch, size)
            if graph is None:
                return None
        else:
            graph.replay()
            self.hits += 1
        return graph.logits[: len(ids)]

    def capture_all(self, batch: BatchCache) -> int:
        """Capture every size the cache's rows allow now, over padding rows only (at load:
        then no step waits for a capture until the cache grows); how many are held."""
        self._over(batch)
        for size in self.sizes:
            if self.size_for(size, batch) is None or size in self._graphs:
                continue
            self.stage(batch, [], size)
            if self._capture(batch, size) is None:
                break
        return len(self._graphs)

    def _over(self, batch: BatchCache) -> None:
        """Drop the graphs when the cache's tensors are not those they were captured over."""
        k = batch.layers[0][0]
        cache = (k.data_ptr(), tuple(k.shape))
        if cache != self._cache:
            self._graphs.clear()
            self._cache = cache

    def stage(self, batch: BatchCache, ids: list[int], size: int) -> None:
        """The step's token ids and positions (each row's length) into the static inputs,
        padded to ``size``, in one copy the host does not wait for."""
        pad = size - len(ids)
        inputs = torch.tensor([ids + [0] * pad, batch.lengths + [0] * pad], dtype=torch.long)
        staged = inputs.to(self.device, non_blocking=True)
        self._ids[:size].copy_(staged[0])
        self._positions[:size].copy_(staged[1])

    def forward(self, batch: BatchCache, size: int) -> torch.Tensor:
        """The step as a graph holds it: ``size`` rows (the staged ones, then padding), over
        every allocated column of the cache; logits ``(size, vocab)``."""
        positions = self._positions[:size]
        columns = torch.arange(batch.layers[0][0].shape[2], device=self.device)
        mask = (columns[None, :] <= positions[:, None])[:, None, None, :]
        writes = FixedWrites(batch, self._rows[:size], positions)
        with planned(StepPlan(size, writes, [], mask)):
            out = self.model(
                input_ids=self._ids[None, :size],
                position_ids=positions[None],
                use_cache=False,
                logits_to_keep=0,
            )
        logits: torch.Tensor = out.logits[0]
        return logits

    def record(self, batch: BatchCache, size: int) -> tuple[torch.Tensor, Recorded]:
        """The step run eagerly (twice, on a side stream, as capture wants: its logits are
        the reference), then captured as a CUDA graph."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            expected = self.forward(batch, size).clone()
            self.forward(batch, size)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.forward(batch, size)
        if self._pool is None:
            self._pool = graph.pool()
        return expected, Recorded(graph.replay, logits)

    def _capture(self, batch: BatchCache, size: int) -> Recorded | None:
        """Record the step, replay it and compare with the eager run: the replay is this step's
        answer. None (and no more graphs) on any failure; the eager runs only rewrote the same
        keys at the same places."""
        try:
            expected, recorded = self.record(batch, size)
            recorded.replay()
            if not torch.allclose(recorded.logits.float(), expected.float(), rtol=0.02, atol=0.05):
                difference = float((recorded.logits.float() - expected.float()).abs().max())
                raise RuntimeError(
                    f"the replayed logits differ from the eager step's by {difference}"
                )
        except Exception as exc:
            self.enabled = False
            self._graphs.clear()
            logger.warning("CUDA graphs off: capturing a step of %d rows failed: %s", size, exc)
            return None
        self.captures += 1
        self._graphs[size] = recorded
        return recorded
