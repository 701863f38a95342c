"""A generative engine's live counts in describe and on /metrics, over fake workers that report
them as `serve.worker.process.WorkerProcess` keeps them from ENGINE frames."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.fake_workers import Behaviour, FakeWorker, FakeWorkers, echo
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import echo_archive

LIMITS = {"slots": 4, "max_running_sequences": 4, "max_cached_tokens": 1000, "max_model_len": 512}
STATS = {
    "waiting": 1,
    "prefilling": 1,
    "running": 2,
    "reserved_tokens": 250,
    "cached_tokens": 180,
    "steps": 42,
    "prefix_cache_tokens": 96,
    "prefix_queried_tokens": 400,
    "prefix_hit_tokens": 300,
    "shared_prompt_tokens": 120,
}


async def engine_loads(worker: FakeWorker) -> None:
    """What LOADED and a later ENGINE frame leave on a WorkerProcess."""
    worker.limits = dict(LIMITS)  # type: ignore[attr-defined]
    worker.engine_stats = dict(STATS)  # type: ignore[attr-defined]


async def samples(lantern: Lantern) -> dict[str, dict[tuple[str, ...], float]]:
    response = await lantern.metrics.get("/metrics")
    found: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[labels] = sample.value  # type: ignore[index]
    return found


def test_describe_and_metrics_show_each_engines_live_counts(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store, "llm", config={"minWorkers": 1, "maxWorkers": 1})
    workers = FakeWorkers({"echo_handler": Behaviour(echo, load=engine_loads)})

    async def body() -> None:
        config = test_config(tmp_path, store, load_models=["llm.mar"])
        async with in_process(config, workers) as lantern:
            (worker,) = (await lantern.management.get("/models/llm")).json()[0]["workers"]
            assert worker["limits"] == LIMITS
            assert worker["engine"] == {
                "waiting": 1,
                "prefilling": 1,
                "running": 2,
                "reservedTokens": 250,
                "cachedTokens": 180,
                "steps": 42,
                "prefixCacheTokens": 96,
                "prefixQueriedTokens": 400,
                "prefixHitTokens": 300,
                "sharedPromptTokens": 120,
                "kvCacheUsage": 0.25,  # 250 of 1000 positions reserved
            }
            labels = (("model", "llm"), ("version", "1.0"), ("worker", worker["id"]))
            found = await samples(lantern)
            assert found["serve_kv_cache_usage_perc"] == {labels: 0.25}
            assert found["serve_engine_num_requests_running"] == {labels: 3.0}  # 2 + 1 prefilling
            assert found["serve_engine_num_requests_waiting"] == {labels: 1.0}
            assert found["serve_engine_prefix_cache_tokens"] == {labels: 96.0}
            assert found["serve_engine_prefix_cache_queries_total"] == {labels: 400.0}
            assert found["serve_engine_prefix_cache_hits_total"] == {labels: 300.0}
            assert found["serve_engine_shared_prompt_tokens_total"] == {labels: 120.0}

    run(body)
