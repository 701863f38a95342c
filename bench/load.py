"""Drive an HTTP endpoint with POSTs for a bounded time: ``wrk`` when installed, else our own.

Both generators keep ``concurrency`` keep-alive connections busy, each sending its next request as
soon as the previous answer arrives (closed loop), and report the same numbers. The generator runs
in its own process; its CPU time is reported, because on a small machine it competes with the
server for the same cores.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LUA_SCRIPT = Path(__file__).resolve().parent / "post.lua"
_MARK = "BENCH_JSON "


@dataclass
class LoadResult:
    """What one bounded load run measured (latencies in milliseconds)."""

    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int  # connection errors, timeouts and non-2xx/3xx answers
    error_detail: dict[str, int]
    generator: str
    generator_cpu_s: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def available_generator(preferred: str = "auto") -> str:
    """``wrk`` if asked for (or ``auto``) and installed, else ``python``."""
    if preferred == "python":
        return "python"
    if shutil.which("wrk"):
        return "wrk"
    if preferred == "wrk":
        raise RuntimeError("wrk is not installed (Debian: apt-get install -y wrk)")
    return "python"


def run_load(
    url: str,
    body: Path,
    content_type: str,
    *,
    concurrency: int,
    seconds: float,
    generator: str = "auto",
    timeout: float = 30.0,
) -> LoadResult:
    """POST ``body`` to ``url`` from ``concurrency`` connections for ``seconds``."""
    kind = available_generator(generator)
    env = dict(os.environ, BENCH_BODY=str(body), BENCH_CONTENT_TYPE=content_type)
    if kind == "wrk":
        cmd = [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, math.ceil(seconds))}s",
            f"--timeout={int(timeout)}s",
            "-s",
            str(LUA_SCRIPT),
            url,
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "bench.pyload",
            url,
            "-c",
            str(concurrency),
            "-d",
            str(seconds),
            "--timeout",
            str(timeout),
        ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + timeout + 30,
        cwd=Path(__file__).resolve().parent.parent,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
    data = json.loads(line[len(_MARK) :])
    detail = {k: int(data[k]) for k in ("connect", "read", "write", "status", "timeout")}
    elapsed = data["duration_us"] / 1e6
    requests = int(data["requests"])
    return LoadResult(
        requests=requests,
        seconds=round(elapsed, 3),
        rps=requests / elapsed if elapsed else 0.0,
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        mean_ms=data["mean_us"] / 1000,
        max_ms=data["max_us"] / 1000,
        errors=sum(detail.values()),
        error_detail=detail,
        generator=kind,
        generator_cpu_s=round(cpu, 3),
    )
