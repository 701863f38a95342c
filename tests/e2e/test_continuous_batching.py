"""Continuous batching end to end (``continuousBatching: true``, no sequences), on a real server.

Two archives of the tiny causal LM built in code (tests/support/generation_fixtures.py): the
built-in ``text_generation`` handler in its one-step-per-``handle`` mode, and a stand-in of
TorchServe 0.12's inferentia2 continuous-batching example handler (tests/e2e/torchserve_examples).
A long request streams; a late one joins its running batch at the next step, leaves when it is
done, and both streams' greedy tokens equal ``generate``'s. A third archive, a stand-in of the
inferentia2 streamer example, streams ``generate`` through ``ts.handler_utils.hf_batch_streamer``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import LanternServer, build_archive

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parent / "torchserve_examples"
COMMON = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 4, "maxBatchDelay": 0}
# New tokens of text_generation's running request and of the late one: the running one lasts
# long enough (seconds) for the late one to arrive while it runs, even on a loaded machine.
LONG, SHORT = 1000, 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.generation_fixtures import save_pretrained

    folder = tmp_path_factory.mktemp("tiny_lm")
    save_pretrained(folder)
    # Llama's rotary positions have no weights: a longer context changes no token, and lets one
    # request run for LONG tokens.
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 2048
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("continuous")
    store = root / "store"
    store.mkdir()
    files = sorted(model_dir.iterdir())
    build_archive(
        store,
        "tg",
        "text_generation",
        config={
            **COMMON,
            "continuousBatching": True,
            # float32: its tokens are compared one for one with a float32 `generate` (the
            # handler's auto dtype is bfloat16 on a CPU that computes it natively)
            "handler": {"prefill_chunk_tokens": 64, "dtype": "float32"},
        },
        extra_files=files,
    )
    build_archive(
        store,
        "tscb",
        EXAMPLES / "hf_continuous_handler.py",
        config={
            **COMMON,
            "continuousBatching": True,
            "handler": {"max_new_tokens": 8, "stop_at_eos": False, "step_delay_ms": 20},
        },
        extra_files=files,
    )
    build_archive(
        store,
        "streamer",
        EXAMPLES / "hf_streamer_handler.py",
        config={**COMMON, "batchSize": 1, "handler": {"max_new_tokens": 20}},
        extra_files=files,
    )
    srv = LanternServer(root, store, ["tg=tg.mar", "tscb=tscb.mar", "streamer=streamer.mar"])
    srv.start(timeout=300)
    yield srv
    srv.stop()


def reference(model_dir: Path, prompt: str, n: int) -> list[int]:
    """Greedy tokens of transformers' own ``generate``, EOS ignored."""
    torch.set_num_threads(1)  # a small model: more threads only wait on each other when loaded
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
    )
    return out[0, ids.shape[1] :].tolist()


def objects(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a streamed answer (its chunks may arrive joined)."""
    decoder, text, out = json.JSONDecoder(), raw.decode(), []
    index = 0
    while index < len(text):
        obj, index = decoder.raw_decode(text, index)
        out.append(obj)
    return out


class Stream:
    """A streamed POST read in a thread; ``first`` is set once its first chunk has arrived."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.first = threading.Event()
        self.raw = b""
        self.headers: dict[str, str] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url, json=body, timeout=120) as response:
                self.headers = dict(response.headers)
                for chunk in response.iter_raw():
                    self.raw += chunk
                    self.first.set()
        except BaseException as exc:  # reported by result()
            self.error = exc
        finally:
            self.first.set()

    def result(self) -> list[dict[str, Any]]:
        self._thread.join(120)
        assert not self._thread.is_alive(), "the stream did not end"
        if self.error is not None:
            raise self.error
        return objects(self.raw)


def batch_sizes(server: LanternServer, model: str) -> tuple[float, float]:
    """(batches of one request, all batches) from ``serve_batch_size`` for ``model``."""
    text = httpx.get(f"{server.metrics}/metrics", timeout=30).text
    ones = total = 0.0
    for line in text.splitlines():
        if line.startswith("serve_batch_size_bucket") and f'model="{model}"' in line:
            if 'le="1.0"' in line:
                ones = float(line.rsplit(" ", 1)[1])
        if line.startswith("serve_batch_size_count") and f'model="{model}"' in line:
            total = float(line.rsplit(" ", 1)[1])
    return ones, total


def test_describe_shows_continuous_batching(server: LanternServer) -> None:
    for model in ("tg", "tscb"):
        described = server.describe(model)[0]
        assert described["continuousBatching"] is True and described["stateful"] is False


def test_text_generation_late_request_joins_the_running_batch(
    server: LanternServer, model_dir: Path
) -> None:
    url = f"{server.inference}/predictions/tg"
    common = {"temperature": 0, "ignore_eos": True, "stream": True}
    long = Stream(url, {"prompt": "the quick brown fox", "max_tokens": LONG, **common})
    assert long.first.wait(120)
    late = Stream(url, {"prompt": "a model server answers", "max_tokens": SHORT, **common})
    late_rows, long_rows = late.result(), long.result()
    assert long.headers["ts_stream_next"] == "true"  # answered in parts
    long_tokens = [t for row in long_rows for t in row["tokens"]]
    late_tokens = [t for row in late_rows for t in row["tokens"]]
    assert late_rows[-1]["finished"] and late_rows[-1]["finish_reason"] == "length"
    assert long_rows[-1]["usage"]["completion_tokens"] == LONG
    assert long_tokens == reference(model_dir, "the quick brown fox", LONG)
    assert late_tokens == reference(model_dir, "a model server answers", SHORT)
    ones, total = batch_sizes(server, "tg")
    assert total > ones  # some step carried both requests: the late one joined


def test_torchserve_style_handler_steps_joins_and_leaves(
    server: LanternServer, model_dir: Path
) -> None:
    url = f"{server.inference}/predictions/tscb"
    long = Stream(url, {"prompt": "the quick brown fox", "max_new_tokens": 100})
    assert long.first.wait(120)
    late = Stream(url, {"prompt": "a model server answers", "max_new_tokens": 4})
    late_rows, long_rows = late.result(), long.result()
    long_id, late_id = long.headers["x-request-id"], late.headers["x-request-id"]
    assert len(long_rows) == 100 and len(late_rows) == 4  # one part per step
    assert long_rows[0]["batch"] == [long_id]
    assert long_id in late_rows[0]["batch"]  # the late request joined the running batch
    joined = [i for i, row in enumerate(long_rows) if late_id in row["batch"]]
    assert len(joined) == 4 and joined == list(range(joined[0], joined[0] + 4))
    assert all(row["batch"] == [long_id] for row in long_rows[joined[-1] + 1 :])  # it left
    assert long_rows[0]["text"].startswith("the quick brown fox")  # prefill: prompt + token
    assert [row["tokens"][0] for row in long_rows] == reference(
        model_dir, "the quick brown fox", 100
    )
    assert [row["tokens"][0] for row in late_rows] == reference(
        model_dir, "a model server answers", 4
    )


def test_hf_batch_streamer_parts_make_the_generated_text(
    server: LanternServer, model_dir: Path
) -> None:
    url = f"{server.inference}/predictions/streamer"
    parts: list[bytes] = []
    with httpx.stream("POST", url, content=b"the quick brown fox", timeout=120) as response:
        assert response.status_code == 200
        assert "content-length" not in response.headers  # chunked: answered in parts
        parts.extend(response.iter_raw())
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    expected = tokenizer.decode(
        reference(model_dir, "the quick brown fox", 20), skip_special_tokens=True
    )
    assert b"".join(parts).decode() == expected
