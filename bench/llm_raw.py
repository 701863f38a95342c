"""The raw limit: the model's batched decode step in this process, with a KV cache.

For each batch size, ``batch`` copies of one prompt are prefilled together into a
``DynamicCache``, then ``steps`` decode steps of shape ``(batch, 1)`` are timed (greedy, the
argmax fed back, as the engine's step does). Tokens/s is ``batch`` over the median step time;
no HTTP, no tokenizer on the way out, no scheduling, no prefill: what a server could reach at
most while every stream decodes.

A server's streams also need their prompts prefilled, which at short answers is a real share of
the work. ``answers_tokens_per_s`` is that limit: the bench's own prompts, ``batch`` at a time,
answered whole by one batched greedy ``generate`` (left-padded prefill, then ``max_tokens``
tokens each), in this process.

``engine_step_p50_s`` is Lantern's own engine (handlers/generation) in this process: ``batch``
copies of the prompt added at once, the median of its full-batch decode steps (the step as the
worker runs it: the packed forward, sampling, detokenizing). Its forward is not transformers'
(its own attention and cache: handlers/generation/ragged.py), so it can be faster than the raw
step; a server's tokens/s against it is what serving costs beyond the engine.

``engine_load_tokens_per_s`` (given ``load_requests``, with ``load_waves``: bench.llm's
``--requests`` and ``--waves``) is Lantern's engine in this process under the load generator's
pattern: ``batch`` streams, each adding its next prompt (the bench's prompts in turn) the step
its last answer ends, until as many requests as bench.llm sends are answered, with the prefix
cache as a served worker has it (``engine_load_no_prefix_tokens_per_s``: without). It
holds everything the served engine does — prefills as requests come and go, rows of different
lengths — and nothing of the server: a server's tokens/s against it is what serving costs.
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


def engine_steps(model: Any, tokenizer: Any, prompt: str, batch: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` full-batch decode steps of Lantern's engine at ``batch``."""
    from handlers.generation.engine import Engine
    from handlers.generation.params import GenerationRequest, SamplingParams
    from handlers.generation.scheduler import EngineLimits

    length = len(tokenizer.encode(prompt)) + steps + 8
    limits = EngineLimits(batch, batch * length, length, batch * length)
    engine = Engine(model, tokenizer, limits)
    params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add(str(i), GenerationRequest(prompt, params))
    while engine.stats()["running"] < batch:  # the prefill, not timed
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return times


def engine_load(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    streams: int,
    requests: int,
    max_tokens: int,
    prefix_cache_tokens: int,
) -> tuple[int, float]:
    """(tokens, seconds) of Lantern's engine answering ``requests`` prompts over ``streams``
    streams, each stream's next prompt added the step its last answer ends."""
    from handlers.generation.engine import Engine
    from handlers.generation.loading import DEFAULT_CACHED_TOKENS, DEFAULT_PREFILL_CHUNK
    from handlers.generation.params import GenerationRequest, SamplingParams
    from handlers.generation.scheduler import EngineLimits

    # a served worker's limits (examples/llm's max_model_len 2048, the default prefill chunk)
    limits = EngineLimits(
        streams, DEFAULT_CACHED_TOKENS, 2048, DEFAULT_PREFILL_CHUNK, prefix_cache_tokens
    )
    engine = Engine(model, tokenizer, limits)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    queue = [prompts[i % len(prompts)] for i in range(requests)]
    queue.reverse()

    def send() -> None:
        engine.add(str(len(queue)), GenerationRequest(queue.pop(), params))

    started = time.perf_counter()
    for _ in range(min(streams, len(queue))):
        send()
    produced = 0
    while engine.has_work():
        for out in engine.step():
            produced += len(out.token_ids)
            if out.finished and queue:
                send()
    return produced, time.perf_counter() - started


def answer_batch(model: Any, tokenizer: Any, prompts: list[str], max_tokens: int) -> float:
    """Seconds to answer ``prompts`` together with ``max_tokens`` tokens each (greedy)."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **batch,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    elapsed = time.perf_counter() - started
    assert out.shape[1] - batch.input_ids.shape[1] == max_tokens
    return elapsed


def raw(
    model_dir: str,
    batches: list[int],
    steps: int,
    threads: int,
    prompt: str,
    dtype: str = "auto",
    prompts: list[str] | None = None,
    max_tokens: int = 32,
    load_requests: int = 0,
    load_waves: int = 1,
) -> dict[str, Any]:
    """Per batch size: the decode step's p50 and tokens/s (``batch / p50``)."""
    import torch

    from handlers.generation.loading import DEFAULT_PREFIX_CACHE_TOKENS, load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir, {"dtype": dtype}, torch.device("cpu"))
    prompt_ids = tokenizer(prompt, return_tensors="pt").input_ids
    levels = []
    for batch in batches:
        decode_steps(model, prompt_ids, batch, 4)  # warm the kernels at this shape
        times = decode_steps(model, prompt_ids, batch, steps)
        p50 = statistics.median(times)
        level = {
            "batch": batch,
            "step_p50_s": p50,
            "step_min_s": min(times),
            "tokens_per_s": batch / p50,
        }
        engine_steps(model, tokenizer, prompt, batch, 4)  # warm
        engine_p50 = statistics.median(engine_steps(model, tokenizer, prompt, batch, steps))
        level |= {"engine_step_p50_s": engine_p50, "engine_tokens_per_s": batch / engine_p50}
        if prompts:
            group = [prompts[i % len(prompts)] for i in range(batch)]
            answer_batch(model, tokenizer, group, 2)  # warm
            seconds = min(answer_batch(model, tokenizer, group, max_tokens) for _ in range(2))
            level["answers_tokens_per_s"] = batch * max_tokens / seconds
        if prompts and load_requests:
            requests = max(load_requests, load_waves * batch)  # as bench.llm's level
            for key, capacity in (
                ("engine_load", DEFAULT_PREFIX_CACHE_TOKENS),
                ("engine_load_no_prefix", 0),
            ):
                produced, seconds = engine_load(
                    model, tokenizer, prompts, batch, requests, max_tokens, capacity
                )
                level[f"{key}_tokens_per_s"] = produced / seconds
        levels.append(level)
    return {"raw": True, "threads": threads, "steps": steps, "dtype": dtype, "levels": levels}
