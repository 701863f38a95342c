"""The raw limit: the model's batched decode step in this process, with a KV cache.

For each batch size, ``batch`` copies of one prompt are prefilled together into a
``DynamicCache``, then ``steps`` decode steps of shape ``(batch, 1)`` are timed (greedy, the
argmax fed back, as the engine's step does). Tokens/s is ``batch`` over the median step time;
no HTTP, no tokenizer on the way out, no scheduling: what a server could reach at most.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def decode_steps(model: Any, prompt_ids: Any, batch: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` decode steps at ``batch`` sequences."""
    import torch
    from transformers import DynamicCache

    ids = prompt_ids.repeat(batch, 1)
    cache = DynamicCache()
    times = []
    with torch.inference_mode():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
        for _ in range(steps):
            t0 = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t0)
    return times


def raw(
    model_dir: str, batches: list[int], steps: int, threads: int, prompt: str, dtype: str = "auto"
) -> dict[str, Any]:
    """Per batch size: the decode step's p50 and tokens/s (``batch / p50``)."""
    import torch

    from handlers.generation.loading import load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir, {"dtype": dtype}, torch.device("cpu"))
    prompt_ids = tokenizer(prompt, return_tensors="pt").input_ids
    levels = []
    for batch in batches:
        decode_steps(model, prompt_ids, batch, 4)  # warm the kernels at this shape
        times = decode_steps(model, prompt_ids, batch, steps)
        p50 = statistics.median(times)
        levels.append(
            {
                "batch": batch,
                "step_p50_s": p50,
                "step_min_s": min(times),
                "tokens_per_s": batch / p50,
            }
        )
    return {"raw": True, "threads": threads, "steps": steps, "dtype": dtype, "levels": levels}
