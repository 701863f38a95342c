"""``python -m bench.memory``: resident memory of the frontend and of each example model's worker.

Builds every example (``examples/*/build.py``), serves them all from one Lantern process (one
worker each), sends each image model one kitten, and reads ``VmRSS`` from ``/proc``: the frontend
with every example loaded, each worker, and the warm spare. (The frontend with 20 models
registered is bounded by ``tests/e2e/test_frontend_memory.py``.) RSS counts shared pages
(torch's libraries) once per process, so the workers' sum overstates what the machine gives them.

``--torchserve PATH`` (the ``torchserve`` launcher of a TorchServe 0.12 install, which needs Java
17) then serves the same archives from TorchServe, one worker each, on free ports, and reads the
JVM's RSS and its workers' the same way.

``--scaling`` (`bench.memory_scaling`) measures RSS, PSS and USS of N = 1, 2, 4 workers of one
model at a time, and of the idle warm spare, on both servers.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

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


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def _post(url: str, data: bytes) -> int:
    status = _post_once(url, data)
    if status != 200:
        print(f"[memory] POST {url}: HTTP {status}", file=sys.stderr, flush=True)
    return status


def _post_once(url: str, data: bytes) -> int:
    # Without a Content-Type urllib sends a form one, which both servers would parse as a form.
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "image/jpeg"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_torchserve(launcher: Path, store: Path, work: Path) -> list[tuple[str, int, float]]:
    """``(what, pid, RSS MB)`` for TorchServe's JVM and each worker, serving every archive."""
    ts_work = work / "torchserve"
    ts_work.mkdir(parents=True, exist_ok=True)
    ports = {k: _free_port() for k in ("inf", "mgmt", "metrics", "grpc_inf", "grpc_mgmt")}
    config = ts_work / "config.properties"
    config.write_text(
        f"inference_address=http://127.0.0.1:{ports['inf']}\n"
        f"management_address=http://127.0.0.1:{ports['mgmt']}\n"
        f"metrics_address=http://127.0.0.1:{ports['metrics']}\n"
        f"grpc_inference_port={ports['grpc_inf']}\n"
        f"grpc_management_port={ports['grpc_mgmt']}\n"
        "default_workers_per_model=1\n"
        "disable_token_authorization=true\n"
        "install_py_dep_per_model=false\n"
    )
    cmd = [
        str(launcher), "--start", "--foreground", "--ncs", "--disable-token-auth",
        "--model-store", str(store), "--models", "all", "--ts-config", str(config),
    ]  # fmt: skip
    log = open(ts_work / "console.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ts_work, stdout=log, stderr=subprocess.STDOUT)
    try:
        api = f"http://127.0.0.1:{ports['mgmt']}"
        deadline = time.monotonic() + 900
        models: list[str] = []
        while time.monotonic() < deadline:
            time.sleep(2)
            try:
                models = [m["modelName"] for m in _get_json(f"{api}/models?limit=100")["models"]]
                infos = [_get_json(f"{api}/models/{m}")[0] for m in models]
            except (OSError, ValueError, KeyError):
                continue
            if models and all(w["status"] == "READY" for info in infos for w in info["workers"]):
                break
        for name in models:
            if name in IMAGE_MODELS:
                _post(f"http://127.0.0.1:{ports['inf']}/predictions/{name}", KITTEN.read_bytes())
        time.sleep(1.0)
        jvm = next((p for p in [proc.pid, *procstat.children(proc.pid)] if _is_java(p)), proc.pid)
        rows = [("TorchServe JVM (frontend)", jvm, _mb(jvm))]
        for name in models:
            for worker in _get_json(f"{api}/models/{name}")[0]["workers"]:
                pid = int(worker.get("pid", -1))
                rows.append((f"TorchServe worker: {name}", pid, _mb(pid) if pid > 0 else 0.0))
        return rows
    finally:
        stop_torchserve(proc, launcher, ts_work)
        log.close()


def _is_java(pid: int) -> bool:
    try:
        return b"java" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="auto")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-memory"))
    parser.add_argument("--torchserve", type=Path, help="a TorchServe 0.12 launcher to compare")
    parser.add_argument("--skip-build", action="store_true", help="reuse the built archives")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="RSS/PSS/USS of N = 1, 2, 4 workers of the tiny and an image model, and the spare",
    )
    args = parser.parse_args(argv)
    if args.scaling:
        from bench.memory_scaling import run

        return run(args.work, args.torchserve)
    store = args.work / "store"
    store.mkdir(parents=True, exist_ok=True)
    for script in [] if args.skip_build else sorted((REPO / "examples").glob("*/build.py")):
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
    if args.torchserve is not None:
        print()
        for what, pid, rss in measure_torchserve(args.torchserve, store, args.work):
            print(f"{what:<40} {pid:>10} {rss:>8.0f}")
    return 0


def stop_torchserve(proc: subprocess.Popen[bytes], launcher: Path, ts_work: Path) -> None:
    """SIGTERM the launcher (SIGKILL after 60 s), then ``torchserve --stop`` for its JVM."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    subprocess.run([str(launcher), "--stop"], cwd=ts_work, capture_output=True, timeout=60)


if __name__ == "__main__":
    sys.exit(main())
