"""`serve.worker.spares.preload`: frameworks are imported in a thread at the start nice value,
NumPy (whose BLAS starts its threads when imported) at normal priority, and the calling thread
keeps its priority (a raised nice value could not be lowered again without privileges)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")

SPY = """
import importlib, json, os, sys, threading, time
seen, tids = {}, set()
real = importlib.import_module
def spy(name, *args, **kwargs):
    seen[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    tids.add(threading.get_native_id())
    return real(name, *args, **kwargs)
importlib.import_module = spy
from serve.worker.spares import preload
preload(["torch", "no_such_framework"], NICE)
deadline = time.monotonic() + 10  # a joined thread may linger in /proc for a moment
while any(os.path.exists(f"/proc/self/task/{tid}") for tid in tids - {threading.get_native_id()}):
    assert time.monotonic() < deadline, "the import thread did not end"
    time.sleep(0.01)
print(json.dumps({
    "seen": seen,
    "caller": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
    "thread_nice": sorted(
        int(open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()[16])
        for tid in os.listdir("/proc/self/task")
    ),
    "torch": "torch" in sys.modules,
}))
"""


def run_preload(nice: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SPY.replace("NICE", str(nice))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_frameworks_are_imported_at_the_start_nice_value_and_the_caller_keeps_its_own() -> None:
    got = run_preload(7)
    assert got["torch"] is True
    assert got["seen"]["torch"] == 7  # in the import thread
    assert got["seen"].get("numpy", 0) == 0  # first, in the calling thread
    assert "no_such_framework" not in got["seen"]  # only PRELOADABLE names are imported
    assert got["caller"] == 0
    # The import thread is gone; the threads left (NumPy's BLAS pool among them) run at normal
    # priority: none was started by the lowered thread.
    assert set(got["thread_nice"]) == {0}


def test_nice_zero_imports_in_the_calling_thread() -> None:
    got = run_preload(0)
    assert got["seen"]["torch"] == 0
    assert got["caller"] == 0
