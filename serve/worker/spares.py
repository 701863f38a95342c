"""Warm spare worker interpreters: started, with torch imported, before a worker is needed.

Importing torch takes 1–2 s of CPU: a fresh ``python -m serve.worker`` that paid it before loading
its model would make a crashed worker's replacement, or a scale-up, 1.2–2.2 s from READY. A spare
is the same interpreter started ahead of time, ``python -m serve.worker --spare``: it imports the
heavy frameworks (of `PRELOADABLE`, those the server's workers use), says ``SPARE-READY`` on
stdout and waits for one line on stdin, the worker's spec. From then on it is an ordinary worker
(same code, same socket protocol); the pool starts the next spare in the background.

Why not fork a zygote that has imported torch: a fork inherits every thread and lock of its
parent, and torch's (OpenMP, CUDA) must never be forked once initialised; a spare is a fresh
``exec`` that has not touched CUDA (importing torch does not initialise it), so nothing is shared.
The price is memory: each spare holds an idle interpreter with torch imported (~520 MiB RSS, of
which ~280 MiB its own (USS), with torch 2.14.1+cu130; ``docs/performance.md``), and the CPU to
start it, spent once no worker is starting.
A spare imports torch, torchvision or ONNX Runtime once a worker of this server has loaded them
(workers report what they imported; a spare started before that is replaced), so a spare that
becomes a worker carries no framework that the server's models do not use, and a server of
torch-free models keeps a bare interpreter.

Spares share one environment, the server's (`worker_base_env`); a worker's thread share reaches
it through its spec (``torch.set_num_threads`` and ONNX Runtime's session options) instead of
``OMP_NUM_THREADS``, which a spare has at 1 unless the server's environment sets it.

**Imports at low priority** (`preload`). A spare, or a cold worker of a model whose workers are
known to use torch, imports the frameworks in a thread whose nice value is raised by
``worker_start_nice`` (default 10): under load the serving workers and the frontend keep the
cores, and the import takes what they leave (at nice 10 a thread gets ~1/10 of a contended core's
share). Only the import thread is lowered (Linux keeps a nice value per thread): loading the model,
the warm-up and inference run in the main thread at normal priority, and a raised nice value could
not be lowered again without privileges. Threads a framework starts while it is imported inherit
the lowered value, so NumPy (whose OpenBLAS starts its thread pool when imported) is imported at
normal priority first; torch and torchvision start no thread when imported, ONNX Runtime one that
stays idle (its compute threads start with a session, in the main thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import threading
from typing import Any

from serve.worker.spawn import Child, spawn

# The server log, not the model log that "serve.worker.*" records go to.
logger = logging.getLogger("serve.spares")

# What a spare may import before it is needed (each only if installed), once a worker of this
# server has used it: torch is ~700 MB of RSS and torchvision ~170 MB more, which a server of
# torch-free models should not carry.
PRELOADABLE = ("torch", "torchvision", "onnxruntime")
READY_LINE = b"SPARE-READY\n"
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def worker_base_env(config: Any) -> dict[str, str]:
    """The environment every worker starts from: the server's, less ``blacklist_env_vars``."""
    env = dict(os.environ)
    if config.blacklist_env_vars:
        pattern = re.compile(config.blacklist_env_vars)
        env = {k: v for k, v in env.items() if not pattern.fullmatch(k)}
    # OpenMP threads otherwise spin after every operator, burning the cores the frontend
    # and the other workers need (measured: half the server CPU per request; bench/).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class SparePool:
    """Keeps up to ``size`` spare interpreters ready; `take` hands one over."""

    def __init__(self, size: int, env: dict[str, str], nice: int = 0) -> None:
        self.size = size
        self.nice = nice  # the spare's imports run at this nice value (see `preload`)
        self.env = dict(env)
        for key in _THREAD_VARS:  # the worker's share comes with its spec
            self.env.setdefault(key, "1")
        self.preload: set[str] = set()
        self._ready: list[Child] = []
        self._preloaded: dict[Child, frozenset[str]] = {}
        self._worker_starts = 0  # workers starting now: spares wait until they are done
        self._starting: set[asyncio.Task[None]] = set()
        self._waiters = 0  # worker starts waiting in `acquire` for a spare on its way
        self._all: set[Child] = set()
        self.closed = False

    def worker_starting(self) -> None:
        """A worker start began: no spare starts (no torch import) until every such start ends."""
        self._worker_starts += 1

    def worker_started(self) -> None:
        """A worker start ended (READY or failed); the last one lets the pool refill."""
        self._worker_starts = max(0, self._worker_starts - 1)
        self.refill()

    def take(self) -> Child | None:
        """A ready spare, or None (then the caller starts a fresh worker)."""
        spare = None
        while self._ready:
            candidate = self._ready.pop(0)
            if candidate.returncode is None:
                spare = candidate
                self._all.discard(spare)
                self._preloaded.pop(spare, None)
                break
        return spare

    def ready_pids(self) -> list[int]:
        """The pids of the spares ready and idle now (their memory is reported: metrics)."""
        return [p.pid for p in self._ready if p.returncode is None]

    async def acquire(self, wait: float) -> Child | None:
        """A ready spare; with none, but one on its way, that one (up to ``wait`` seconds: it is
        further along than a fresh interpreter would be, and does not compete with one for the
        cores); else None (then the caller starts a fresh worker)."""
        spare = self.take()
        # One waiter per spare on its way: a second start waiting for the same spare would get
        # none and only then start cold (a scale-up 1 -> 3 took twice as long that way).
        if spare is None and wait > 0 and self._waiters < len(self._starting):
            self._waiters += 1
            try:
                await asyncio.wait(set(self._starting), timeout=wait, return_when="FIRST_COMPLETED")
            finally:
                self._waiters -= 1
            spare = self.take()
        return spare

    def learn(self, modules: list[str]) -> None:
        """Frameworks a loaded worker imported: spares preload them from now on, and ready ones
        that lack one are replaced."""
        if self.expect(modules):
            self.refill()

    def expect(self, modules: list[str] | frozenset[str]) -> bool:
        """Frameworks a model's workers will import (known at its registration,
        `serve.worker.frameworks`): the next spares preload them, ready ones that lack one are
        replaced. Starts nothing itself: spares start once no worker is starting. True when
        something was new."""
        new = set(modules) & set(PRELOADABLE)
        if new <= self.preload:
            return False
        self.preload |= new
        stale = [p for p in self._ready if not self.preload <= self._preloaded.get(p, set())]
        for proc in stale:
            self._ready.remove(proc)
            self._discard(proc)
            logger.info("Spare worker replaced (pid %s): it lacks %s", proc.pid, ", ".join(new))
        return True

    def _discard(self, proc: Child) -> None:
        if proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # EOF: the spare exits by itself
        _kill(proc)
        self._all.discard(proc)
        self._preloaded.pop(proc, None)

    def refill(self) -> None:
        """Start spares until ``size`` are ready or starting, unless workers are starting: their
        model loads come first (a spare's torch import would compete for the same cores)."""
        if self.closed or self._worker_starts:
            return
        for _ in range(self.size - len(self._ready) - len(self._starting)):
            task = asyncio.create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        preload = frozenset(self.preload)
        try:
            proc = await spawn(
                [sys.executable, "-m", "serve.worker", "--spare", ",".join(sorted(preload)),
                 str(self.nice)],
                env=self.env,
                stdin=True,
            )  # fmt: skip
        except OSError as exc:
            logger.warning("Could not start a spare worker: %s", exc)
            return
        self._all.add(proc)
        assert proc.stdout is not None
        try:
            line = await proc.stdout.readline()
        except (asyncio.CancelledError, Exception):
            _kill(proc)
            raise
        if line != READY_LINE or self.closed:
            if line != READY_LINE:  # not retried: the next worker start tries again
                logger.warning("A spare worker exited while starting (pid %s)", proc.pid)
            self._discard(proc)
            return
        if not self.preload <= preload:  # the server learnt of a framework meanwhile: redo
            self._discard(proc)
            logger.info("Spare worker replaced (pid %s): it lacks %s", proc.pid, "a framework")
            self._starting.discard(asyncio.current_task())
            self.refill()
            return
        self._ready.append(proc)
        self._preloaded[proc] = preload
        logger.info(
            "Spare worker ready (pid %s, preloaded: %s)",
            proc.pid,
            ", ".join(sorted(preload)) or "nothing",
        )

    async def stop(self) -> None:
        """Stop every spare (EOF on stdin, then SIGKILL)."""
        self.closed = True
        for task in list(self._starting):
            task.cancel()
        for proc in list(self._all):
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            _kill(proc)
        for proc in list(self._all):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5.0)
        self._all.clear()
        self._ready.clear()
        self._preloaded.clear()


def _kill(proc: Child) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def loaded_frameworks() -> list[str]:
    """In a worker: which of `PRELOADABLE` it has imported (sent with LOADED)."""
    return [name for name in PRELOADABLE if name in sys.modules]


def preload(modules: list[str], nice: int = 0) -> float:
    """Import those of ``modules`` that are `PRELOADABLE` and installed, in a thread at the
    given nice value (Linux; elsewhere, or with 0, in this thread as it is); the seconds it took."""
    import importlib
    import importlib.util
    import time

    def import_all() -> None:
        if lowered:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        for name in modules:
            if name not in PRELOADABLE or importlib.util.find_spec(name) is None:
                continue
            try:
                importlib.import_module(name)
            except Exception as exc:  # a broken optional install must not stop the worker
                print(f"could not preload {name}: {exc}", file=sys.stderr, flush=True)

    started = time.monotonic()
    lowered = nice > 0 and sys.platform.startswith("linux") and hasattr(os, "setpriority")
    if not lowered:
        import_all()
        return time.monotonic() - started
    if importlib.util.find_spec("numpy") is not None:
        with contextlib.suppress(Exception):  # its BLAS threads start now, at normal priority
            importlib.import_module("numpy")
    thread = threading.Thread(target=import_all, name="lantern-preload")
    thread.start()
    thread.join()
    return time.monotonic() - started


def wait_as_spare(modules: list[str], nice: int = 0) -> str | None:
    """In the spare process: preload, say so, and wait for a spec: the line it comes on, to be
    decoded as a `serve.wire.messages.WorkerSpec` (None: stop, no worker)."""
    preload(modules, nice)
    # The worker's own modules too: everything but the model is then in memory.
    import handlers.context
    import handlers.service  # noqa: F401

    sys.stdout.buffer.write(READY_LINE)
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line.strip():
        return None
    return line
