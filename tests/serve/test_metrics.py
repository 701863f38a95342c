"""ServerMetrics, handler metrics, system gauges and the exposition, in process."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve.core.host import process_rss
from serve.core.jobs import BatchItem, BatchOutcome, Job
from serve.metrics.exposition import BareCounter, render
from serve.metrics.handler import HandlerMetrics, sanitize_name
from serve.metrics.prometheus import ServerMetrics
from serve.metrics.system import SystemMetrics, parse_nvidia_smi


def parse(body: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(families: dict[str, object], name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for f in families.values()
        for s in f.samples  # type: ignore[attr-defined]
        if s.name == name
    ]


def no_gpu_metrics() -> ServerMetrics:
    return ServerMetrics(system=SystemMetrics(find_nvidia_smi=False))


# ----- handler metrics ---------------------------------------------------------------------------


def record(name: str, value: object, kind: str = "counter", **dims: object) -> dict[str, object]:
    return {"name": name, "unit": "Count", "type": kind, "value": value, "dimensions": dims}


def collect(handler: HandlerMetrics) -> dict[str, object]:
    return parse(render(handler.collect()))


def test_handler_counters_add_up_and_gauges_keep_the_last_value() -> None:
    h = HandlerMetrics("host")
    h.record([record("Hits", 2, ModelName="m"), record("Hits", 3, ModelName="m")])
    h.record([record("Hits", 1, ModelName="other")])
    h.record(
        [record("Temp", 5, "gauge", ModelName="m"), record("Temp", 7.5, "gauge", ModelName="m")]
    )
    h.record([record("Hist", 9, "histogram", ModelName="m")])
    families = collect(h)
    assert families["Hits"].type == "counter"  # type: ignore[attr-defined]
    assert sorted(samples(families, "Hits_total"), key=lambda s: s[1]) == [
        ({"ModelName": "other", "Hostname": "host"}, 1.0),
        ({"ModelName": "m", "Hostname": "host"}, 5.0),
    ]
    assert samples(families, "Temp") == [({"ModelName": "m", "Hostname": "host"}, 7.5)]
    assert families["Hist"].type == "histogram"  # type: ignore[attr-defined]


def test_handler_metric_names_and_labels_are_sanitised() -> None:
    h = HandlerMetrics("host")
    h.record([record("my metric.v2-x", 1, **{"odd-dim": "a", "__x": "b", "9lives": "c"})])
    h.record([record("1st", 1, "gauge", Hostname="given")])
    families = collect(h)
    assert samples(families, "my_metric_v2_x_total") == [
        ({"odd_dim": "a", "x": "b", "_9lives": "c", "Hostname": "host"}, 1.0)
    ]
    assert samples(families, "_1st") == [({"Hostname": "given"}, 1.0)]
    assert sanitize_name("a:b/c") == "a_b_c"


def test_handler_metrics_never_shadow_the_servers_own() -> None:
    h = HandlerMetrics("host")
    h.record(
        [
            record("serve_batch_size", 1, "gauge"),
            record("ts_inference_requests_total", 1),
            record("Requests2XX", 1),
            record("ts_handler_preprocess", 2.5, "gauge"),  # TorchServe's @timed names are kept
        ]
    )
    names = set(collect(h))
    assert names == {
        "handler_serve_batch_size",
        "handler_ts_inference_requests",
        "handler_Requests2XX",
        "ts_handler_preprocess",
    }


def test_handler_metrics_refuse_bad_records_and_type_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = HandlerMetrics("host")
    h.record(
        [
            record("Good", 1),
            record("Good", "not a number"),
            record("Good", 1, "gauge"),  # was a counter
            record("Good", -5),  # counters never go down
            {"value": 1},
            record(["unhashable"], 1),  # type: ignore[arg-type]
            record("Listy", 1, dim=["a"]),
            "not a dict",  # type: ignore[list-item]
        ]
    )
    assert samples(collect(h), "Good_total") == [({"Hostname": "host"}, 1.0)]
    assert "Listy" not in collect(h)
    assert "was a counter and is now sent as a gauge" in caplog.text


def test_handler_metric_cardinality_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    h = HandlerMetrics("host", max_metrics=3, max_series=4, max_value_length=5)
    h.record([record("Many", 1, user=str(i)) for i in range(10)])
    h.record([record(f"Name{i}", 1) for i in range(10)])
    h.record([record("Long", 1, v="x" * 50)])
    families = collect(h)
    assert len(samples(families, "Many_total")) == 4
    assert set(families) == {"Many", "Name0", "Name1"}
    assert "more than 4 label sets" in caplog.text
    assert "more than 3 handler metrics" in caplog.text
    h2 = HandlerMetrics("host", max_value_length=5)
    h2.record([record("Long", 1, v="x" * 50)])
    assert samples(collect(h2), "Long_total") == [({"v": "xxxxx", "Hostname": "host"}, 1.0)]


# ----- the request path and the exposition -------------------------------------------------------


def test_request_done_counts_by_status_and_keeps_torchserve_names() -> None:
    m = no_gpu_metrics()
    m.request_done("m", "1.0", 200, 0.002)
    m.request_done("m", "1.0", 200, 0.004)
    m.request_done("m", "1.0", 503, 0.001)
    m.request_done("m", "default", 200, 0.001)  # no registry bound: stays "default"
    for status in (200, 201, 404, 500, 503, 302):
        m.response_sent(status)
    text = m.exposition().decode()
    families = parse(text.encode())
    assert [
        v for labels, v in samples(families, "serve_requests_total") if labels["version"] == "1.0"
    ] == [2.0, 1.0]
    assert samples(families, "ts_inference_requests_total")[0] == (
        {"model_name": "m", "model_version": "1.0", "hostname": m.hostname},
        3.0,
    )
    [(_, latency)] = [
        s
        for s in samples(families, "ts_inference_latency_microseconds_total")
        if s[0]["model_version"] == "1.0"
    ]
    assert latency == pytest.approx(7000)
    lines = text.splitlines()
    assert "# TYPE ts_inference_latency_microseconds counter" in lines
    assert "# TYPE ts_inference_requests_total counter" in lines
    assert f'Requests2XX{{Hostname="{m.hostname}",Level="Host"}} 2.0' in lines
    assert f'Requests5XX{{Hostname="{m.hostname}",Level="Host"}} 2.0' in lines
    assert [f.type for f in families.values() if f.type == "unknown"] == []  # type: ignore[attr-defined]


def test_batch_done_records_sizes_waits_phases_and_handler_metrics() -> None:
    async def scenario() -> ServerMetrics:
        m = no_gpu_metrics()
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        jobs = []
        for i in range(3):
            job = Job(BatchItem(f"r{i}", {}, []), loop.create_future(), now - 0.02, now + 10)
            job.dispatched_at = now
            jobs.append(job)
        timings: dict[str, object] = {"odd": "not a number"}  # handler-written: skipped
        timings.update({"preprocess": 0.001, "inference": 0.01, "postprocess": 0.001})
        timings.update({"handler": 0.02, **{f"extra{i}": 0.001 for i in range(30)}})  # bounded
        outcome = BatchOutcome([], timings, [record("Rows", 3, ModelName="m")])  # type: ignore[arg-type]
        m.batch_done("m", "1.0", jobs, outcome)
        return m

    families = parse(asyncio.run(scenario()).exposition())
    assert samples(families, "serve_batch_size_sum") == [({"model": "m", "version": "1.0"}, 3.0)]
    assert samples(families, "serve_queue_wait_seconds_count")[0][1] == 3.0
    [(_, queued)] = samples(families, "ts_queue_latency_microseconds_total")
    assert queued == pytest.approx(3 * 20_000, rel=0.01)
    phases = {
        labels["phase"] for labels, _ in samples(families, "serve_handler_duration_seconds_count")
    }
    assert {"preprocess", "inference", "postprocess", "handler"} <= phases
    assert len(phases) == 16
    assert samples(families, "Rows_total")[0][1] == 3.0


def test_name_filter_selects_whole_families() -> None:
    m = no_gpu_metrics()
    m.request_done("m", "1.0", 200, 0.01)
    picked = parse(
        m.exposition(
            ["ts_inference_requests_total", "serve_request_duration_seconds", "Requests4XX"]
        )
    )
    assert set(picked) == {"ts_inference_requests", "serve_request_duration_seconds", "Requests4XX"}
    assert m.exposition(["nothing"]) == b""


def test_bare_counter_label_values_are_escaped() -> None:
    family = BareCounter("Odd", "doc")
    family.add_sample("Odd", {"v": 'a "quoted"\\ \nvalue'}, 1)
    [parsed] = text_string_to_metric_families(render([family]).decode())
    assert parsed.samples[0].labels == {"v": 'a "quoted"\\ \nvalue'}


# ----- system gauges -----------------------------------------------------------------------------


NVIDIA_CSV = "0, GPU-aaa, 1024, 81559, 37\n1, GPU-bbb, [N/A], 81559, [N/A]\n"


def fake_nvidia_smi(tmp_path: Path, output: str, code: int = 0) -> Path:
    """An executable standing in for nvidia-smi: prints ``output`` and counts its runs."""
    exe = tmp_path / "nvidia-smi"
    (tmp_path / "out.csv").write_text(output)
    exe.write_text(
        f'#!/bin/sh\necho run >> "{tmp_path}/runs"\ncat "{tmp_path}/out.csv"\nexit {code}\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(NVIDIA_CSV + "garbage\n")
    assert [(g.index, g.uuid, g.memory_used, g.memory_total, g.utilization) for g in gpus] == [
        ("0", "GPU-aaa", 1024 * 2**20, 81559 * 2**20, 37.0),
        ("1", "GPU-bbb", None, 81559 * 2**20, None),
    ]


def test_gpu_gauges_come_from_nvidia_smi_and_are_cached(tmp_path: Path) -> None:
    exe = fake_nvidia_smi(tmp_path, NVIDIA_CSV)
    system = SystemMetrics(str(exe))

    async def scrape_twice() -> None:
        await asyncio.gather(system.refresh(), system.refresh())
        await system.refresh()

    asyncio.run(scrape_twice())
    assert (tmp_path / "runs").read_text().count("run") == 1
    families = parse(render(system.collect()))
    assert samples(families, "serve_gpu_memory_used_bytes") == [
        ({"device": "0", "uuid": "GPU-aaa"}, 1024.0 * 2**20)
    ]
    assert len(samples(families, "serve_gpu_memory_total_bytes")) == 2
    assert samples(families, "serve_gpu_utilization_percent") == [
        ({"device": "0", "uuid": "GPU-aaa"}, 37.0)
    ]


def test_failing_nvidia_smi_means_no_gpu_gauges(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    system = SystemMetrics(str(fake_nvidia_smi(tmp_path, "", code=9)))
    with caplog.at_level(logging.WARNING):
        asyncio.run(system.refresh())
    assert "GPU metrics unavailable" in caplog.text
    assert not any(name.startswith("serve_gpu") for name in parse(render(system.collect())))


def test_host_gauges() -> None:
    system = SystemMetrics(find_nvidia_smi=False)
    sum(i * i for i in range(200_000))  # some CPU time between samples
    families = parse(render(system.collect()))
    [(_, cpu)] = samples(families, "serve_host_cpu_utilization_percent")
    assert 0.0 <= cpu <= 100.0
    [(_, total)] = samples(families, "serve_host_memory_total_bytes")
    [(_, used)] = samples(families, "serve_host_memory_used_bytes")
    assert 0 < used < total
    assert (process_rss(os.getpid()) or 0) > 1 << 20
    assert process_rss(None) is None
