"""The autoscaling metric is real: Debian's prometheus scrapes a running Lantern on loopback, and
the PromQL of the chart's KEDA trigger and of the shipped prometheus-adapter rule return requests
in flight while the server is under load."""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from tests.deploy.support import CHART, DEPLOY, render
from tests.support.server import LanternServer, echo_archive

# Kubernetes adds namespace/service/pod labels to scraped series; here the scrape job stands in.
JOB = 'job="lantern"'


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("prometheus is missing: .ci/run installs Debian's prometheus package")
    pytest.skip("Debian's prometheus package is not installed (apt-get install prometheus)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def lantern(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("autoscaling")
    store = work / "store"
    store.mkdir()
    echo_archive(store, config={"minWorkers": 2, "batchSize": 1})
    with LanternServer(work, store, ["echo=echo.mar"]) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(lantern: LanternServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = prometheus_binary()
    work = tmp_path_factory.mktemp("prometheus")
    target = lantern.metrics.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "lantern", "static_configs": [{"targets": [target]}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(work / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def keda_query() -> str:
    objects = render(CHART / "ci" / "keda-values.yaml", namespace="ml")
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    matchers = 'namespace="ml", service="rel-lantern"'
    assert matchers in query
    return query.replace(matchers, JOB)


def adapter_query() -> str:
    values = yaml.safe_load((DEPLOY / "helm" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    return rule["metricsQuery"].replace("<<.LabelMatchers>>", JOB).replace("<<.GroupBy>>", "job")


def query(base: str, promql: str) -> float | None:
    body = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert body["status"] == "success", body
    results = body["data"]["result"]
    return max(float(r["value"][1]) for r in results) if results else None


def test_queries_return_requests_in_flight_under_load(
    lantern: LanternServer, prometheus: str
) -> None:
    queries = {"keda": keda_query(), "adapter": adapter_query()}
    seen: dict[str, float] = {}
    stop = time.monotonic() + 40  # bounded: at most 40 s of load, 8 clients

    def client() -> int:
        sent = 0
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop and len(seen) < len(queries):
                resp = http.post(f"{lantern.inference}/predictions/echo", content=b"sleep 0.5")
                assert resp.status_code == 200, resp.text
                sent += 1
        return sent

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client) for _ in range(8)]
        while time.monotonic() < stop and len(seen) < len(queries):
            for name, promql in queries.items():
                value = query(prometheus, promql)
                if value is not None and value >= 1:
                    seen[name] = value
            time.sleep(0.5)
        sent = sum(f.result() for f in futures)
    assert set(seen) == set(queries), f"no value under load for {set(queries) - set(seen)}"
    assert sent > 0


def test_queries_are_valid_promql_when_idle(prometheus: str) -> None:
    for promql in (keda_query(), adapter_query()):
        value = query(prometheus, promql)
        assert value is None or value >= 0


def test_scrape_target_is_up(prometheus: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if query(prometheus, f"up{{{JOB}}}") == 1:
            return
        time.sleep(0.5)
    pytest.fail("prometheus never scraped Lantern's metrics port")
