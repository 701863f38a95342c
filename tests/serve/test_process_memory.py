"""`serve.core.host`'s memory readings: the smaps_rollup parser (a table) and the live reader."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from serve.core import host
from serve.core.host import ProcessMemory, parse_smaps_rollup

HEADER = b"562d61426000-7ffca775f000 ---p 00000000 00:00 0                          [rollup]\n"
FULL = HEADER + (
    b"Rss:                1736 kB\n"
    b"Pss:                 384 kB\n"
    b"Pss_Dirty:           112 kB\n"
    b"Pss_Anon:            112 kB\n"
    b"Shared_Clean:       1584 kB\n"
    b"Shared_Dirty:          0 kB\n"
    b"Private_Clean:        40 kB\n"
    b"Private_Dirty:       112 kB\n"
    b"Swap:                  0 kB\n"
    b"SwapPss:               0 kB\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (FULL, ProcessMemory(1736 * 1024, 384 * 1024, 152 * 1024)),
        # Without the private fields: PSS, no USS.
        (HEADER + b"Rss: 10 kB\nPss: 4 kB\n", ProcessMemory(10240, 4096, None)),
        (HEADER + b"Rss: 10 kB\nPss: 4 kB\nPrivate_Clean: 1 kB\n", ProcessMemory(10240, 4096)),
        # Pss_* fields before Pss, or repeated, do not stand for it.
        (b"Pss_Anon: 7 kB\nRss: 10 kB\nPss: 4 kB\nPss: 9 kB\n", ProcessMemory(10240, 4096)),
        (b"", None),  # empty (a process that is exiting)
        (HEADER + b"Rss: 10 kB\n", None),  # no Pss (not a rollup)
        (b"Rss: ten kB\nPss: 4 kB\n", None),  # malformed
        (b"Rss: 10 MB\nPss: 4 kB\n", None),  # a unit the kernel does not write
        (b"Rss:\nPss: 4 kB\n", None),
    ],
)
def test_parse_smaps_rollup(text: bytes, expected: ProcessMemory | None) -> None:
    assert parse_smaps_rollup(text) == expected


def test_fallbacks_prefer_the_overestimate() -> None:
    assert ProcessMemory(100).unique_or_rss == 100
    assert ProcessMemory(100).share_or_rss == 100
    assert ProcessMemory(100, 60, 20).unique_or_rss == 20
    assert ProcessMemory(100, 60, 20).share_or_rss == 60


def test_this_process_reads_uss_within_pss_within_rss() -> None:
    memory = host.process_memory(os.getpid())
    assert memory is not None and memory.pss is not None and memory.uss is not None
    assert 0 < memory.uss <= memory.pss <= memory.rss
    assert host.process_unique(os.getpid()) == memory.uss


def test_a_gone_or_absent_process_reads_none() -> None:
    assert host.process_memory(None) is None
    assert host.process_memory(0) is None
    assert host.process_unique(None) is None
    assert host.process_memory(2**22 + 1) is None  # above pid_max's largest value


def test_without_smaps_rollup_it_reads_rss_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def no_rollup(path: str | Path, *args: object, **kwargs: object) -> object:
        if str(path).endswith("smaps_rollup"):
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_rollup)
    memory = host.process_memory(os.getpid())
    assert memory is not None and memory.rss > 0
    assert memory.pss is None and memory.uss is None
    assert host.process_unique(os.getpid()) == memory.rss


def test_child_pids_lists_this_process_children() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert child.pid in host.child_pids(os.getpid())
        assert os.getpid() not in host.child_pids(child.pid)
    finally:
        child.kill()
        child.wait()
    assert child.pid not in host.child_pids(os.getpid())
