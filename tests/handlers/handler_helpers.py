"""Helpers shared by the handler tests (imported by name; tests/handlers is on sys.path)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The package is not installed in the venv; make `import handlers` / `archiver` work from the repo.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from handlers.context import Context, RequestProcessor  # noqa: E402

DATA_DIR = REPO_ROOT / "examples" / "data"
KITTEN = DATA_DIR / "kitten.jpg"
COFFEE = DATA_DIR / "coffee.jpg"
IMAGENET_LABELS = DATA_DIR / "index_to_name.json"


def write(path: Path, text: str) -> Path:
    """Write dedented ``text`` to ``path`` and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def write_json(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj))
    return path


def make_context(archive, batch_size: int = 8, num_threads: int | None = None) -> Context:
    """A worker-style Context for an opened archive (CPU)."""
    return Context(
        archive.model_name,
        str(archive.model_dir),
        archive.manifest,
        batch_size,
        None,
        "test",
        limit_max_image_pixels=True,
        model_yaml_config=archive.model_config,
        num_threads=num_threads,
    )


def set_batch(ctx: Context, batch: Sequence, headers: Sequence[dict] | None = None) -> None:
    """What the worker does before predict: request ids and one processor per row."""
    ctx.request_ids = {i: f"req-{i}" for i in range(len(batch))}
    headers = headers or [{} for _ in batch]
    ctx.request_processor = [RequestProcessor(dict(h)) for h in headers]
