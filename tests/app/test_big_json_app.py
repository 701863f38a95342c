"""Big OIP JSON bodies in process (issue 27, item 7): one over ``max_request_elements`` is refused
from its declared shapes without being parsed; a big one within it is decoded in the decoding
process and answered as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve.core import offload
from serve.wire import oip
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import in_process, run, test_config
from tests.support.server import HANDLERS, build_archive

MAX_ELEMENTS = 200_000


def _body(count: int, datatype: str = "FP32") -> bytes:
    data: list[object] = ["ab"] * count if datatype == "BYTES" else [0.25] * count
    doc = {"inputs": [{"name": "x", "shape": [count], "datatype": datatype, "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def test_big_json_bodies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "count", HANDLERS / "count_handler.py", config={"minWorkers": 1})
    parsed: list[int] = []
    real = oip.parse_request

    def recording(body: bytes, *args: object) -> oip.InferRequest:
        parsed.append(len(body))
        return real(body, *args)  # type: ignore[arg-type]

    async def test() -> None:
        config = test_config(
            tmp_path, store, max_request_elements=MAX_ELEMENTS, load_models=["count.mar"]
        )
        async with in_process(config, InlineWorkers()) as lantern:
            infer = lantern.inference
            headers = {"content-type": "application/json"}
            with monkeypatch.context() as patched:
                patched.setattr(oip, "parse_request", recording)
                for datatype in ("FP32", "BYTES"):
                    over = _body(MAX_ELEMENTS + 1, datatype)
                    assert len(over) > offload.PROCESS_MIN
                    resp = await infer.post("/v2/models/count/infer", content=over, headers=headers)
                    assert resp.status_code == 413, resp.text
                    assert "max_request_elements" in resp.json()["error"]
                assert parsed == []  # refused from the shapes: never parsed
            big = _body(MAX_ELEMENTS)
            assert len(big) >= offload.PROCESS_MIN  # decoded in the process
            resp = await infer.post("/v2/models/count/infer", content=big, headers=headers)
            assert resp.status_code == 200, resp.text
            assert resp.json()["outputs"][0]["data"] == [MAX_ELEMENTS]

    try:
        run(test)
    finally:
        offload.shutdown()
