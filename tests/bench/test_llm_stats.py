"""The LLM benchmark's arithmetic (bench/llm_stats.py) and its request bodies (bench/llm.py)."""

from __future__ import annotations

import json

import pytest

from bench.llm import length_fields
from bench.llm_stats import (
    Sample,
    cpu_per_token,
    median_levels,
    percentile,
    raw_limits,
    summarise,
    table,
)


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


def test_median_levels_takes_each_figures_median_and_sums_the_counts() -> None:
    def level(c: int, tps: float, itl: float, errors: int, cpu: float | None) -> dict:
        return {"concurrency": c, "output_tokens_per_s": tps, "itl_p50_s": itl,
                "errors": errors, "requests": 16, "cpu_per_token_ms": cpu,
                "first_error": "429: busy" if errors else None}  # fmt: skip

    rounds = [
        [level(1, 40.0, 0.030, 0, 40.0), level(32, 500.0, 0.060, 0, 3.0)],
        [level(1, 30.0, 0.020, 1, None), level(32, 400.0, 0.050, 0, 4.0)],
        [level(1, 50.0, 0.025, 0, 44.0), level(32, 600.0, 0.070, 0, 5.0)],
    ]
    one, many = median_levels(rounds)
    assert one["concurrency"] == 1 and one["rounds"] == 3
    assert one["output_tokens_per_s"] == 40.0 and one["itl_p50_s"] == 0.025  # each on its own
    assert one["output_tokens_per_s_range"] == (30.0, 50.0)
    assert one["errors"] == 1 and one["requests"] == 48 and one["first_error"] == "429: busy"
    assert one["cpu_per_token_ms"] == 42.0  # the median of the rounds that read it
    assert many["output_tokens_per_s"] == 500.0 and many["cpu_per_token_ms"] == 4.0


def test_median_levels_of_one_round_is_that_round_without_a_range() -> None:
    [only] = median_levels([[_level(4, 100.0, 0.2, 0.03)]])
    assert only["output_tokens_per_s"] == 100.0 and only["rounds"] == 1
    assert "output_tokens_per_s_range" not in only
    assert not any("round" in line for line in table({"lantern": [only]}))


def test_table_shows_the_spread_of_rounds() -> None:
    merged = median_levels([[_level(1, 40.0, 0.2, 0.03)], [_level(1, 44.0, 0.2, 0.03)]])
    lines = table({"lantern": merged})
    assert "| tok/s lowest-highest round | 40-44 |" in lines
    assert "| output tok/s | 42.0 |" in lines


def test_raw_limits_are_medians_per_batch_and_limit() -> None:
    raws = [
        {"levels": [{"batch": 1, "tokens_per_s": 40.0, "engine_tokens_per_s": 41.0},
                    {"batch": 32, "tokens_per_s": 600.0}]},
        {"levels": [{"batch": 1, "tokens_per_s": 30.0}, {"batch": 32, "tokens_per_s": 500.0}]},
        {"levels": [{"batch": 1, "tokens_per_s": 45.0}, {"batch": 32, "tokens_per_s": 700.0}]},
    ]  # fmt: skip
    limits = raw_limits(raws)
    assert limits["tokens_per_s"] == {1: 40.0, 32: 600.0}
    assert limits["engine_tokens_per_s"] == {1: 41.0}  # only the run that measured it
    assert limits["answers_tokens_per_s"] == {}
