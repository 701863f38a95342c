"""A small async load generator for OpenAI-compatible servers: streamed completions, measured.

    python -m bench.llm --url http://127.0.0.1:8080/v1 --model smollm2 \
        --concurrency 1,4,16 --requests 16 --max-tokens 32

Each request streams ``POST /completions`` with a prompt from a fixed set, ``temperature: 0``,
``max_tokens`` and the fields that fix the output length in the server's dialect (``--length``:
vLLM's ``ignore_eos`` + ``min_tokens``, llama-cpp-python's ``min_tokens``, ``transformers
serve``'s ``generation_config``); the tokens actually returned are counted either way. Per
concurrency level it reports output tokens/s, requests/s, time to first token and inter-token
latency (p50/p99, from the SSE chunks' arrival times), errors, and with ``--pid`` the CPU
seconds of the server's process tree per generated token; ``--json`` writes them. The same
client drives every server, so their figures compare. ``--floor MODEL_DIR`` measures one
``generate`` call per request, one at a time, in-process on an unpacked archive's model;
``--raw MODEL_DIR`` the batched decode step (bench/llm_raw.py). ``python -m bench.llm_compare``
runs every server and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import aiohttp

from bench import procstat
from bench.llm_stats import Sample, percentile, summarise

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue to a ten year old.",
    "List five uses for a paperclip.",
    "What is the capital of France, and what is it known for?",
    "Describe the water cycle in three sentences.",
    "Give me a recipe for a simple tomato soup.",
    "Summarise the plot of a detective novel you invent.",
    "Why do cats purr?",
]


async def one(client: aiohttp.ClientSession, args: argparse.Namespace, prompt: str) -> Sample:
    body: dict[str, Any] = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(length_fields(args.length, args.max_tokens))
    sample = Sample()
    started = time.perf_counter()
    last = started
    try:
        async with client.post(f"{args.url}/completions", json=body) as resp:
            if resp.status != 200:
                sample.error = f"{resp.status}: {(await resp.read())[:200]!r}"
                return sample
            async for raw in resp.content:  # one SSE line at a time
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    sample.tokens = int(chunk["usage"].get("completion_tokens", sample.tokens))
                if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                    continue
                now = time.perf_counter()
                if sample.ttft is None:
                    sample.ttft = now - started
                else:
                    sample.gaps.append(now - last)
                last = now
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
    return sample


def length_fields(style: str, tokens: int) -> dict[str, Any]:
    """The body fields that make a server return exactly ``tokens`` tokens, in its dialect:
    vLLM's ``ignore_eos`` + ``min_tokens`` (Lantern), llama-cpp-python's ``min_tokens``,
    ``transformers serve``'s ``generation_config`` JSON, or nothing (stop at EOS)."""
    if style == "ignore_eos":
        return {"ignore_eos": True, "min_tokens": tokens}
    if style == "min_tokens":
        return {"min_tokens": tokens}
    if style == "generation_config":
        config = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
        return {"generation_config": json.dumps(config)}
    return {}


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (a frontend's workers, their helpers)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(procstat.children(current))
    return found


async def level(args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(max(args.requests, args.waves * concurrency)):
        queue.put_nowait(PROMPTS[i % len(PROMPTS)])
    samples: list[Sample] = []
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                samples.append(await one(client, args, queue.get_nowait()))

        pids = tree(args.pid) if args.pid else []
        before = procstat.cpu_snapshot(pids)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = procstat.cpu_delta(before, procstat.cpu_snapshot(tree(args.pid))) if pids else None
    return summarise(samples, concurrency, elapsed, cpu)


def floor(
    model_dir: str, requests: int, max_tokens: int, threads: int, dtype: str = "auto"
) -> dict[str, Any]:
    """The floor: one ``generate`` call per request, one at a time, in this process (greedy,
    fixed length); time to first token from a 1-token ``generate``, the rest per token."""
    import torch

    from handlers.generation.loading import load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir, {"dtype": dtype}, torch.device("cpu"))
    ttfts, gaps, tokens = [], [], 0
    started = time.perf_counter()
    for i in range(requests):
        ids = tokenizer(PROMPTS[i % len(PROMPTS)], return_tensors="pt")
        with torch.no_grad():
            t0 = time.perf_counter()
            model.generate(**ids, max_new_tokens=1, do_sample=False)
            t1 = time.perf_counter()
            model.generate(
                **ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
            )
            t2 = time.perf_counter()
        ttfts.append(t1 - t0)
        gaps.append(((t2 - t1) - (t1 - t0)) / max(1, max_tokens - 1))
        tokens += max_tokens
    elapsed = time.perf_counter() - started
    generate_time = elapsed - sum(ttfts)  # the 1-token calls are measurement, not the floor
    return {
        "floor": True,
        "requests": requests,
        "output_tokens_per_s": tokens / generate_time,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "itl_p50_s": percentile(gaps, 0.5),
        "itl_p99_s": percentile(gaps, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the API's base, e.g. http://host:8080/v1")
    parser.add_argument("--model", help="the model's name on the server")
    parser.add_argument("--floor", metavar="MODEL_DIR", help="measure the floor instead")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads (--floor, --raw)"
    )
    parser.add_argument("--dtype", default="auto", help="the model's dtype (--floor, --raw)")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--requests", type=int, default=32, help="requests per level (at least)")
    parser.add_argument(
        "--waves",
        type=int,
        default=1,
        help="at least this many requests per stream at each level (more: less of the run is "
        "the first burst's prefill and the last requests' tail)",
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--length",
        default="ignore_eos",
        choices=["ignore_eos", "min_tokens", "generation_config", "none"],
        help="how to ask for exactly --max-tokens tokens (the server's dialect)",
    )
    parser.add_argument("--pid", type=int, help="the server's root process: CPU of its tree")
    parser.add_argument("--raw", metavar="MODEL_DIR", help="the batched decode step in-process")
    parser.add_argument("--steps", type=int, default=16, help="decode steps per batch for --raw")
    parser.add_argument(
        "--load-limit",
        action="store_true",
        help="--raw also runs Lantern's engine in-process under the load's pattern (--requests, "
        "--waves): bench/llm_raw.py's engine_load",
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if args.raw:
        from bench.llm_raw import raw

        batches = [int(c) for c in args.concurrency.split(",")]
        levels = raw(
            args.raw,
            batches,
            args.steps,
            args.threads,
            PROMPTS[0],
            args.dtype,
            prompts=PROMPTS,
            max_tokens=args.max_tokens,
            load_requests=args.requests if args.load_limit else 0,
            load_waves=args.waves,
        )
        print(json.dumps(levels), flush=True)
        return
    if args.floor:
        result = floor(args.floor, args.requests, args.max_tokens, args.threads, args.dtype)
        print(json.dumps(result), flush=True)
        return
    if not args.url or not args.model:
        parser.error("--url and --model (or --floor MODEL_DIR)")
    results = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        result = asyncio.run(level(args, concurrency))
        results.append(result)
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}
        print(json.dumps(shown), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
