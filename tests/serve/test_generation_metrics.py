"""The LLM series: what a generative worker's RESULT timings become on /metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from serve.core.jobs import BatchItem, BatchOutcome, Job
from tests.serve.test_metrics import no_gpu_metrics, parse, samples


def test_a_generative_request_records_latencies_and_token_counts_not_phases() -> None:
    async def scenario() -> bytes:
        m = no_gpu_metrics()
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        job = Job(BatchItem("r0", {}, []), loop.create_future(), now - 0.5, now + 10)
        job.dispatched_at = now  # waited half a second in the queue
        timings = {"handler": 2.5, "first_token": 0.5, "prompt_tokens": 7.0}
        timings["completion_tokens"] = 21.0
        m.batch_done("m", "1.0", [job], BatchOutcome([], timings, []))
        return m.exposition()

    families = parse(asyncio.run(scenario()))
    labels = {"model": "m", "version": "1.0"}
    assert samples(families, "serve_prompt_tokens_total") == [(labels, 7.0)]
    assert samples(families, "serve_generation_tokens_total") == [(labels, 21.0)]
    [(_, ttft)] = samples(families, "serve_time_to_first_token_seconds_sum")
    assert ttft == pytest.approx(1.0, rel=0.01)  # queue wait + first token
    [(_, itl)] = samples(families, "serve_inter_token_latency_seconds_sum")
    assert itl == pytest.approx(2.0 / 20)
    [(_, e2e)] = samples(families, "serve_e2e_request_latency_seconds_sum")
    assert e2e == pytest.approx(3.0, rel=0.01)
    phases = {lab["phase"] for lab, _ in samples(families, "serve_handler_duration_seconds_count")}
    assert phases == {"handler"}
