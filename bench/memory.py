"""``python -m bench.memory``: resident memory of the frontend and of each example model's worker.

Builds every example (``examples/*/build.py``), serves them all from one Lantern process (one
worker each), sends each image model one kitten, and reads ``VmRSS`` from ``/proc``: the frontend
with every example loaded, each worker, and the warm spare. (The frontend with 20 models
registered is bounded by ``tests/e2e/test_frontend_memory.py``.) RSS counts shared pages
(torch's libraries) once per process, so the workers' sum overstates what the machine gives them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench import procstat
from bench.server import LanternProcess

REPO = Path(__file__).resolve().parent.parent
KITTEN = REPO / "examples" / "data" / "kitten.jpg"
IMAGE_MODELS = (
    "efficientnet_lite0",
    "efficientnet_lite0_onnx",
    "resnet18",
    "top_class",
    "top_class_fn",
    "classifier",
)


def _mb(pid: int) -> float:
    return (procstat.rss_bytes(pid) or 0) / 2**20


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def _post(url: str, data: bytes) -> int:
    req = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="auto")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-memory"))
    args = parser.parse_args(argv)
    store = args.work / "store"
    store.mkdir(parents=True, exist_ok=True)
    for script in sorted((REPO / "examples").glob("*/build.py")):
        print(f"[memory] building {script.parent.name}", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, str(script), "--model-store", str(store)], check=True, cwd=REPO
        )
    lantern = LanternProcess(args.work, store, ["all"], args.server).start(timeout=900)
    try:
        api = lantern.addresses["management"]
        models = [m["modelName"] for m in _get_json(f"{api}/models?limit=100")["models"]]
        for name in models:
            if name in IMAGE_MODELS:
                _post(lantern.url(name), KITTEN.read_bytes())
        time.sleep(1.0)
        rows = []
        for name in models:
            for worker in _get_json(f"{api}/models/{name}")[0]["workers"]:
                rows.append((name, worker["pid"], _mb(worker["pid"])))
        workers = {pid for _, pid, _ in rows}
        spares = [(p, _mb(p)) for p in lantern.worker_pids() if p not in workers]
        front = _mb(lantern.pid)
    finally:
        lantern.stop()
    print(f"{'model':<26} {'worker pid':>10} {'RSS MB':>8}")
    for name, pid, rss in rows:
        print(f"{name:<26} {pid:>10} {rss:>8.0f}")
    for pid, rss in spares:
        print(f"{'(warm spare)':<26} {pid:>10} {rss:>8.0f}")
    print(f"{'frontend':<26} {lantern.pid:>10} {front:>8.0f}")
    print(f"\n{len(models)} example models, one worker each; RSS after one request per image model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
