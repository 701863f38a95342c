"""The TorchServe describe-model object for ``GET /models/{name}[/{version}]``."""

from __future__ import annotations

import time
from typing import Any

from serve.core.host import process_memory
from serve.core.jobs import WorkerState
from serve.core.model import ModelVersion
from serve.core.pool import WorkerInfo


def describe_model(model: ModelVersion) -> dict[str, Any]:
    """TorchServe 0.12's describe object (``customizedMetadata`` is added by the caller)."""
    s = model.settings
    workers = [_describe_worker(info) for info in model.workers()]
    data: dict[str, Any] = {
        "modelName": model.name,
        "modelVersion": model.version,
        "modelUrl": model.source.url,
        "runtime": model.source.runtime,
        "minWorkers": model.min_workers,
        "maxWorkers": model.max_workers,
        "batchSize": s.batch_size,
        "maxBatchDelay": s.max_batch_delay,
        "responseTimeout": int(s.response_timeout),
        "startupTimeout": int(s.startup_timeout),
        "maxRetryTimeoutInSec": int(s.max_retry_timeout_in_sec),
        "clientTimeoutInMills": 0,
        "parallelType": "",
        "parallelLevel": 0,
        "deviceType": s.device_type or ("gpu" if any(w["gpu"] for w in workers) else "cpu"),
        "continuousBatching": model.sequences.continuous,  # with or without sequences
        # Lantern's: a generative engine's model (the OpenAI and generate routes, the console's
        # chat); maxModelLen is its longest sequence, once a worker has reported it.
        "generative": model.runs_engine,
        "useJobTicket": False,
        "useVenv": False,
        # Sequence batching (serve.core.sequences); all 0 for a model without, as in TorchServe.
        "stateful": model.sequences.enabled,
        "sequenceMaxIdleMSec": model.sequences.sequence_max_idle_msec,
        "sequenceTimeoutMSec": model.sequences.sequence_timeout_msec,
        "maxNumSequence": model.sequences.max_num_sequence,
        "maxSequenceJobQueueSize": model.sequences.max_sequence_job_queue_size,
        "loadedAtStartup": model.loaded_at_startup,
        "workers": workers,
        "jobQueueStatus": {
            "remainingCapacity": model.remaining_capacity(),
            "pendingRequests": model.pending_requests(),
        },
    }
    if s.device_ids:
        data["deviceIds"] = s.device_ids
    if model.runs_engine and model.max_model_len() is not None:
        data["maxModelLen"] = model.max_model_len()
    return data


def _describe_worker(info: WorkerInfo) -> dict[str, Any]:
    pid = info.pid
    memory = process_memory(pid)
    data: dict[str, Any] = {
        "id": info.worker_id,
        "startTime": _iso(info.started_at if info.started_at is not None else time.time()),
        "status": _worker_status(info),
        "memoryUsage": memory.rss if memory else 0,  # TorchServe's field: RSS in bytes
        # Lantern's: PSS (its share of pages it maps with others) and USS (pages only it maps:
        # what its exit frees), bytes; null where /proc/PID/smaps_rollup cannot be read.
        "memoryPss": memory.pss if memory else None,
        "memoryUss": memory.uss if memory else None,
        "pid": pid or -1,
        "gpu": info.gpu_id is not None,
        "gpuUsage": "N/A",
        "warmupSeconds": info.warmup_seconds or 0.0,
        "gpuMemoryUsage": info.gpu_memory or 0,
    }
    if info.limits:  # it runs many requests at once (serve/worker/concurrent.py)
        data["limits"] = info.limits
        data["runningRequests"] = info.in_flight
    if info.engine:  # a generative engine's live counts, as its worker last reported them
        data["engine"] = _engine(info)
    return data


_ENGINE_KEYS = {
    "waiting": "waiting",
    "prefilling": "prefilling",
    "running": "running",
    "reserved_tokens": "reservedTokens",
    "cached_tokens": "cachedTokens",
    "steps": "steps",
    "prefix_cache_tokens": "prefixCacheTokens",
    "prefix_queried_tokens": "prefixQueriedTokens",
    "prefix_hit_tokens": "prefixHitTokens",
    "shared_prompt_tokens": "sharedPromptTokens",
    "cuda_graph_hits": "cudaGraphHits",
    "cuda_graph_captures": "cudaGraphCaptures",
}


def _engine(info: WorkerInfo) -> dict[str, Any]:
    data: dict[str, Any] = {
        camel: info.engine[key] for key, camel in _ENGINE_KEYS.items() if key in info.engine
    }
    usage = info.kv_cache_usage
    if usage is not None:
        data["kvCacheUsage"] = round(usage, 4)
    return data


def _worker_status(info: WorkerInfo) -> str:
    if info.retiring or info.state == WorkerState.STOPPING:
        return "UNLOADING"  # a retiring worker finishing its last batch is on its way out
    if info.state in (WorkerState.READY, WorkerState.BUSY):
        return "READY"
    return info.state.value


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def failed_versions(failures: dict[str, Any]) -> dict[str, Any]:
    """Versions of a model that failed to load, warm up or be admitted (Lantern's addition)."""
    if not failures:
        return {}
    return {
        "failedVersions": [
            {"version": f.version, "error": f.message, "time": _iso(f.at)}
            for f in failures.values()
        ]
    }
