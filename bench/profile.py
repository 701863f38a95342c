"""Where the frontend's (or a worker's) time goes under load: py-spy on one served scenario.

    python -m bench.profile --server uvicorn --workers 2 --batch 8 -c 32 [--target worker]

Starts Lantern with the tiny model variant, drives it with the load generator, samples the target
process with ``py-spy record --gil`` (only samples holding the GIL, so threads blocked in
``waitpid`` or idle pool threads do not count), and prints the top frames by self and inclusive
share, folded to ``file:function``. Needs ``py-spy`` (``pip install py-spy``; not a dependency).
Raw stacks are kept under ``bench/results/`` for flame graphs.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.load import LoadResult, run_load
from bench.models import MODELS, ModelFactory, Variant
from bench.server import LanternProcess

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def _frame(raw: str) -> str:
    """``fn (path/to/file.py:123)`` -> ``file.py:fn``."""
    name, _, where = raw.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{Path(path).name}:{name}" if path else name


def summarise(stacks: Path, top: int = 25) -> str:
    """Top frames of a py-spy ``--format raw`` file, by self and by inclusive share."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            incl[frame] += n
    if not total:
        return "no samples"
    lines = [f"{total} samples", "self:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("inclusive:")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top * 2)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--server", choices=["hypercorn", "uvicorn"], default="uvicorn")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--delay", type=int, default=5, help="max_batch_delay in ms")
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--target", choices=["frontend", "worker"], default="frontend")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--work", type=Path, default=RESULTS / "work")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    factory = ModelFactory(args.work)
    variant = Variant(
        args.model, args.workers, args.threads, args.batch, args.delay if args.batch > 1 else 0
    )
    body, content_type = factory.body(args.model)
    name = f"{variant.name}={factory.archive(variant).name}"
    out = RESULTS / f"profile-{args.server}-{variant.name}-c{args.concurrency}-{args.target}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    with LanternProcess(args.work, factory.store, [name], args.server).start() as lantern:
        url = lantern.url(variant.name)
        run_load(url, body, content_type, concurrency=args.concurrency, seconds=1.0)  # warm up
        pid = lantern.pid if args.target == "frontend" else lantern.worker_pids()[0]
        result: dict[str, LoadResult] = {}

        def drive() -> None:
            result["load"] = run_load(
                url, body, content_type, concurrency=args.concurrency, seconds=args.seconds + 1.0
            )

        loader = threading.Thread(target=drive)
        loader.start()
        time.sleep(0.5)
        subprocess.run(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(args.seconds)),
                "--rate",
                str(args.rate),
                "--gil",
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        loader.join()
    load = result["load"]
    print(
        f"{args.server} {variant.name} c={args.concurrency}: {load.rps:.0f} req/s "
        f"(under py-spy), p50 {load.p50_ms:.2f} ms; {args.target} pid {pid}"
    )
    print(summarise(out, args.top))
    print(f"stacks: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
