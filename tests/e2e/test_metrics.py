"""The metrics port against a running server: what the worker reports and its process shows.

Handler phases and custom handler metrics come from the worker; resident memory from its process.
Request counters, batches, status codes, restarts and the name filter are tested in process over
fake workers (`tests/app/test_metrics_app.py`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import HANDLERS, LanternServer, build_archive

OBS = {"model_name": "obs", "model_version": "1.0"}
MV = {"model": "obs", "version": "1.0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("metrics")
    store = work / "store"
    store.mkdir()
    build_archive(
        store,
        "obs",
        HANDLERS / "metrics_handler.py",
        config={"batchSize": 8, "maxBatchDelay": 50, "minWorkers": 1, "maxWorkers": 1},
    )
    srv = LanternServer(work, store, ["obs.mar"]).start()
    yield srv
    srv.stop()


def scrape(server: LanternServer, *names: str) -> dict[str, Metric]:
    response = httpx.get(
        f"{server.metrics}/metrics", params=[("name[]", n) for n in names], timeout=10
    )
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """The first sample named ``sample`` whose labels include ``labels``; 0 if none yet."""
    for family in families.values():
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def predict(server: LanternServer, body: bytes, model: str = "obs") -> httpx.Response:
    return httpx.post(f"{server.inference}/predictions/{model}", content=body, timeout=30)


def test_histogram_buckets_move(server: LanternServer) -> None:
    before = scrape(server, "serve_request_duration_seconds", "serve_handler_duration_seconds")
    for i in range(3):
        assert predict(server, f"h{i}".encode()).status_code == 200
    after = scrape(server, "serve_request_duration_seconds", "serve_handler_duration_seconds")
    assert set(after) == {"serve_request_duration_seconds", "serve_handler_duration_seconds"}

    def delta(sample: str, **labels: str) -> float:
        return value(after, sample, **labels) - value(before, sample, **labels)

    bucket = "serve_request_duration_seconds_bucket"
    # Every request sleeps 50 ms in the handler: the 25 ms bucket stays, the 1 s one moves.
    assert delta(bucket, le="0.025", **MV) == 0
    assert delta(bucket, le="1.0", **MV) == 3
    assert delta(bucket, le="+Inf", **MV) == 3
    assert delta("serve_request_duration_seconds_sum", **MV) >= 0.15
    phases = "serve_handler_duration_seconds"
    for phase in ("preprocess", "inference", "postprocess", "handler"):
        assert delta(f"{phases}_count", phase=phase, **MV) == 3, phase
    assert delta(f"{phases}_sum", phase="inference", **MV) >= 0.15
    assert delta(f"{phases}_bucket", phase="inference", le="0.025", **MV) == 0


def test_handler_metrics_appear_with_dimensions(server: LanternServer) -> None:
    assert predict(server, b"m").status_code == 200
    families = scrape(server)
    ts_requests = families["ts_inference_requests"]
    hostname = ts_requests.samples[0].labels["hostname"]
    dims = {"ModelName": "obs", "Level": "Model", "Hostname": hostname}
    rows = families["RowsSeen"]
    assert rows.type == "counter"
    assert value(families, "RowsSeen_total", Kind="rows", **dims) >= 1
    for name, expected in (("EchoTime", 1.5), ("EchoSize", 2.0), ("EchoPercent", 42.0)):
        assert families[name].type == "gauge", name
        assert value(families, name, **dims) == expected
    # A name and a dimension that are not valid Prometheus names are sanitised.
    assert families["Echo_Batch_rows"].type == "counter"
    assert value(families, "Echo_Batch_rows_total", odd_dim="x y", **dims) >= 1
    # BaseHandler's own HandlerTime (ms), as TorchServe reports it.
    assert value(families, "HandlerTime", **dims) > 0
    # A counter adds up across requests.
    first = value(families, "RowsSeen_total", Kind="rows", **dims)
    assert predict(server, b"m2").status_code == 200
    assert value(scrape(server, "RowsSeen"), "RowsSeen_total", Kind="rows", **dims) == first + 1


def test_worker_gauges(server: LanternServer) -> None:
    families = scrape(server)
    assert value(families, "serve_workers", state="READY", **MV) == 1
    assert value(families, "serve_workers", state="DEAD", **MV) == 0
    rss = value(families, "serve_worker_resident_memory_bytes", worker="obs_1.0-w0", **MV)
    assert rss > 10 * 2**20  # a Python process with torch imported
    pss = value(families, "serve_worker_proportional_memory_bytes", worker="obs_1.0-w0", **MV)
    uss = value(families, "serve_worker_unique_memory_bytes", worker="obs_1.0-w0", **MV)
    assert 0 < uss <= pss <= rss  # smaps_rollup, read at scrape time
    assert value(families, "serve_frontend_memory_bytes", kind="uss") > 0
    assert value(families, "serve_host_memory_total_bytes") > 0
    assert 0 <= value(families, "serve_host_cpu_utilization_percent") <= 100
    assert value(families, "process_resident_memory_bytes") > 0  # the frontend itself
    if shutil.which("nvidia-smi") is None:
        assert not any(name.startswith("serve_gpu_") for name in families)


def test_exposition_parses_and_every_family_is_typed(server: LanternServer) -> None:
    response = httpx.get(f"{server.metrics}/metrics", timeout=10)
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = list(text_string_to_metric_families(response.text))
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    # A sample the parser cannot place in a declared family becomes an "unknown" family.
    assert [f.name for f in families if f.type == "unknown"] == []
    assert {
        "ts_inference_requests",
        "ts_inference_latency_microseconds",
        "ts_queue_latency_microseconds",
        "Requests2XX",
        "serve_request_duration_seconds",
        "serve_queue_wait_seconds",
        "serve_batch_size",
        "serve_handler_duration_seconds",
        "serve_requests",
        "serve_queue_depth",
        "serve_workers",
        "serve_worker_restarts",
        "serve_worker_resident_memory_bytes",
    } <= set(names)
    # TorchServe's exact exposed names, for the dashboards that query them.
    for line in (
        "# TYPE ts_inference_requests_total counter",
        "# TYPE ts_inference_latency_microseconds counter",
        "# TYPE ts_queue_latency_microseconds counter",
        "# TYPE Requests2XX counter",
    ):
        assert line in response.text.splitlines()
    promtool = shutil.which("promtool")
    if promtool is not None:  # Debian's prometheus package; lint rules TorchServe's names break
        check = subprocess.run(
            [promtool, "check", "metrics"], input=response.text, capture_output=True, text=True
        )
        assert check.returncode in (0, 3), check.stderr
        problems = (check.stdout + check.stderr).splitlines()
        assert not [p for p in problems if re.match(r"(serve_|process_)", p)], problems
