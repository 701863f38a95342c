"""The share of test lines in modules that start real servers or worker processes.

A test module (``tests/**/test_*.py``) counts as starting real processes when its source names one
of `MARKERS`: the real-server helper (`tests.support.server.LanternServer`), the CLI run as a
subprocess (``-m serve.cli``, the container's entrypoint), a worker process (`WorkerProcess`,
``-m serve.worker``, the worker-spec and arena helpers), the Ray cluster, or the HTTP servers over
sockets (`run_servers`). Building an archive with `tests.support.server.build_archive` alone does
not count: it starts nothing. Lines are physical lines, blank ones included (``wc -l``).

``--servers-only`` counts the narrower way: only modules that start a Lantern server process
(`LanternServer`, the CLI, the container entrypoint), not those that start bare worker processes
or Ray.

    python -m bench.test_share [--list] [--servers-only] [--tests DIR]
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MARKERS = re.compile(
    r"LanternServer|[\"']serve\.cli[\"']|serve\.cli\.main|STAGE\.entrypoint"
    r"|WorkerProcess|[\"']serve\.worker[\"']|tests\.support\.(?:worker_spec|arena)"
    r"|run_servers|ray_cluster|ray\.init"
)
SERVER_MARKERS = re.compile(
    r"LanternServer|[\"']serve\.cli[\"']|serve\.cli\.main|STAGE\.entrypoint"
)


@dataclass(frozen=True)
class Share:
    real_lines: int
    total_lines: int
    real_files: list[tuple[str, int]]

    @property
    def percent(self) -> float:
        return 100.0 * self.real_lines / self.total_lines if self.total_lines else 0.0


def starts_processes(source: str, markers: re.Pattern[str] = MARKERS) -> bool:
    """Whether a test module's source starts a server, the CLI or a worker process."""
    return markers.search(source) is not None


def measure(tests: Path, markers: re.Pattern[str] = MARKERS) -> Share:
    real: list[tuple[str, int]] = []
    total = 0
    for path in sorted(tests.rglob("test_*.py")):
        source = path.read_text()
        lines = source.count("\n")
        total += lines
        if starts_processes(source, markers):
            real.append((str(path.relative_to(tests.parent)), lines))
    return Share(sum(n for _, n in real), total, real)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, default=REPO / "tests")
    parser.add_argument("--list", action="store_true", help="list the modules counted as real")
    parser.add_argument("--servers-only", action="store_true", help="Lantern server processes only")
    args = parser.parse_args()
    share = measure(args.tests, SERVER_MARKERS if args.servers_only else MARKERS)
    if args.list:
        for name, lines in sorted(share.real_files, key=lambda f: -f[1]):
            print(f"{lines:6d}  {name}")
    print(
        f"{share.real_lines} of {share.total_lines} test lines ({share.percent:.1f}%) are in "
        f"{len(share.real_files)} modules that start "
        + ("Lantern server processes" if args.servers_only else "real servers or workers")
    )


if __name__ == "__main__":
    main()
