"""The Grafana dashboard and the Prometheus alerting rules under deploy/monitoring/: promtool
accepts the rules; every PromQL expression in both returns data from a real Prometheus scraping a
real Lantern under a little load (errors and a worker restart included); the dashboard fits a
model of Grafana's dashboard schema; the Helm chart ships both (a ConfigMap, and a PrometheusRule
where the CRD is)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from tests.deploy.support import CHART, DEPLOY, kubernetes_validate, run_helm, validate_custom
from tests.deploy.test_autoscaling_metric import free_port, prometheus_binary
from tests.support.server import LanternServer, echo_archive

MONITORING = DEPLOY / "monitoring"
RULES = MONITORING / "lantern-alerts.yaml"
DASHBOARD = MONITORING / "lantern-dashboard.json"
# An alert is `(signal) <op> threshold`: the signal must return data, the whole may be empty.
ALERT = re.compile(r"^\((?P<signal>.+)\)\s*(>|<|>=|<=|==|!=)\s*[0-9.e+-]+$", re.DOTALL)
# Grafana's variables, as the dashboard's queries use them.
VARIABLES = {"$__rate_interval": "1m", "$model": ".*"}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str, bool]]:
    """(panel title, expression, whether it must return data): panels in a row whose title says
    "(when present)" (GPU) may be empty on this host, but must still be valid PromQL."""
    out = []
    required = True
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            required = "(when present)" not in panel["title"]
            continue
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr, required))
    return out


# ----- static checks ------------------------------------------------------------------------------


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        prometheus_binary()  # fails under CI, skips elsewhere, with the reason
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_alerts_cover_what_operators_page_on() -> None:
    names = {rule["alert"] for rule in rules()}
    assert names == {
        "LanternNoHealthyWorker",
        "LanternQueueNearFull",
        "LanternHighErrorRate",
        "LanternWorkerRestartLoop",
        "LanternHighP99Latency",
    }
    for rule in rules():
        assert ALERT.match(rule["expr"].strip()), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]


_TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": {"$ref": "#/$defs/datasource"},
    },
    "additionalProperties": False,
}
_GRID = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
    "additionalProperties": False,
}
# A model of Grafana's dashboard JSON (schemaVersion 39; grafana/grafana's
# kinds/dashboard/dashboard_kind.cue), strict where ours is written: unknown keys are refused.
DASHBOARD_SCHEMA = {
    "$defs": {
        "datasource": {
            "type": "object",
            "required": ["type", "uid"],
            "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
            "additionalProperties": False,
        }
    },
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string"},
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "description": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "timezone": {"enum": ["browser", "utc", ""]},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "version": {"type": "integer"},
        "refresh": {"type": "string"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "annotations": {"type": "object"},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {
                            "name": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                            "type": {"enum": ["datasource", "query", "custom", "constant"]},
                        },
                    },
                }
            },
        },
        "panels": {
            "type": "array",
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["id", "type", "title", "gridPos", "collapsed", "panels"],
                        "properties": {
                            "id": {"type": "integer"},
                            "type": {"const": "row"},
                            "title": {"type": "string"},
                            "gridPos": _GRID,
                            "collapsed": {"type": "boolean"},
                            "panels": {"type": "array", "maxItems": 0},
                        },
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "required": ["id", "type", "title", "gridPos", "datasource", "targets"],
                        "properties": {
                            "id": {"type": "integer"},
                            "type": {"enum": ["timeseries", "stat", "gauge", "bargauge", "table"]},
                            "title": {"type": "string", "minLength": 1},
                            "description": {"type": "string"},
                            "datasource": {"$ref": "#/$defs/datasource"},
                            "gridPos": _GRID,
                            "fieldConfig": {
                                "type": "object",
                                "required": ["defaults", "overrides"],
                            },
                            "options": {"type": "object"},
                            "targets": {"type": "array", "minItems": 1, "items": _TARGET},
                        },
                        "additionalProperties": False,
                    },
                ]
            },
        },
    },
    "additionalProperties": False,
}


def test_the_dashboard_fits_grafanas_schema() -> None:
    board = dashboard()
    jsonschema.Draft202012Validator(DASHBOARD_SCHEMA).validate(board)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, p["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        for target in p.get("targets", []):
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= {"__rate_interval", "model"}, used
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "model"}
    shown = " ".join(expr for _, expr, _ in dashboard_queries())
    for metric in (
        "serve_requests_total",
        "serve_request_duration_seconds_bucket",
        "serve_queue_depth",
        "serve_worker_restarts_total",
        "serve_batch_size",
        "serve_worker_resident_memory_bytes",
    ):
        assert metric in shown, metric


# ----- the Helm chart ---------------------------------------------------------------------------


def render(*args: str) -> list[dict[str, Any]]:
    result = run_helm("template", "rel", str(CHART), "--namespace", "ml", *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_chart_ships_the_same_files() -> None:
    for name in (RULES.name, DASHBOARD.name):
        assert (CHART / "files" / name).read_bytes() == (MONITORING / name).read_bytes(), name


def test_the_chart_renders_the_rule_where_the_crd_is_and_the_dashboard_when_asked(
    tmp_path: Path,
) -> None:
    plain = render()
    assert not [o for o in plain if o["kind"] == "PrometheusRule"]
    assert not [o for o in plain if o["metadata"]["name"].endswith("-dashboard")]
    objects = render(
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
        "--set",
        "grafanaDashboard.enabled=true",
    )
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    validate_custom(rule)
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    (board,) = [o for o in objects if o["metadata"]["name"] == "rel-lantern-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["lantern-dashboard.json"]) == dashboard()
    kubernetes_validate([board], tmp_path)


# ----- against a real Prometheus ------------------------------------------------------------------


@pytest.fixture(scope="module")
def lantern(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("monitoring")
    store = work / "store"
    store.mkdir()
    echo_archive(store, config={"minWorkers": 2, "batchSize": 4, "maxBatchDelay": 20})
    with LanternServer(work, store, ["echo=echo.mar"]) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(lantern: LanternServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = prometheus_binary()
    work = tmp_path_factory.mktemp("prometheus-monitoring")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "lantern",
                "static_configs": [{"targets": [lantern.metrics.removeprefix("http://")]}],
            }
        ],
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


def series(base: str, promql: str) -> int:
    """How many series ``promql`` returns now; fails on a query Prometheus refuses."""
    body = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", (promql, body)
    return len(body["data"]["result"])


def load(lantern: LanternServer, done: threading.Event) -> int:
    """Requests until ``done``: short sleeps, and every seventh one fails (500)."""
    sent = 0
    with httpx.Client(timeout=30) as http:
        while not done.is_set():
            body = b"boom" if sent % 7 == 3 else b"sleep 0.02"
            http.post(f"{lantern.inference}/predictions/echo", content=body)
            sent += 1
    return sent


def test_every_expression_returns_data_under_load(lantern: LanternServer, prometheus: str) -> None:
    signals = {rule["alert"]: ALERT.match(rule["expr"].strip()) for rule in rules()}
    wanted = {name: m["signal"] for name, m in signals.items() if m}
    optional: dict[str, str] = {}
    for title, expr, required in dashboard_queries():
        (wanted if required else optional)[f"{title}: {expr}"] = expr
    for rule in rules():  # the whole alert is valid PromQL too (it may well be empty)
        series(prometheus, rule["expr"])
    for expr in optional.values():
        series(prometheus, expr)
    # A worker restart, for the restart panel and alert.
    httpx.post(f"{lantern.inference}/predictions/echo", content=b"crash", timeout=30)
    seen: set[str] = set()
    done = threading.Event()
    stop = time.monotonic() + 60  # bounded: at most 60 s of load, 4 clients
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load, lantern, done) for _ in range(4)]
        try:
            while time.monotonic() < stop and len(seen) < len(wanted):
                for name, expr in wanted.items():
                    if name not in seen and series(prometheus, expr) > 0:
                        seen.add(name)
                time.sleep(0.5)  # Prometheus scrapes every second
        finally:
            done.set()
        sent = sum(f.result() for f in futures)
    assert sent > 0
    assert not set(wanted) - seen, f"no data for: {sorted(set(wanted) - seen)}"
