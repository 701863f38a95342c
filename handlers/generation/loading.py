"""Finding and loading an archive's causal LM (a ``save_pretrained`` folder or a ``.gguf`` file).

The handler's section of model-config.yaml (``handler:``) may name the model: ``model_path`` (a
folder or a ``.gguf`` file, relative to the model directory) and ``dtype``. Without
``model_path`` the model directory itself is used when it holds a ``config.json``, else its one
``.gguf`` file. ``dtype: auto`` (the default) is bfloat16 where the device computes it natively
(a CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX), else float32, and float32 for a
``.gguf`` file (transformers keeps its weights packed and computes them in float32); ``float32``,
``bfloat16`` and ``float16`` choose. On this project's CPU bfloat16 halves the decode step and
the prefill (docs/performance.md). The engine's limits come from the same section:
``max_running_sequences``, ``max_cached_tokens``, ``max_model_len``, ``prefill_chunk_tokens`` and
``prefix_cache_tokens`` (0 turns prefix caching off); ``cuda_graphs: false`` turns off the
CUDA graphs of decode steps on a GPU.
"""

from __future__ import annotations

import os
from typing import Any

from handlers.exceptions import HandlerLoadError
from handlers.generation.engine import model_context_length
from handlers.generation.scheduler import EngineLimits

DEFAULT_RUNNING = 8
DEFAULT_CACHED_TOKENS = 16384
DEFAULT_PREFILL_CHUNK = 256
# On a GPU a step's cost hardly grows with its prompt tokens until there are thousands, while
# every step costs the host the same: 256 tokens a step prefilled a burst of 256 short prompts in
# 15 eager steps (docs/performance.md, GPU run 3).
DEFAULT_PREFILL_CHUNK_GPU = 2048
DEFAULT_PREFIX_CACHE_TOKENS = 4096
LIMIT_KEYS = (
    "max_running_sequences",
    "max_cached_tokens",
    "max_model_len",
    "prefill_chunk_tokens",
    "prefix_cache_tokens",
)


def find_model(model_dir: str, config: dict) -> tuple[str, str | None]:
    """``(folder, gguf file name or None)`` of the model to load from ``model_dir``."""
    named = config.get("model_path")
    path = os.path.join(model_dir, named) if named else model_dir
    if os.path.isfile(path) and path.endswith(".gguf"):
        return os.path.dirname(path), os.path.basename(path)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, None
    ggufs = (
        sorted(f for f in os.listdir(path) if f.endswith(".gguf")) if os.path.isdir(path) else []
    )
    if len(ggufs) == 1:
        return path, ggufs[0]
    found = f"{len(ggufs)} .gguf files" if ggufs else "no config.json or .gguf file"
    raise HandlerLoadError(
        f"text_generation: {path} holds {found}; name the model with handler.model_path "
        "in model-config.yaml (a save_pretrained folder or one .gguf file)"
    )


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not readable)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def auto_dtype(device: Any, flags: set[str] | None = None) -> str:
    """``bfloat16`` where ``device`` computes it natively, else ``float32``."""
    if str(device).startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if any(flag in flags for flag in CPU_BF16_FLAGS) else "float32"


def load_model(model_dir: str, config: dict, device: Any) -> tuple[Any, Any]:
    """The model (in eval mode, on ``device``) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = find_model(model_dir, config)
    dtype_name = str(config.get("dtype", "auto"))
    if dtype_name == "auto":
        dtype_name = "float32" if gguf else auto_dtype(device)
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise HandlerLoadError(f"text_generation: unknown dtype {dtype_name!r}")
    extra = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **extra)
    return model.to(device).eval(), tokenizer


def _integer(config: dict, key: str, default: int, least: int = 1) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
        raise HandlerLoadError(f"text_generation: handler.{key} must be {kind}")
    return value


def cuda_graphs(config: dict) -> bool:
    """``handler.cuda_graphs`` (default true): replay decode steps from CUDA graphs on a GPU
    (`handlers.generation.graphs`); false runs every step eagerly. No effect on a CPU."""
    value = config.get("cuda_graphs", True)
    if not isinstance(value, bool):
        raise HandlerLoadError("text_generation: handler.cuda_graphs must be true or false")
    return value


def _prefill_chunk(model: Any) -> int:
    """The default prompt tokens a step prefills: more on a GPU."""
    device = getattr(model, "device", None)
    return (
        DEFAULT_PREFILL_CHUNK_GPU
        if getattr(device, "type", "") == "cuda"
        else DEFAULT_PREFILL_CHUNK
    )


def engine_limits(config: dict, model: Any, batch_size: int | None) -> EngineLimits:
    """The engine's limits: the config's values, else defaults (the model's own context).

    ``max_model_len`` may exceed ``max_cached_tokens``: a request longer than the model allows is a
    400, one that the model allows but this worker's budget never can hold is a 507.
    """
    running_default = batch_size if batch_size and batch_size > 1 else DEFAULT_RUNNING
    cached = _integer(config, "max_cached_tokens", DEFAULT_CACHED_TOKENS)
    context = model_context_length(model) or cached
    model_len = _integer(config, "max_model_len", context)
    if model_len > context:
        raise HandlerLoadError(
            f"text_generation: handler.max_model_len {model_len} exceeds the model's "
            f"context {context}"
        )
    return EngineLimits(
        max_running_sequences=_integer(config, "max_running_sequences", running_default),
        max_cached_tokens=cached,
        max_model_len=model_len,
        prefill_chunk_tokens=_integer(config, "prefill_chunk_tokens", _prefill_chunk(model)),
        prefix_cache_tokens=_integer(
            config, "prefix_cache_tokens", DEFAULT_PREFIX_CACHE_TOKENS, least=0
        ),
    )
