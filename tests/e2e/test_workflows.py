"""Workflows on a real server: each node of a workflow runs in a worker process of its own.

The workflow API, its DAGs and TorchServe's example flows are tested in process
(`tests/app/test_workflows_app.py`); this module keeps what only processes show.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import LanternServer, build_archive

WORKFLOWS = Path(__file__).resolve().parents[1] / "support" / "workflows"
_REAL = (
    "import sys; from workflow_archiver.workflow_packaging import generate_workflow_archive; "
    "sys.argv[0] = 'torch-workflow-archiver'; generate_workflow_archive()"
)
PHRASES = {
    "en2de": ("german_output", {"Hello World !!!": "Hallo Welt!!!"}),
    "en2fr": ("french_output", {"Hello World !!!": "Bonjour le monde ! ! !"}),
}


def real_workflow_archiver(name: str, spec: str, handler: str, out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-c",
            _REAL,
            "--workflow-name",
            name,
            "--spec-file",
            str(WORKFLOWS / spec),
            "--handler",
            str(WORKFLOWS / handler),
            "--export-path",
            str(out),
            "-f",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out / f"{name}.war"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("workflows")
    models, wars = work / "model_store", work / "wf_store"
    for d in (models, wars):
        d.mkdir()
    for name, (key, phrases) in PHRASES.items():
        build_archive(
            models,
            name,
            WORKFLOWS / "phrasebook_handler.py",
            config={"handler": {"output_key": key, "phrases": phrases}},
        )
    real_workflow_archiver("nmt_wf_dual", "nmt_dual.yaml", "nmt_dual_handler.py", wars)
    srv = LanternServer(
        work, models, args=["--enable-model-api", "--workflow-store", str(wars)]
    ).start()
    try:
        response = httpx.post(
            f"{srv.management}/workflows", params={"url": "nmt_wf_dual.war"}, timeout=300
        )
        assert response.status_code == 200, response.text
        yield srv
    finally:
        srv.stop()


def test_function_and_model_nodes_run_in_worker_processes(server: LanternServer) -> None:
    described = httpx.get(f"{server.management}/workflows/nmt_wf_dual", timeout=60).json()[0]
    children = set(server.child_pids())
    for node in described["nodes"]:
        (worker,) = node["model"]["workers"]
        assert worker["pid"] != server.pid and worker["pid"] in children, node["name"]
    answer = httpx.put(
        f"{server.inference}/wfpredict/nmt_wf_dual", content=b"Hello World !!!\n", timeout=60
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["german_translation"] == "Hallo Welt!!!"
