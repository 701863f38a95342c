"""`WorkerProcess` against a real (torch-free) worker subprocess: socket paths and socket loss."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from serve.core.jobs import BatchItem, ItemResult, WorkerState
from serve.wire.errors import WorkerDied
from serve.wire.messages import WorkerSpec
from serve.worker.process import SOCKET_PATH_MAX, WorkerProcess, WorkerStartFailed
from tests.support.server import HANDLERS
from tests.support.worker_spec import worker_spec


def test_a_closed_socket_takes_the_worker_out_of_service_before_its_exit_is_seen(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        proc = WorkerProcess(
            "hangup_1.0-w0",
            worker_spec(tmp_path, HANDLERS / "hangup_handler.py", name="hangup"),
            tmp_path,
        )
        await proc.start(60)
        try:
            ok = await proc.run_batch([BatchItem("r0", {}, [("body", "text/plain", b"fine")])])
            answer = ok.results[0]
            assert isinstance(answer, ItemResult) and b"fine" in answer.body
            proc.change_state(WorkerState.BUSY)  # as the dispatcher asks
            with pytest.raises(WorkerDied):
                await proc.run_batch([BatchItem("r1", {}, [("body", "text/plain", b"hangup")])])
            # The exit watcher has not run yet, and the worker must already be out of service.
            assert proc.exit_code is None
            assert proc.state is WorkerState.DEAD
            with pytest.raises(WorkerDied):
                await proc.run_batch([BatchItem("r2", {}, [("body", "text/plain", b"x")])])
            assert await asyncio.wait_for(proc.wait_exit(), 30) is not None
        finally:
            await proc.stop(1)

    asyncio.run(scenario())


def test_the_socket_path_does_not_grow_with_the_model_name(tmp_path: Path) -> None:
    async def scenario() -> None:
        name = "n" * 200
        proc = WorkerProcess(
            f"{name}_1.0-w0",
            worker_spec(tmp_path, HANDLERS / "hangup_handler.py", name=name),
            tmp_path,
        )
        assert name not in str(proc.socket_path)
        await proc.start(60)
        try:
            assert proc.state is WorkerState.READY
        finally:
            await proc.stop(1)

    asyncio.run(scenario())


def test_a_work_dir_too_long_for_a_socket_is_a_clear_start_failure(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * (SOCKET_PATH_MAX - len(str(tmp_path))))
    deep.mkdir()

    async def scenario() -> None:
        proc = WorkerProcess(
            "w_1.0-w0", worker_spec(tmp_path, HANDLERS / "hangup_handler.py", name="w"), deep
        )
        with pytest.raises(WorkerStartFailed, match="set a shorter work_dir"):
            await proc.start(60)
        assert proc.pid is None  # nothing was spawned

    asyncio.run(scenario())


def channels() -> set[str]:
    """This process's sockets, pipes and pidfds (libuv's one /dev/null reserve left out)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(("socket:", "pipe:", "anon_inode:[pidfd]")):
            found.add(f"{name} {target}")
    return found


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_killed_workers_socket_and_pipes_close_once_it_is_gone_not_when_collected(
    tmp_path: Path, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def scenario() -> None:
        before = channels()
        proc = WorkerProcess(
            "hangup_1.0-w0",
            worker_spec(tmp_path, HANDLERS / "hangup_handler.py", name="hangup"),
            tmp_path,
        )
        await proc.start(60)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait_exit(), 30)

        async def closed() -> None:  # `proc` is still referenced: nothing is collected
            while channels() != before:
                await asyncio.sleep(0.02)

        try:
            await asyncio.wait_for(closed(), 10)
        except asyncio.TimeoutError:
            raise AssertionError(f"still open: {channels() - before}") from None
        await proc.stop(1)

    run(scenario())


def test_the_worker_process_is_the_only_writer_of_its_state(tmp_path: Path) -> None:
    spec = WorkerSpec(model_name="m", model_version="1", model_dir=str(tmp_path), manifest={})
    proc = WorkerProcess("w0", spec, tmp_path)
    assert proc.state is WorkerState.STARTING
    with pytest.raises(AttributeError):
        proc.state = WorkerState.READY  # type: ignore[misc]
    assert not proc.change_state(WorkerState.BUSY) and proc.state is WorkerState.STARTING
    assert proc.change_state(WorkerState.READY) and proc.change_state(WorkerState.BUSY)
    assert proc.change_state(WorkerState.STOPPING)
    assert not proc.change_state(WorkerState.READY) and proc.state is WorkerState.STOPPING
