"""Micro-batching: a batch split into slices that flow through preprocess -> inference ->
postprocess in parallel threads (TorchServe's ``ts.handler_utils.micro_batching``).

A handler opts in by replacing its ``handle`` with ``MicroBatching(self)``; the batch is cut into
slices of ``micro_batch_size``, each phase runs in ``parallelism[phase]`` threads (1 by default)
fed by a queue, and the slices' results are put back in their original order. Describe and
explain requests skip the pipeline, as in TorchServe.

Differences from TorchServe: the phase threads are daemon threads (a worker can exit without
calling ``shutdown``), and an exception in a phase fails the batch it belongs to instead of
leaving ``handle`` waiting forever.
"""

from __future__ import annotations

import queue
import threading
import time
from copy import copy
from dataclasses import dataclass
from typing import Any

HANDLER_METHODS = ["preprocess", "inference", "postprocess"]
_POLL_SECONDS = 0.5  # how often an idle phase thread checks whether it should stop


@dataclass
class WorkerThread:
    """One phase thread and the event that stops it."""

    event: threading.Event
    thread: threading.Thread


@dataclass
class _Failure:
    error: BaseException


def _run_phase(
    in_queue: queue.Queue,
    out_queue: queue.Queue,
    call: Any,
    local: threading.local,
    stop: threading.Event,
) -> None:
    while not stop.is_set():
        try:
            idx, data = in_queue.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if isinstance(data, _Failure):  # an earlier phase failed: pass the failure on
            out_queue.put((idx, data))
            continue
        local.micro_batch_idx = idx
        try:
            out_queue.put((idx, call(data)))
        except BaseException as exc:  # handed to the caller of handle
            out_queue.put((idx, _Failure(exc)))


class MicroBatching:
    """Replaces a handler's ``handle``: ``handler.handle = MicroBatching(handler)``."""

    def __init__(
        self, parent_handler: Any, micro_batch_size: int = 1, parallelism: dict | None = None
    ) -> None:
        self.handler = parent_handler
        self.micro_batch_size = micro_batch_size
        self._parallelism: dict[str, int] = dict(parallelism or {})
        self.thread_groups: dict[str, list[WorkerThread]] = {m: [] for m in HANDLER_METHODS}
        self.thread_local_data = threading.local()
        self.terminate = threading.Event()
        self._lock = threading.Lock()  # one batch at a time through the shared queues
        # Each phase's output queue is the next phase's input queue.
        self.queues: dict[str, queue.Queue] = {}
        previous: queue.Queue = queue.Queue()
        for method in HANDLER_METHODS:
            self.queues[f"{method}_in"] = previous
            previous = queue.Queue()
            self.queues[f"{method}_out"] = previous
        self._update_threads()

    def __del__(self) -> None:
        self.shutdown()

    @property
    def parallelism(self) -> dict[str, int]:
        return copy(self._parallelism)

    @parallelism.setter
    def parallelism(self, parallelism: dict[str, int]) -> None:
        """Set the number of threads of some phases (the others keep theirs)."""
        unknown = set(parallelism) - set(HANDLER_METHODS)
        if unknown:
            raise ValueError(f"unknown micro-batching phases {sorted(unknown)}")
        self._parallelism.update(parallelism)
        self._update_threads()

    def shutdown(self) -> None:
        """Stop every phase thread."""
        for group in getattr(self, "thread_groups", {}).values():
            for worker in group:
                worker.event.set()
            for worker in group:
                if worker.thread is not threading.current_thread():
                    worker.thread.join()
            group.clear()

    def _update_threads(self) -> None:
        for method in HANDLER_METHODS:
            target = int(self._parallelism.get(method, 1))
            if target < 0:
                raise ValueError(f"parallelism of {method} cannot be negative")
            group = self.thread_groups[method]
            while len(group) < target:
                stop = threading.Event()
                thread = threading.Thread(
                    target=_run_phase,
                    args=(
                        self.queues[f"{method}_in"],
                        self.queues[f"{method}_out"],
                        getattr(self.handler, method),
                        self.thread_local_data,
                        stop,
                    ),
                    name=f"micro-batching-{method}-{len(group)}",
                    daemon=True,
                )
                thread.start()
                group.append(WorkerThread(stop, thread))
            while len(group) > target:
                worker = group.pop()
                worker.event.set()
                worker.thread.join()

    def handle(self, data: list) -> list:
        """Run ``data`` through the phases in slices; results in the order of ``data``."""
        size = max(1, int(self.micro_batch_size))
        slices = [data[i : i + size] for i in range(0, len(data), size)]
        with self._lock:
            for idx, part in enumerate(slices):
                self.queues[f"{HANDLER_METHODS[0]}_in"].put_nowait((idx, part))
            done = [self.queues[f"{HANDLER_METHODS[-1]}_out"].get() for _ in slices]
        done.sort(key=lambda pair: pair[0])
        for _, result in done:
            if isinstance(result, _Failure):
                raise result.error
        return [item for _, result in done for item in result]

    def get_micro_batch_idx(self) -> int | None:
        """Index of the slice the calling phase thread works on (None outside a phase)."""
        return getattr(self.thread_local_data, "micro_batch_idx", None)

    def __call__(self, data: list, context: Any) -> list:
        """The handler's ``handle``: describe, explain, or the micro-batched pipeline."""
        start = time.time()
        self.handler.context = context
        if self.handler._is_describe():
            output = [self.handler.describe_handle()]
        elif self.handler._is_explain():
            output = self.handler.explain_handle(self.handler.preprocess(data), data)
        else:
            output = self.handle(data)
        context.metrics.add_time("HandlerTime", round((time.time() - start) * 1000, 2), None, "ms")
        return output
