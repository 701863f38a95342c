"""``python -m bench.dispatch``: the dispatcher's own cost per request, in process.

Requests go through `serve.core.dispatcher.Dispatcher` to workers that answer on the next
event-loop tick, so what is timed is the dispatcher (queue, placement, batch task, answer) and the
event loop, never a process or a socket. The figure is the process's CPU time per request
(steadier than the clock on a shared machine), best of ``--repeats`` runs of ``--requests``
requests with ``--concurrency`` of them in flight at once, per placement policy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from collections.abc import Callable

from serve.config import ModelSettings
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState, next_state
from serve.core.sequences import SEQUENCE_ID_HEADER, SequenceSettings, make_dispatcher

_ids = itertools.count()


class _Worker:
    """Answers every batch on the next tick."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._state = WorkerState.READY

    @property
    def state(self) -> WorkerState:
        return self._state

    def change_state(self, wanted: WorkerState) -> bool:
        self._state = next_state(self._state, wanted)
        return self._state is wanted

    async def run_batch(
        self, items: list[BatchItem], on_partial: Callable[[list[ItemResult]], None] | None = None
    ) -> BatchOutcome:
        await asyncio.sleep(0)
        results: list[ItemResult | object] = [ItemResult(200, b"ok", None) for _ in items]
        return BatchOutcome(results, {}, [])  # type: ignore[arg-type]

    def kill(self) -> None:
        self._state = WorkerState.DEAD


class _Pool:
    def __init__(self, count: int) -> None:
        self._workers = [_Worker(f"w{i}") for i in range(count)]

    def workers(self) -> list[_Worker]:
        return self._workers

    def can_serve(self) -> bool:
        return True

    def batch_finished(self, worker: object) -> None:
        pass


async def _one_run(
    sequences: SequenceSettings, workers: int, batch_size: int, requests: int, concurrency: int
) -> float:
    settings = ModelSettings().merged(
        {"batch_size": batch_size, "max_batch_delay": 0, "job_queue_size": 100_000}
    )
    dispatcher = make_dispatcher("m", "1", _Pool(workers), lambda: settings, sequences)
    seq_ids = [f"s{i}" for i in range(concurrency)]

    async def client(index: int) -> None:
        for _ in range(requests // concurrency):
            headers = {SEQUENCE_ID_HEADER: seq_ids[index]} if sequences.enabled else {}
            await dispatcher.submit(BatchItem(f"r{next(_ids)}", headers, []))

    start = time.process_time()  # its own CPU: steadier than the clock on a shared machine
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return (time.process_time() - start) / (requests // concurrency * concurrency)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    plain = SequenceSettings()
    seq = SequenceSettings.from_config(
        {"sequenceBatching": True, "sequenceMaxIdleMSec": 60_000, "maxSequenceJobQueueSize": 4},
        8,
        2,
    )
    cont = SequenceSettings.from_config(
        {
            "sequenceBatching": True,
            "sequenceMaxIdleMSec": 60_000,
            "maxSequenceJobQueueSize": 4,
            "continuousBatching": True,
        },
        8,
        2,
    )
    cases = [
        ("plain, 1 worker, batch 1", plain, 1, 1),
        ("plain, 2 workers, batch 8", plain, 2, 8),
        ("sequences, 2 workers, batch 8", seq, 2, 8),
        ("seq. continuous, 2 w, batch 8", cont, 2, 8),
    ]
    print(f"{'case':<32} {'CPU µs/request':>14}")
    for name, sequences, workers, batch in cases:
        best = min(
            asyncio.run(_one_run(sequences, workers, batch, args.requests, args.concurrency))
            for _ in range(args.repeats)
        )
        print(f"{name:<32} {best * 1e6:>14.2f}")
    print(f"\nbest of {args.repeats} × {args.requests} requests, {args.concurrency} in flight.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
