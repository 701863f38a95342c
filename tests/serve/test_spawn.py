"""`serve.worker.spawn`: children started off the event loop, with their pipes and exit on it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from serve.worker.spawn import spawn

ECHO = """
import sys
print("out", flush=True)
print("err", file=sys.stderr, flush=True)
line = sys.stdin.readline()
print("got " + line.strip(), flush=True)
sys.exit(3)
"""


def run(coro):
    return asyncio.run(coro)


def test_pipes_and_exit_status() -> None:
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


def test_kill_is_seen_as_a_signal_exit_and_later_signals_are_harmless() -> None:
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


def test_a_child_that_cannot_start_raises() -> None:
    async def main() -> None:
        await spawn(["/nonexistent/lantern-no-such-program"], env=None)

    try:
        run(main())
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("spawning a missing program must raise")


def test_a_child_has_its_own_process_group_in_our_session() -> None:
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
