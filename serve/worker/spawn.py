"""Start a worker (or spare) process without stalling the event loop.

``asyncio.create_subprocess_exec`` spawns on the event loop's thread; under uvloop (libuv's
``uv_spawn`` forks the whole frontend, then waits for the child's ``exec``) that stopped every
request in flight for 5–20 ms per process on a 2-core machine, and a scale-up from 1 to 4 workers
(two or three spawns at once) for ~50 ms: the largest latency spike of a scale-up under load
(``bench/scaleup.py``, docs/performance.md). `spawn` runs `subprocess.Popen` (vfork and exec)
on a thread of its own and watches the child's pipes from the loop through `serve.worker.pipes`
(never ``connect_read_pipe``: under uvloop it closes the descriptor twice); the loop learns of
the exit through a pidfd (Linux ≥ 5.3), or else from a thread that waits for it.

`Child` offers what the pool and the spares use of ``asyncio.subprocess.Process``: ``pid``,
``returncode``, ``stdin``/``stdout``/``stderr`` streams, ``wait``, ``send_signal`` and ``kill``.

Children get a process group of their own (a Ctrl-C at the terminal reaches the frontend only)
but stay in the frontend's session. A session of their own (``setsid``, as before) also put
each worker in an autogroup of its own where Linux's ``sched_autogroup`` is on (desktop and VM
kernels, tasks outside a cgroup with CPU control): the scheduler then shared the cores equally
among frontend, serving workers and starting ones whatever their nice values, so a starting
worker's low-priority imports (`serve.worker.spares.preload`) took as much CPU as a serving
worker. In one session they share one autogroup and nice values order them, as they do inside
a container's cgroup.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any, cast

from serve.worker.pipes import PipeReader, PipeWriter

_LIMIT = 1 << 16  # the stream readers' line limit, asyncio's default
_spawner: concurrent.futures.ThreadPoolExecutor | None = None
# Python 3.10 has no process_group: a session of its own there (see the module docstring).
_OWN_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
)


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """One thread for every spawn: never queued behind other work of the default executor."""
    global _spawner
    if _spawner is None:
        _spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lantern-spawn")
    return _spawner


class Child:
    """A started child process whose pipes and exit the event loop watches."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._watch_exit()

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has been reaped (negative: killed by a signal)."""
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:  # never signal a reaped pid (it may be reused)
            self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _watch_exit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux ≥ 5.3: a thread waits instead
            threading.Thread(
                target=self._wait_in_thread, args=(loop,), name="lantern-child", daemon=True
            ).start()
            return

        def readable() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._reaped(self._popen.wait())

        loop.add_reader(pidfd, readable)

    def _wait_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        code = self._popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(self._reaped, code)

    def _reaped(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)


async def spawn(args: Sequence[str], *, env: dict[str, str] | None, stdin: bool = False) -> Child:
    """Start ``args`` in a process group of its own, stdout and stderr piped, stdin piped when
    asked for (else /dev/null)."""
    loop = asyncio.get_running_loop()
    starting = loop.run_in_executor(
        _executor(),
        functools.partial(
            subprocess.Popen,
            list(args),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            **_OWN_GROUP,
        ),
    )
    try:
        started = await asyncio.shield(starting)
    except asyncio.CancelledError:  # the process starts all the same: stop and reap it
        starting.add_done_callback(_discard_unwanted)
        raise
    popen = cast("subprocess.Popen[bytes]", started)  # bytes pipes: no text mode was asked for
    try:
        stdout = _reader(loop, popen.stdout)
        stderr = _reader(loop, popen.stderr)
        writer = None
        if popen.stdin is not None:
            protocol = asyncio.streams.FlowControlMixin(loop=loop)
            writer = asyncio.StreamWriter(
                PipeWriter(loop, popen.stdin, protocol), protocol, None, loop
            )
        return Child(popen, writer, stdout, stderr)
    except BaseException:
        popen.kill()
        raise


def _discard_unwanted(starting: asyncio.Future[Any]) -> None:
    """A child whose ``spawn`` was cancelled while ``Popen`` ran: kill it, close its pipes (no
    transport has them) and reap it, or it would stay a zombie (or, as a spare, wait on stdin)."""
    if starting.cancelled() or starting.exception() is not None:
        return
    popen: subprocess.Popen[bytes] = starting.result()
    popen.kill()
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()
    threading.Thread(target=popen.wait, name="lantern-reap", daemon=True).start()


def _reader(loop: asyncio.AbstractEventLoop, pipe: IO[bytes] | None) -> asyncio.StreamReader:
    assert pipe is not None
    reader = asyncio.StreamReader(limit=_LIMIT, loop=loop)
    PipeReader(loop, pipe, reader)
    return reader
