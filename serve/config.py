"""One `Config` for the server and `ModelSettings` for each model version.

Server precedence: defaults < config file (YAML, or TorchServe's ``config.properties``) <
environment (``LANTERN_<KEY>``) < command-line flags. Model precedence: server defaults < the
archive's ``model-config.yaml`` < registration parameters.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

logger = logging.getLogger(__name__)

ENV_PREFIX = "LANTERN_"
HttpServer = Literal["auto", "hypercorn", "uvicorn"]


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names the key."""


@dataclass(frozen=True)
class Config:
    """Server-wide settings. Names are TorchServe's ``config.properties`` keys where one exists."""

    inference_address: str = "http://127.0.0.1:8080"
    management_address: str = "http://127.0.0.1:8081"
    metrics_address: str = "http://127.0.0.1:8082"
    model_store: str | None = None
    workflow_store: str | None = None  # where .war names are looked up; the model store if unset
    load_models: list[str] = field(default_factory=list)
    # TorchServe's ``model_snapshot`` (config.properties): the models to load, with settings.
    model_snapshot: dict[str, Any] | None = None
    default_workers_per_model: int = 0  # 0: one per visible GPU, else 1 (TorchServe: one per core)
    job_queue_size: int = 100
    batch_size: int = 1
    max_batch_delay: int = 100  # milliseconds
    default_response_timeout: float = 120.0  # seconds
    default_startup_timeout: float = 120.0  # seconds
    unregister_model_timeout: float = 120.0  # seconds
    max_request_size: int = 6553500
    max_response_size: int = 6553500
    enable_model_api: bool = False
    disable_token_authorization: bool = False
    # With token authorization off, refuse (403) a Host header that names none of the port's own
    # addresses, localhost or allowed_hosts: DNS rebinding (serve/http/host_guard.py).
    check_host_header: bool = True
    allowed_hosts: list[str] = field(default_factory=list)
    token_expiration_min: float = 60.0
    key_file: str = "key_file.json"
    # Fixed keys (e.g. from a Kubernetes Secret); each one set replaces that generated key and
    # does not expire. Rotating it over /token still works until the next start.
    inference_key: str | None = None
    management_key: str | None = None
    api_key: str | None = None
    allowed_urls: list[str] = field(default_factory=list)
    download_max_size: int = 1 << 30
    download_timeout: float = 60.0
    enable_metrics_api: bool = True
    # The OpenAI-compatible API on the inference port (serve/http/openai.py, docs/llm.md).
    enable_openai_api: bool = True
    # A chat completion without max_tokens answers up to the rest of the model's context, as
    # OpenAI's does, but at most this many tokens (each answer reserves its KV cache up front).
    openai_chat_max_tokens: int = 2048
    number_of_gpu: int | None = None
    cpu_affinity: bool = False
    # A generative engine's workers keep OpenMP's own wait policy (threads spin between operators)
    # instead of OMP_WAIT_POLICY=PASSIVE: a few percent faster alone, many times slower beside
    # other work on the same cores (docs/performance.md, "The engine beside a CPU hog").
    engine_spin_wait: bool = False
    decode_input_request: bool = True
    # TorchServe's request envelope for every model's handler (handlers/request_envelope.py).
    service_envelope: str | None = None
    limit_max_image_pixels: bool = True
    blacklist_env_vars: str | None = None
    log_dir: str = "logs"
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"  # server and model logs; the access log is on or off (access_log)
    access_log: bool = True
    snapshot: bool = True
    http_server: HttpServer = "auto"  # uvicorn unless a hypercorn-only setting is on
    http2: bool = False  # serve HTTP/2 too (h2c; ALPN with TLS): hypercorn only
    drain_timeout: float = 30.0
    worker_restart_max_backoff: float = 30.0
    # A worker up this many seconds ends a crash streak: its replacement restarts without delay.
    worker_restart_backoff_reset: float = 60.0
    # A worker that crashes in service is restarted at once, at most this many times a minute per
    # model version (then with back-off): serve/core/restarts.py. 0: every restart backs off.
    worker_restart_immediate_per_minute: int = 10
    worker_max_rss_mb: int | None = None  # recycle a worker between batches past this RSS
    worker_spares: int = 1  # warm interpreters (torch imported) for the next worker start
    # A starting worker (or spare) imports torch & co. at this nice value, so that under load it
    # takes the CPU the serving workers leave (serve/worker/spares.py); 0: normal priority.
    worker_start_nice: int = 10
    # Request bodies of at least worker_shm_threshold_kb KiB go to the worker through a shared-
    # memory arena of worker_shm_arena_mb MiB per worker (serve/wire/shm.py); 0 MiB: always inline.
    worker_shm_arena_mb: int = 128
    worker_shm_threshold_kb: int = 64
    # A worker that keeps many requests in flight (a generative engine, asyncCommunication) and
    # answers no liveness ping for this many seconds is killed and restarted; 0: not checked.
    worker_liveness_timeout: float = 20.0
    max_retry_timeout_in_sec: float = 300.0
    work_dir: str | None = None  # extraction and sockets; a private temp dir when unset
    # Faults and limits (docs/faults.md).
    max_request_elements: int = 1 << 20  # tensor elements per OIP request (413 past it)
    max_header_size: int = 16 * 1024  # bytes of a request's line and headers (431 past it)
    workflow_max_nodes: int = 100  # nodes in a workflow's dag (400 past it)
    workflow_max_edges: int = 1000  # edges in a workflow's dag (400 past it)
    log_max_bytes: int = 100 * 1024 * 1024  # each log file rotates at this size (TorchServe's)
    log_backup_count: int = 5  # rotated files kept per log (TorchServe's DefaultRolloverStrategy)
    # Handler metrics as TorchServe declares them (serve/metrics/config.py).
    metrics_mode: str = "prometheus"  # prometheus | log | legacy (TorchServe's default: log)
    metrics_config: str | None = None  # a TorchServe metrics.yaml
    model_metrics_auto_detect: bool | None = None  # None: on without metrics_config, else off
    # Install each archive's requirements.txt into its own folder (serve/core/model_deps.py).
    install_py_dep_per_model: bool = False
    # Model updates (docs/model-updates.md): a watched store, version policies, admission.
    watch_model_store: bool = False
    # Triton's --model-control-mode: none (the default: enable_model_api and watch_model_store
    # decide, both off as in Triton's none), poll (the watched store; load/unload refused),
    # explicit (load/unload on: it sets enable_model_api).
    model_control_mode: str | None = None
    # OpenVINO Model Server's config.json (model_config_list): served, and re-read when it changes.
    ovms_config: str | None = None
    watch_interval: float = 2.0  # seconds between scans of the model store
    version_policy: str = "latest: 1"  # latest: N | specific: [versions] | all
    model_version_policies: dict[str, Any] = field(default_factory=dict)  # per model name
    # TF Serving's start (serve/store/tfs_config.py, docs/migrating-from-tf-serving.md): a
    # models.config to serve, re-read every model_config_file_poll_wait_seconds (0: read once),
    # or one model from a versioned tree.
    model_config_file: str | None = None
    model_config_file_poll_wait_seconds: float = 0.0
    model_name: str | None = None
    model_base_path: str | None = None
    batching_parameters_file: str | None = None  # TF Serving's BatchingParameters for every model
    memory_admission: bool = True  # refuse (507) workers the host has no memory for
    memory_reserve_mb: int = 256  # memory kept free on the host
    gpu_memory_reserve_mb: int = 512  # memory kept free on each GPU
    worker_memory_limit_mb: int = 0  # the most all workers together may use; 0: no limit
    # HTTPS (serve/http/tls.py) for the addresses that say https://, as TorchServe configures it.
    private_key_file: str | None = None
    certificate_file: str | None = None
    keystore: str | None = None
    keystore_pass: str = "changeit"
    keystore_type: str = "PKCS12"
    # CORS (serve/http/cors.py): off unless cors_allowed_origin is set, as in TorchServe.
    cors_allowed_origin: str | None = None
    cors_allowed_methods: str | None = None
    cors_allowed_headers: str | None = None
    # The console (serve/http/console.py) on the management port; "" or null turns it off.
    console_path: str | None = "/console"
    # gRPC (serve/grpc), TorchServe's keys; addresses are IPs, ports separate (0 picks a free one).
    enable_grpc: bool = True
    grpc_inference_address: str = "127.0.0.1"
    grpc_inference_port: int = 7070
    grpc_management_address: str = "127.0.0.1"
    grpc_management_port: int = 7071
    enable_grpc_ssl: bool = False
    # private_key_file / certificate_file (PEM, above) serve gRPC's TLS too, as in TorchServe.
    ts_open_inference_protocol: bool | None = None  # OIP over gRPC; unset: on (Lantern's default)

    @classmethod
    def load(
        cls,
        *,
        config_file: str | os.PathLike[str] | None = None,
        ts_config_file: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> Config:
        """Build the config in precedence order; raises `ConfigError` naming the bad key."""
        values: dict[str, Any] = {}
        if ts_config_file:
            values.update(read_properties(Path(ts_config_file)))
        if config_file:
            values.update(read_yaml_config(Path(config_file)))
        values.update(_from_env(os.environ if env is None else env))
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Config:
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in known:
                raise ConfigError(f"Config '{key}' is not a known setting")
            kwargs[key] = _coerce(key, raw, known[key].type)
        tf_serving = kwargs.get("model_base_path") or kwargs.get("model_config_file")
        if tf_serving and not kwargs.get("model_store"):
            # TF Serving's layout: /models/<name>/<version>/ beside /models/models.config
            kwargs["model_store"] = str(Path(str(tf_serving)).resolve().parent)
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        for key in ("inference_address", "management_address", "metrics_address"):
            try:
                host_port(getattr(self, key))
            except ConfigError as exc:
                raise ConfigError(f"Config '{key}': {exc}") from None
        if self.http_server not in ("auto", "hypercorn", "uvicorn"):
            raise ConfigError("Config 'http_server' must be 'auto', 'hypercorn' or 'uvicorn'")
        if self.service_envelope not in (None, "", "body", "json", "kserve", "kservev2"):
            raise ConfigError("Config 'service_envelope' must be body, json, kserve or kservev2")
        if self.log_format not in ("text", "json"):
            raise ConfigError("Config 'log_format' must be 'text' or 'json'")
        if str(self.log_level).upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError("Config 'log_level' must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        if self.console_path and (
            not self.console_path.startswith("/") or self.console_path.rstrip("/") == ""
        ):
            raise ConfigError("Config 'console_path' must be a path such as /console, or empty")
        if self.worker_restart_immediate_per_minute < 0:
            raise ConfigError("Config 'worker_restart_immediate_per_minute' must be 0 or more")
        if self.worker_spares < 0:
            raise ConfigError("Config 'worker_spares' must be 0 or more")
        if not 0 <= self.worker_start_nice <= 19:
            raise ConfigError("Config 'worker_start_nice' must be between 0 and 19")
        if self.worker_shm_arena_mb < 0:
            raise ConfigError("Config 'worker_shm_arena_mb' must be 0 or more")
        if self.worker_shm_threshold_kb < 1:
            raise ConfigError("Config 'worker_shm_threshold_kb' must be 1 or more")
        if self.worker_liveness_timeout < 0:
            raise ConfigError("Config 'worker_liveness_timeout' must be 0 or more")
        if (
            self.enable_grpc
            and self.enable_grpc_ssl
            and not (self.private_key_file and self.certificate_file)
        ):
            raise ConfigError(
                "Config 'enable_grpc_ssl' needs 'private_key_file' and 'certificate_file'"
            )
        for key in ("job_queue_size", "batch_size", "max_request_size", "max_request_elements"):
            if getattr(self, key) < 1:
                raise ConfigError(f"Config '{key}' must be at least 1")
        for key in ("workflow_max_nodes", "workflow_max_edges"):
            if getattr(self, key) < 1:
                raise ConfigError(f"Config '{key}' must be at least 1")
        if self.max_header_size < 1024:
            raise ConfigError("Config 'max_header_size' must be at least 1024 bytes")
        if str(self.metrics_mode).lower() not in ("prometheus", "log", "legacy"):
            raise ConfigError("Config 'metrics_mode' must be 'prometheus', 'log' or 'legacy'")
        if self.model_control_mode not in (None, "poll", "explicit"):
            raise ConfigError("Config 'model_control_mode' must be 'none', 'poll' or 'explicit'")
        if self.watch_model_store and not self.model_store:
            raise ConfigError("Config 'watch_model_store' needs a model_store to watch")
        if self.model_base_path and not self.model_name:
            raise ConfigError("Config 'model_base_path' needs a 'model_name'")
        if self.model_base_path and self.model_config_file:
            raise ConfigError("Give either 'model_config_file' or 'model_base_path', not both")
        if self.watch_interval <= 0:
            raise ConfigError("Config 'watch_interval' must be more than 0 seconds")

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def default_model_settings(self) -> ModelSettings:
        return ModelSettings(
            batch_size=self.batch_size,
            max_batch_delay=self.max_batch_delay,
            response_timeout=self.default_response_timeout,
            startup_timeout=self.default_startup_timeout,
            job_queue_size=self.job_queue_size,
            max_retry_timeout_in_sec=self.max_retry_timeout_in_sec,
            worker_max_rss_mb=self.worker_max_rss_mb,
        )


# Per-model settings: attribute name → model-config.yaml key (TorchServe's camelCase).
_MODEL_KEYS = {
    "min_workers": "minWorkers",
    "max_workers": "maxWorkers",
    "batch_size": "batchSize",
    "max_batch_delay": "maxBatchDelay",
    "response_timeout": "responseTimeout",
    "startup_timeout": "startupTimeout",
    "device_type": "deviceType",
    "device_ids": "deviceIds",
    "job_queue_size": "jobQueueSize",
    "hard_timeout": "hardTimeout",
    "num_threads": "numThreads",
    "cpu_affinity": "cpuAffinity",
    "max_retry_timeout_in_sec": "maxRetryTimeoutInSec",
    "worker_max_rss_mb": "workerMaxRssMb",
    "memory_per_worker_mb": "memoryPerWorkerMB",
    "gpu_memory_per_worker_mb": "gpuMemoryPerWorkerMB",
}


@dataclass(frozen=True)
class ModelSettings:
    """How one model version is served. Times: batch delay in ms, timeouts in seconds."""

    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int = 1
    max_batch_delay: int = 100
    response_timeout: float = 120.0
    startup_timeout: float = 120.0
    device_type: str | None = None  # "cpu" or "gpu"
    device_ids: list[int] | None = None
    job_queue_size: int = 100
    hard_timeout: float | None = None  # kill a worker whose batch runs this long; 2× response
    num_threads: int | None = None  # torch / ONNX Runtime intra-op threads per worker
    cpu_affinity: bool | None = None
    max_retry_timeout_in_sec: float = 300.0
    worker_max_rss_mb: int | None = None  # recycle a worker between batches past this RSS (MiB)
    memory_per_worker_mb: int | None = None  # admission's figure for one worker (overrides RSS)
    gpu_memory_per_worker_mb: int | None = None  # the same on its GPU (overrides the measure)

    def merged(self, values: Mapping[str, Any]) -> ModelSettings:
        """These settings with ``values`` (attribute or camelCase names) laid over them."""
        by_yaml = {v: k for k, v in _MODEL_KEYS.items()}
        types = {f.name: f.type for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            name = by_yaml.get(key, key)
            if name not in types or raw is None:
                continue
            try:
                changes[name] = _coerce(name, raw, types[name])
            except ConfigError as exc:
                # TorchServe logs and ignores a wrong type in model-config.yaml; we say so.
                logger.warning("Ignoring model setting %s: %s", key, exc)
        settings = dataclasses.replace(self, **changes)
        if settings.batch_size < 1:
            settings = dataclasses.replace(settings, batch_size=1)
        return settings

    @property
    def effective_hard_timeout(self) -> float:
        return self.hard_timeout if self.hard_timeout else 2 * self.response_timeout

    def as_yaml_dict(self) -> dict[str, Any]:
        return {
            _MODEL_KEYS[f.name]: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None
        }


def host_port(address: str) -> tuple[str, int]:
    """``http://127.0.0.1:8080`` or ``127.0.0.1:8080`` → (host, port)."""
    text = address if "://" in address else f"http://{address}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ConfigError(f"Address '{address}' must look like http://HOST:PORT")
    return parts.hostname, parts.port


def read_yaml_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of settings")
    return data


# TorchServe keys that have no meaning here: accepted and ignored with a log line.
_TS_IGNORED = {
    "vmargs",
    "number_of_netty_threads",
    "netty_client_threads",
    "async_logging",
    "prefer_direct_buffer",
    "use_native_io",
    "io_ratio",
    "initial_worker_port",
    "initial_distribution_port",
    "disable_system_metrics",
    "enable_envvars_config",
    "models",
    "use_env_allowed_urls",
}
_TS_RENAMED = {"default_response_timeout": "default_response_timeout"}


def read_properties(path: Path) -> dict[str, Any]:
    """The keys of a TorchServe ``config.properties`` that apply to Lantern."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from exc
    raw: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if sep < 0:
            continue
        raw[line[:sep].strip()] = line[sep + 1 :].strip()
    known = {f.name for f in fields(Config)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        key = _TS_RENAMED.get(key, key)
        if key == "allowed_urls":
            values[key] = [p.strip() for p in value.split(",") if p.strip()]
        elif key == "load_models":
            values[key] = [m.strip() for m in value.split(",") if m.strip()]
        elif key == "model_snapshot":
            values[key] = _json_object(key, value)
        elif key in known:
            values[key] = value
        elif key not in _TS_IGNORED:
            logger.warning("config.properties key %r is not used by Lantern", key)
    return values


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    known = {f.name for f in fields(Config)}
    values: dict[str, Any] = {}
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower()
            if key in known:
                values[key] = value
    return values


def _json_object(key: str, raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise ConfigError(f"Config '{key}' is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"Config '{key}' must be a JSON object")
    return value


def _coerce(key: str, raw: Any, annotation: Any) -> Any:
    kind = str(annotation)
    if kind.startswith("dict"):
        return None if raw is None else _json_object(key, raw)
    try:
        if kind.startswith("bool"):
            if isinstance(raw, bool):
                return raw
            if raw is None and "None" in kind:
                return None
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null")):
            if "None" in kind:
                return None
            if kind == "str" and isinstance(raw, str):  # a plain string may be empty or "none"
                return raw.strip()
            raise ValueError(raw)
        if kind.startswith("int"):
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
        if kind.startswith("list"):
            if isinstance(raw, str):
                text = raw.strip()
                items = json.loads(text) if text.startswith("[") else text.split(",")
            else:
                items = list(raw)
            if "int" in kind:
                return [int(i) for i in items]
            return [str(i).strip() for i in items if str(i).strip()]
        return raw if not isinstance(raw, str) else raw.strip()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Config '{key}' has a value of the wrong type: {raw!r}") from exc
