"""The LLM benchmark's arithmetic (bench/llm_stats.py) and its request bodies (bench/llm.py)."""

from __future__ import annotations

import json

import pytest

from bench.llm import length_fields
from bench.llm_stats import Sample, cpu_per_token, percentile, summarise, table


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_percentile_is_not_thrown_by_float_rounding() -> None:
    # 0.07 * 100 is 7.000000000000001 in floating point: the 7th value, not the 8th.
    assert percentile([float(v) for v in range(1, 101)], 0.07) == 7.0


def test_cpu_per_token() -> None:
    assert cpu_per_token(2.0, 400) == pytest.approx(0.005)
    assert cpu_per_token(None, 400) is None
    assert cpu_per_token(1.0, 0) is None


def test_summarise_counts_usage_or_chunks_and_leaves_errors_out() -> None:
    samples = [
        Sample(ttft=0.1, gaps=[0.02, 0.04], tokens=3),
        Sample(ttft=0.3, gaps=[0.03] * 4),  # no usage chunk: 1 + 4 gaps = 5 tokens
        Sample(error="503: busy"),
    ]
    out = summarise(samples, concurrency=2, elapsed=2.0, cpu_seconds=0.4)
    assert out["requests"] == 3 and out["errors"] == 1 and out["first_error"] == "503: busy"
    assert out["output_tokens"] == 8
    assert out["output_tokens_per_s"] == pytest.approx(4.0)
    assert out["requests_per_s"] == pytest.approx(1.0)
    assert out["tokens_per_request"] == pytest.approx(4.0)
    assert out["ttft_p50_s"] == 0.1 and out["ttft_p99_s"] == 0.3
    assert out["itl_p50_s"] == 0.03 and out["itl_p99_s"] == 0.04
    assert out["cpu_per_token_ms"] == pytest.approx(50.0)


def test_summarise_without_successes_or_cpu() -> None:
    out = summarise([Sample(error="boom")], concurrency=1, elapsed=1.0, cpu_seconds=None)
    assert out["output_tokens"] == 0 and out["ttft_p50_s"] is None
    assert out["cpu_per_token_ms"] is None and out["tokens_per_request"] == 0.0


def _level(c: int, tps: float, ttft99: float, itl50: float) -> dict[str, float]:
    return {"concurrency": c, "output_tokens_per_s": tps, "ttft_p99_s": ttft99,
            "itl_p50_s": itl50, "errors": 0}  # fmt: skip


def test_table_has_a_column_per_server_level_and_ratios() -> None:
    servers = {
        "lantern": [_level(1, 20.0, 0.1, 0.05), _level(16, 160.0, 0.5, 0.1)],
        "peer": [_level(1, 10.0, 0.2, 0.1), _level(16, 80.0, 2.0, 0.2)],
    }
    lines = table(servers, raw={1: 25.0, 16: 200.0}, answers={1: 22.0, 16: 320.0})
    assert lines[0] == "| | lantern c=1 | lantern c=16 | peer c=1 | peer c=16 |"
    assert lines[2] == "| output tok/s | 20.0 | 160.0 | 10.0 | 80.0 |"
    assert "| TTFT p50/p99 ms | - / 100 | - / 500 | - / 200 | - / 2000 |" in lines
    assert "| tok/s vs peer | 2.00x | 2.00x |" in lines
    assert "| TTFT p99 vs peer | 0.50x | 0.25x |" in lines
    assert "| tok/s vs raw forward | 0.80x | 0.80x |" in lines
    # the raw step at batch 16 is 16 / 200 = 80 ms; Lantern's gap 100 ms is 1.25x of it
    assert "| ITL p50 vs raw step | 1.25x | 1.25x |" in lines
    assert "| tok/s vs raw whole answers | 0.91x | 0.50x |" in lines


def test_table_without_the_baseline_has_no_ratios() -> None:
    lines = table({"peer": [_level(1, 10.0, 0.2, 0.1)]})
    assert len(lines) == 2 + 7 and not any("vs" in line for line in lines)


def test_length_fields_per_dialect() -> None:
    assert length_fields("ignore_eos", 32) == {"ignore_eos": True, "min_tokens": 32}
    assert length_fields("min_tokens", 32) == {"min_tokens": 32}
    config = json.loads(length_fields("generation_config", 32)["generation_config"])
    assert config == {"max_new_tokens": 32, "min_new_tokens": 32, "do_sample": False}
    assert length_fields("none", 32) == {}
