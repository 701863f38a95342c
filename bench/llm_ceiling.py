"""Lantern at one concurrency against the raw limits, alternating, round after round.

    python -m bench.llm_ceiling --store STORE --concurrency 32 --rounds 5

One Lantern server (``serve start --foreground`` on ``STORE/smollm2.mar``) stays up; each round
runs the raw limits in their own process (``bench.llm --raw`` at a batch of ``--concurrency``: the
transformers decode step, Lantern's engine stepping in-process, whole answers by one batched
``generate``, Lantern's engine in-process under the same load: bench/llm_raw.py), then drives
the server at ``--concurrency`` streams (``bench.llm``), so that every ratio compares two runs
taken seconds apart: on a shared machine the speed moves from minute to minute (20% here), and a
ratio of runs minutes apart says more about the machine than the server.
Prints one row per round (after bench.llm's own line for each served run) and the median of
each ratio; ``--json`` keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from bench.llm_compare import drive, in_process, lantern_up, parse_with_run_arguments, unpack
from handlers.generation.loading import auto_dtype

RATIOS = (
    ("raw step", "tokens_per_s"),
    ("whole answers", "answers_tokens_per_s"),
    ("engine step", "engine_tokens_per_s"),
    ("engine under load", "engine_load_tokens_per_s"),
)


def row(round_: int, raw: dict[str, Any], lantern: dict[str, Any]) -> tuple[str, dict[str, float]]:
    tps = float(lantern["output_tokens_per_s"])
    ratios = {name: tps / raw[key] for name, key in RATIOS if raw.get(key)}
    limits = [f"{raw.get(key, 0):.0f}" for _, key in RATIOS]
    limits.append(f"{raw.get('engine_load_no_prefix_tokens_per_s', 0):.0f}")
    cells = [f"{round_}", f"{raw['step_p50_s'] * 1000:.1f}", *limits, f"{tps:.0f}",
             f"{lantern['itl_p50_s'] * 1000:.1f}", str(lantern["errors"]),
             *(f"{ratios.get(name, 0):.2f}x" for name, _ in RATIOS)]  # fmt: skip
    return "| " + " | ".join(cells) + " |", ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="holds smollm2.mar")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llm-ceiling"))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32, help="per round, at least")
    parser.add_argument("--waves", type=int, default=4, help="requests per stream, at least")
    parser.add_argument("--dtype", default=auto_dtype("cpu"), help="of the raw limits")
    args = parse_with_run_arguments(parser)
    folder = unpack(args.store, args.work)
    extra = ["--concurrency", str(args.concurrency), "--load-limit", "--requests",
             str(args.requests), "--waves", str(args.waves)]  # fmt: skip
    print(f"c={args.concurrency}, {args.max_tokens} tokens per answer, {args.waves} waves")
    print("| round | raw step ms | raw step tok/s | whole answers tok/s | engine step tok/s "
          "| engine under load tok/s | the same, no prefix cache | Lantern tok/s "
          "| Lantern ITL p50 ms | errors "
          "| vs raw step | vs whole answers | vs engine step | vs engine under load |")  # fmt: skip
    print("|---" * 14 + "|")
    rounds: list[dict[str, Any]] = []
    concurrency = str(args.concurrency)
    with lantern_up(args, args.work) as server:
        drive(args, server, concurrency)  # warm the server at this concurrency
        for i in range(1, args.rounds + 1):
            raw = in_process("--raw", folder, args, extra)["levels"][0]
            lantern = drive(args, server, concurrency)[0]
            line, ratios = row(i, raw, lantern)
            print(line, flush=True)
            rounds.append(
                {"raw": raw, "lantern": lantern, "ratios": ratios, "load": os.getloadavg()}
            )
    medians = {
        name: statistics.median(r["ratios"][name] for r in rounds if name in r["ratios"])
        for name, _ in RATIOS
        if any(name in r["ratios"] for r in rounds)
    }
    print("median: " + ", ".join(f"vs {name} {value:.2f}x" for name, value in medians.items()))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"store": str(args.store),
                             "work": str(args.work), "json": str(args.json)},
                             "rounds": rounds, "medians": medians}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
