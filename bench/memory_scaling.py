"""``python -m bench.memory --scaling``: what N = 1, 2, 4 workers of a model cost, as the kernel
counts it (RSS, PSS, USS from ``/proc/PID/smaps_rollup``), and what an idle warm spare costs.

One server per model (so that no other model's workers share its pages), scaled with
``PUT /models/{m}?min_worker=N&synchronous=true``, two requests per worker, then, for Lantern, a
wait for its warm spare (``serve_spares_ready``). Models: ``tiny`` (the 100→64→10 TorchScript
MLP behind ``bench/tiny_json_handler.py``, a ``ts.*`` handler both servers run) and
``efficientnet_lite0`` (``examples/image_classifier``, TorchScript behind ``image_classifier``).
``--torchserve PATH`` serves the same archives from TorchServe 0.12 the same way.

Columns: the workers' sums; ``spare`` the idle spare (Lantern only); ``all PSS`` the sum of PSS
over every process of the server (frontend, workers, spare): what the machine gives it, each
shared page counted once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from archiver import build
from bench import procstat
from bench.models import ModelFactory
from bench.server import LanternProcess
from serve.core.host import ProcessMemory, process_memory

REPO = Path(__file__).resolve().parent.parent
KITTEN = REPO / "examples" / "data" / "kitten.jpg"
TINY_BODY = json.dumps([0.01 * i for i in range(100)]).encode()
BODIES = {
    "tiny": (TINY_BODY, "application/json"),
    "efficientnet_lite0": (KITTEN.read_bytes(), "image/jpeg"),
}
MIB = 1 << 20


@dataclass
class Row:
    server: str
    model: str
    workers: int
    rss: int
    pss: int
    uss: int
    spare: ProcessMemory | None
    all_pss: int


def build_store(work: Path) -> Path:
    """``tiny.mar`` and ``efficientnet_lite0.mar`` in ``work/scaling-store``."""
    store = work / "scaling-store"
    store.mkdir(parents=True, exist_ok=True)
    if not (store / "tiny.mar").exists():
        weights = ModelFactory(work).weights("tiny")
        build(
            model_name="tiny",
            version="1.0",
            handler=str(REPO / "bench" / "tiny_json_handler.py"),
            serialized_file=str(weights),
            export_path=str(store),
            force=True,
        )
    if not (store / "efficientnet_lite0.mar").exists():
        script = REPO / "examples" / "image_classifier" / "build.py"
        subprocess.run([sys.executable, str(script), "--model-store", str(store)], check=True)
    return store


def _json(url: str, method: str = "GET", timeout: float = 600) -> object:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as r:
        return json.loads(r.read())


def _post(url: str, body: bytes, ctype: str) -> None:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


def _worker_pids(mgmt: str, model: str) -> list[int]:
    workers = _json(f"{mgmt}/models/{model}")[0]["workers"]  # type: ignore[index]
    return [int(w["pid"]) for w in workers if w["status"] == "READY"]


def _sums(pids: list[int]) -> tuple[int, int, int]:
    readings = [m for m in map(process_memory, pids) if m is not None]
    return (
        sum(m.rss for m in readings),
        sum(m.share_or_rss for m in readings),
        sum(m.unique_or_rss for m in readings),
    )


def _scale_and_read(
    server: str,
    model: str,
    counts: tuple[int, ...],
    mgmt: str,
    inference: str,
    all_pids: Callable[[], list[int]],
    spare_ready: Callable[[], bool],
) -> list[Row]:
    rows = []
    body, ctype = BODIES[model]
    for n in counts:
        _json(f"{mgmt}/models/{model}?min_worker={n}&max_worker={n}&synchronous=true", "PUT")
        deadline = time.monotonic() + 300
        while len(_worker_pids(mgmt, model)) != n and time.monotonic() < deadline:
            time.sleep(0.5)
        for _ in range(2 * n):
            _post(f"{inference}/predictions/{model}", body, ctype)
        deadline = time.monotonic() + 300
        while not spare_ready() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # let the last answers' buffers settle
        workers = _worker_pids(mgmt, model)
        everyone = all_pids()
        spares = [p for p in everyone if p not in workers and p != everyone[0]]
        spare = process_memory(spares[0]) if spares else None
        rss, pss, uss = _sums(workers)
        rows.append(Row(server, model, n, rss, pss, uss, spare, _sums(everyone)[1]))
        print(f"[scaling] {server} {model} N={n}: done", file=sys.stderr, flush=True)
    return rows


def measure_lantern(work: Path, store: Path, model: str, counts: tuple[int, ...]) -> list[Row]:
    lantern = LanternProcess(work, store, [f"{model}={model}.mar"], "auto").start(timeout=600)
    try:
        mgmt, metrics = lantern.addresses["management"], lantern.addresses["metrics"]

        def spare_ready() -> bool:
            with urllib.request.urlopen(f"{metrics}/metrics", timeout=30) as resp:
                text = resp.read().decode()
            return any(
                line.startswith("serve_spares_ready ") and float(line.split()[1]) >= 1
                for line in text.splitlines()
            )

        return _scale_and_read(
            "Lantern",
            model,
            counts,
            mgmt,
            lantern.addresses["inference"],
            lambda: [lantern.pid, *procstat.children(lantern.pid)],
            spare_ready,
        )
    finally:
        lantern.stop()


def measure_torchserve(
    launcher: Path, work: Path, store: Path, model: str, counts: tuple[int, ...]
) -> list[Row]:
    from bench.memory import _free_port, _is_java, stop_torchserve

    ts_work = work / f"torchserve-{model}"
    ts_work.mkdir(parents=True, exist_ok=True)
    ports = {k: _free_port() for k in ("inf", "mgmt", "metrics", "gi", "gm")}
    config = ts_work / "config.properties"
    config.write_text(
        f"inference_address=http://127.0.0.1:{ports['inf']}\n"
        f"management_address=http://127.0.0.1:{ports['mgmt']}\n"
        f"metrics_address=http://127.0.0.1:{ports['metrics']}\n"
        f"grpc_inference_port={ports['gi']}\ngrpc_management_port={ports['gm']}\n"
        "default_workers_per_model=1\ndisable_token_authorization=true\n"
        "install_py_dep_per_model=false\n"
    )
    cmd = [
        str(launcher), "--start", "--foreground", "--ncs", "--disable-token-auth",
        "--model-store", str(store), "--models", f"{model}={model}.mar", "--ts-config", str(config),
    ]  # fmt: skip
    log = open(ts_work / "console.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ts_work, stdout=log, stderr=subprocess.STDOUT)
    mgmt = f"http://127.0.0.1:{ports['mgmt']}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                if _worker_pids(mgmt, model):
                    break
            except (OSError, ValueError, KeyError, IndexError):
                continue

        def everyone() -> list[int]:
            kids = procstat.children(proc.pid)
            jvm = next((p for p in [proc.pid, *kids] if _is_java(p)), proc.pid)
            return [jvm, *procstat.children(jvm)]

        return _scale_and_read(
            "TorchServe 0.12",
            model,
            counts,
            mgmt,
            f"http://127.0.0.1:{ports['inf']}",
            everyone,
            lambda: True,
        )
    finally:
        stop_torchserve(proc, launcher, ts_work)
        log.close()


def table(rows: list[Row]) -> list[str]:
    head = f"{'server':<16} {'model':<19} {'N':>2} {'RSS':>7} {'PSS':>7} {'USS':>7} {'spare RSS/PSS/USS':>18} {'all PSS':>8}"  # noqa: E501
    lines = [head, "-" * len(head)]
    for r in rows:
        spare = (
            f"{r.spare.rss // MIB}/{r.spare.share_or_rss // MIB}/{r.spare.unique_or_rss // MIB}"
            if r.spare
            else "-"
        )
        lines.append(
            f"{r.server:<16} {r.model:<19} {r.workers:>2} {r.rss // MIB:>7} {r.pss // MIB:>7} "
            f"{r.uss // MIB:>7} {spare:>18} {r.all_pss // MIB:>8}"
        )
    lines.append("MiB; workers' sums; 'all PSS': every process of the server, shared pages once")
    return lines


def run(work: Path, torchserve: Path | None, counts: tuple[int, ...] = (1, 2, 4)) -> int:
    store = build_store(work)
    rows: list[Row] = []
    for model in ("tiny", "efficientnet_lite0"):
        rows += measure_lantern(work, store, model, counts)
        if torchserve is not None:
            rows += measure_torchserve(torchserve, work, store, model, counts)
    print("\n".join(table(rows)))
    return 0
