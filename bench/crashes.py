"""``python -m bench.recovery --kills 5``: issue 25's scenario, kill → READY as describe sees it.

One server with its defaults (back-off, spares) and no model; the tiny TorchScript MLP is
registered (``synchronous=true``) and its worker SIGKILLed ``kills`` times, ``interval`` s apart
(the next kill ``interval`` s after the last one, or at once if its replacement took longer);
each time the harness polls ``GET /models/NAME`` every 10 ms until a READY worker with another
pid is there. Nothing waits for a
spare: what a user meets. ``--base DIR`` runs the same against another tree's code first.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bench.recovery import _request, ready_pids, warm_starts
from bench.server import LanternProcess


def kill_series(lantern: LanternProcess, model: str, kills: int, interval: float) -> list[float]:
    """Seconds from each kill to a READY worker with a new pid."""
    times = []
    next_kill = time.monotonic() + interval
    for _ in range(kills):
        time.sleep(max(0.0, next_kill - time.monotonic()))
        (old,) = ready_pids(lantern, model)[:1]
        started = time.perf_counter()
        next_kill = time.monotonic() + interval
        os.kill(old, signal.SIGKILL)
        while True:
            pids = ready_pids(lantern, model)
            if pids and old not in pids:
                break
            if time.perf_counter() - started > 120:
                raise TimeoutError(f"{model}: no replacement")
            time.sleep(0.01)
        times.append(time.perf_counter() - started)
    return times


def run(
    store: Path, work: Path, server: str, kills: int, interval: float, tree: Path | None
) -> tuple[list[float], int]:
    """Start a server (``tree``'s code, or this one's), run the kills; times and warm starts."""
    for key in ("LANTERN_WORKER_RESTART_MAX_BACKOFF", "LANTERN_WORKER_SPARES"):
        os.environ.pop(key, None)  # the defaults: what a user has
    lantern = LanternProcess(work, store, [], server, ["--enable-model-api"])
    saved = os.environ.get("PYTHONPATH")
    if tree is not None:
        lantern.cwd = tree.resolve()
        os.environ["PYTHONPATH"] = str(lantern.cwd)
    try:
        lantern.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        api = lantern.addresses["management"]
        status, body = _request(
            "POST", f"{api}/models?url=torchscript.mar&initial_workers=1&synchronous=true"
        )
        if status != 200:
            raise RuntimeError(f"register: {status} {body[:300]!r}")
        before = warm_starts(lantern)  # the log is appended to across runs
        times = kill_series(lantern, "torchscript", kills, interval)
        return times, warm_starts(lantern) - before
    finally:
        lantern.stop()


def table(rows: dict[str, tuple[list[float], int]], interval: float) -> str:
    """One row per tree: each kill's kill → READY in seconds, and how many started warm."""
    kills = max(len(times) for times, _ in rows.values())
    head = "tree      " + "".join(f"  kill {i + 1}" for i in range(kills)) + "   warm starts"
    lines = [head]
    for name, (times, warm) in rows.items():
        cells = "".join(f"{t:>8.2f}" for t in times)
        lines.append(f"{name:<10}{cells}   {warm}/{len(times)}")
    lines.append(
        f"kill -> READY (new pid, as describe sees it), s; kills {interval:g} s apart; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    return "\n".join(lines)
