"""gRPC settings: TLS, the model-API gate, ``ts_open_inference_protocol``, ``--no-grpc``, and
graceful shutdown. Torch-free models only; two small servers."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.support.grpc_stubs import generate
from tests.support.server import HANDLERS, LanternServer, build_archive


def _self_signed(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.fixture(scope="module")
def ts(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return generate(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    """TLS on both gRPC ports, the model API off (the default), OIP over gRPC off."""
    work = tmp_path_factory.mktemp("grpc-tls")
    store = work / "store"
    store.mkdir()
    build_archive(store, "headers", HANDLERS / "headers_handler.py")
    key, cert = _self_signed(work)
    config = work / "config.properties"
    config.write_text(
        f"enable_grpc_ssl=true\nprivate_key_file={key}\ncertificate_file={cert}\n"
        "ts_open_inference_protocol=false\n"
    )
    srv = LanternServer(work, store, ["headers=headers.mar"], args=["--ts-config", str(config)])
    srv.start()
    srv.cert = cert.read_bytes()  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def _secure(server: LanternServer, address: str) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=server.cert)  # type: ignore[attr-defined]
    return grpc.secure_channel(address, credentials)


def test_tls_on_both_ports(tls_server: LanternServer, ts: SimpleNamespace) -> None:
    request = ts.inference_pb2.PredictionsRequest(model_name="headers", input={"data": b"tls"})
    with _secure(tls_server, tls_server.grpc_inference) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        assert json.loads(stub.Predictions(request).prediction)["input"] == "tls"
    with _secure(tls_server, tls_server.grpc_management) as channel:
        stub = ts.management_pb2_grpc.ManagementAPIsServiceStub(channel)
        assert "headers" in stub.ListModels(ts.management_pb2.ListModelsRequest()).msg
    with grpc.insecure_channel(tls_server.grpc_inference) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predictions(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_model_api_gate(tls_server: LanternServer, ts: SimpleNamespace) -> None:
    pb = ts.management_pb2
    with _secure(tls_server, tls_server.grpc_management) as channel:
        stub = ts.management_pb2_grpc.ManagementAPIsServiceStub(channel)
        for call, request in [
            (stub.RegisterModel, pb.RegisterModelRequest(url="headers.mar", model_name="other")),
            (stub.UnregisterModel, pb.UnregisterModelRequest(model_name="headers")),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                call(request)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Scaling is not gated, as in TorchServe.
        reply = stub.ScaleWorker(pb.ScaleWorkerRequest(model_name="headers", synchronous=True))
        assert reply.msg == "Workers scaled to 1 for model: headers, version: 1.0"


def test_open_inference_protocol_can_be_turned_off(tls_server: LanternServer) -> None:
    client = triton.InferenceServerClient(
        tls_server.grpc_inference,
        ssl=True,
        root_certificates=str(Path(tls_server.workdir) / "cert.pem"),
    )
    with pytest.raises(InferenceServerException) as info:
        client.is_server_live()
    assert str(info.value.status()) == "StatusCode.UNIMPLEMENTED"


def test_graceful_shutdown_finishes_calls_in_flight(
    tls_server: LanternServer, ts: SimpleNamespace
) -> None:
    """Runs last: stops the module's server (SIGTERM) with a call in flight."""
    request = ts.inference_pb2.PredictionsRequest(
        model_name="headers", input={"data": b"sleep 1.5"}
    )
    with _secure(tls_server, tls_server.grpc_inference) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        call = stub.Predictions.future(request)
        deadline = time.monotonic() + 30
        while _in_flight(tls_server) == 0:  # the server has the call
            assert time.monotonic() < deadline
            time.sleep(0.02)
        stopped: list[int | None] = []
        stopper = threading.Thread(target=lambda: stopped.append(tls_server.stop()))
        stopper.start()
        assert json.loads(call.result(timeout=30).prediction)["input"] == "sleep 1.5"
        stopper.join(60)
    assert stopped == [0]


def _in_flight(server: LanternServer) -> float:
    text = httpx.get(f"{server.metrics}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("serve_requests_in_flight{")
    )


def test_no_grpc_flag(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    with LanternServer(tmp_path, store, args=["--no-grpc"]) as srv:
        assert not any(name.startswith("grpc") for name in srv.state["addresses"])
        client = triton.InferenceServerClient(srv.inference.removeprefix("http://"))
        with pytest.raises(InferenceServerException) as info:
            client.is_server_live()
        if srv.runs_uvicorn:  # no HTTP/2: nothing answers gRPC at all
            assert str(info.value.status()) == "StatusCode.UNAVAILABLE"
        else:
            assert "gRPC is not served" in info.value.message()


@pytest.mark.parametrize("which", ["inference", "management"])
def test_a_busy_grpc_port_is_named_and_exits_4_as_http_ports_do(tmp_path: Path, which: str) -> None:
    """The port comes from `serve start --grpc-*-port` (over the environment's 0)."""
    import socket

    store = tmp_path / "store"
    store.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        srv = LanternServer(tmp_path, store, args=[f"--grpc-{which}-port", str(port)])
        with pytest.raises(RuntimeError) as info:
            srv.start(timeout=60)
        srv.stop()
    assert (
        f"Error: Cannot listen on grpc_{which} address 127.0.0.1:{port}: Address already in use"
    ) in str(info.value)
    assert "Traceback" not in str(info.value)
    assert srv.proc is not None and srv.proc.returncode == 4


def test_a_grpc_client_on_hypercorns_http_port_is_told_where_grpc_is(tmp_path: Path) -> None:
    """hypercorn speaks HTTP/2, so a gRPC call reaching an HTTP port is answered UNIMPLEMENTED
    with the gRPC address (uvicorn, the default, refuses the HTTP/2 connection instead)."""
    store = tmp_path / "store"
    store.mkdir()
    with LanternServer(tmp_path, store, http_server="hypercorn") as srv:
        client = triton.InferenceServerClient(srv.inference.removeprefix("http://"))
        with pytest.raises(InferenceServerException) as info:
            client.is_server_live()
        assert str(info.value.status()) == "StatusCode.UNIMPLEMENTED"
        assert f"gRPC inference calls go to {srv.grpc_inference}" in info.value.message()
        log = srv.log_text("lantern.log") + srv.console_text()
        assert "Traceback" not in log and "KeyError" not in log
