"""Token authorisation on a real server: the key file comes and goes with the process.

The tokens' rules (which key opens which port, rotation, the model-API switch) are tested in
process (`tests/app/test_auth_app.py`).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx

from tests.support.server import LanternServer, echo_archive


def test_the_key_file_lives_as_long_as_the_server(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store)
    srv = LanternServer(tmp_path, store, models=["echo.mar"], token_auth=True).start()
    try:
        key_file = Path(srv.state["key_file"])
        assert key_file.parent == srv.workdir.resolve()  # the working directory, as in TorchServe
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        keys = json.loads(key_file.read_text())
        models = f"{srv.management}/models"
        assert httpx.get(models, timeout=10).status_code == 401
        authorised = {"Authorization": f"Bearer {keys['management']['key']}"}
        assert httpx.get(models, headers=authorised, timeout=10).status_code == 200
    finally:
        srv.stop()
    assert not key_file.exists()  # the key file goes with the server, as in TorchServe
