"""The LLM load tools users point at an OpenAI-compatible server, against Lantern and a tiny
``text_generation`` model, offline: their requests must all succeed.

guidellm runs from ``.venv-llmtools`` (``make test`` builds it beside ``.venv``, reusing its
packages; guidellm pins click 8.4). It checks ``GET /health`` first, then streams chat
completions with ``stream_options`` ``include_usage`` and ``continuous_usage_stats``, ``stop:
null`` and ``ignore_eos``, reading the token counts from the chunks' usage; its tokenizer is
the tiny model's own folder (``HF_HUB_OFFLINE=1``: nothing is downloaded).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import REPO, LanternServer, build_archive

pytest.importorskip("transformers")

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOOLS_VENV = Path(os.environ.get("LANTERN_LLM_TOOLS_VENV", REPO / ".venv-llmtools"))


def tool(name: str) -> Path:
    path = TOOLS_VENV / "bin" / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: `make test` builds {TOOLS_VENV}")
        pytest.skip(f"no {name} at {path} (make test builds {TOOLS_VENV})")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.generation_fixtures import save_pretrained

    folder = tmp_path_factory.mktemp("llm-tools") / "tiny"
    _, tokenizer = save_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE  # guidellm chats (POST /v1/chat/completions)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[LanternServer]:
    work = tiny.parent
    store = work / "store"
    store.mkdir()
    config = {"minWorkers": 1, "handler": {"max_model_len": 128}}
    build_archive(
        store, "tiny", "text_generation", config=config, extra_files=sorted(tiny.iterdir())
    )
    lantern = LanternServer(work, store, ["tiny=tiny.mar"], args=["--no-grpc"])
    lantern.start(timeout=180)
    yield lantern
    lantern.stop()


def test_guidellm_runs_every_request_without_an_error(
    server: LanternServer, tiny: Path, tmp_path: Path
) -> None:
    guidellm = tool("guidellm")
    report = tmp_path / "guidellm.json"
    cmd = [
        str(guidellm), "run",
        "--backend", f"kind=openai_http,target={server.inference},model=tiny",
        "--profile", "kind=concurrent,streams=2",
        "--constraint", "kind=max_requests,count=6",
        "--tokenizer", f"kind=huggingface_auto,model={tiny}",
        "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=8",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    errors = [r.get("info", {}).get("error") for r in benchmark["requests"].get("errored", [])]
    assert totals == {"successful": 6, "errored": 0, "incomplete": 0, "total": 6}, errors[:2]
    # Its token counts come from the usage chunks: exactly what it asked for (ignore_eos).
    assert benchmark["metrics"]["output_token_count"]["successful"]["total_sum"] == 6 * 8
