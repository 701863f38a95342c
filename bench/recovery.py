"""``python -m bench.recovery``: how fast a worker becomes READY, cold and from a warm spare.

For a tiny 100→64→10 MLP in three forms (TorchScript, eager ``model.py`` + state dict, ONNX):

* **register → READY**: ``POST /models?synchronous=true`` for a fresh copy, timed by the client
  (archive extraction included); a new version's first worker starts cold on either server (it
  takes a spare only once a worker of that version has reported that it uses torch);
* **crash → READY**: SIGKILL the worker, poll ``GET /models/NAME`` every 10 ms until a READY
  worker with another pid is there.

Two servers run side by side, ``worker_spares: 0`` (every worker a fresh interpreter: the old
path) and ``worker_spares: 1``; both with ``worker_restart_max_backoff: 0`` so the figure is the
start itself, not the restart back-off. Before each spare-server measurement the harness waits
for the spare to be ready (the server logs it), as an idle server has it.

Scale-up under load is ``bench.scaleup``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from archiver import build
from bench.models import TINY_FEATURES, ModelFactory
from bench.server import LanternProcess

REPO = Path(__file__).resolve().parent.parent
EAGER_MODEL = """
import torch


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(100, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.net(x)
"""
KINDS = ("torchscript", "eager", "onnx")


def _log(message: str) -> None:
    print(f"[recovery {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_models(work: Path) -> Path:
    """``ts.mar``, ``eager.mar`` and ``onnx.mar`` (folder archives) in ``work/store``."""
    import torch

    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    factory = ModelFactory(work)
    ts_file = factory.weights("tiny")
    model_py = work / "tiny_model.py"
    model_py.write_text(EAGER_MODEL)
    namespace: dict[str, Any] = {}
    exec(compile(EAGER_MODEL, str(model_py), "exec"), namespace)
    torch.manual_seed(0)
    module = namespace["TinyMLP"]().eval()
    state = work / "tiny_eager.pt"
    torch.save(module.state_dict(), state)
    onnx_file = work / "tiny.onnx"
    if not onnx_file.exists():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (torch.zeros(1, TINY_FEATURES),),
                str(onnx_file),
                dynamo=False,
                input_names=["input"],
                output_names=["out"],
                dynamic_axes={"input": {0: "batch"}, "out": {0: "batch"}},
            )
    config = work / "one-worker.yaml"
    config.write_text("minWorkers: 1\nmaxWorkers: 4\nbatchSize: 1\njobQueueSize: 1000\n")
    common = {"version": "1.0", "handler": "base_handler", "export_path": str(store)}
    for name, extra in (
        ("torchscript", {"serialized_file": str(ts_file)}),
        ("eager", {"serialized_file": str(state), "model_file": str(model_py)}),
        ("onnx", {"serialized_file": str(onnx_file)}),
    ):
        if not (store / f"{name}.mar").exists():
            build(model_name=name, config_file=str(config), force=True, **common, **extra)
    return store


def _request(method: str, url: str, timeout: float = 120.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def ready_pids(lantern: LanternProcess, model: str) -> list[int]:
    status, body = _request("GET", f"{lantern.addresses['management']}/models/{model}", 10)
    if status != 200:
        return []
    return [w["pid"] for w in json.loads(body)[0]["workers"] if w["status"] == "READY"]


def server_log(lantern: LanternProcess) -> str:
    """The server log so far ("" before it exists)."""
    log = lantern.work / "logs" / "lantern.log"
    return log.read_text(errors="replace") if log.exists() else ""


def logged_ready(lantern: LanternProcess) -> set[str]:
    """Pids of the spares the server has logged ready so far."""
    return set(re.findall(r"Spare worker ready \(pid (\d+)", server_log(lantern)))


def wait_new_spare(lantern: LanternProcess, seen: set[str], spares: int) -> None:
    """Wait for a spare not in ``seen`` to be ready (the one taken has been replaced), as an
    idle server has it. The log, not a count: its lines may reach the file late."""
    deadline = time.monotonic() + 120
    while spares and not logged_ready(lantern) - seen:
        if time.monotonic() > deadline:
            raise TimeoutError("no spare became ready")
        time.sleep(0.05)


def warm_starts(lantern: LanternProcess) -> int:
    """How many workers the server has started from a warm spare so far."""
    return server_log(lantern).count("started from a warm spare")


def crash_to_ready(lantern: LanternProcess, model: str) -> float:
    (old,) = ready_pids(lantern, model)[:1]
    started = time.perf_counter()
    os.kill(old, signal.SIGKILL)
    while True:
        pids = ready_pids(lantern, model)
        if pids and old not in pids:
            return time.perf_counter() - started
        if time.perf_counter() - started > 120:
            raise TimeoutError(f"{model}: no replacement")
        time.sleep(0.01)


def register_to_ready(lantern: LanternProcess, kind: str, copy: str) -> float:
    api = lantern.addresses["management"]
    started = time.perf_counter()
    status, body = _request(
        "POST",
        f"{api}/models?url={kind}.mar&model_name={copy}&initial_workers=1&synchronous=true",
    )
    elapsed = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"register {copy}: {status} {body[:300]!r}")
    _request("DELETE", f"{api}/models/{copy}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="crashes per model and server")
    parser.add_argument("--server", default="uvicorn")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-recovery"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--kills", type=int, help="issue 25's scenario instead (bench.crashes)")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--base", type=Path, help="with --kills: this tree's code runs first")
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs running meanwhile")
    args = parser.parse_args(argv)
    store = build_models(args.work)
    if args.kills:
        return _kills(args, store)
    results: dict[str, Any] = {}
    servers: dict[int, LanternProcess] = {}
    os.environ["LANTERN_WORKER_RESTART_MAX_BACKOFF"] = "0"
    try:
        for spares in (0, 1):
            os.environ["LANTERN_WORKER_SPARES"] = str(spares)
            work = args.work / f"spares{spares}"
            names = [f"{k}={k}.mar" for k in KINDS]
            _log(f"starting the worker_spares={spares} server")
            servers[spares] = LanternProcess(
                work, store, names, args.server, ["--enable-model-api"]
            ).start()
        ready_before: dict[int, bool] = {}
        for rep in range(args.repeats):
            for kind in KINDS:
                for spares, lantern in servers.items():
                    key = f"{kind}:spares{spares}"
                    if not ready_before.get(spares):  # the first spare of this server
                        wait_new_spare(lantern, set(), spares)
                    seen = logged_ready(lantern)
                    crash = crash_to_ready(lantern, kind)
                    wait_new_spare(lantern, seen, spares)
                    seen = logged_ready(lantern)
                    taken = warm_starts(lantern)
                    reg = register_to_ready(lantern, kind, f"{kind}_copy")
                    if warm_starts(lantern) > taken:  # a new version's first worker starts
                        wait_new_spare(lantern, seen, spares)  # cold: it takes no spare
                    ready_before[spares] = True
                    slot = results.setdefault(key, {"crash": [], "register": []})
                    slot["crash"].append(crash)
                    slot["register"].append(reg)
                    _log(
                        f"{key} repeat {rep + 1}: crash {crash * 1000:.0f} ms, "
                        f"register {reg * 1000:.0f} ms"
                    )
    finally:
        for lantern in servers.values():
            lantern.stop()
    print("model        spares  crash->READY p50 (min-max) ms   register->READY p50 ms")
    for key, slot in results.items():
        kind, spare_count = key.split(":")
        crashes = sorted(slot["crash"])
        print(
            f"{kind:<12} {spare_count[-1]:>6}  {statistics.median(crashes) * 1000:>8.0f} "
            f"({crashes[0] * 1000:.0f}-{crashes[-1] * 1000:.0f})"
            f"{statistics.median(slot['register']) * 1000:>26.0f}"
        )
    print(
        f"\n{args.server}; {args.repeats} crashes per model and server, back-off 0; "
        f"load average now {os.getloadavg()[0]:.2f}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"recovery-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"JSON: {out}")
    return 0


def _kills(args: argparse.Namespace, store: Path) -> int:
    from bench import crashes
    from bench.hog import cpu_hogs

    rows = {}
    with cpu_hogs(args.hogs):
        for name, tree in (("base", args.base), ("this", None)):
            if name == "base" and tree is None:
                continue
            _log(f"{args.kills} kills on {name} ({args.hogs} CPU hogs)")
            rows[name] = crashes.run(
                store, args.work / f"kills-{name}", args.server, args.kills, args.interval, tree
            )
        print(crashes.table(rows, args.interval) + f"; {args.hogs} CPU hogs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
