"""docs/operating.md's commands: the two-server example gives the second server every listener
a server on the defaults holds, with flags `serve start` has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from serve.cli.main import start
from serve.config import Config

DOC = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)


def test_the_two_server_example_moves_every_listener() -> None:
    block = next(b for b in _bash_blocks() if "--pid-file ~/a.json" in b)
    first = block.replace("\\\n", " ").splitlines()[0]
    words = shlex.split(first)
    assert words[:2] == [".venv/bin/serve", "start"]
    flags = {w for w in words if w.startswith("--")}
    known = {opt for param in start.params for opt in param.opts}
    assert flags <= known, flags - known
    # One flag for each listener a default server holds (the three HTTP and two gRPC ports).
    defaults = Config()
    listeners = ["inference_address", "management_address", "metrics_address"]
    listeners += ["grpc_inference_port", "grpc_management_port"]
    for key in listeners:
        assert getattr(defaults, key)  # a default server listens there
        flag = "--" + key.replace("_", "-")
        assert flag in flags, flag


def test_the_commands_name_the_venv_script() -> None:
    for block in _bash_blocks():
        for line in block.splitlines():
            assert not re.match(r"\s*serve ", line), line
