"""TorchServe's gRPC services against one in-process server, driven by stubs generated from its
protos. The gRPC listeners are real (loopback, free ports) and run on the server's own event loop;
the handlers run in inline workers (the worker runtime in this process).

Token auth is on (as by default), so every call carries the port's key, as TorchServe's
``torchserve_grpc_client.py --auth-token`` does. Models: ``echo`` (batching, torch-free),
``stream`` (intermediate responses), ``headers`` (answers the request headers it was given; one
worker and a queue of two, for deadline and cancellation tests).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.grpc_stubs import bearer, generate
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import ThreadedLantern, test_config
from tests.support.server import HANDLERS, build_archive, echo_archive
from tests.support.waiting import wait_for

MAX_REQUEST = 100_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedLantern]:
    work = tmp_path_factory.mktemp("grpc-ts")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo", config={"batchSize": 4, "maxBatchDelay": 50})
    echo_archive(store, "echo-v2", version="2.0")
    build_archive(store, "stream", HANDLERS / "stream_handler.py")
    build_archive(store, "headers", HANDLERS / "headers_handler.py", config={"jobQueueSize": 2})
    config = test_config(
        work,
        store,
        load_models=["echo=echo.mar", "stream=stream.mar", "headers=headers.mar"],
        disable_token_authorization=False,
        key_file=str(work / "key_file.json"),
        enable_model_api=True,
        max_request_size=MAX_REQUEST,
        enable_grpc=True,
        grpc_inference_port=0,
        grpc_management_port=0,
    )
    with ThreadedLantern(config, InlineWorkers(), grpc=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def ts(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return generate(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(scope="module")
def keys(server: ThreadedLantern) -> dict[str, str]:
    assert server.lantern is not None and server.lantern.server.state.auth is not None
    found = json.loads(server.lantern.server.state.auth.key_file.read_text())
    return {kind: entry["key"] for kind, entry in found.items()}


@pytest.fixture(scope="module")
def inference(server: ThreadedLantern, ts: SimpleNamespace) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_inference) as channel:
        yield ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)


@pytest.fixture(scope="module")
def management(server: ThreadedLantern, ts: SimpleNamespace) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_management) as channel:
        yield ts.management_pb2_grpc.ManagementAPIsServiceStub(channel)


@pytest.fixture(scope="module")
def inf_md(keys: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return bearer(keys["inference"])


@pytest.fixture(scope="module")
def mgmt_md(keys: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return bearer(keys["management"])


def code_of(fn: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)
    return info.value.code(), info.value.details() or ""


def predict(ts: SimpleNamespace, model: str, data: bytes, version: str = "") -> Any:
    return ts.inference_pb2.PredictionsRequest(
        model_name=model, model_version=version, input={"data": data}
    )


# ----- inference -------------------------------------------------------------------------------


def test_ping_answers_the_http_ping_json(server: ThreadedLantern, inference: Any, inf_md) -> None:
    reply = inference.Ping(empty_pb2.Empty(), metadata=inf_md)
    assert json.loads(reply.health) == server.client("inference").get("/ping").json()
    assert json.loads(reply.health) == {"status": "Healthy"}


def test_predictions_runs_the_handler_with_the_call_metadata(
    inference: Any, ts: SimpleNamespace, inf_md
) -> None:
    md = (*inf_md, ("x-request-id", "grpc-rid-1"))
    reply, call = inference.Predictions.with_call(predict(ts, "headers", b"hello"), metadata=md)
    assert dict(call.trailing_metadata())["x-request-id"] == "grpc-rid-1"
    answer = json.loads(reply.prediction)
    assert answer["input"] == "hello"
    assert answer["headers"]["x-request-id"] == "grpc-rid-1"
    assert answer["headers"]["session_id"] == "12345"  # TorchServe's client sends it


@pytest.mark.parametrize(
    ("model", "version", "data", "code"),
    [
        ("", "", b"x", grpc.StatusCode.INVALID_ARGUMENT),
        ("nope", "", b"x", grpc.StatusCode.NOT_FOUND),  # TorchServe: INTERNAL
        ("echo", "9.9", b"x", grpc.StatusCode.NOT_FOUND),
        ("echo", "", b"boom", grpc.StatusCode.INTERNAL),  # the handler raised
        ("echo", "", b"status 404", grpc.StatusCode.NOT_FOUND),  # the handler's own status
        ("echo", "", b"status 503", grpc.StatusCode.UNAVAILABLE),
        ("echo", "", b"x" * (MAX_REQUEST + 1), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
def test_predictions_errors(
    inference: Any, ts: SimpleNamespace, inf_md, model: str, version: str, data: bytes, code
) -> None:
    got, details = code_of(
        inference.Predictions, predict(ts, model, data, version), metadata=inf_md
    )
    assert got == code, details


def test_unknown_model_message(inference: Any, ts: SimpleNamespace, inf_md) -> None:
    with pytest.raises(grpc.RpcError) as info:
        inference.Predictions(predict(ts, "nope", b"x"), metadata=inf_md)
    assert info.value.details() == "Model not found: nope"
    # Values are str (the stubs say bytes, which only "-bin" keys carry).
    trailers: dict[str, Any] = {m.key: m.value for m in info.value.trailing_metadata()}
    rid = trailers["x-request-id"]  # a new one, as HTTP answers
    assert re.fullmatch(r"[0-9a-f-]{36}", rid)


def test_stream_predictions_sends_each_intermediate_response(
    inference: Any, ts: SimpleNamespace, inf_md
) -> None:
    replies = inference.StreamPredictions(predict(ts, "stream", b"x"), metadata=inf_md)
    assert [r.prediction for r in replies] == [b"part0 ", b"part1 ", b"part2 ", b"done"]


def test_predictions_on_a_streaming_handler_answers_all_chunks(
    inference: Any, ts: SimpleNamespace, inf_md
) -> None:
    reply = inference.Predictions(predict(ts, "stream", b"x"), metadata=inf_md)
    assert reply.prediction == b"part0 part1 part2 done"


def test_stream_predictions2_passes_sequence_ids_as_request_headers(
    inference: Any, ts: SimpleNamespace, inf_md
) -> None:
    pb = ts.inference_pb2
    requests = [
        pb.PredictionsRequest(model_name="headers", sequence_id="seq-A", input={"data": b"1"}),
        pb.PredictionsRequest(
            model_name="headers",
            sequence_id="seq-A",
            input={"data": b"2", "ts_request_sequence_end": b"true"},
        ),
        pb.PredictionsRequest(model_name="headers", input={"data": b"no id"}),
        pb.PredictionsRequest(
            model_name="headers", input={"data": b"3", "ts_request_sequence_start": b"true"}
        ),
        pb.PredictionsRequest(model_name="nope", sequence_id="seq-B", input={"data": b"4"}),
        pb.PredictionsRequest(model_name="headers", sequence_id="seq-B", input={"data": b"5"}),
    ]
    replies = list(inference.StreamPredictions2(iter(requests), metadata=inf_md))
    assert len(replies) == len(requests)  # one each; errors in band, the stream goes on
    first, second, missing, started, unknown, last = replies

    def seen(reply: Any) -> dict[str, Any]:
        assert not reply.HasField("status"), reply.status
        return json.loads(reply.prediction)["headers"]

    assert first.sequence_id == "seq-A"
    assert seen(first)["ts_request_sequence_id"] == "seq-A"
    assert seen(first)["ts_request_sequence_end"] is None
    assert seen(second)["ts_request_sequence_end"] == "true"
    assert missing.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert missing.status.message == "Parameter sequenceId is required."
    info = error_details_pb2.ErrorInfo()
    assert missing.status.details[0].Unpack(info) and info.reason == "BadRequestException"
    assert re.fullmatch(r"ts-seq-[0-9a-f-]{36}", started.sequence_id)
    assert seen(started)["ts_request_sequence_id"] == started.sequence_id
    assert seen(started)["ts_request_sequence_start"] == "true"
    assert unknown.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert seen(last)["ts_request_sequence_id"] == "seq-B"


def test_grpc_and_http_requests_share_one_queue_and_batch(
    server: ThreadedLantern, inference: Any, ts: SimpleNamespace, inf_md, keys
) -> None:
    """While the worker sleeps, two gRPC and one HTTP request queue and run as one batch."""
    http_headers = {"Authorization": f"Bearer {keys['inference']}"}
    url = "/predictions/echo"
    http_post = server.client("inference").post
    with cf.ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(http_post, url, content=b"sleep 1", headers=http_headers)
        wait_for(lambda: _metric(server, "serve_requests_in_flight", "echo") >= 1)
        calls = [inference.Predictions.future(predict(ts, "echo", b"g"), metadata=inf_md)]
        calls.append(inference.Predictions.future(predict(ts, "echo", b"g"), metadata=inf_md))
        http = pool.submit(http_post, url, content=b"h", headers=http_headers)
        rows = [json.loads(c.result(timeout=30).prediction) for c in calls]
        rows.append(http.result().json())
        assert blocker.result().status_code == 200
    assert {r["batch"] for r in rows} == {3}, rows


def test_deadline_is_the_request_deadline(
    server: ThreadedLantern, inference: Any, ts: SimpleNamespace, inf_md
) -> None:
    code, _ = code_of(
        inference.Predictions, predict(ts, "headers", b"sleep 1"), metadata=inf_md, timeout=0.3
    )
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_expired_and_cancelled_calls_free_their_queue_slots(
    server: ThreadedLantern, inference: Any, ts: SimpleNamespace, inf_md
) -> None:
    """``headers`` has one worker and room for two queued requests.

    A cancelled or expired call behind a live one in the queue must not keep its slot.
    """

    def call(data: bytes) -> Any:
        return inference.Predictions.future(predict(ts, "headers", data), metadata=inf_md)

    def depth() -> float:
        return _metric(server, "serve_queue_depth", "headers")

    busy = call(b"sleep 2")
    wait_for(lambda: _metric(server, "serve_requests_in_flight", "headers") == 1 and not depth())
    first = call(b"first")
    wait_for(lambda: depth() == 1)
    cancelled = call(b"cancelled")
    wait_for(lambda: depth() == 2)
    cancelled.cancel()
    wait_for(lambda: depth() == 1)
    # The queue holds [first, cancelled]: this one takes the cancelled call's slot, then expires.
    code, details = code_of(
        inference.Predictions, predict(ts, "headers", b"expires"), metadata=inf_md, timeout=0.3
    )
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
    later = call(b"later")  # and this one the expired call's
    assert json.loads(later.result(timeout=30).prediction)["input"] == "later"
    assert json.loads(first.result(timeout=30).prediction)["input"] == "first"
    assert json.loads(busy.result(timeout=30).prediction)["input"] == "sleep 2"


# ----- token auth ------------------------------------------------------------------------------


def test_each_port_takes_only_its_own_key(
    server: ThreadedLantern, inference: Any, management: Any, ts: SimpleNamespace, keys
) -> None:
    list_request = ts.management_pb2.ListModelsRequest()
    for md in [(), bearer("wrong"), bearer(keys["management"]), bearer(keys["API"])]:
        code, details = code_of(inference.Predictions, predict(ts, "echo", b"x"), metadata=md)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert details.startswith("Token Authorization failed")
        assert code_of(inference.Ping, empty_pb2.Empty(), metadata=md)[0] == code
    for md in [(), bearer("wrong"), bearer(keys["inference"])]:
        assert code_of(management.ListModels, list_request, metadata=md)[0] == code
    management.ListModels(list_request, metadata=bearer(keys["management"]))


def test_health_and_reflection_need_no_key(server: ThreadedLantern) -> None:
    with grpc.insecure_channel(server.grpc_inference) as channel:
        health: Any = health_pb2_grpc.HealthStub(channel)  # its stubs declare no methods
        serving = health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest()).status == serving
        assert health.Check(health_pb2.HealthCheckRequest(service="echo")).status == serving
        assert health.Check(health_pb2.HealthCheckRequest(service="echo/1.0")).status == serving
        code, _ = code_of(health.Check, health_pb2.HealthCheckRequest(service="nope"))
        assert code == grpc.StatusCode.NOT_FOUND


# ----- management ------------------------------------------------------------------------------


def test_list_models_msg_is_the_http_json(
    server: ThreadedLantern, management: Any, ts: SimpleNamespace, mgmt_md, keys
) -> None:
    reply = management.ListModels(ts.management_pb2.ListModelsRequest(limit=2), metadata=mgmt_md)
    http = server.client("management").get(
        "/models?limit=2",
        headers={"Authorization": f"Bearer {keys['management']}"},
    )
    assert json.loads(reply.msg) == http.json()
    assert json.loads(reply.msg)["nextPageToken"] == "2"


def test_describe_msg_is_the_http_json(
    server: ThreadedLantern, management: Any, ts: SimpleNamespace, mgmt_md, keys
) -> None:
    reply = management.DescribeModel(
        ts.management_pb2.DescribeModelRequest(model_name="echo"), metadata=mgmt_md
    )
    http = (
        server.client("management")
        .get(
            "/models/echo",
            headers={"Authorization": f"Bearer {keys['management']}"},
        )
        .json()
    )
    grpc_json = json.loads(reply.msg)

    def stable(data: list[dict[str, Any]]) -> list[dict[str, Any]]:  # memory and times move
        return [
            {**d, "workers": [{"id": w["id"], "status": w["status"]} for w in d["workers"]]}
            for d in data
        ]

    assert stable(grpc_json) == stable(http)
    code, _ = code_of(
        management.DescribeModel,
        ts.management_pb2.DescribeModelRequest(model_name="nope"),
        metadata=mgmt_md,
    )
    assert code == grpc.StatusCode.NOT_FOUND


def test_torchserve_grpc_client_flow(
    server: ThreadedLantern, inference: Any, management: Any, ts: SimpleNamespace, mgmt_md, inf_md
) -> None:
    """``torchserve_grpc_client.py register | infer | unregister``, with its parameters."""
    params = {"url": "echo.mar", "initial_workers": 1, "synchronous": True, "model_name": "flow"}
    reply = management.RegisterModel(
        ts.management_pb2.RegisterModelRequest(**params), metadata=mgmt_md
    )
    assert reply.msg == 'Model "flow" Version: 1.0 registered with 1 initial workers'
    answer = inference.Predictions(predict(ts, "flow", b"kitten"), metadata=inf_md)
    assert json.loads(answer.prediction)["echo"] == "kitten"
    reply = management.UnregisterModel(
        ts.management_pb2.UnregisterModelRequest(model_name="flow"), metadata=mgmt_md
    )
    assert reply.msg == 'Model "flow" unregistered'
    code, _ = code_of(inference.Predictions, predict(ts, "flow", b"x"), metadata=inf_md)
    assert code == grpc.StatusCode.NOT_FOUND


def test_register_scale_set_default_unregister(
    server: ThreadedLantern, management: Any, ts: SimpleNamespace, mgmt_md
) -> None:
    pb = ts.management_pb2
    call = management
    request = pb.RegisterModelRequest(url="echo-v2.mar", model_name="echo", synchronous=True)
    reply = call.RegisterModel(request, metadata=mgmt_md)
    assert reply.msg == (
        'Model "echo" Version: 2.0 registered with 0 initial workers.'
        " Use scale workers API to add workers for the model."
    )
    assert code_of(call.RegisterModel, request, metadata=mgmt_md)[0] == (
        grpc.StatusCode.ALREADY_EXISTS  # TorchServe: UNKNOWN with no message
    )
    scale = pb.ScaleWorkerRequest(
        model_name="echo", model_version="2.0", min_worker=1, synchronous=True
    )
    reply = call.ScaleWorker(scale, metadata=mgmt_md)
    assert reply.msg == "Workers scaled to 1 for model: echo, version: 2.0"
    reply = call.SetDefault(
        pb.SetDefaultRequest(model_name="echo", model_version="2.0"), metadata=mgmt_md
    )
    assert reply.msg == 'Default version successfully updated for model "echo" to "2.0"'
    code, _ = code_of(
        call.UnregisterModel,
        pb.UnregisterModelRequest(model_name="echo", model_version="2.0"),
        metadata=mgmt_md,
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED  # the default version, with others left
    call.SetDefault(pb.SetDefaultRequest(model_name="echo", model_version="1.0"), metadata=mgmt_md)
    reply = call.UnregisterModel(
        pb.UnregisterModelRequest(model_name="echo", model_version="2.0"), metadata=mgmt_md
    )
    assert reply.msg == 'Model "echo" unregistered'


@pytest.mark.parametrize(
    ("method", "request_args", "code"),
    [
        ("RegisterModel", {"url": ""}, grpc.StatusCode.INVALID_ARGUMENT),
        ("RegisterModel", {"url": "missing.mar"}, grpc.StatusCode.NOT_FOUND),
        ("RegisterModel", {"url": "echo.mar", "runtime": "LSP"}, grpc.StatusCode.INVALID_ARGUMENT),
        ("ScaleWorker", {"model_name": "nope"}, grpc.StatusCode.NOT_FOUND),
        ("ScaleWorker", {"model_name": ""}, grpc.StatusCode.INVALID_ARGUMENT),
        (
            "ScaleWorker",
            {"model_name": "echo", "min_worker": 3, "max_worker": 2},
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        ("SetDefault", {"model_name": "echo", "model_version": "9"}, grpc.StatusCode.NOT_FOUND),
        ("SetDefault", {"model_name": "nope", "model_version": "1"}, grpc.StatusCode.NOT_FOUND),
        ("UnregisterModel", {"model_name": "nope"}, grpc.StatusCode.NOT_FOUND),
        ("UnregisterModel", {"model_name": ""}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_management_errors(
    management: Any, ts: SimpleNamespace, mgmt_md, method: str, request_args: dict, code
) -> None:
    message = {
        "RegisterModel": "RegisterModelRequest",
        "ScaleWorker": "ScaleWorkerRequest",
        "SetDefault": "SetDefaultRequest",
        "UnregisterModel": "UnregisterModelRequest",
    }[method]
    request = getattr(ts.management_pb2, message)(**request_args)
    got, details = code_of(getattr(management, method), request, metadata=mgmt_md)
    assert got == code, details


def test_calls_are_in_the_access_log_with_the_protocol(
    server: ThreadedLantern, inference, ts, inf_md
) -> None:
    md = (*inf_md, ("x-request-id", "logged-grpc-call"))
    inference.Predictions(predict(ts, "echo", b"x"), metadata=md)
    wait_for(lambda: "logged-grpc-call" in server.log_text())
    line = next(line for line in server.log_text().splitlines() if "logged-grpc-call" in line)
    assert "InferenceAPIsService/Predictions" in line and " OK " in line
    assert "model=echo version=1.0" in line and "protocol=grpc" in line


# ----- helpers ---------------------------------------------------------------------------------


def _metric(server: ThreadedLantern, name: str, model: str) -> float:
    text = server.client("metrics").get("/metrics").text
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_stream_predictions_errors(inference: Any, ts: SimpleNamespace, inf_md) -> None:
    for model, data, code in [
        ("nope", b"x", grpc.StatusCode.NOT_FOUND),
        ("", b"x", grpc.StatusCode.INVALID_ARGUMENT),
        ("echo", b"boom", grpc.StatusCode.INTERNAL),
    ]:
        replies = inference.StreamPredictions(predict(ts, model, data), metadata=inf_md)
        with pytest.raises(grpc.RpcError) as info:
            list(replies)
        assert info.value.code() == code, (model, data)


def test_describe_customized_runs_the_handler(
    management: Any, ts: SimpleNamespace, mgmt_md
) -> None:
    request = ts.management_pb2.DescribeModelRequest(model_name="echo", customized=True)
    data = json.loads(management.DescribeModel(request, metadata=mgmt_md).msg)
    assert len(data) == 1 and "customizedMetadata" in data[0]
