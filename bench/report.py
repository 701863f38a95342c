"""The results table and the checks against the performance bar (`docs/performance.md`)."""

from __future__ import annotations

from typing import Any

from bench.plan import BATCH, DELAY_MS, DEMO_DELAY_MS

_COLUMNS = (
    ("scenario", "<"),
    ("server", "<"),
    ("model", "<"),
    ("w×t", ">"),
    ("batching", "<"),
    ("c", ">"),
    ("req/s", ">"),
    ("p50 ms", ">"),
    ("p90 ms", ">"),
    ("p99 ms", ">"),
    ("err", ">"),
    ("batch", ">"),
    ("cpu ms/req", ">"),
    ("fe ms/req", ">"),
    ("fe RSS MB", ">"),
)


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _cells(row: dict[str, Any]) -> list[str]:
    kind = row["kind"]
    wt = f"{row['workers']}×{row['threads']}" if row.get("workers") else "-"
    batch = row.get("batch") or {}
    return [
        kind,
        row.get("server") or "-",
        row["model"],
        wt,
        row.get("batching") or "-",
        str(row["concurrency"]) if row.get("concurrency") else "-",
        _num(row.get("rps"), 0 if (row.get("rps") or 0) >= 100 else 1),
        _num(row.get("p50_ms")),
        _num(row.get("p90_ms")),
        _num(row.get("p99_ms")),
        str(row.get("errors", 0)),
        _num(batch.get("mean")) if batch else "-",
        _num(row.get("cpu_ms_per_req"), 3),
        _num(row.get("frontend_cpu_ms_per_req"), 3),
        _num(row.get("frontend_rss_mb"), 0),
    ]


def format_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """One table of every scenario (raw rows: items/s and per-batch p50)."""
    cells = [[name for name, _ in _COLUMNS]] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]

    def line(values: list[str]) -> str:
        return "  ".join(
            v.ljust(w) if align == "<" else v.rjust(w)
            for v, w, (_, align) in zip(values, widths, _COLUMNS, strict=True)
        )

    out = [line(cells[0]), line(["-" * w for w in widths])]
    out += [line(c) for c in cells[1:]]
    served = [r for r in rows if r["kind"] != "raw" and r.get("requests")]
    gen_cpu = sum((r.get("generator_cpu_s") or 0) * r["repeats"] for r in served) / max(
        1, sum(r["requests"] for r in served)
    )
    out.append("")
    out.append(
        f"{meta['mode']} run, {meta['cores']} cores (load average {meta['loadavg'][0]:g} before, "
        f"{meta['loadavg'][1]:g} after), {meta['duration_s']:g} s × "
        f"{meta['repeats']} per scenario (medians), load from {meta['generator']} on the same "
        f"cores ({gen_cpu * 1000:.3f} ms of its CPU per request). raw rows: items/s, p50 = one "
        "batch; cpu = frontend + workers; fe = frontend (or bare server) alone."
    )
    return "\n".join(out)


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The row whose fields equal ``match`` (by attributes, so any core count's keys match)."""
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _served(
    rows: list[dict[str, Any]], server: str, model: str, batch: int, delay: int, c: int
) -> dict[str, Any] | None:
    """A two-worker served row."""
    return _find(
        rows,
        kind="served",
        server=server,
        model=model,
        workers=2,
        batch_size=batch,
        max_batch_delay_ms=delay if batch > 1 else 0,
        concurrency=c,
    )


def _check(
    name: str, value: float | None, target: float, *, at_most: bool = False, detail: str = ""
) -> dict[str, Any]:
    passed = None if value is None else (value <= target if at_most else value >= target)
    return {
        "check": name,
        "value": value,
        "target": target,
        "op": "<=" if at_most else ">=",
        "pass": passed,
        "detail": detail,
    }


def evaluate_bar(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bar item whose scenarios ran, with its figure and whether it passes."""
    checks: list[dict[str, Any]] = []
    servers = sorted({r["server"] for r in rows if r["kind"] == "served"})
    for server in servers:
        served = _served(rows, server, "tiny", BATCH, DELAY_MS, 32)
        ceiling = _find(rows, kind="ceiling", server=server, concurrency=32)
        if served and ceiling and ceiling["rps"]:
            checks.append(
                _check(
                    f"{server}: tiny (2w, batch {BATCH}/{DELAY_MS}ms) c=32 ÷ bare ASGI c=32",
                    served["rps"] / ceiling["rps"],
                    0.8,
                    detail=f"{served['rps']:.0f} / {ceiling['rps']:.0f} req/s",
                )
            )
    uv = _served(rows, "uvicorn", "tiny", BATCH, DELAY_MS, 32)
    if uv:
        checks.append(
            _check(f"uvicorn: tiny (2w, batch {BATCH}/{DELAY_MS}ms) c=32 req/s", uv["rps"], 4500)
        )
        checks.append(
            _check(
                f"uvicorn: tiny (2w, batch {BATCH}/{DELAY_MS}ms) c=32 CPU ms/req",
                uv["cpu_ms_per_req"],
                0.35,
                at_most=True,
                detail=f"frontend {uv['frontend_cpu_ms_per_req']:.3f} ms",
            )
        )
    uv1 = _served(rows, "uvicorn", "tiny", 1, 0, 1)
    if uv1:
        checks.append(
            _check("uvicorn: tiny unbatched c=1 p50 ms", uv1["p50_ms"], 1.0, at_most=True)
        )
    raw = _find(rows, kind="raw", model="resnet18", workers=2, batch_size=BATCH)
    for server in servers:
        batched16 = _served(rows, server, "resnet18", BATCH, DELAY_MS, 16)
        if batched16 and raw and raw["rps"]:
            checks.append(
                _check(
                    f"{server}: resnet18 (2 workers, batch {BATCH}) c=16 ÷ raw (2 processes, "
                    f"batch {BATCH})",
                    batched16["rps"] / raw["rps"],
                    0.98,
                    detail=f"{batched16['rps']:.1f} / {raw['rps']:.1f} items/s",
                )
            )
        batched8 = _served(rows, server, "resnet18", BATCH, DELAY_MS, 8)
        unbatched8 = _served(rows, server, "resnet18", 1, 0, 8)
        if batched8 and unbatched8 and unbatched8["rps"]:
            mean = (batched8.get("batch") or {}).get("mean")
            checks.append(
                _check(
                    f"{server}: resnet18 2w batch {BATCH} c=8 ÷ unbatched 2w c=8 (no starvation)",
                    batched8["rps"] / unbatched8["rps"],
                    0.9,
                    detail=f"{batched8['rps']:.1f} / {unbatched8['rps']:.1f} req/s, "
                    f"mean batch {mean}",
                )
            )
        base = _served(rows, server, "tiny", 1, 0, 1)
        for delay in (DELAY_MS, DEMO_DELAY_MS):
            batched = _served(rows, server, "tiny", BATCH, delay, 1)
            if batched and base:
                added = batched["p99_ms"] - base["p99_ms"]
                checks.append(
                    _check(
                        f"{server}: batch {BATCH}/{delay}ms at c=1, added p99 latency ms "
                        f"(≤ max_batch_delay)",
                        added,
                        float(delay),
                        at_most=True,
                        detail=f"p50 {batched['p50_ms']:.2f} vs {base['p50_ms']:.2f} unbatched",
                    )
                )
    return checks


def format_bar(checks: list[dict[str, Any]]) -> str:
    out = ["The bar (docs/performance.md):"]
    for c in checks:
        mark = {True: "PASS", False: "MISS", None: "n/a "}[c["pass"]]
        value = "-" if c["value"] is None else f"{c['value']:.3g}"
        detail = f"  ({c['detail']})" if c["detail"] else ""
        out.append(f"  [{mark}] {c['check']}: {value} {c['op']} {c['target']:g}{detail}")
    return "\n".join(out)
