"""The LLM benchmark's arithmetic: percentiles, one level's summary, CPU per token, the table.

Pure functions over plain data, so ``tests/bench/test_llm_stats.py`` checks them without a server.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One streamed request: time to first token, the gaps between later tokens, the count."""

    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None

    def output_tokens(self) -> int:
        """The server's ``usage.completion_tokens`` if it sent one, else the chunks counted."""
        if self.tokens:
            return self.tokens
        return len(self.gaps) + 1 if self.ttft is not None else 0


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-int(round(q * 1000)) * len(ordered) // 1000))  # ceil(q * n), exact
    return ordered[min(len(ordered), rank) - 1]


def cpu_per_token(cpu_seconds: float | None, tokens: int) -> float | None:
    """CPU seconds of the server's process tree over a level, per generated token."""
    if cpu_seconds is None or tokens <= 0:
        return None
    return cpu_seconds / tokens


def summarise(
    samples: Sequence[Sample], concurrency: int, elapsed: float, cpu_seconds: float | None
) -> dict[str, Any]:
    """One concurrency level's figures (times in seconds)."""
    ok = [s for s in samples if s.error is None]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    gaps = [g for s in ok for g in s.gaps]
    tokens = sum(s.output_tokens() for s in ok)
    return {
        "concurrency": concurrency,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "first_error": next((s.error for s in samples if s.error), None),
        "seconds": elapsed,
        "output_tokens": tokens,
        "tokens_per_request": tokens / len(ok) if ok else 0.0,
        "output_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "requests_per_s": len(ok) / elapsed if elapsed > 0 else 0.0,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "itl_p50_s": percentile(gaps, 0.5),
        "itl_p99_s": percentile(gaps, 0.99),
        "cpu_s": cpu_seconds,
        "cpu_per_token_ms": None if (c := cpu_per_token(cpu_seconds, tokens)) is None else c * 1000,
    }


COUNTED = ("requests", "errors", "output_tokens")  # summed over rounds; other numbers: the median


def median_levels(rounds: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One server's levels over several rounds: per concurrency, the median of each figure (the
    counts summed), ``rounds`` measured, and over more than one round the lowest and highest
    tokens/s (``output_tokens_per_s_range``). A figure some rounds lack (no CPU read) is the
    median of the rounds that have it."""
    by: dict[int, list[Mapping[str, Any]]] = {}
    for levels in rounds:
        for level in levels:
            by.setdefault(int(level["concurrency"]), []).append(level)
    merged = []
    for concurrency, levels in sorted(by.items()):
        out: dict[str, Any] = {"concurrency": concurrency, "rounds": len(levels)}
        for key in dict.fromkeys(k for level in levels for k in level if k != "concurrency"):
            values = [level.get(key) for level in levels]
            numbers = [float(v) for v in values if isinstance(v, (int, float))]
            if key in COUNTED:
                out[key] = int(sum(numbers))
            elif numbers:
                out[key] = statistics.median(numbers)
            else:
                out[key] = next((v for v in values if v is not None), None)
        tps = [float(level["output_tokens_per_s"]) for level in levels]
        if len(tps) > 1:
            out["output_tokens_per_s_range"] = (min(tps), max(tps))
        merged.append(out)
    return merged


LIMITS = ("tokens_per_s", "answers_tokens_per_s", "engine_tokens_per_s")


def raw_limits(raws: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Each raw limit (`LIMITS`: tokens/s by batch size) over several ``bench.llm --raw`` runs:
    the median of its measurements."""
    values: dict[str, dict[int, list[float]]] = {key: {} for key in LIMITS}
    for raw in raws:
        for level in raw["levels"]:
            for key in LIMITS:
                if key in level:
                    values[key].setdefault(int(level["batch"]), []).append(float(level[key]))
    return {
        key: {batch: statistics.median(v) for batch, v in by.items()} for key, by in values.items()
    }


def _range(r: Mapping[str, Any]) -> str:
    low_high = r.get("output_tokens_per_s_range")
    return "-" if not low_high else f"{low_high[0]:.0f}-{low_high[1]:.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


ROWS = (
    ("output tok/s", lambda r: _num(r.get("output_tokens_per_s"))),
    ("tok/s lowest-highest round", _range),
    ("requests/s", lambda r: _num(r.get("requests_per_s"), ".2f")),
    ("tokens/request", lambda r: _num(r.get("tokens_per_request"))),
    ("TTFT p50/p99 ms", lambda r: f"{_ms(r.get('ttft_p50_s'))} / {_ms(r.get('ttft_p99_s'))}"),
    ("ITL p50/p99 ms", lambda r: f"{_ms(r.get('itl_p50_s'))} / {_ms(r.get('itl_p99_s'))}"),
    ("CPU ms/token", lambda r: _num(r.get("cpu_per_token_ms"))),
    ("errors", lambda r: str(r.get("errors", "-"))),
)


def table(
    servers: Mapping[str, Sequence[Mapping[str, Any]]],
    raw: Mapping[int, float] | None = None,
    baseline: str = "lantern",
    answers: Mapping[int, float] | None = None,
    engine: Mapping[int, float] | None = None,
) -> list[str]:
    """Markdown: one column per server and concurrency, one row per figure, then the ratios of
    ``baseline``'s tokens/s and TTFT p99 to each other server's, to the raw batched forward
    (``raw``: batch size -> tokens/s of the decode step) and to whole answers generated in one
    batch in-process (``answers``: batch size -> tokens/s, prefill included) and to Lantern's
    own engine stepping in-process (``engine``: batch size -> tokens/s), at the same
    concurrency."""
    levels = sorted({r["concurrency"] for rs in servers.values() for r in rs})
    by = {name: {r["concurrency"]: r for r in rs} for name, rs in servers.items()}
    heads = [f"{name} c={c}" for name in servers for c in levels if c in by[name]]
    lines = ["| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    rounds = any("output_tokens_per_s_range" in r for rs in servers.values() for r in rs)
    for label, cell in ROWS:
        if cell is _range and not rounds:
            continue
        cells = [cell(by[name][c]) for name in servers for c in levels if c in by[name]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if baseline not in by:
        return lines
    lines += ["", f"| {baseline} against | " + " | ".join(f"c={c}" for c in levels) + " |"]
    lines.append("|---" * (len(levels) + 1) + "|")
    base = by[baseline]
    for name in servers:
        if name == baseline:
            continue
        tps = [
            _ratio(_get(base, c, "output_tokens_per_s"), _get(by[name], c, "output_tokens_per_s"))
            for c in levels
        ]
        ttft = [
            _ratio(_get(base, c, "ttft_p99_s"), _get(by[name], c, "ttft_p99_s")) for c in levels
        ]
        lines.append(f"| tok/s vs {name} | " + " | ".join(tps) + " |")
        lines.append(f"| TTFT p99 vs {name} | " + " | ".join(ttft) + " |")
    if raw:
        cells = [_ratio(_get(base, c, "output_tokens_per_s"), raw.get(c)) for c in levels]
        lines.append("| tok/s vs raw forward | " + " | ".join(cells) + " |")
        step = {c: c / tps for c, tps in raw.items() if tps}
        cells = [_ratio(_get(base, c, "itl_p50_s"), step.get(c)) for c in levels]
        lines.append("| ITL p50 vs raw step | " + " | ".join(cells) + " |")
    if answers:
        cells = [_ratio(_get(base, c, "output_tokens_per_s"), answers.get(c)) for c in levels]
        lines.append("| tok/s vs raw whole answers | " + " | ".join(cells) + " |")
    if engine:
        cells = [_ratio(_get(base, c, "output_tokens_per_s"), engine.get(c)) for c in levels]
        lines.append("| tok/s vs its engine's step in-process | " + " | ".join(cells) + " |")
    return lines


def _get(rows: Mapping[int, Mapping[str, Any]], c: int, key: str) -> float | None:
    value = rows.get(c, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None
