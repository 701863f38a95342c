"""Charts of a benchmark run, next to its JSON: throughput and latency against concurrency.

``python -m bench`` calls `write_charts` after writing its JSON; ``python -m bench.plots RUN.json
[--out DIR]`` draws an earlier run again. Two figures per run, one panel per model, the servers
side by side in each:

* ``<stem>-throughput``: req/s by concurrency, one bar per server and variant (workers × threads,
  batching); the raw baselines (no HTTP at all) as dashed lines across the panel;
* ``<stem>-latency``: p50 as a bar, p90 as a dot and the line on to p99, per scenario (log scale).

Written as SVG and PNG with matplotlib's non-interactive backend (no display is needed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FORMATS = ("svg", "png")
_COLOURS = ("#c2410c", "#2563eb", "#15803d", "#7c3aed", "#0891b2", "#b91c1c", "#a16207", "#475569")


def series_label(row: dict[str, Any]) -> str:
    """What one bar stands for: the server and, for served runs, the variant."""
    if row["kind"] == "ceiling":
        return f"{row['server']} bare ASGI"
    if row["kind"] == "raw":
        return f"raw {row.get('workers')}×{row.get('threads')}, {row.get('batching')}"
    label = str(row.get("server") or "")
    if row.get("workers"):
        label += f" {row['workers']}×{row.get('threads')}"
    if row.get("batching") and row["batching"] != "-":
        label += f", {row['batching']}"
    return label.strip()


def by_model(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rows by model, in the order the run has them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(str(row["model"]), []).append(row)
    return out


def write_charts(
    data: dict[str, Any], out: Path, stem: str, formats: Sequence[str] = FORMATS
) -> list[Path]:
    """Draw ``data`` (a run's JSON) into ``out`` in ``formats``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "lantern"  # stable element ids in the SVG
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text (searchable, smaller)
    from matplotlib import pyplot as plt

    written = []
    title = _title(data.get("meta") or {})
    for name, draw, field in (("throughput", _throughput, "rps"), ("latency", _latency, "p50_ms")):
        # Only the models with figures for this chart (a run's rows may lack latencies).
        models = by_model(
            [r for r in data["results"] if r.get("concurrency") and r.get(field) is not None]
            + [r for r in data["results"] if r["kind"] == "raw" and field == "rps"]
        )
        if not models:
            continue
        out.mkdir(parents=True, exist_ok=True)
        fig, axes = plt.subplots(
            len(models), 1, figsize=(11, 3.2 * len(models)), squeeze=False, layout="constrained"
        )
        for ax, (model, rows) in zip(axes[:, 0], models.items(), strict=True):
            draw(ax, model, rows)
        fig.suptitle(title, fontsize=10)
        for fmt in formats:
            path = out / f"{stem}-{name}.{fmt}"
            fig.savefig(path, dpi=110, metadata=_metadata(fmt))
            written.append(path)
        plt.close(fig)
    return written


def _metadata(fmt: str) -> dict[str, Any]:
    # No dates in the files: redrawing the same results gives the same bytes.
    return {"Date": None} if fmt == "svg" else {}


def _title(meta: dict[str, Any]) -> str:
    parts = [f"{meta['mode']} run" if meta.get("mode") else "benchmark"]
    if meta.get("started"):
        parts.append(str(meta["started"]))
    if meta.get("cores"):
        parts.append(f"{meta['cores']} cores")
    if meta.get("loadavg"):
        parts.append(f"load {meta['loadavg'][0]}→{meta['loadavg'][-1]}")
    if meta.get("commit"):
        parts.append(str(meta["commit"]))
    return ", ".join(parts)


def _throughput(ax: Any, model: str, rows: list[dict[str, Any]]) -> None:
    measured = [r for r in rows if r.get("concurrency") and r.get("rps") is not None]
    levels = sorted({int(r["concurrency"]) for r in measured})
    labels = list(dict.fromkeys(series_label(r) for r in measured))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        points = {int(r["concurrency"]): r["rps"] for r in measured if series_label(r) == label}
        xs = [levels.index(c) - 0.4 + width * (i + 0.5) for c in points]
        bars = ax.bar(xs, list(points.values()), width, label=label, color=_colour(i))
        ax.bar_label(bars, fmt=_figure, fontsize=7, padding=1)
    for j, raw in enumerate(r for r in rows if r["kind"] == "raw" and r.get("rps")):
        ax.axhline(raw["rps"], ls="--", lw=1, color="#6b7380", alpha=0.5 + 0.5 * (j % 2))
        ax.annotate(
            series_label(raw), (1.0, raw["rps"]), xycoords=("axes fraction", "data"),
            ha="right", va="bottom", fontsize=7, color="#6b7380",
        )  # fmt: skip
    ax.set_xticks(range(len(levels)), [f"c={c}" for c in levels])
    ax.set_ylabel("req/s")
    ax.set_title(model, loc="left", fontsize=10)
    if labels:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)


def _latency(ax: Any, model: str, rows: list[dict[str, Any]]) -> None:
    measured = [r for r in rows if r.get("concurrency") and r.get("p50_ms") is not None]
    labels = list(dict.fromkeys(series_label(r) for r in measured))
    names = []
    for y, row in enumerate(measured):
        colour = _colour(labels.index(series_label(row)))
        ax.barh(y, row["p50_ms"], color=colour, height=0.6)
        if row.get("p99_ms") is not None:
            ax.plot([row["p50_ms"], row["p99_ms"]], [y, y], color=colour, lw=1.5)
            ax.plot(row["p99_ms"], y, "|", color=colour, ms=9)
        if row.get("p90_ms") is not None:
            ax.plot(row["p90_ms"], y, "o", color=colour, ms=4)
        names.append(f"{series_label(row)}, c={row['concurrency']}")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    if measured:
        ax.set_xscale("log")
    ax.set_xlabel(latency_axis(measured))
    ax.set_title(model, loc="left", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)


def latency_axis(rows: list[dict[str, Any]]) -> str:
    """The latency axis's label: the marks the chart draws, and only those (a run transcribed
    from tables may give p50 alone)."""
    marks = ["bar p50"]
    if any(r.get("p90_ms") is not None for r in rows):
        marks.append("dot p90")
    if any(r.get("p99_ms") is not None for r in rows):
        marks.append("tick p99")
    return f"ms ({', '.join(marks)})"


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _colour(i: int) -> str:
    return _COLOURS[i % len(_COLOURS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.plots", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, help="a run's JSON (bench/results/bench-*.json)")
    parser.add_argument("--out", type=Path, help="folder for the charts (default: beside the JSON)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: svg, png")
    args = parser.parse_args(argv)
    data = json.loads(args.results.read_text())
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for path in write_charts(data, args.out or args.results.parent, args.results.stem, formats):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
