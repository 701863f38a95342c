"""`serve.worker.spawn`: children started off the event loop, with their pipes and exit on it.

Every test runs on asyncio's loop and on uvloop (the server's default): the pipes' descriptors
must be owned, and closed once, on both (`serve.worker.pipes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from serve.worker.spawn import spawn

ECHO = """
import sys
print("out", flush=True)
print("err", file=sys.stderr, flush=True)
line = sys.stdin.readline()
print("got " + line.strip(), flush=True)
sys.exit(3)
"""


Runner = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Runs a coroutine to completion on a fresh loop of the kind the test is parametrised with."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


def test_pipes_and_exit_status(run: Runner) -> None:
    async def main() -> tuple[list[bytes], bytes, int, int | None]:
        child = await spawn([sys.executable, "-c", ECHO], env=None, stdin=True)
        assert child.stdin is not None and child.pid > 0
        first = await child.stdout.readline()
        err = await child.stderr.readline()
        child.stdin.write(b"hello\n")
        await child.stdin.drain()
        child.stdin.close()
        second = await child.stdout.readline()
        code = await asyncio.wait_for(child.wait(), 30)
        return [first, second], err, code, child.returncode

    lines, err, code, returncode = run(main())
    assert lines == [b"out\n", b"got hello\n"]
    assert err == b"err\n"
    assert code == returncode == 3


def test_kill_is_seen_as_a_signal_exit_and_later_signals_are_harmless(run: Runner) -> None:
    async def main() -> tuple[int, int]:
        child = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], env=None)
        assert child.stdin is None  # /dev/null unless asked for
        assert child.returncode is None
        child.kill()
        code = await asyncio.wait_for(child.wait(), 30)
        child.send_signal(signal.SIGTERM)  # reaped: never sent to a pid that may be reused
        again = await child.wait()  # waiting twice gives the same status
        return code, again

    assert run(main()) == (-signal.SIGKILL, -signal.SIGKILL)


def test_a_child_that_cannot_start_raises(run: Runner) -> None:
    async def main() -> None:
        await spawn(["/nonexistent/lantern-no-such-program"], env=None)

    try:
        run(main())
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("spawning a missing program must raise")


def test_a_child_has_its_own_process_group_in_our_session(run: Runner) -> None:
    """Its own group: a Ctrl-C at the terminal reaches the frontend only. Our session: one
    autogroup, so nice values order frontend and workers (see serve.worker.spawn)."""

    async def main() -> tuple[int, int]:
        child = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], env=None)
        try:
            return os.getpgid(child.pid), os.getsid(child.pid)
        finally:
            child.kill()
            await child.wait()

    group, session = run(main())
    assert group != os.getpgid(0)
    if sys.version_info >= (3, 11):
        assert session == os.getsid(0)


class ClosedTwiceProbe:
    """Makes the file objects ``Popen`` gives a child's pipes report a second close of their
    descriptor number: each ``close`` opens a sentinel pipe just before and just after closing
    (Linux hands out the lowest free number, so a sentinel takes the number if it is free), and
    a sentinel that is no longer open, or no longer the same pipe, afterwards was closed by a
    second owner of the number (uvloop's ``connect_read_pipe``: MagicStack/uvloop#763)."""

    def __init__(self) -> None:
        self.closes = 0
        self.sentinels: list[tuple[int, int, int]] = []  # read end, write end, inode

    def sentinel(self) -> None:
        read, write = os.pipe()
        self.sentinels.append((read, write, os.fstat(read).st_ino))

    def file_class(self, base: type[Any]) -> type[Any]:
        probe = self

        class Probed(base):
            def close(self) -> None:
                if not self.closed:
                    probe.closes += 1
                    probe.sentinel()
                super().close()
                probe.sentinel()

        return Probed

    def stolen(self) -> list[int]:
        """The sentinel descriptors something closed (or replaced) under their owner."""
        lost = []
        for read, write, inode in self.sentinels:
            for fd in (read, write):
                try:
                    same = os.fstat(fd).st_ino == inode
                except OSError:
                    same = False
                if not same:
                    lost.append(fd)
        return lost

    def close_sentinels(self) -> None:
        for read, write, _ in self.sentinels:
            for fd in (read, write):
                try:
                    os.close(fd)
                except OSError:
                    pass


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Any:
    watcher = ClosedTwiceProbe()
    real = subprocess.Popen

    class ProbedPopen(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for name, base in (
                ("stdin", io.BufferedWriter),
                ("stdout", io.BufferedReader),
                ("stderr", io.BufferedReader),
            ):
                pipe = getattr(self, name)
                if pipe is not None:
                    setattr(self, name, watcher.file_class(base)(pipe.detach()))

    monkeypatch.setattr(subprocess, "Popen", ProbedPopen)
    yield watcher
    watcher.close_sentinels()


def test_a_childs_pipes_are_closed_once_and_a_reused_number_stays_with_its_new_owner(
    run: Runner, probe: ClosedTwiceProbe
) -> None:
    """The regression test of the frontend's aborts under concurrent management calls
    (docs/faults.md): on uvloop, ``connect_read_pipe``/``connect_write_pipe`` over these file
    objects closed each number twice, and the second close hit the sentinel."""

    async def main() -> bytes:
        child = await spawn([sys.executable, "-c", ECHO], env=None, stdin=True)
        assert child.stdin is not None
        await child.stdout.readline()
        child.stdin.write(b"bye\n")
        await child.stdin.drain()
        child.stdin.close()
        rest = await child.stdout.read()
        await child.stderr.read()
        await asyncio.wait_for(child.wait(), 30)
        for _ in range(3):  # whatever the loop does after a close runs now
            await asyncio.sleep(0)
        return rest

    assert run(main()) == b"got bye\n"
    gc.collect()  # a transport's finalizer is the other path to a second close
    assert probe.closes == 3  # stdin, stdout and stderr: each closed, once
    assert probe.stolen() == []


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def test_children_that_exit_or_are_killed_leave_no_descriptor_behind(run: Runner) -> None:
    async def main() -> tuple[set[int], set[int]]:
        before = open_fds()
        for _ in range(3):
            child = await spawn([sys.executable, "-c", ECHO], env=None, stdin=True)
            assert child.stdin is not None
            child.stdin.write(b"x\n")
            await child.stdin.drain()
            child.stdin.close()
            await child.stdout.read()
            await child.stderr.read()
            await asyncio.wait_for(child.wait(), 30)
        killed = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], env=None)
        killed.kill()
        await asyncio.wait_for(killed.wait(), 30)
        assert await killed.stdout.read() == b""  # EOF: the pipe is closed on our side too
        assert await killed.stderr.read() == b""
        await asyncio.sleep(0)
        return before, open_fds()

    before, after = run(main())
    assert after == before


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


SINK = "import sys; data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data[::-1])"


def test_a_megabyte_each_way_goes_through_both_flow_controls(run: Runner) -> None:
    """More than the pipe and the 64 KiB marks hold: the writer pauses its protocol (drain
    waits), the reader pauses reading while its buffer is full, and nothing is lost."""
    payload = os.urandom(1 << 20)

    async def main() -> bytes:
        child = await spawn([sys.executable, "-c", SINK], env=None, stdin=True)
        assert child.stdin is not None
        child.stdin.write(payload)
        assert child.stdin.transport.get_write_buffer_size() > 0  # more than a pipe holds
        await child.stdin.drain()
        child.stdin.close()
        # The child answers a megabyte nobody reads yet: the reader stops reading at its mark.
        transport = child.stdout._transport  # type: ignore[attr-defined]
        await asyncio.wait_for(until(lambda: not transport.is_reading()), 30)
        echoed = await child.stdout.read()
        await asyncio.wait_for(child.wait(), 30)
        return echoed

    assert run(main()) == payload[::-1]


def test_writing_to_a_child_that_is_gone_raises_a_connection_error(run: Runner) -> None:
    async def main() -> None:
        child = await spawn([sys.executable, "-c", "pass"], env=None, stdin=True)
        assert child.stdin is not None
        await asyncio.wait_for(child.wait(), 30)
        child.stdin.write(b"spec\n")
        with pytest.raises(ConnectionError):
            await child.stdin.drain()
        child.stdin.close()  # closing after the error is harmless

    run(main())


def children() -> set[int]:
    """This process's live children (zombies count: they are not reaped yet)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.add(int(entry))
    return found


def test_a_spawn_cancelled_while_the_child_starts_kills_and_reaps_it(
    run: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unregister or scale-down cancels worker starts; one cancelled while ``Popen`` ran left
    a child nobody watched (a sleeping spare, or a zombie once it exited)."""
    entered, proceed = threading.Event(), threading.Event()
    started: list[int] = []
    real = subprocess.Popen

    class HeldPopen(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            entered.set()
            proceed.wait(30)  # until the spawn has been cancelled
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    monkeypatch.setattr(subprocess, "Popen", HeldPopen)

    async def main() -> None:
        before = children()
        task = asyncio.create_task(
            spawn([sys.executable, "-c", "import time; time.sleep(60)"], env=None, stdin=True)
        )
        await asyncio.wait_for(until(entered.is_set), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proceed.set()
        await asyncio.wait_for(until(lambda: bool(started)), 20)
        # Reaped: gone from /proc (a zombie is still there), and nothing else left behind.
        await asyncio.wait_for(until(lambda: not os.path.exists(f"/proc/{started[0]}")), 20)
        assert children() == before

    try:
        run(main())
    finally:
        proceed.set()
        for pid in started:  # whatever happened, the test leaves no sleeper behind
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
